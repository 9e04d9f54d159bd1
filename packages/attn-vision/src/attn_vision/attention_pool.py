"""MAP head: multi-head attention pooling with a learned latent query (SigLIP, timm ``map``).

Shape legend: ``B`` batch, ``N`` tokens, ``D`` width, ``Hd`` heads, ``hd = D // Hd``.

A learned latent ``(1, 1, D)`` is the one query; the tokens give keys and values. The
pooled vector then gets a residual MLP: ``y = proj(attn(q(latent), kv(x)))``,
``y = y + mlp(norm(y))``. Parameter names are timm's ``AttentionPoolLatent``
(``latent``, ``q``, ``kv``, ``proj``, ``norm``, ``mlp.fc1``, ``mlp.fc2``), so timm and
open_clip SigLIP checkpoints load as they are. The attention itself is attn_core's
:func:`~attn_core.attention.attention`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from attn_core.attention import attention
from attn_core.blocks import FeedForward
from torch import nn

__all__ = ["AttentionPoolLatent"]


class AttentionPoolLatent(nn.Module):
    """``(B, N, D)`` tokens -> ``(B, D)``: one learned query attends over the tokens.

    Args:
        dim: token width ``D`` (also the output width).
        num_heads: attention heads; ``dim`` must be divisible by it.
        mlp_ratio: hidden width of the residual MLP as a multiple of ``dim``.
        qkv_bias: biases in ``q`` and ``kv`` (timm: always on).
        norm_layer: norm constructor before the MLP (e.g. ``partial(nn.LayerNorm, eps=1e-6)``).
        act: MLP activation name (see :data:`attn_core.blocks.ACTIVATIONS`).
    """

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        mlp_ratio: float = 4.0,
        *,
        qkv_bias: bool = True,
        norm_layer: Callable[[int], nn.Module] = nn.LayerNorm,
        act: str = "gelu",
    ) -> None:
        super().__init__()
        if num_heads <= 0 or dim % num_heads:
            raise ValueError(f"dim ({dim}) must be divisible by num_heads ({num_heads})")
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.latent = nn.Parameter(torch.zeros(1, 1, dim))
        self.q = nn.Linear(dim, dim, bias=qkv_bias)
        self.kv = nn.Linear(dim, 2 * dim, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)
        self.norm = norm_layer(dim)
        self.mlp = FeedForward(dim, int(dim * mlp_ratio), act=act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, N, D)`` -> ``(B, D)``."""
        B, N, D = x.shape
        H, hd = self.num_heads, self.head_dim
        q = self.q(self.latent).view(1, 1, H, hd).transpose(1, 2).expand(B, -1, -1, -1)
        k, v = self.kv(x).view(B, N, 2, H, hd).permute(2, 0, 3, 1, 4)  # 2 x (B, Hd, N, hd)
        out = attention(q, k, v)  # (B, Hd, 1, hd)
        out = self.proj(out.transpose(1, 2).reshape(B, D))  # (B, D)
        return out + self.mlp(self.norm(out))
