"""The CPU inference fast path: one switch for a whole model, and fast block stacks.

Shape legend: ``B`` batch, ``N`` tokens, ``D`` width, ``Hkv`` key-value heads, ``hd`` head
width, ``P`` prefix tokens, ``L`` token ids per row, ``S`` tokens of a length group.

Models keep one readable forward made of module calls. The modules that have a faster
inference path carry a ``fast_inference`` flag (on by default: ``VisionTransformer`` and
ViTamin, ConvNeXt's blocks, OpenAI's ``ModifiedResNet`` and its bottlenecks, CLIP's text
tower) and one call switches every flag of a model::

    from attn_core import fast_inference
    fast_inference.disable(model)  # plain module calls everywhere (packed weights freed)
    fast_inference.enable(model)  # back on (the default)
    with fast_inference.disabled(model):  # off inside the block only
        ...

The path runs only where it applies -- eval mode and :func:`fast_path_available`: CPU,
fp32 / bf16 (bf16 where the CPU has oneDNN's bf16 kernels), no autograd, no autocast --
and otherwise falls back to the module calls, so a switched-on model is always safe to
call. Its kernels are :mod:`attn_core.onednn` (oneDNN products on pre-packed weights,
convolutions on folded BatchNorms, :func:`patchify`, :func:`linear_act`,
:func:`conv_bn_act`, :func:`pointwise_conv`, :func:`channels_last`, :func:`inplace_act`,
re-exported here) and :func:`channel_multiplier_conv`; a :class:`TransformerBlock`'s fused
forward lives in the block (``forward_fused``, next to ``forward``). On top of them, each
step exact up to float rounding (tests/core/test_fast_inference.py):

* :func:`run_blocks` runs a block stack, the supported blocks fused, and can compute only
  one row per sequence in the last block (the token a model pools: ViT's [CLS], CLIP
  text's EOT);
* :func:`run_causal_pooled` encodes causal sequences only up to their pooled token,
  encodes prefixes shared by several rows once (their keys / values are reused, as a KV
  cache is when decoding) and runs rows in groups of similar length.

Exporting (ONNX, OpenVINO) and anything else that must see plain PyTorch ops starts with
:func:`disable` (``attn_clip.export`` does).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import TypeVar

import torch
import torch.nn.functional as F
from torch import nn

from .blocks import KV, TransformerBlock
from .onednn import (  # the kernels, re-exported: models import them from here
    _ONEDNN_BF16,  # noqa: F401  (read by tests: whether bf16 runs fused)
    _folded,  # noqa: F401
    _packed,  # noqa: F401
    channels_last,
    compile_module,
    conv_bn_act,
    fast_path_available,
    inplace_act,
    linear_act,
    patchify,
    pointwise_conv,
    release_packed_weights,
)

__all__ = [
    "block_supported",
    "channel_multiplier_conv",
    "channels_last",
    "compile_module",
    "conv_bn_act",
    "disable",
    "disabled",
    "enable",
    "fast_path_available",
    "inplace_act",
    "is_enabled",
    "linear_act",
    "patchify",
    "pointwise_conv",
    "release_packed_weights",
    "run_blocks",
    "run_causal_pooled",
]

_GROUP_COST = 64  # a separate length group costs about as much as this many extra tokens
_MIN_PREFIX = 3  # shortest shared prefix worth caching (tokens)
_MIN_SAVING = 0.15  # share prefixes only when that saves at least this fraction of tokens

M = TypeVar("M", bound=nn.Module)


# ---------------------------------------------------------------------------------------
# The switch
# ---------------------------------------------------------------------------------------


def _switches(model: nn.Module) -> list[nn.Module]:
    """The modules of ``model`` (itself included) that carry a ``fast_inference`` flag."""
    if not isinstance(model, nn.Module):
        raise ValueError(f"expected an nn.Module, got {type(model).__name__}")
    return [m for m in model.modules() if isinstance(getattr(m, "fast_inference", None), bool)]


def enable(model: M, on: bool = True) -> M:
    """Switch the inference fast path of every module of ``model`` on (``on=False``: off,
    as :func:`disable`); returns ``model``. A model without one is left as it is."""
    for m in _switches(model):
        m.fast_inference = on
    if not on:
        release_packed_weights(model)
    return model


def disable(model: M) -> M:
    """Run ``model``'s plain module calls everywhere and free its packed / folded weight
    copies; returns ``model``."""
    return enable(model, False)


@contextmanager
def disabled(model: M) -> Iterator[M]:
    """``with disabled(model):`` the plain module calls inside the block; each flag is
    restored after it (the packed weights are packed again on the next fast call)."""
    saved = [(m, m.fast_inference) for m in _switches(model)]
    disable(model)
    try:
        yield model
    finally:
        for m, flag in saved:
            m.fast_inference = flag


def is_enabled(model: nn.Module) -> bool:
    """Whether any module of ``model`` has its fast path switched on."""
    return any(m.fast_inference for m in _switches(model))


# ---------------------------------------------------------------------------------------
# Convolutions
# ---------------------------------------------------------------------------------------


def channel_multiplier_conv(conv: nn.Conv2d, x: torch.Tensor, enabled: bool = True) -> torch.Tensor:
    """``conv(x)``, ``(B, C, H, W)`` -> ``(B, m C, H', W')``, fast for a grouped convolution
    with one input channel and ``m > 1`` outputs per group (``groups == C``; FastViT's
    downsampling and final convs): ``m`` depthwise convolutions (output ``j`` of every group),
    interleaved. PyTorch's kernels for such a conv measured 3-10x slower than this on the
    AVX2 EPYC at 1 thread (5-7 ms vs 0.7 ms for FastViT-MCi2's first downsampling at batch
    1). The output keeps ``x``'s memory layout (NCHW or channels-last). Other convolutions,
    and off the fast path (``enabled``, :func:`fast_path_available`): ``conv(x)`` itself."""
    if type(conv) is not nn.Conv2d:  # (e.g. a quantized conv: its own forward)
        return conv(x)
    C = conv.in_channels
    m = conv.out_channels // C
    if not (
        enabled
        and conv.groups == C
        and m > 1
        and conv.padding_mode == "zeros"
        and conv.weight.dtype == x.dtype
        and fast_path_available(x)
        and not torch.compiler.is_compiling()
    ):
        return conv(x)
    w, b = conv.weight, conv.bias  # output j of group c is channel c m + j
    outs = [
        F.conv2d(x, w[j::m], None if b is None else b[j::m], conv.stride, conv.padding,
                 conv.dilation, C)
        for j in range(m)
    ]  # fmt: skip
    if not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last):
        # channels-last in, channels-last out: (B, H', W', C, m) -> (B, C m, H', W')
        return torch.stack([o.permute(0, 2, 3, 1) for o in outs], -1).flatten(3).permute(0, 3, 1, 2)
    return torch.stack(outs, 2).flatten(1, 2)  # (B, C, m, H', W') -> (B, C m, H', W')


# ---------------------------------------------------------------------------------------
# Blocks
# ---------------------------------------------------------------------------------------


def block_supported(block: nn.Module) -> bool:
    """Whether the fast path runs ``block`` fused (other blocks run as ``block(x)``): a
    :class:`TransformerBlock` whose :meth:`~TransformerBlock.fused_supported` holds."""
    return isinstance(block, TransformerBlock) and block.fused_supported()


def _run(
    blocks: Sequence[nn.Module],
    x: torch.Tensor,
    *,
    is_causal: bool = False,
    attn_mask: torch.Tensor | None = None,
    rows: torch.Tensor | None = None,
    prefix: Sequence[KV] | None = None,
    keep_kv: list[KV] | None = None,
    rotary: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """:func:`run_blocks` with per-block ``prefix`` keys / values and ``keep_kv`` (these
    need every block supported)."""
    if not blocks:
        return x if rows is None else x[torch.arange(x.shape[0], device=x.device), rows][:, None]
    fast = fast_path_available(x) and rotary is None
    extra = {} if rotary is None else {"rotary": rotary}
    last = len(blocks) - 1
    for i, blk in enumerate(blocks):
        r = rows if i == last else None
        if fast and block_supported(blk) and blk.attn.qkv.weight.dtype == x.dtype:
            pre = None if prefix is None else prefix[i]
            x = blk.forward_fused(
                x, is_causal=is_causal, attn_mask=attn_mask, rows=r, prefix=pre, keep_kv=keep_kv
            )
            continue
        if prefix is not None or keep_kv is not None:
            raise ValueError("prefix / keep_kv need the fast path and supported blocks")
        x = blk(x, attn_mask=attn_mask, is_causal=is_causal, **extra)
        if r is not None:
            x = x[torch.arange(x.shape[0], device=x.device), r][:, None]
    return x


def run_blocks(
    blocks: Iterable[nn.Module],
    x: torch.Tensor,
    *,
    is_causal: bool = False,
    attn_mask: torch.Tensor | None = None,
    rows: torch.Tensor | None = None,
    rotary: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """``for blk in blocks: x = blk(x, attn_mask=attn_mask, is_causal=is_causal)``, fast.

    Args:
        x: ``(B, N, D)`` tokens.
        attn_mask: self-attention mask (bool True = may attend, or additive), broadcastable
            to ``(B, H, N, N)``.
        rows: ``(B,)``: return only token ``rows[b]`` of the last block's output,
            ``(B, 1, D)``; its keys and values still come from every token, so the result
            equals those rows of the full output.
        rotary: passed to every block (2D RoPE); the blocks then run their own forward.

    Runs the fast kernels where :func:`fast_path_available` and :func:`block_supported`
    allow, the blocks' own forward elsewhere; no dropout either way (an inference path:
    models call it in eval mode without autograd).
    """
    kw = dict(is_causal=is_causal, attn_mask=attn_mask, rows=rows, rotary=rotary)
    return _run(list(blocks), x, **kw)


# ---------------------------------------------------------------------------------------
# Causal sequences pooled at one token: shared prefixes, length groups
# ---------------------------------------------------------------------------------------


def _length_groups(lengths: list[int]) -> list[int]:
    """Split sorted ``lengths`` into runs encoded separately: the end index of each run,
    minimising ``sum(run rows * run max length) + _GROUP_COST * runs`` (exact DP over the
    distinct lengths)."""
    ends = [
        i + 1 for i in range(len(lengths)) if i + 1 == len(lengths) or lengths[i + 1] > lengths[i]
    ]
    best = [0.0] + [float("inf")] * len(ends)  # best[j]: cost of the first ends[j - 1] rows
    cut = [0] * (len(ends) + 1)
    for j in range(1, len(ends) + 1):
        for i in range(j):  # rows ends[i - 1] .. ends[j - 1] form one run
            start = ends[i - 1] if i else 0
            cost = best[i] + (ends[j - 1] - start) * lengths[ends[j - 1] - 1] + _GROUP_COST
            if cost < best[j]:
                best[j], cut[j] = cost, i
    runs, j = [], len(ends)
    while j:
        runs.append(ends[j - 1])
        j = cut[j]
    return runs[::-1]


def _shared_prefixes(seqs: list[list[int]]) -> tuple[list[int], list[int]] | None:
    """Plan prefix sharing for token sequences ``seqs`` (each up to its pooled token).

    Returns ``(cluster, prefix_len)``: ``cluster[i]`` is row ``i``'s cluster (-1: none) and
    ``prefix_len[c]`` the tokens every row of cluster ``c`` starts with (each row keeps at
    least its pooled token to itself). Clusters are runs of rows in lexicographic order whose
    neighbours share >= ``T`` tokens; ``T`` is chosen to minimise the tokens encoded,
    ``sum(len) - sum((rows_c - 1) * prefix_c)``. None when that saves < ``_MIN_SAVING``.
    """
    B = len(seqs)
    order = sorted(range(B), key=seqs.__getitem__)
    lcp = [0] * B  # shared tokens with the previous row in `order`
    for j in range(1, B):
        a, b = seqs[order[j - 1]], seqs[order[j]]
        limit, m = min(len(a), len(b)) - 1, 0
        while m < limit and a[m] == b[m]:
            m += 1
        lcp[j] = m
    total = sum(len(t) for t in seqs)
    best_cost, best = total, []
    for T in range(_MIN_PREFIX, max(lcp, default=0) + 1):
        runs, j = [], 0  # (start, end, prefix) in `order`
        while j < B:
            k, p = j + 1, 1 << 30
            while k < B and lcp[k] >= T:
                p, k = min(p, lcp[k]), k + 1
            if k - j > 1:
                runs.append((j, k, p))
            j = k
        cost = total - sum((e - s - 1) * p for s, e, p in runs)
        if cost < best_cost:
            best_cost, best = cost, runs
    if best_cost > (1 - _MIN_SAVING) * total:
        return None
    cluster = [-1] * B
    for c, (start, end, _) in enumerate(best):
        for j in range(start, end):
            cluster[order[j]] = c
    return cluster, [p for _, _, p in best]


Embed = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def run_causal_pooled(
    blocks: Sequence[nn.Module], tokens: torch.Tensor, pooled: torch.Tensor, embed: Embed
) -> torch.Tensor:
    """Causal token sequences -> the last block's output at one token per row, ``(B, D)``.

    Args:
        tokens: ``(B, L)`` token ids.
        pooled: ``(B,)`` the position to return in each row.
        embed: ``embed(ids, positions)``, both ``(n, S)`` -> ``(n, S, D)`` block inputs in
            the blocks' dtype (positions of padding may repeat ``L - 1``; never read).

    Equals ``run_blocks(blocks, embed(tokens, arange(L)), is_causal=True)`` at
    ``[b, pooled[b]]``: with causal attention nothing after ``pooled[b]`` reaches it, so
    each row is encoded only up to there. On the fast path, prefixes shared by several rows
    are encoded once (their per-block keys / values reused, as when decoding) and the rest
    of each row runs in groups of similar length (each cut after its longest row).
    Elsewhere the batch runs at once, cut after its last pooled token; inside
    ``torch.compile`` (the planner is Python over token lists) it runs at once uncut, as
    reading the cut would break the graph here: cut ``tokens`` before calling.
    """
    B, L = tokens.shape
    device = tokens.device
    if B == 0:
        raise ValueError("tokens must hold at least one row")
    if (
        not blocks
        or not all(block_supported(b) for b in blocks)
        or not fast_path_available(blocks[0].attn.qkv.weight)
        or torch.compiler.is_compiling()
    ):  # one batch, cut after the last pooled token
        S = L if torch.compiler.is_compiling() else int(pooled.max()) + 1
        positions = torch.arange(S, device=device).expand(B, S)
        return _run(blocks, embed(tokens[:, :S], positions), is_causal=True, rows=pooled)[:, 0]

    lengths = (pooled + 1).tolist()
    seqs = [row[:n] for row, n in zip(tokens.tolist(), lengths, strict=True)]
    plan = _shared_prefixes(seqs)
    cluster, prefix_len = plan if plan is not None else ([-1] * B, [])
    prefix_kv: list[KV] = []
    if prefix_len:  # one pass over every shared prefix: (Cl, P) tokens, padded at the end
        first = {c: i for i, c in reversed(list(enumerate(cluster))) if c >= 0}
        P = max(prefix_len)
        heads = [seqs[first[c]][:p] + [0] * (P - p) for c, p in enumerate(prefix_len)]
        heads = torch.tensor(heads, dtype=tokens.dtype, device=device)  # (Cl, P)
        positions = torch.arange(P, device=device).expand(len(prefix_len), P)
        _run(blocks, embed(heads, positions), is_causal=True, keep_kv=prefix_kv)
    skip = [prefix_len[c] if c >= 0 else 0 for c in cluster]  # tokens taken from a prefix
    rest = [n - k for n, k in zip(lengths, skip, strict=True)]
    order = sorted(range(B), key=rest.__getitem__)
    out, start = None, 0
    for end in _length_groups([rest[i] for i in order]):
        rows = order[start:end]
        S, P = rest[rows[-1]], max(skip[i] for i in rows)
        ids = [seqs[i][skip[i] :] + [0] * (S - rest[i]) for i in rows]
        ids = torch.tensor(ids, dtype=tokens.dtype, device=device)  # (n, S)
        offset = torch.tensor([skip[i] for i in rows], device=device)  # (n,)
        positions = (offset[:, None] + torch.arange(S, device=device)).clamp(max=L - 1)
        last = torch.tensor([rest[i] - 1 for i in rows], device=device)  # (n,)
        mask = prefix = None
        if P:  # keys: the row's prefix (P slots, the first skip[i] real), then its own
            own = torch.ones(S, S, dtype=torch.bool, device=device).tril()
            pre = torch.arange(P, device=device) < offset[:, None]  # (n, P)
            mask = torch.cat((pre[:, None, :].expand(-1, S, -1), own.expand(len(rows), -1, -1)), 2)
            mask = mask[:, None]  # (n, 1, S, P + S)
            sel = torch.tensor([max(cluster[i], 0) for i in rows], device=device)
            prefix = [(k[sel, :, :P], v[sel, :, :P]) for k, v in prefix_kv]
        x = _run(
            blocks, embed(ids, positions), is_causal=True, attn_mask=mask, rows=last,
            prefix=prefix,
        )[:, 0]  # fmt: skip
        if out is None:
            out = x.new_empty(B, x.shape[-1])
        out[torch.tensor(rows, device=device)] = x
        start = end
    return out
