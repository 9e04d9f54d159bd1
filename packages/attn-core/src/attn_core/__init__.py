"""attn_core: one attention entry point and the building blocks every attn-zoo model uses.

``attention()`` is the fast entry point (math / sdpa / flash_attn / flex backends);
``scaled_dot_product_attention()`` is the readable reference that returns weights.
Mask convention: ``attn_mask`` bool True = may attend (float = additive);
``key_padding_mask`` bool True = padding. See docs/attention.md.
``fast_inference`` runs TransformerBlock stacks for inference with fused CPU kernels (opt-in
per model).
"""

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
from .blocks import DropPath, FeedForward, LayerScale, QuickGELU, TransformerBlock
from .functional import masked_softmax, scaled_dot_product_attention
from .kv_cache import KVCache
from .linear_attention import LinearAttention, PerformerAttention, linear_attention
from .masks import causal_mask, combine_masks, padding_mask, sliding_window_mask, to_additive
from .mha import MultiHeadAttention
from .rope import AxialRotaryEmbedding, RotaryEmbedding, apply_rotary
from .sliding_window import sliding_window_attention

__version__ = "0.1.0"

__all__ = [
    "AxialRotaryEmbedding",
    "BACKENDS",
    "AdditiveAttention",
    "AttentionBackendError",
    "DropPath",
    "FeedForward",
    "KVCache",
    "LayerScale",
    "LinearAttention",
    "MultiHeadAttention",
    "PerformerAttention",
    "QuickGELU",
    "RotaryEmbedding",
    "apply_rotary",
    "TransformerBlock",
    "attention",
    "available_backends",
    "causal_mask",
    "combine_masks",
    "last_backend",
    "linear_attention",
    "fast_inference",
    "masked_softmax",
    "masks",
    "padding_mask",
    "scaled_dot_product_attention",
    "sliding_window_attention",
    "sliding_window_mask",
    "to_additive",
    "use_backend",
]
