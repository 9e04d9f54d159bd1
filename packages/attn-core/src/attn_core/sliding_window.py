"""Local (sliding-window) attention in O(L * window) memory, Longformer / Mistral style.

Shape legend: ``B`` batch, ``H`` heads, ``L`` sequence length, ``D`` head width,
``c`` chunk length, ``N = ceil(L / c)`` chunks, ``K`` keys visible to one chunk.

The sequence is cut into chunks of ``c`` queries. A chunk's queries can only see the
``K ~ c + window`` keys around it (``window - 1`` before it when causal, ``window // 2``
on each side otherwise), which are overlapping, zero-copy views of the keys. All interior
chunks run through the ordinary ``attention()`` entry point in *one* call, as a batch of
``B * H`` x ``N`` small attention problems sharing one ``(c, K)`` mask of the window rule,
so PyTorch's fused CPU / GPU kernels see ``c x K`` score tiles and never a ``L x L`` one.
The few queries at the sequence ends (and next to global tokens), whose windows would
leave the sequence, form two short contiguous ranges that get a dense call with an exact
mask each. Scores take ``B * H * L * K`` memory at most (the fused kernels keep only a
tile per thread) instead of ``B * H * L * L``. The rule is the one of
:func:`attn_core.masks.sliding_window_mask`.
"""

from __future__ import annotations

import torch

from .attention import attention
from .masks import window_rule

__all__ = ["sliding_window_attention"]

_KEY_ALIGN = 16  # pad each chunk's key window to a multiple of this (SIMD-friendly tiles)


def _windows(x: torch.Tensor, start: int, c: int, n: int, K: int) -> torch.Tensor:
    """Overlapping views ``(B*H, n, K, D)`` of ``x`` ``(B, H, L, D)``: window ``i`` holds rows
    ``start + i*c .. start + i*c + K`` (all inside the sequence). No copy."""
    B, H, L, D = x.shape
    x = x.contiguous().view(B * H, L, D)
    s0, s1, s2 = x.stride()
    return x.as_strided((B * H, n, K, D), (s0, c * s1, s1, s2), x.storage_offset() + start * s1)


def _dense_range(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    start: int,
    end: int,
    before: int,
    after: int,
    window: int,
    causal: bool,
    g: int,
    scale: float | None,
    backend: str | None,
) -> torch.Tensor:
    """Exact windowed attention of queries ``start:end`` against the keys they can reach
    (their window plus the ``g`` global keys), with a dense ``(end - start, keys)`` mask."""
    L = k.shape[-2]
    device = q.device
    k_lo, k_hi = max(0, start - before), min(L, end + after)
    kpos = torch.arange(k_lo, k_hi, device=device)
    ks, vs = k[:, :, k_lo:k_hi], v[:, :, k_lo:k_hi]
    if g > k_lo:  # some global keys fall inside the range already: take the rest too
        kpos = torch.arange(0, k_hi, device=device)
        ks, vs = k[:, :, :k_hi], v[:, :, :k_hi]
    elif g:
        kpos = torch.cat((torch.arange(g, device=device), kpos))
        ks = torch.cat((k[:, :, :g], ks), dim=2)
        vs = torch.cat((v[:, :, :g], vs), dim=2)
    qpos = torch.arange(start, end, device=device)[:, None]
    mask = window_rule(qpos, kpos[None, :], window, causal)  # (end - start, keys)
    if g:
        glob = kpos[None, :] < g
        mask |= glob & (kpos[None, :] <= qpos) if causal else glob
    return attention(q[:, :, start:end], ks, vs, attn_mask=mask, scale=scale, backend=backend)


