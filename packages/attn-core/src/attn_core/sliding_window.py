"""Local (sliding-window) attention in O(L * window) memory, Longformer / Mistral style.

Shape legend: ``B`` batch, ``H`` heads, ``L`` sequence length, ``D`` head width,
``c`` chunk length, ``N = ceil(L / c)`` chunks, ``K`` keys visible to one chunk.

The sequence is cut into chunks of ``c`` queries. A chunk's queries can only see the
``K = c + window`` keys around it (``window - 1`` before it when causal, ``window // 2``
on each side otherwise), which are overlapping, zero-copy views of the keys. Every chunk
then runs through the ordinary ``attention()`` entry point with one shared ``(c, K)``
mask of the window rule; only the few chunks at the edges (sequence ends, global
tokens) get a mask of their own. Scores take ``B * H * L * K`` memory instead of
``B * H * L * L``. The rule is the one of :func:`attn_core.masks.sliding_window_mask`.
"""

from __future__ import annotations

import torch

from .attention import attention
from .masks import window_rule

__all__ = ["sliding_window_attention"]


def _windows(x: torch.Tensor, start: int, c: int, n: int, K: int) -> torch.Tensor:
    """Overlapping views ``(B*H, n, K, D)`` of ``x`` ``(B, H, L, D)``: window ``i`` holds rows
    ``start + i*c .. start + i*c + K`` (all inside the sequence). No copy."""
    B, H, L, D = x.shape
    x = x.contiguous().view(B * H, L, D)
    s0, s1, s2 = x.stride()
    return x.as_strided((B * H, n, K, D), (s0, c * s1, s1, s2), x.storage_offset() + start * s1)


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
            attends to ``chunk_size + window`` keys, so smaller chunks waste fewer
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
    K = before + c + after  # keys in one chunk's window
    Dv = v.shape[-1]
    device = q.device

    # The window rule depends only on (key - query) offsets, identical for every chunk:
    # chunk i's query a sits at i*c + a and its key b at i*c - before + b.
    a = torch.arange(c, device=device)[:, None]
    b = torch.arange(K, device=device)[None, :]
    pattern = window_rule(a + before, b, window, causal)  # (c, K)

    # Interior chunks: every window key is a real, non-global token, so the windows are
    # zero-copy views and one shared (c, K) mask serves them all.
    lo = min(n, -(-(g + before) // c))
    hi = max(lo, min(L // c, (L - K + before) // c + 1))
    outs = []
    if hi > lo:
        qc = q.reshape(B * H, L, D)[:, lo * c : hi * c].reshape(B * H, hi - lo, c, D)
        kw = _windows(k, lo * c - before, c, hi - lo, K)  # (B*H, hi - lo, K, D)
        vw = _windows(v, lo * c - before, c, hi - lo, K)
        if g:  # ... plus the g global keys, visible to every interior query
            kw = torch.cat((k[:, :, :g].reshape(B * H, 1, g, D).expand(-1, hi - lo, -1, -1), kw), 2)
            vw = torch.cat(
                (v[:, :, :g].reshape(B * H, 1, g, Dv).expand(-1, hi - lo, -1, -1), vw), 2
            )
            pattern = torch.cat((pattern.new_ones(c, g), pattern), dim=-1)
        inner = attention(qc, kw, vw, attn_mask=pattern, scale=scale, backend=backend)
        outs.append((lo * c, inner.reshape(B, H, (hi - lo) * c, Dv)))

    # Edge chunks (sequence ends, global tokens): gather their keys, mask each exactly.
    edge = [i for i in range(n) if not lo <= i < hi]
    if edge:
        idx = torch.tensor(edge, device=device)
        qpos = (idx[:, None] * c + a.T).clamp(max=L - 1)  # (n_edge, c)
        kpos = idx[:, None] * c - before + b  # (n_edge, K)
        mask = window_rule(qpos[:, :, None], kpos[:, None, :], window, causal)
        mask &= ((kpos >= g) & (kpos < L))[:, None, :]  # (n_edge, c, K)
        if g:
            kpos = torch.cat((torch.arange(g, device=device).expand(len(edge), g), kpos), 1)
            gvis = kpos[:, None, :g] <= qpos[:, :, None] if causal else mask.new_ones(1, 1, g)
            mask = torch.cat((gvis.expand(len(edge), c, g), mask), dim=-1)
        kpos = kpos.clamp(0, L - 1)
        eq, ek, ev = q[:, :, qpos.flatten()], k[:, :, kpos.flatten()], v[:, :, kpos.flatten()]
        edge_out = attention(
            eq.reshape(B * H, len(edge), c, D),
            ek.reshape(B * H, len(edge), -1, D),
            ev.reshape(B * H, len(edge), -1, Dv),
            attn_mask=mask[None],
            scale=scale,
            backend=backend,
        ).reshape(B, H, len(edge), c, Dv)
        for j, i in enumerate(edge):
            outs.append((i * c, edge_out[:, :, j, : min(c, L - i * c)]))
    outs.sort(key=lambda t: t[0])
    out = torch.cat([o for _, o in outs], dim=2)  # (B, H, L, Dv)
    if g and not causal:  # global queries attend to the whole sequence
        glob = attention(q[:, :, :g], k, v, scale=scale, backend=backend)
        out = torch.cat((glob, out[:, :, g:]), dim=2)
    return out
