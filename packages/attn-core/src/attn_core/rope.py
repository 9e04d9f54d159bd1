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

:class:`AxialRotaryEmbedding` is the 2D form for vision tokens (EVA02, timm's
``RotaryEmbeddingCat``): a patch at grid row ``y`` and column ``x`` rotates its first
``dim / 2`` channels by ``y`` and the other half by ``x``, each with ``dim / 4``
frequencies; prefix tokens (class, registers) are not rotated.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["AxialRotaryEmbedding", "RotaryEmbedding", "apply_rotary"]


def apply_rotary(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool
) -> torch.Tensor:
    """Rotate each channel pair of ``x`` ``(..., L, dim)`` by the angles whose ``cos`` and
    ``sin`` are given ``(L, dim)``: ``x * cos + rotate(x) * sin``, ``rotate: (a, b) -> (-b, a)``
    for adjacent (``interleaved``) or half-split pairs."""
    if interleaved:
        x1, x2 = x[..., 0::2], x[..., 1::2]
        turned = torch.stack((-x2, x1), dim=-1).flatten(-2)
    else:
        x1, x2 = x.chunk(2, dim=-1)
        turned = torch.cat((-x2, x1), dim=-1)
    return x * cos + turned * sin


def _pair_layout(angles: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """``(..., dim/2)`` angles -> ``(..., dim)``: ``a a b b ...`` or ``a b ... a b ...``."""
    if interleaved:
        return angles.repeat_interleave(2, dim=-1)
    return torch.cat((angles, angles), dim=-1)


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
        angles = _pair_layout(angles, self.interleaved)
        return angles.cos().to(dtype), angles.sin().to(dtype)

    def forward(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        """Rotate ``x`` ``(..., L, D)`` for positions ``offset .. offset + L - 1``."""
        if x.shape[-1] < self.dim:
            raise ValueError(f"rotary dim {self.dim} exceeds the head width {x.shape[-1]}")
        positions = torch.arange(offset, offset + x.shape[-2], device=x.device)
        cos, sin = self.cos_sin(positions, x.dtype)
        rot, rest = x[..., : self.dim], x[..., self.dim :]
        rot = apply_rotary(rot, cos, sin, self.interleaved)
        return torch.cat((rot, rest), dim=-1) if rest.shape[-1] else rot


class AxialRotaryEmbedding(nn.Module):
    """2D rotary embedding of the patch tokens of ``(B, H, P + gh * gw, dim)`` tensors.

    Args:
        dim: channels rotated per head (the head width in EVA02), divisible by 4.
        base: frequency base (timm's ``temperature``): frequency ``i`` of an axis is
            ``base ** (-i / (dim / 4))``.
        ref_grid: the ``(rows, cols)`` grid the model was trained at; other grids are
            scaled onto it (row ``y`` of ``gh`` becomes ``y * ref_rows / gh``), as EVA02 does.
        grid_offset: added to every row / column index.
        interleaved: adjacent pairs (EVA02, timm's default) or half-split pairs.
    """

    inv_freq: torch.Tensor

    def __init__(
        self,
        dim: int,
        base: float = 10000.0,
        ref_grid: tuple[int, int] | None = None,
        grid_offset: float = 0.0,
        interleaved: bool = True,
    ) -> None:
        super().__init__()
        if dim <= 0 or dim % 4:
            raise ValueError(f"axial rotary dim must be a positive multiple of 4, got {dim}")
        self.dim, self.base, self.interleaved = dim, base, interleaved
        self.ref_grid = tuple(ref_grid) if ref_grid is not None else None
        self.grid_offset = grid_offset
        bands = dim // 4
        # computed on the CPU, then put on the default device: on ``meta`` (models built
        # before their weights are loaded) arithmetic would import torch._dynamo (~1 s)
        inv_freq = base ** (-torch.arange(bands, dtype=torch.float32, device="cpu") / bands)
        self.register_buffer("inv_freq", inv_freq.to(torch.get_default_device()), persistent=False)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, base={self.base}, ref_grid={self.ref_grid}"

    def cos_sin(
        self, grid: tuple[int, int], dtype: torch.dtype = torch.float32
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``cos`` and ``sin`` of the angles of a ``(gh, gw)`` grid, each ``(gh * gw, dim)``
        (row-major patch order)."""
        f32 = dict(device=self.inv_freq.device, dtype=torch.float32)
        axes = [torch.arange(n, **f32) + self.grid_offset for n in grid]
        if self.ref_grid is not None:
            axes = [t / n * r for t, n, r in zip(axes, grid, self.ref_grid, strict=True)]
        yx = torch.stack(torch.meshgrid(*axes, indexing="ij"), dim=-1)  # (gh, gw, 2)
        angles = (yx[..., None] * self.inv_freq).flatten(-2).flatten(0, 1)  # (N, dim/2): y | x
        angles = _pair_layout(angles, self.interleaved)
        return angles.cos().to(dtype), angles.sin().to(dtype)

    def forward(
        self, x: torch.Tensor, grid: tuple[int, int], num_prefix_tokens: int = 0
    ) -> torch.Tensor:
        """Rotate the last ``gh * gw`` tokens of ``x`` ``(..., P + gh * gw, D)`` (their first
        ``dim`` channels); the ``P`` prefix tokens pass through."""
        n = grid[0] * grid[1]
        if x.shape[-2] != num_prefix_tokens + n or x.shape[-1] < self.dim:
            raise ValueError(
                f"expected (..., {num_prefix_tokens} + {grid[0]} * {grid[1]} tokens, >= "
                f"{self.dim} channels), got {tuple(x.shape)}"
            )
        cos, sin = self.cos_sin(grid)  # fp32, rotated in fp32 as timm does
        prefix, patches = x[..., :num_prefix_tokens, :], x[..., num_prefix_tokens:, :]
        rot, rest = patches[..., : self.dim], patches[..., self.dim :]
        rot = apply_rotary(rot.float(), cos, sin, self.interleaved).to(x.dtype)
        return torch.cat((prefix, torch.cat((rot, rest), dim=-1)), dim=-2)
