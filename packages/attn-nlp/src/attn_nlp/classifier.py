"""Text classifier: a Transformer encoder, a pooling step and a linear head.

Shape legend: ``B`` batch, ``L`` tokens, ``D`` width, ``C`` classes.

Multi-head attention put to work in an encoder that classifies sentences. Pooling is
``"cls"`` (a learned token prepended to every sequence, as in BERT / ViT) or ``"mean"``
(average over non-padding tokens).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .config import config_from_dict
from .layers import make_positions
from .model import TransformerEncoder

__all__ = ["ClassifierConfig", "TextClassifier"]


@dataclass
class ClassifierConfig:
    """Hyper-parameters of :class:`TextClassifier`."""

    vocab_size: int = 8000
    num_classes: int = 2
    embed_dim: int = 128
    depth: int = 2
    num_heads: int = 4
    mlp_dim: int = 512
    max_positions: int = 256  # longest input (the cls token included)
    pos_embed: str = "learned"  # learned, sinusoidal or sinusoidal_interleaved
    pool: str = "cls"  # cls or mean
    act: str = "gelu"
    dropout: float = 0.1
    attn_dropout: float = 0.0
    norm_eps: float = 1e-5
    pad_id: int = 0
    labels: list[str] = dataclasses.field(default_factory=list)  # class names, index order

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ClassifierConfig:
        """Build from a dict (e.g. ``config.json``); unknown keys raise ``ValueError``."""
        return config_from_dict(cls, data, "attn_nlp.classifier")


class TextClassifier(nn.Module):
    """Token ids ``(B, L)`` -> class logits ``(B, C)`` (pre-norm encoder)."""

    def __init__(self, config: ClassifierConfig) -> None:
        super().__init__()
        c = self.config = config
        if c.pool not in ("cls", "mean"):
            raise ValueError(f"pool must be 'cls' or 'mean', got {c.pool!r}")
        self.tok_embed = nn.Embedding(c.vocab_size, c.embed_dim, padding_idx=c.pad_id)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, c.embed_dim)) if c.pool == "cls" else None
        self.pos_embed = make_positions(c.pos_embed, c.max_positions, c.embed_dim)
        self.drop = nn.Dropout(c.dropout)
        self.encoder = TransformerEncoder(
            c.embed_dim,
            c.depth,
            c.num_heads,
            c.mlp_dim,
            act=c.act,
            norm_first=True,
            final_norm=True,
            dropout=c.dropout,
            attn_dropout=c.attn_dropout,
            norm_eps=c.norm_eps,
        )
        self.head = nn.Linear(c.embed_dim, c.num_classes)
        nn.init.normal_(self.tok_embed.weight, std=0.02)
        if self.cls_token is not None:
            nn.init.normal_(self.cls_token, std=0.02)

    def forward(
        self,
        ids: torch.Tensor,
        key_padding_mask: torch.Tensor | None = None,
        *,
        return_layers: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
        """``key_padding_mask`` ``(B, L)`` True = padding; default ``ids == pad_id``.
        ``return_layers``: ``(logits, hidden_states, attentions)`` with every encoder
        block's output and attention weights (see :meth:`TransformerEncoder.forward`)."""
        if ids.ndim != 2:
            raise ValueError(f"ids must be (B, L), got {tuple(ids.shape)}")
        if key_padding_mask is None:
            key_padding_mask = ids == self.config.pad_id
        x = self.tok_embed(ids)  # (B, L, D)
        if self.cls_token is not None:
            x = torch.cat((self.cls_token.expand(x.shape[0], -1, -1), x), dim=1)
            no_pad = key_padding_mask.new_zeros(x.shape[0], 1)
            key_padding_mask = torch.cat((no_pad, key_padding_mask), dim=1)  # (B, 1 + L)
        if self.pos_embed is not None:
            x = x + self.pos_embed(0, x.shape[1])
        layers = self.encoder(self.drop(x), key_padding_mask, return_layers=return_layers)
        x = layers[0] if return_layers else layers
        if self.cls_token is not None:
            pooled = x[:, 0]  # (B, D)
        else:
            keep = (~key_padding_mask).unsqueeze(-1).to(x.dtype)  # (B, L, 1)
            pooled = (x * keep).sum(1) / keep.sum(1).clamp_min(1.0)
        logits = self.head(pooled)  # (B, C)
        return (logits, layers[1], layers[2]) if return_layers else logits
