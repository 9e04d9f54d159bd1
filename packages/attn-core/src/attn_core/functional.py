"""The readable reference: softmax(Q K^T / sqrt(d_k) + mask) V, written out step by step.

Shape legend: ``...`` any leading (batch, head) dims, ``Lq`` queries, ``Lk`` keys,
``D`` query/key width, ``Dv`` value width.

This is the ``"math"`` backend of :func:`attn_core.attention` and the only one that
can return the attention weights. Everything else in attn-core is measured against it.

Half inputs (float16 / bfloat16) are computed in float32 -- scores, softmax and the
weighted sum -- and cast back, so large logits cannot overflow into NaN; float32 and
float64 inputs are computed in their own dtype. Empty inputs work: ``Lq == 0`` gives an
empty output, ``Lk == 0`` (every query fully masked) gives zeros.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .masks import causal_mask, combine_masks

__all__ = ["masked_softmax", "scaled_dot_product_attention"]


def masked_softmax(
    scores: torch.Tensor, mask: torch.Tensor | None = None, dim: int = -1
) -> torch.Tensor:
    """Softmax over ``dim`` after applying an attention mask (bool True = keep, float = add).

    A row whose entries are all masked gets all-zero weights (not NaN), and its
    gradient is zero and finite. The softmax runs in float32 for half inputs (and in the
    input dtype for float32 / float64); the weights come back in the dtype of ``scores``.
    """
    if mask is not None and scores.shape[dim] == 0:
        mask = None  # no keys: nothing to mask, and the (empty) softmax is already "zeros"
    if mask is not None:
        scores = (
            scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
        )
        dead = scores.amax(dim, keepdim=True) == float("-inf")
        scores = scores.masked_fill(dead, 0.0)
    compute = torch.promote_types(scores.dtype, torch.float32)  # half -> float32
    weights = F.softmax(scores, dim=dim, dtype=compute).to(scores.dtype)
    if mask is not None:
        weights = weights.masked_fill(dead, 0.0)
    return weights


def scaled_dot_product_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Scaled dot-product attention, returning ``(output, weights)``.

    Args:
        query: ``(..., Lq, D)``.
        key: ``(..., Lk, D)``.
        value: ``(..., Lk, Dv)``.
        mask: attention mask broadcastable to ``(..., Lq, Lk)``; bool True = may attend,
            float = additive bias.
        dropout_p: dropout on the attention weights (pass 0.0 in eval mode).
        is_causal: add a (bottom-right aligned) causal mask.
        scale: score scale; default ``1 / sqrt(D)``.

    Returns:
        output ``(..., Lq, Dv)`` and weights ``(..., Lq, Lk)`` (before dropout), both in
        the input dtype; half inputs are computed in float32 and cast back.
    """
    d_k = query.shape[-1]
    scale = 1.0 / math.sqrt(d_k) if scale is None else scale
    # 0. half precision overflows (fp16: |x| > 65504) on large logits: compute in float32.
    compute = torch.promote_types(query.dtype, torch.float32)  # no-op for float32 / float64
    # 1. similarity of every query with every key; dividing by sqrt(d_k) keeps the
    #    scores' variance near 1 so the softmax does not saturate as d_k grows.
    scores = torch.matmul(query.to(compute), key.to(compute).transpose(-2, -1)) * scale
    # 2. masks: blocked keys get -inf, i.e. zero weight after the softmax.
    if is_causal:
        mask = combine_masks(mask, causal_mask(query.shape[-2], key.shape[-2], query.device))
    if mask is not None and mask.is_floating_point():
        mask = mask.to(scores.dtype)
    # 3. normalise each query's scores into a distribution over the keys.
    weights = masked_softmax(scores, mask)  # (..., Lq, Lk)
    attn = F.dropout(weights, p=dropout_p) if dropout_p > 0.0 else weights
    # 4. the output is the weighted average of the values.
    out = torch.matmul(attn, value.to(compute))  # (..., Lq, Dv)
    return out.to(value.dtype), weights.to(query.dtype)
