"""Local (sliding-window) attention in O(L * window) memory, Longformer / Mistral style.

Shape legend: ``B`` batch, ``H`` heads, ``L`` sequence length, ``D`` head width,
``c`` chunk length, ``N = ceil(L / c)`` chunks, ``K`` keys visible to one chunk.

The sequence is cut into chunks of ``c`` queries. Every query of a chunk can only see
keys in its own chunk and its neighbours (one chunk back when causal, one back and one
ahead otherwise), so each chunk attends to ``K = 2c`` or ``3c`` keys through the
ordinary ``attention()`` entry point, with a small ``(N, c, K)`` mask that encodes the
exact window. Scores take ``B * H * L * K`` memory instead of ``B * H * L * L``.
The window rule is the one of :func:`attn_core.masks.sliding_window_mask`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .attention import attention
from .masks import window_rule

__all__ = ["sliding_window_attention"]


def _chunk_windows(x: torch.Tensor, c: int, n: int, back: int, ahead: int) -> torch.Tensor:
    """``(B, H, L, D)`` -> ``(B, H, N, (back + 1 + ahead) * c, D)``: each chunk's key window."""
    B, H, L, D = x.shape
    x = F.pad(x, (0, 0, back * c, n * c - L + ahead * c)).view(B, H, n + back + ahead, c, D)
    return torch.cat([x[:, :, i : i + n] for i in range(back + 1 + ahead)], dim=3)


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

    c = min(window if causal else max(window // 2, 1), max(L, 1))
    back, ahead = (1, 0) if causal else (1, 1)
    n = -(-L // c)
    qc = F.pad(q, (0, 0, 0, n * c - L)).view(B * H, n, c, D)  # (B*H, N, c, D)
    kc = _chunk_windows(k, c, n, back, ahead).flatten(0, 1)  # (B*H, N, K, D)
    vc = _chunk_windows(v, c, n, back, ahead).flatten(0, 1)

    # Absolute positions of each chunk's queries (N, c) and window keys (N, K).
    device = q.device
    qpos = torch.arange(n * c, device=device).view(n, c)
    kpos = (torch.arange(n, device=device) * c - back * c)[:, None] + torch.arange(
        (back + 1 + ahead) * c, device=device
    )
    qi, kj = qpos[:, :, None], kpos[:, None, :]
    mask = window_rule(qi, kj, window, causal)
    mask &= (kj >= g) & (kj < L)  # real keys only; global keys are added separately

    if g:  # every chunk also sees the g global keys
        kg = k[:, :, :g].flatten(0, 1)[:, None].expand(B * H, n, g, D)
        vg = v[:, :, :g].flatten(0, 1)[:, None].expand(B * H, n, g, v.shape[-1])
        kc, vc = torch.cat((kg, kc), dim=2), torch.cat((vg, vc), dim=2)
        gmask = torch.arange(g, device=device)[None, None, :] <= qi if causal else None
        gmask = torch.ones(n, c, g, dtype=torch.bool, device=device) if gmask is None else gmask
        mask = torch.cat((gmask.expand(n, c, g), mask), dim=-1)

    out = attention(qc, kc, vc, attn_mask=mask[None], scale=scale, backend=backend)
    out = out.reshape(B, H, n * c, -1)[:, :, :L]
    if g and not causal:  # global queries attend to the whole sequence
        glob = attention(q[:, :, :g], k, v, scale=scale, backend=backend)
        out = torch.cat((glob, out[:, :, g:]), dim=2)
    return out
