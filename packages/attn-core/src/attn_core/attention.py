"""``attention()``: the one attention entry point every attn-zoo model calls.

Shape legend: ``B`` batch, ``H`` query heads, ``Hkv`` key/value heads (``H % Hkv == 0``;
fewer key/value heads = GQA, one = MQA), ``Lq`` / ``Lk`` query / key length,
``D`` head width, ``Dv`` value head width.

Backends, looked up by name:

* ``"math"``  -- :func:`attn_core.functional.scaled_dot_product_attention`, the readable
  reference; the only backend that returns weights.
* ``"sdpa"``  -- ``torch.nn.functional.scaled_dot_product_attention`` (flash /
  memory-efficient / cuDNN kernels chosen by PyTorch).
* ``"flash_attn"`` -- the ``flash_attn`` package (CUDA, fp16/bf16, no arbitrary mask).
* ``"flex"`` -- ``torch.nn.attention.flex_attention`` (masks become block masks).

``backend=None`` picks the best that can serve the call (flash_attn when it can, else
sdpa; math when weights are needed). A backend that was *forced* -- by argument, by
``use_backend(name)`` or by the ``ATTN_CORE_BACKEND`` environment variable -- and
cannot serve a call raises :class:`AttentionBackendError` instead of falling back.
``last_backend()`` tells which one ran last; a DEBUG log line says the same.

Edge cases, the same on every backend:

* A query row with every key masked returns zeros (and zero, finite gradients).
* Empty inputs need no kernel: ``Lq == 0`` gives an empty ``(B, H, 0, Dv)`` output,
  ``Lk == 0`` gives zeros ``(B, H, Lq, Dv)`` (every query is fully masked); weights are
  empty ``(B, H, Lq, Lk)``. A forced backend still checks that it could serve the call.
* Padding keys are never read: a key that is padding in ``key_padding_mask`` (bool True
  or float ``-inf``), or that an attn_mask with one query row (shape ``(..., 1, Lk)``,
  which is every mask when ``Lq == 1``) blocks for every head, has its key and value
  replaced by zeros before the kernel. NaN / inf stored there reaches neither the output
  nor the gradients of q, k, v (its own gradient is zero). Keys blocked by a full
  ``(Lq, Lk)`` attn_mask are read as usual (a NaN value there gives NaN, as ``0 * NaN``),
  even where every query blocks them: pass those as a ``key_padding_mask``.
* The math backend computes float16 / bfloat16 inputs in float32 and casts back.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib.util
import logging
import os
import warnings
from collections.abc import Iterator

import torch
import torch.nn.functional as F

from .functional import scaled_dot_product_attention
from .masks import (
    causal_mask,
    combine_masks,
    expand_key_padding_mask,
    validate_attn_mask,
    validate_key_padding_mask,
)

__all__ = [
    "BACKENDS",
    "AttentionBackendError",
    "attention",
    "available_backends",
    "last_backend",
    "use_backend",
]

logger = logging.getLogger(__name__)

BACKENDS = ("math", "sdpa", "flash_attn", "flex")


class AttentionBackendError(ValueError):
    """A forced attention backend cannot serve this call (or does not exist)."""


def _check_name(name: str | None) -> str | None:
    if name is not None and name not in BACKENDS:
        raise AttentionBackendError(
            f"unknown attention backend {name!r}; expected one of {BACKENDS}"
        )
    return name


_ENV_BACKEND = _check_name(os.environ.get("ATTN_CORE_BACKEND") or None)
_forced: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "attn_core_backend", default=_ENV_BACKEND
)
_last: str | None = None


@contextlib.contextmanager
def use_backend(name: str | None) -> Iterator[None]:
    """Force every ``attention()`` call inside the block onto backend ``name``.

    ``None`` restores automatic choice. Like ``torch.nn.attention.sdpa_kernel``, but a
    backend that cannot serve a call raises instead of silently falling back.
    """
    token = _forced.set(_check_name(name))
    try:
        yield
    finally:
        _forced.reset(token)


def last_backend() -> str | None:
    """Name of the backend that served the most recent ``attention()`` call."""
    return _last


# Looked up once at import (plain constants keep torch.compile graphs free of breaks).
_HAS_FLASH_ATTN = importlib.util.find_spec("flash_attn") is not None
_HAS_FLEX = importlib.util.find_spec("torch.nn.attention.flex_attention") is not None


def available_backends() -> list[str]:
    """Backends importable in this environment (whether one serves a call depends on it)."""
    names = ["math", "sdpa"]
    if _HAS_FLASH_ATTN:
        names.append("flash_attn")
    if _HAS_FLEX:
        names.append("flex")
    return names


def _why_not(
    name: str, q: torch.Tensor, k_len: int, has_mask: bool, is_causal: bool, dropout_p: float
) -> str | None:
    """Why backend ``name`` cannot serve this call, or None if it can."""
    if name == "flash_attn":
        if not _HAS_FLASH_ATTN:
            return "the flash_attn package is not installed"
        if not q.is_cuda:
            return "flash_attn needs CUDA tensors"
        if q.dtype not in (torch.float16, torch.bfloat16):
            return f"flash_attn needs float16/bfloat16 inputs, got {q.dtype}"
        if has_mask:
            return "flash_attn supports only is_causal, not attn_mask/key_padding_mask"
        if is_causal and q.shape[-2] > k_len:
            return "flash_attn causal attention needs Lq <= Lk"
        if q.shape[-1] > 256:
            return f"flash_attn supports head dims up to 256, got {q.shape[-1]}"
    if name == "flex":
        if not _HAS_FLEX:
            return "torch.nn.attention.flex_attention is not available in this torch"
        if dropout_p > 0.0:
            return "flex does not support dropout"
        if q.device.type == "cpu" and torch.is_grad_enabled() and q.requires_grad:
            return "FlexAttention has no backward on CPU"
    return None


def _flash(q, k, v, is_causal, dropout_p, scale):
    from flash_attn import flash_attn_func

    # flash_attn wants (B, L, H, D); its causal mask is bottom-right aligned like ours.
    out = flash_attn_func(
        q.transpose(1, 2),
        k.transpose(1, 2),
        v.transpose(1, 2),
        dropout_p=dropout_p,
        softmax_scale=scale,
        causal=is_causal,
    )
    return out.transpose(1, 2)


@functools.cache
def _flex_fn(device_type: str):
    from torch.nn.attention.flex_attention import flex_attention

    # Compiled on GPU (a fused kernel); eager elsewhere (correct, materialises scores).
    return torch.compile(flex_attention, dynamic=False) if device_type == "cuda" else flex_attention


def _flex(q, k, v, mask, is_causal, scale):
    from torch.nn.attention.flex_attention import create_block_mask

    B, H, Lq, _ = q.shape
    Lk = k.shape[-2]
    block_mask = score_mod = None
    if is_causal:
        offset = Lk - Lq

        def mask_mod(b, h, qi, ki):
            return ki <= qi + offset

        block_mask = create_block_mask(mask_mod, None, None, Lq, Lk, device=q.device)
    elif mask is not None:
        # index the dense (b, h, Lq, Lk) mask; size-1 batch/head dims broadcast
        mb, mh = mask.shape[0], mask.shape[1]
        dense = mask.expand(mb, mh, Lq, Lk)

        def pick(b, h, qi, ki):
            return dense[b if mb > 1 else 0, h if mh > 1 else 0, qi, ki]

        if mask.dtype == torch.bool:
            block_mask = create_block_mask(
                lambda b, h, qi, ki: pick(b, h, qi, ki),
                B if mb > 1 else None,
                H if mh > 1 else None,
                Lq,
                Lk,
                device=q.device,
            )
        else:

            def score_mod(score, b, h, qi, ki):
                return score + pick(b, h, qi, ki)

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
        return _flex_fn(q.device.type)(
            q,
            k,
            v,
            score_mod=score_mod,
            block_mask=block_mask,
            scale=scale,
            enable_gqa=k.shape[1] != H,
        )


def _empty_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``Lq == 0`` or ``Lk == 0``: empty output, or zeros ``(B, H, Lq, Dv)`` when ``Lk == 0``;
    empty ``(B, H, Lq, Lk)`` weights. Gradients (zeros) reach q, k and v."""
    H, Hkv = q.shape[1], k.shape[1]
    if Hkv != H:
        k = k.repeat_interleave(H // Hkv, dim=1)
        v = v.repeat_interleave(H // Hkv, dim=1)
    return scaled_dot_product_attention(q, k, v, scale=scale)


def _padding_keys(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Keys blocked for every head by a one-query-row attn_mask ``(b, h, 1, Lk)``:
    ``(b, Lk)``, True = padding. Float masks are read as ``dtype`` (as the kernels see them)."""
    if mask.is_floating_point():
        return torch.isneginf(mask.to(dtype)).all(1)[:, 0]
    return ~mask.any(1)[:, 0]


def _zero_keys(
    k: torch.Tensor, v: torch.Tensor, padding: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Replace the keys and values at ``padding`` ``(b, Lk)`` (True = padding) by zeros.

    Padding often holds garbage, and a NaN there would reach the output even though its
    weight is 0: through its score on kernels that add the mask to the scores, and as
    ``0 * NaN`` in the weighted sum on all of them. ``torch.where`` (not a product) drops it.
    """
    # On CPU, checking is free (no device sync) and saves copying k and v.
    if padding.device.type == "cpu" and not torch.compiler.is_compiling() and not padding.any():
        return k, v
    padding = padding[:, None, :, None]  # (b, 1, Lk, 1): broadcasts over heads and D
    return torch.where(padding, 0.0, k), torch.where(padding, 0.0, v)


def _let_dead_rows_attend(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Open the query rows whose every key is masked; return ``(mask, dead)``.

    The dead rows then attend everywhere (finite maths on every backend) and the caller
    zeroes their output, so it is 0 and its gradients are 0. ``dead`` ``(b, h, Lq, 1)``,
    or ``None`` when there is no dead row (known for free on CPU only).
    """
    if mask.is_floating_point():
        dead = torch.isneginf(mask).all(-1, keepdim=True)
    else:
        dead = ~mask.any(-1, keepdim=True)
    # On CPU, checking is free (no device sync) and saves two passes over the output.
    if dead.device.type == "cpu" and not torch.compiler.is_compiling() and not dead.any():
        return mask, None
    if mask.is_floating_point():
        return mask.masked_fill(dead, 0.0), dead
    return mask | dead, dead


def _run(
    name: str,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    sdpa_causal: bool,
    native_causal: bool,
    dropout_p: float,
    scale: float | None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Call backend ``name``; ``(output (B, H, Lq, Dv), weights (B, H, Lq, Lk) or None)``."""
    H, Hkv = q.shape[1], k.shape[1]
    if name == "math":
        if Hkv != H:
            k = k.repeat_interleave(H // Hkv, dim=1)
            v = v.repeat_interleave(H // Hkv, dim=1)
        return scaled_dot_product_attention(
            q, k, v, mask, dropout_p=dropout_p, is_causal=sdpa_causal, scale=scale
        )
    if name == "sdpa":
        out = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=mask,
            dropout_p=dropout_p,
            is_causal=sdpa_causal,
            scale=scale,
            enable_gqa=Hkv != H,
        )
    elif name == "flash_attn":
        out = _flash(q, k, v, native_causal, dropout_p, scale)
    else:
        out = _flex(q, k, v, None if native_causal else mask, native_causal, scale)
    return out, None


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    attn_mask: torch.Tensor | None = None,
    key_padding_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    dropout_p: float = 0.0,
    scale: float | None = None,
    need_weights: bool = False,
    backend: str | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Multi-head scaled dot-product attention on ``(B, H, L, D)`` tensors.

    Args:
        q: ``(B, H, Lq, D)``.
        k: ``(B, Hkv, Lk, D)``.
        v: ``(B, Hkv, Lk, Dv)``.
        attn_mask: broadcastable to ``(B, H, Lq, Lk)``; bool True = may attend,
            float = additive.
        key_padding_mask: ``(B, Lk)``; bool True = padding, float = additive.
        is_causal: causal attention, bottom-right aligned when ``Lq != Lk``.
        dropout_p: dropout on the attention weights; pass 0.0 in eval mode.
        scale: score scale, default ``1 / sqrt(D)``.
        need_weights: also return the ``(B, H, Lq, Lk)`` weights (uses ``"math"``).
        backend: force a backend by name; ``None`` = ``use_backend`` / automatic.

    Returns:
        ``(B, H, Lq, Dv)`` output, or ``(output, weights)`` when ``need_weights``.
        Queries whose keys are all masked (all of them when ``Lk == 0``) get zeros
        (finite gradients), never NaN; padding keys are zeroed before the kernel, so NaN
        stored there never reaches the output (see the module docstring).
    """
    global _last
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise ValueError(
            "attention expects q (B, H, Lq, D), k (B, Hkv, Lk, D), v (B, Hkv, Lk, Dv); got "
            f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    B, H, Lq, D = q.shape
    Hkv, Lk = k.shape[1], k.shape[2]
    if k.shape[0] != B or v.shape[0] != B or v.shape[1:3] != k.shape[1:3] or k.shape[3] != D:
        raise ValueError(
            f"k must be (B, Hkv, Lk, D) = ({B}, Hkv, Lk, {D}) and v (B, Hkv, Lk, Dv) with "
            f"the same B, Hkv, Lk; got k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    if H % Hkv:
        raise ValueError(f"query heads ({H}) must be a multiple of key/value heads ({Hkv})")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")

    forced = _check_name(backend) if backend is not None else _forced.get()

    # Fold key padding and (non-square) causality into one mask in the attn_mask convention,
    # and note the padding keys (blocked for every query): their k and v get zeroed.
    mask = padding = None
    if attn_mask is not None:
        mask = validate_attn_mask(attn_mask, B, H, Lq, Lk)
        if mask.shape[2] == 1:  # one query row (or Lq == 1): a padding mask in disguise
            padding = _padding_keys(mask, q.dtype)
    if key_padding_mask is not None:
        kpm = validate_key_padding_mask(key_padding_mask, B, Lk)
        mask = combine_masks(mask, expand_key_padding_mask(kpm))
        pad = kpm if kpm.dtype == torch.bool else torch.isneginf(kpm.to(q.dtype))
        padding = pad if padding is None else padding | pad
    user_mask = mask is not None
    native_causal = is_causal and not user_mask  # flash_attn/flex: bottom-right causal built in
    if is_causal and (mask is not None or Lq != Lk):
        mask = combine_masks(mask, causal_mask(Lq, Lk, q.device))
    sdpa_causal = is_causal and mask is None

    if need_weights:
        if forced not in (None, "math"):
            raise AttentionBackendError(
                f"need_weights=True needs the 'math' backend, but {forced!r} was forced"
            )
        name = "math"
    elif forced is not None:
        name = forced
        reason = _why_not(name, q, Lk, user_mask, is_causal, dropout_p)
        if reason:
            raise AttentionBackendError(
                f"attention backend {name!r} cannot serve this call: {reason}"
            )
    elif _HAS_FLASH_ATTN and not _why_not("flash_attn", q, Lk, user_mask, is_causal, dropout_p):
        name = "flash_attn"
    else:
        name = "sdpa"

    if Lq == 0 or Lk == 0:
        # No (query, key) pair to compute. Every backend returns the math formula's result
        # on the empty tensors (it keeps the autograd graph): Lk == 0 leaves every query
        # fully masked, and the empty weighted sum gives it zeros, as the rule asks.
        out, weights = _empty_attention(q, k, v, scale)
    else:
        if padding is not None:
            k, v = _zero_keys(k, v, padding)
        dead = None
        if mask is not None:
            if mask.is_floating_point():
                mask = mask.to(q.dtype)
            mask, dead = _let_dead_rows_attend(mask)
        out, weights = _run(name, q, k, v, mask, sdpa_causal, native_causal, dropout_p, scale)
        if dead is not None:
            out = out.masked_fill(dead, 0.0)
            if weights is not None:
                weights = weights.masked_fill(dead, 0.0)
    if not torch.compiler.is_compiling():  # bookkeeping stays out of compiled graphs
        _last = name
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug(
                "attention backend=%s q=%s k=%s mask=%s",
                name,
                tuple(q.shape),
                tuple(k.shape),
                mask is not None,
            )
    return (out, weights) if need_weights else out
