"""Attention masks and the one mask convention used across attn-zoo.

Convention (the same as PyTorch's own functions):

* ``attn_mask`` -- bool: ``True`` means "this query **may attend** to this key"
  (as in ``F.scaled_dot_product_attention``); float: an additive bias added to the
  scores (``-inf`` blocks a key). Broadcastable to ``(B, H, Lq, Lk)``.
* ``key_padding_mask`` -- bool ``(B, Lk)``: ``True`` means "this key is **padding**"
  (as in ``nn.MultiheadAttention``); a float one is additive.

Note the two bool conventions point in opposite directions, exactly as in PyTorch.

What :func:`attn_core.attention` guarantees for masked positions, on every backend: a
query row with every key masked returns zeros; a padding key (``key_padding_mask``, or an
``attn_mask`` with a single query row, ``(..., 1, Lk)``, that blocks it for every head) is
replaced by zeros before the kernel, so NaN / inf stored there never reaches the output.
A key blocked only by a full ``(Lq, Lk)`` ``attn_mask`` is still read.
``padding_mask`` builds a key-padding mask; every other builder here returns an
attention ("may attend") mask.

Causal masks are aligned to the bottom-right corner: query ``i`` of ``q_len`` sits at
absolute position ``k_len - q_len + i``. For ``q_len == k_len`` this is the familiar
lower-triangular mask; for ``q_len < k_len`` (decoding with a KV cache) the new
queries see the whole cache plus themselves.
"""

from __future__ import annotations

import torch

__all__ = [
    "causal_mask",
    "combine_masks",
    "expand_key_padding_mask",
    "padding_mask",
    "sliding_window_mask",
    "to_additive",
    "validate_attn_mask",
    "validate_key_padding_mask",
    "window_rule",
]


def causal_mask(
    q_len: int, k_len: int | None = None, device: torch.device | str | None = None
) -> torch.Tensor:
    """Bool ``(q_len, k_len)`` mask, True where query ``i`` may attend key ``j``.

    Bottom-right aligned: ``j <= i + (k_len - q_len)``.
    """
    k_len = q_len if k_len is None else k_len
    if q_len < 0 or k_len < 0:
        raise ValueError(f"q_len and k_len must be >= 0, got {q_len} and {k_len}")
    return torch.ones(q_len, k_len, dtype=torch.bool, device=device).tril(k_len - q_len)


def padding_mask(lengths: torch.Tensor | list[int], max_len: int | None = None) -> torch.Tensor:
    """Key-padding mask ``(B, max_len)`` from sequence lengths: True marks **padding**."""
    lengths = torch.as_tensor(lengths)
    if lengths.ndim != 1 or lengths.is_floating_point():
        raise ValueError(f"lengths must be a 1-D integer tensor (B,), got {tuple(lengths.shape)}")
    longest = int(lengths.max()) if lengths.numel() else 0
    max_len = longest if max_len is None else max_len
    if longest > max_len:
        raise ValueError(f"max_len={max_len} is shorter than the longest length {longest}")
    positions = torch.arange(max_len, device=lengths.device)
    return positions[None, :] >= lengths[:, None]


