"""MLP activations by name (``ACTIVATIONS``; the gated ones in ``GATED_ACTIVATIONS``) and
``QuickGELU``, OpenAI CLIP's GELU."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

__all__ = ["ACTIVATIONS", "GATED_ACTIVATIONS", "QuickGELU"]


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
    "geglu_tanh": lambda: nn.GELU(approximate="tanh"),  # gated, T5 v1.1 / mT5 "gated-gelu"
}
# names whose FeedForward is gated (fc1 gives value and gate; hidden = value * act(gate))
GATED_ACTIVATIONS = frozenset({"swiglu", "geglu_tanh"})
