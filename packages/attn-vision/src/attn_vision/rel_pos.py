"""BEiT's relative position bias (Bao et al. 2021): a learned table, one row per offset.

Shape legend: ``gh, gw`` patch grid, ``L = gh * gw`` patches, ``N = 1 + L`` tokens
([CLS] first), ``Hd`` heads, ``T = (2gh - 1) * (2gw - 1) + 3`` table rows.

Every (query, key) pair of patches reads the row of its offset ``(dy, dx)``
(:func:`attn_vision.swin.relative_position_index`, as in Swin); the last three rows are
[CLS] -> patch, patch -> [CLS] and [CLS] -> [CLS]. The result is an additive ``(1, Hd, N,
N)`` attention bias, attached to a ViT block as ``blocks.{i}.attn.rel_pos``
(``ViTConfig.rel_pos="beit"``). timm's ``Beit`` and transformers' ``BeitModel`` store the
same table; a bias shared by every block (BEiT's pretraining) is the same table copied into
each block (what BEiT does to fine-tune it).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .swin import relative_position_index

__all__ = ["BeitRelPosBias", "beit_relative_position_index"]


def beit_relative_position_index(grid: tuple[int, int]) -> torch.Tensor:
    """``(N, N)`` row of the ``T``-row table for each (query, key) pair, [CLS] at 0."""
    gh, gw = grid
    offsets = (2 * gh - 1) * (2 * gw - 1)
    index = torch.empty(gh * gw + 1, gh * gw + 1, dtype=torch.long)
    index[1:, 1:] = relative_position_index(grid)
    index[0, :] = offsets  # [CLS] -> patch
    index[:, 0] = offsets + 1  # patch -> [CLS]
    index[0, 0] = offsets + 2  # [CLS] -> [CLS]
    return index


class BeitRelPosBias(nn.Module):
    """The ``(T, Hd)`` table of one block (``relative_position_bias_table``) for the patch
    grid it was trained on; :meth:`forward` gives the bias for any grid.

    At another grid the offset rows are resampled as transformers' BEiT does on every
    forward (bilinear over the ``(2gh - 1, 2gw - 1)`` offsets, not antialiased; the three
    [CLS] rows kept)."""

    def __init__(self, num_heads: int, grid: tuple[int, int]) -> None:
        super().__init__()
        self.grid = tuple(grid)
        gh, gw = self.grid
        rows = (2 * gh - 1) * (2 * gw - 1) + 3
        self.relative_position_bias_table = nn.Parameter(torch.zeros(rows, num_heads))

    def table(self, grid: tuple[int, int]) -> torch.Tensor:
        """The ``((2gh - 1) * (2gw - 1) + 3, Hd)`` table for ``grid``."""
        table = self.relative_position_bias_table
        if tuple(grid) == self.grid:
            return table
        (gh0, gw0), (gh, gw) = self.grid, grid
        offsets = table[:-3].reshape(1, 2 * gh0 - 1, 2 * gw0 - 1, -1).permute(0, 3, 1, 2)
        offsets = F.interpolate(offsets, size=(2 * gh - 1, 2 * gw - 1), mode="bilinear")
        return torch.cat([offsets.permute(0, 2, 3, 1).reshape(-1, table.shape[1]), table[-3:]])

    def forward(self, grid: tuple[int, int], num_prefix_tokens: int = 1) -> torch.Tensor:
        """``(gh, gw)`` grid -> ``(1, Hd, N, N)`` additive bias ([CLS] + ``L`` patches)."""
        if num_prefix_tokens != 1:
            raise ValueError(f"BEiT's bias has rows for one [CLS] token, got {num_prefix_tokens}")
        table = self.table(grid)
        index = beit_relative_position_index(grid).to(table.device).view(-1)
        N = grid[0] * grid[1] + 1
        return table[index].view(N, N, -1).permute(2, 0, 1)[None]
