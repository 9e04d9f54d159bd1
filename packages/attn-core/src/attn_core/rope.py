"""Rotary position embedding (RoPE, Su et al. 2021).

Shape legend: ``B`` batch, ``H`` heads, ``L`` positions, ``D`` head width.

Position ``m`` rotates each pair of channels ``(x_a, x_b)`` by the angle
``m * base ** (-2i / dim)``, so the dot product of a rotated query at ``m`` with a
rotated key at ``n`` depends only on ``m - n``. Which channels form a pair is the one
thing implementations disagree on, so it is named explicitly:

* ``interleaved=False`` (default): half-split pairs ``(x_i, x_{i + dim/2})`` --
  GPT-NeoX and Hugging Face Llama (``rotate_half``).
* ``interleaved=True``: adjacent pairs ``(x_{2i}, x_{2i+1})`` -- the original paper,
  GPT-J and Meta's Llama reference code (complex multiplication).

Only the first ``dim`` channels of each head are rotated (partial rotary when
``dim < D``); the rest pass through.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["RotaryEmbedding"]


class RotaryEmbedding(nn.Module):
    """Rotary embedding over the first ``dim`` channels of ``(B, H, L, D)`` tensors."""

    inv_freq: torch.Tensor

    def __init__(self, dim: int, base: float = 10000.0, interleaved: bool = False) -> None:
        super().__init__()
        if dim <= 0 or dim % 2:
            raise ValueError(f"rotary dim must be a positive even number, got {dim}")
        self.dim = dim
        self.base = base
        self.interleaved = interleaved
        inv_freq = base ** (-torch.arange(0, dim, 2, dtype=torch.float32) / dim)  # (dim/2,)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, base={self.base}, interleaved={self.interleaved}"

    def cos_sin(
        self, positions: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``cos`` and ``sin`` of the rotation angles, each ``(L, dim)``, for ``positions``."""
        angles = positions.to(torch.float32)[:, None] * self.inv_freq[None, :]  # (L, dim/2)
        if self.interleaved:
            angles = angles.repeat_interleave(2, dim=-1)  # a a b b ...
        else:
            angles = torch.cat((angles, angles), dim=-1)  # a b ... a b ...
        return angles.cos().to(dtype), angles.sin().to(dtype)

    def _rotate(self, x: torch.Tensor) -> torch.Tensor:
        """The 90-degree partner of each channel pair: (a, b) -> (-b, a)."""
        if self.interleaved:
            x1, x2 = x[..., 0::2], x[..., 1::2]
            return torch.stack((-x2, x1), dim=-1).flatten(-2)
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((-x2, x1), dim=-1)

    def forward(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        """Rotate ``x`` ``(..., L, D)`` for positions ``offset .. offset + L - 1``."""
        if x.shape[-1] < self.dim:
            raise ValueError(f"rotary dim {self.dim} exceeds the head width {x.shape[-1]}")
        positions = torch.arange(offset, offset + x.shape[-2], device=x.device)
        cos, sin = self.cos_sin(positions, x.dtype)
        rot, rest = x[..., : self.dim], x[..., self.dim :]
        rot = rot * cos + self._rotate(rot) * sin
        return torch.cat((rot, rest), dim=-1) if rest.shape[-1] else rot
