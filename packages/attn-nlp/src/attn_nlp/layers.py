"""Position embeddings and the block factory shared by every attn-nlp model.

Shape legend: ``B`` batch, ``L`` tokens, ``D`` model width, ``P`` maximum positions.

* :class:`SinusoidalPositionalEmbedding` -- fixed sin/cos table ("Attention Is All You
  Need"), in one of two channel layouts: ``"concat"`` puts every sine first and every
  cosine second (tensor2tensor, fairseq, Marian / opus-mt), ``"interleaved"`` alternates
  them (the paper's formula ``PE[pos, 2i] = sin``, ``PE[pos, 2i + 1] = cos``).
* :class:`LearnedPositionalEmbedding` -- a trained ``(P, D)`` table (BERT, GPT-2).
* :func:`make_block` -- an ``attn_core.TransformerBlock`` from plain arguments
  (Hugging Face activation names such as Marian's ``swish`` accepted).
"""

from __future__ import annotations

import math
from functools import partial

import torch
from attn_core import RotaryEmbedding, TransformerBlock
from torch import nn

__all__ = [
    "LearnedPositionalEmbedding",
    "SinusoidalPositionalEmbedding",
    "make_block",
]


def sinusoidal_table(num_positions: int, dim: int, layout: str = "concat") -> torch.Tensor:
    """``(P, D)`` float32 sin/cos table, computed in float64 like the reference code."""
    if layout not in ("concat", "interleaved"):
        raise ValueError(f"layout must be 'concat' or 'interleaved', got {layout!r}")
    pos = torch.arange(num_positions, dtype=torch.float64)[:, None]  # (P, 1)
    half = (dim + 1) // 2
    # frequency of channel pair i: 10000 ** (-2i / D)
    div = torch.pow(10000.0, 2 * torch.arange(half, dtype=torch.float64) / dim)  # (D/2,)
    angles = pos / div  # (P, D/2)
    table = torch.empty(num_positions, dim, dtype=torch.float64)
    if layout == "concat":
        table[:, :half] = angles.sin()
        table[:, half:] = angles[:, : dim - half].cos()
    else:
        table[:, 0::2] = angles.sin()
        table[:, 1::2] = angles[:, : dim // 2].cos()
    return table.float()


class SinusoidalPositionalEmbedding(nn.Module):
    """Fixed sinusoidal positions: positions ``(L,)`` -> ``(L, D)``; not in the state dict."""

    table: torch.Tensor

    def __init__(self, num_positions: int, dim: int, layout: str = "concat") -> None:
        super().__init__()
        self.num_positions = num_positions
        self.layout = layout
        self.register_buffer(
            "table", sinusoidal_table(num_positions, dim, layout), persistent=False
        )

    def extra_repr(self) -> str:
        return f"num_positions={self.num_positions}, layout={self.layout!r}"

    def forward(self, start: int, length: int) -> torch.Tensor:
        _check_positions(start, length, self.num_positions)
        return self.table[start : start + length]  # (L, D)


class LearnedPositionalEmbedding(nn.Module):
    """Trained positions: ``forward(start, length)`` -> ``(L, D)``."""

    def __init__(self, num_positions: int, dim: int) -> None:
        super().__init__()
        self.num_positions = num_positions
        self.weight = nn.Parameter(torch.empty(num_positions, dim))
        nn.init.normal_(self.weight, std=0.02)

    def forward(self, start: int, length: int) -> torch.Tensor:
        _check_positions(start, length, self.num_positions)
        return self.weight[start : start + length]  # (L, D)


def _check_positions(start: int, length: int, num_positions: int) -> None:
    if start + length > num_positions:
        raise ValueError(
            f"sequence needs positions up to {start + length}, but the model has only "
            f"{num_positions} (max_positions); shorten or truncate the input"
        )


def make_positions(kind: str, num_positions: int, dim: int) -> nn.Module | None:
    """``"sinusoidal"`` / ``"sinusoidal_interleaved"`` / ``"learned"`` / ``"none"`` (RoPE)."""
    if kind == "sinusoidal":
        return SinusoidalPositionalEmbedding(num_positions, dim, "concat")
    if kind == "sinusoidal_interleaved":
        return SinusoidalPositionalEmbedding(num_positions, dim, "interleaved")
    if kind == "learned":
        return LearnedPositionalEmbedding(num_positions, dim)
    if kind in ("none", "rope"):
        return None
    raise ValueError(
        f"unknown position embedding {kind!r}; expected 'sinusoidal', "
        "'sinusoidal_interleaved', 'learned' or 'rope'"
    )


def make_block(
    dim: int,
    num_heads: int,
    mlp_dim: int,
    *,
    act: str = "relu",
    norm_first: bool = False,
    cross_attention: bool = False,
    dropout: float = 0.0,
    attn_dropout: float = 0.0,
    mlp_dropout: float | None = None,
    norm_eps: float = 1e-5,
    rope: RotaryEmbedding | None = None,
) -> TransformerBlock:
    """One ``attn_core.TransformerBlock`` (self-attn, optional cross-attn, MLP).

    ``dropout`` acts on each branch output; ``mlp_dropout`` inside the MLP, after the
    activation (Marian's ``activation_dropout``; None = ``dropout``).
    """
    block = TransformerBlock(
        dim,
        num_heads,
        mlp_hidden_dim=mlp_dim,
        act=act,
        norm_first=norm_first,
        cross_attention=cross_attention,
        dropout=dropout,
        attn_dropout=attn_dropout,
        norm_layer=partial(nn.LayerNorm, eps=norm_eps),
        rope=rope,
    )
    if mlp_dropout is not None:
        block.mlp.drop.p = mlp_dropout
    return block


def embed_scale(dim: int, scale_embedding: bool) -> float:
    """``sqrt(D)`` when token embeddings are scaled (Vaswani et al., Marian), else 1."""
    return math.sqrt(dim) if scale_embedding else 1.0