def sliding_window_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    window: int,
    *,
    causal: bool = True,
    global_tokens: int = 0,
    scale: float | None = None,
    backend: str | None = None,
    chunk_size: int | None = None,
) -> torch.Tensor:
    """Self-attention restricted to a sliding window, with optional global tokens.

    Args:
        q, k, v: ``(B, H, L, D)``; ``k``/``v`` may have fewer heads (GQA).
        window: causal -> each query sees its last ``window`` keys (itself included);
            non-causal -> ``window // 2`` keys on each side.
        causal: see ``window``.
        global_tokens: the first ``g`` tokens are seen by every query (and, when not
            causal, see every key), as in Longformer.
        scale: score scale, default ``1 / sqrt(D)``.
        backend: forced ``attention()`` backend for the chunked call.
        chunk_size: queries per chunk (default ``max(window // 8, 16)``); each chunk
            attends to about ``chunk_size + window`` keys, so smaller chunks waste fewer
            masked scores but make smaller matrix products.

    Returns:
        ``(B, H, L, D)``, equal to dense attention with ``sliding_window_mask``.
    """
    if q.ndim != 4 or k.shape[-2] != q.shape[-2] or v.shape[-2] != q.shape[-2]:
        raise ValueError(
            "sliding_window_attention expects q, k, v of shape (B, H, L, D) with one L, got "
            f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    if global_tokens < 0:
        raise ValueError(f"global_tokens must be >= 0, got {global_tokens}")
    B, H, L, D = q.shape
    if L == 0:  # nothing to chunk: attention() returns the empty output
        return attention(q, k, v, scale=scale, backend=backend)
    g = min(global_tokens, L)
    if H % k.shape[1] or k.shape[1] != v.shape[1]:
        raise ValueError(f"query heads ({H}) must be a multiple of key/value heads ({k.shape[1]})")
    if k.shape[1] != H:  # GQA: share key/value heads across their query-head group
        k = k.repeat_interleave(H // k.shape[1], dim=1)
        v = v.repeat_interleave(H // v.shape[1], dim=1)

    before = window - 1 if causal else window // 2  # keys a query sees before itself
    after = 0 if causal else window // 2  # ... and after itself
    c = max(1, min(chunk_size or max(window // 8, 16), L))
    n = -(-L // c)
    # Keys in one chunk's window; the extra `pad` keys in front are always masked, they
    # only round K up to a multiple of _KEY_ALIGN (full SIMD tiles in the kernels).
    pad = (-(before + c + after)) % _KEY_ALIGN
    K = pad + before + c + after
    Dv = v.shape[-1]

    # Interior chunks [lo, hi): every window key is a real, non-global token, so the
    # windows are zero-copy views and one shared (c, K) mask serves them all.
    lo = min(n, -(-(g + before + pad) // c))
    hi = max(lo, min(L // c, (L - K + before + pad) // c + 1))
    parts = []
    if lo > 0:  # queries near the start (and the global tokens): one dense call
        parts.append(
            _dense_range(q, k, v, 0, lo * c, before, after, window, causal, g, scale, backend)
        )
    if hi > lo:
        # The window rule depends only on (key - query) offsets, identical for every
        # chunk: chunk i's query a sits at i*c + a and its key b at i*c - before - pad + b.
        a = torch.arange(c, device=q.device)[:, None]
        b = torch.arange(K, device=q.device)[None, :]
        pattern = window_rule(a + before + pad, b, window, causal)  # (c, K)
        qc = q.reshape(B * H, L, D)[:, lo * c : hi * c].reshape(B * H, hi - lo, c, D)
        kw = _windows(k, lo * c - before - pad, c, hi - lo, K)  # (B*H, hi - lo, K, D)
        vw = _windows(v, lo * c - before - pad, c, hi - lo, K)
        if g:  # ... plus the g global keys, visible to every interior query
            kw = torch.cat((k[:, :, :g].reshape(B * H, 1, g, D).expand(-1, hi - lo, -1, -1), kw), 2)
            vw = torch.cat(
                (v[:, :, :g].reshape(B * H, 1, g, Dv).expand(-1, hi - lo, -1, -1), vw), 2
            )
            pattern = torch.cat((pattern.new_ones(c, g), pattern), dim=-1)
        inner = attention(qc, kw, vw, attn_mask=pattern, scale=scale, backend=backend)
        parts.append(inner.reshape(B, H, (hi - lo) * c, Dv))
    if hi * c < L:  # queries near the end: one dense call
        parts.append(
            _dense_range(q, k, v, hi * c, L, before, after, window, causal, g, scale, backend)
        )
    out = torch.cat(parts, dim=2) if len(parts) > 1 else parts[0]  # (B, H, L, Dv)
    if g and not causal:  # global queries attend to the whole sequence
        glob = attention(q[:, :, :g], k, v, scale=scale, backend=backend)
        out = torch.cat((glob, out[:, :, g:]), dim=2)
    return out
