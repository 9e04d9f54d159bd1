"""Additive (Bahdanau) attention: ``score(q, k) = w^T tanh(W_q q + W_k k)``.

Shape legend: ``B`` batch, ``Lq`` queries, ``Lk`` keys, ``Dq`` / ``Dk`` / ``Dv`` query /
key / value widths, ``Hd`` scoring hidden width.

Instead of a dot product, a small MLP scores each (query, key) pair (Bahdanau, Cho &
Bengio 2015). With ``out_dim`` the module also fuses the query with the attended
context through a Linear (the ``attn_combine`` step of the PyTorch seq2seq tutorial's
attention decoder), batched and over variable-length keys with a padding mask.
"""

from __future__ import annotations

import torch
from torch import nn

from .functional import masked_softmax
from .masks import validate_key_padding_mask

__all__ = ["AdditiveAttention"]


class AdditiveAttention(nn.Module):
    """Bahdanau attention over a set of keys.

    Args:
        query_dim: ``Dq``.
        key_dim: ``Dk``.
        hidden_dim: ``Hd``, width of the scoring MLP.
        out_dim: if given, return ``combine(cat(query, context))`` of this width
            instead of the raw context.
        value_dim: ``Dv`` (default ``key_dim``: values are the keys).
    """

    def __init__(
        self,
        query_dim: int,
        key_dim: int,
        hidden_dim: int,
        out_dim: int | None = None,
        *,
        value_dim: int | None = None,
    ) -> None:
        super().__init__()
        self.query_dim, self.key_dim = query_dim, key_dim
        self.value_dim = key_dim if value_dim is None else value_dim
        self.query_proj = nn.Linear(query_dim, hidden_dim, bias=False)
        self.key_proj = nn.Linear(key_dim, hidden_dim)
        self.score = nn.Linear(hidden_dim, 1, bias=False)
        self.combine = nn.Linear(query_dim + self.value_dim, out_dim) if out_dim else None

    def forward(
        self,
        query: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor | None = None,
        *,
        key_padding_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Attend from ``query`` ``(B, Dq)`` or ``(B, Lq, Dq)`` to ``keys`` ``(B, Lk, Dk)``.

        ``values`` ``(B, Lk, Dv)`` default to ``keys``; ``key_padding_mask`` ``(B, Lk)``
        is True at padding. Returns ``(output, weights)``: output ``(B, [Lq,] Dv)`` (or
        ``out_dim``), weights ``(B, [Lq,] Lk)``.
        """
        values = keys if values is None else values
        single = query.ndim == 2
        q = query[:, None] if single else query  # (B, Lq, Dq)
        if q.ndim != 3 or q.shape[-1] != self.query_dim:
            raise ValueError(
                f"query must be (B, {self.query_dim}) or (B, Lq, {self.query_dim}), "
                f"got {tuple(query.shape)}"
            )
        B = q.shape[0]
        if keys.ndim != 3 or keys.shape[0] != B or keys.shape[-1] != self.key_dim:
            raise ValueError(
                f"keys must be (B, Lk, {self.key_dim}) with B={B}, got {tuple(keys.shape)}"
            )
        if values.shape[:2] != keys.shape[:2] or values.shape[-1] != self.value_dim:
            raise ValueError(
                f"values must be (B, Lk, {self.value_dim}) = ({B}, {keys.shape[1]}, "
                f"{self.value_dim}), got {tuple(values.shape)}"
            )

        # (B, Lq, 1, Hd) + (B, 1, Lk, Hd) -> one score per (query, key) pair
        hidden = torch.tanh(self.query_proj(q)[:, :, None] + self.key_proj(keys)[:, None])
        scores = self.score(hidden).squeeze(-1)  # (B, Lq, Lk)
        mask = None
        if key_padding_mask is not None:
            kpm = validate_key_padding_mask(key_padding_mask, B, keys.shape[1])
            mask = ~kpm[:, None, :] if kpm.dtype == torch.bool else kpm[:, None, :]
        weights = masked_softmax(scores, mask)  # (B, Lq, Lk)
        context = weights @ values  # (B, Lq, Dv)
        out = self.combine(torch.cat((q, context), dim=-1)) if self.combine else context
        if single:
            return out[:, 0], weights[:, 0]
        return out, weights
