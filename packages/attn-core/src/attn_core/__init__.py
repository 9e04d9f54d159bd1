"""attn_core: one attention entry point and the building blocks every attn-zoo model uses.

``attention()`` is the fast entry point (math / sdpa / flash_attn / flex backends);
``scaled_dot_product_attention()`` is the readable reference that returns weights.
Mask convention: ``attn_mask`` bool True = may attend (float = additive);
``key_padding_mask`` bool True = padding. See docs/attention.md.
``fast_inference`` runs blocks for inference with fused CPU (oneDNN) kernels, switched for a
whole model by one call (``fast_inference.enable(model)`` / ``disable(model)``).

Names are imported on first use (PEP 562): ``import attn_core.cli`` or ``attn_core.errors``
(what every app and script imports first) does not import torch.
"""

# ruff: noqa: F401  (the TYPE_CHECKING imports below re-export __all__)
from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "additive": ["AdditiveAttention"],
    "attention": [
        "BACKENDS",
        "AttentionBackendError",
        "attention",
        "available_backends",
        "last_backend",
        "use_backend",
    ],
    "blocks": [
        "CrossAttentionBlock",
        "DropPath",
        "FeedForward",
        "LayerScale",
        "QuickGELU",
        "TransformerBlock",
    ],
    "functional": ["masked_softmax", "scaled_dot_product_attention"],
    "kv_cache": ["KVCache"],
    "linear_attention": ["LinearAttention", "PerformerAttention", "linear_attention"],
    "masks": ["causal_mask", "combine_masks", "padding_mask", "sliding_window_mask", "to_additive"],
    "mha": ["MultiHeadAttention"],
    "rope": ["AxialRotaryEmbedding", "RotaryEmbedding", "apply_rotary"],
    "sliding_window": ["sliding_window_attention"],
}
_SUBMODULES = ("fast_inference", "masks")  # exported as modules
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}

__version__ = "0.1.0"
__all__ = sorted([*_WHERE, *_SUBMODULES])


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        value = getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
    else:  # a submodule: attn_core.hub, attn_core.fast_inference, ...
        try:
            value = importlib.import_module(f".{name}", __name__)
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module 'attn_core' has no attribute {name!r}") from None
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)


class _Package(types.ModuleType):
    """Importing the submodule ``attn_core.attention`` (or ``linear_attention``) must not
    hide the function of the same name, as it would not with an eager ``__init__``."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _WHERE and isinstance(value, types.ModuleType):
            return  # __getattr__ gives the function
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


if TYPE_CHECKING:  # the same names, eagerly, for type checkers and IDEs
    from . import fast_inference, masks
    from .additive import AdditiveAttention
    from .attention import (
        BACKENDS,
        AttentionBackendError,
        attention,
        available_backends,
        last_backend,
        use_backend,
    )
    from .blocks import (
        CrossAttentionBlock,
        DropPath,
        FeedForward,
        LayerScale,
        QuickGELU,
        TransformerBlock,
    )
    from .functional import masked_softmax, scaled_dot_product_attention
    from .kv_cache import KVCache
    from .linear_attention import LinearAttention, PerformerAttention, linear_attention
    from .masks import causal_mask, combine_masks, padding_mask, sliding_window_mask, to_additive
    from .mha import MultiHeadAttention
    from .rope import AxialRotaryEmbedding, RotaryEmbedding, apply_rotary
    from .sliding_window import sliding_window_attention