def sliding_window_mask(
    q_len: int,
    window: int,
    causal: bool = True,
    *,
    global_tokens: int = 0,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Bool ``(q_len, q_len)`` local-attention mask, True where attention is allowed.

    * ``causal=True``: query ``i`` sees keys ``i - window < j <= i`` (its last
      ``window`` tokens, itself included; Mistral's ``sliding_window``).
    * ``causal=False``: query ``i`` sees keys ``|i - j| <= window // 2`` (Longformer's
      ``attention_window``: half the window on each side).
    * ``global_tokens=g``: the first ``g`` keys are visible to every query (subject to
      causality) and, when not causal, the first ``g`` queries see every key.
    """
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    if global_tokens < 0:
        raise ValueError(f"global_tokens must be >= 0, got {global_tokens}")
    i = torch.arange(q_len, device=device)[:, None]
    j = torch.arange(q_len, device=device)[None, :]
    mask = window_rule(i, j, window, causal)
    if global_tokens:
        glob = j < global_tokens
        if causal:
            glob = glob & (j <= i)
        else:
            glob = glob | (i < global_tokens)
        mask = mask | glob
    return mask


def window_rule(i: torch.Tensor, j: torch.Tensor, window: int, causal: bool) -> torch.Tensor:
    """The local-window rule on (broadcast) query positions ``i`` and key positions ``j``."""
    if causal:
        return (j <= i) & (j > i - window)
    return (i - j).abs() <= window // 2


def to_additive(mask: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Convert an attention mask to an additive float bias: allowed -> 0, blocked -> -inf.

    Float masks are already additive and are only cast to ``dtype``.
    """
    if not dtype.is_floating_point:
        raise ValueError(f"to_additive needs a floating dtype, got {dtype}")
    if mask.dtype == torch.bool:
        bias = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
        return bias.masked_fill_(~mask, float("-inf"))
    if mask.is_floating_point():
        return mask.to(dtype)
    raise ValueError(f"attention masks must be bool or floating point, got {mask.dtype}")


def combine_masks(*masks: torch.Tensor | None) -> torch.Tensor | None:
    """Combine attention masks ("may attend" convention); ``None`` entries are ignored.

    All bool -> logical AND (a key is visible only if every mask allows it).
    Any float -> everything is made additive and summed. Shapes broadcast.
    """
    present = [m for m in masks if m is not None]
    for m in present:
        if m.dtype != torch.bool and not m.is_floating_point():
            raise ValueError(f"attention masks must be bool or floating point, got {m.dtype}")
    if not present:
        return None
    if all(m.dtype == torch.bool for m in present):
        out = present[0]
        for m in present[1:]:
            out = out & m
        return out
    dtype = next(m.dtype for m in present if m.is_floating_point())
    out = to_additive(present[0], dtype)
    for m in present[1:]:
        out = out + to_additive(m, dtype)
    return out


def expand_key_padding_mask(key_padding_mask: torch.Tensor) -> torch.Tensor:
    """``(B, Lk)`` key-padding mask (True = padding) -> ``(B, 1, 1, Lk)`` attention mask.

    Bool masks are inverted into the "may attend" convention; float masks stay additive.
    """
    if key_padding_mask.dtype == torch.bool:
        return ~key_padding_mask[:, None, None, :]
    return key_padding_mask[:, None, None, :]


def _shape_str(shape: tuple[int, ...]) -> str:
    return "(" + ", ".join(str(s) for s in shape) + ")"


def validate_attn_mask(
    mask: torch.Tensor, batch: int, heads: int, q_len: int, k_len: int
) -> torch.Tensor:
    """Check an ``attn_mask`` against ``(B, H, Lq, Lk)`` and return it as a 4-D view.

    Raises ``ValueError`` naming the expected shape on a wrong dtype or shape.
    """
    expected = (batch, heads, q_len, k_len)
    if not isinstance(mask, torch.Tensor):
        raise ValueError(f"attn_mask must be a torch.Tensor, got {type(mask).__name__}")
    if mask.dtype != torch.bool and not mask.is_floating_point():
        raise ValueError(
            "attn_mask must be bool (True = may attend) or floating point (additive), "
            f"got {mask.dtype}"
        )
    if not 2 <= mask.ndim <= 4:
        raise ValueError(
            f"attn_mask must have 2 to 4 dims broadcastable to (B, H, Lq, Lk) = "
            f"{_shape_str(expected)}, got shape {_shape_str(tuple(mask.shape))}"
        )
    full = (1,) * (4 - mask.ndim) + tuple(mask.shape)
    if any(s not in (1, e) for s, e in zip(full, expected, strict=True)):
        raise ValueError(
            f"attn_mask of shape {_shape_str(tuple(mask.shape))} is not broadcastable to "
            f"(B, H, Lq, Lk) = {_shape_str(expected)}"
        )
    return mask.reshape(full)


def validate_key_padding_mask(mask: torch.Tensor, batch: int, k_len: int) -> torch.Tensor:
    """Check a ``key_padding_mask`` is ``(B, Lk)`` and bool or float; return it."""
    if not isinstance(mask, torch.Tensor):
        raise ValueError(f"key_padding_mask must be a torch.Tensor, got {type(mask).__name__}")
    if mask.dtype != torch.bool and not mask.is_floating_point():
        raise ValueError(
            f"key_padding_mask must be bool (True = padding) or floating point (additive), "
            f"got {mask.dtype}"
        )
    if tuple(mask.shape) != (batch, k_len):
        raise ValueError(
            f"key_padding_mask must have shape (B, Lk) = ({batch}, {k_len}), "
            f"got {_shape_str(tuple(mask.shape))}"
        )
    return mask
