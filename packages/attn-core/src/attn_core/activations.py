"""MLP activations by name (``ACTIVATIONS``) and ``QuickGELU``, OpenAI CLIP's GELU."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

__all__ = ["ACTIVATIONS", "QuickGELU"]


class QuickGELU(nn.Module):
    """``x * sigmoid(1.702 x)``: the GELU approximation OpenAI's CLIP was trained with."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(1.702 * x)


ACTIVATIONS: dict[str, Callable[[], nn.Module]] = {
    "gelu": nn.GELU,
    "gelu_tanh": lambda: nn.GELU(approximate="tanh"),
    "quick_gelu": QuickGELU,
    "relu": nn.ReLU,
    "silu": nn.SiLU,  # a.k.a. swish (Marian, BART-family configs)
    "swiglu": nn.SiLU,  # gate activation of the gated (GLU) variant
}
