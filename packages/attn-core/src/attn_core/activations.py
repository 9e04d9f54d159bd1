"""MLP activations by name (``ACTIVATIONS``; the gated ones in ``GATED_ACTIVATIONS``),
``QuickGELU``, OpenAI CLIP's GELU, and transformers' activation names -> ours
(``HF_ACTIVATIONS``, read through :func:`hf_activation`)."""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

import torch
from torch import nn

__all__ = ["ACTIVATIONS", "GATED_ACTIVATIONS", "HF_ACTIVATIONS", "QuickGELU", "hf_activation"]


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

# transformers' ACT2FN names (``hidden_act``, ``activation_function``) -> the one of ours that
# is the same function; any other name is refused. "gelu" is the exact (erf) GELU; "gelu_new",
# "gelu_fast" and the "*_tanh" ones are its tanh approximation.
HF_ACTIVATIONS: dict[str, str] = {
    "gelu": "gelu",
    "gelu_python": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_fast": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_python_tanh": "gelu_tanh",
    "quick_gelu": "quick_gelu",
    "relu": "relu",
    "silu": "silu",
    "swish": "silu",
}


def hf_activation(name: Any, where: str, supported: Collection[str] | None = None) -> str:
    """Our activation for transformers' ``name``, read from the config field ``where`` (e.g.
    ``"hidden_act"``, ``"vision_config.hidden_act"``). ``supported``: the transformers names
    the caller can build (default: all of ``HF_ACTIVATIONS``). Anything else raises one
    ``ValueError`` naming the field, the value and the supported names."""
    names = HF_ACTIVATIONS.keys() if supported is None else supported
    if not isinstance(name, str) or name not in names:
        raise ValueError(f"{where}={name!r} is not supported: expected one of {sorted(names)}")
    return HF_ACTIVATIONS[name]
