"""Run :class:`TransformerBlock` stacks for inference as fast as this machine allows.

Shape legend: ``B`` batch, ``N`` tokens, ``D`` width, ``H`` / ``Hkv`` query / key-value
heads, ``hd`` head width, ``P`` prefix tokens, ``L`` token ids per row, ``S`` tokens of a
length group, ``C`` channels, ``gh, gw`` patch grid.

Models keep one readable forward made of module calls and opt in to this path with a flag
(``model.set_fast_inference(True)``, the default for the ViT and CLIP towers). It runs
only where it applies -- :func:`fast_path_available`: CPU, fp32 / bf16 (bf16 where the CPU
has oneDNN's bf16 kernels: AVX512 or AVX-NE-CONVERT), no autograd
(``torch.no_grad()`` / ``torch.inference_mode()``), no autocast, oneDNN present -- and
otherwise falls back to the module calls, so it is always safe to call. What it does,
each step exact up to float rounding (tests/core/test_fast_inference.py):

* every Linear of a block is one oneDNN call (``torch.ops.mkldnn._linear_pointwise``)
  with the bias and GELU / ReLU / SiLU fused in; PyTorch's ``F.linear`` uses MKL's
  ``sgemm``, slower at the sizes these models use;
* the weights are pre-packed once into oneDNN's blocked layout (a copy the size of the
  weights) and re-packed when they change: the cache checks each weight's version
  counter, which in-place writes bump (``load_state_dict``, ``nn.init``, ``copy_``), and
  its storage (``.to()``), and forgets the parameters of every ``torch.optim`` step
  (fused optimizers do not bump the counter; a global step hook, added on the first
  packing). It dies with the parameters, and :func:`release_packed_weights` frees it
  earlier; call that after writes through ``param.data``, which nothing can see;
* :func:`run_blocks` can compute only one row per sequence in the last block (the token a
  model pools: ViT's [CLS], CLIP text's EOT);
* :func:`run_causal_pooled` encodes causal sequences only up to their pooled token,
  encodes prefixes shared by several rows once (their keys / values are reused, as a KV
  cache is when decoding) and runs rows in groups of similar length;
* :func:`patchify` computes a patch-embedding convolution as one fused product on
  flattened patches;
* :func:`linear_act` is one such fused Linear (+ activation) for models outside the
  blocks (ConvNeXt's MLPs);
* :func:`conv_bn_act` runs ``act(bn(conv(x)) + residual)`` of convolutional networks
  (ResNets) as one oneDNN convolution in channels-last memory, the BatchNorm folded into a
  cached copy of the conv weights (re-folded when any of them changes, like the packing).

Nothing is registered with torch at import. Under ``torch.compile`` the fused product
needs a custom op (Inductor cannot lower ``mkldnn._linear_pointwise`` on non-constant
weights); :func:`compile_module` registers it (``attn_core::onednn_linear``) before
compiling. Code compiled without it uses the plain modules.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils.hooks import RemovableHandle
from torch.utils.weak import WeakIdKeyDictionary

from .attention import attention
from .blocks import FeedForward, LayerScale, QuickGELU, TransformerBlock

__all__ = [
    "block_supported",
    "compile_module",
    "conv_bn_act",
    "fast_path_available",
    "linear_act",
    "patchify",
    "release_packed_weights",
    "run_blocks",
    "run_causal_pooled",
]

_ONEDNN = (
    torch.backends.mkldnn.is_available()
    and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
)
# oneDNN's bf16 products need AVX512 (BW / VL / DQ) or AVX-NE-CONVERT; elsewhere (an AVX2-only
# CPU) bf16 models run their module calls instead of raising from the weight reorder
_ONEDNN_BF16 = _ONEDNN and torch.ops.mkldnn._is_mkldnn_bf16_supported()
_PACK_ROWS = 64  # oneDNN's layout hint: expected rows per product (8..400 measured alike)
_GROUP_COST = 64  # a separate length group costs about as much as this many extra tokens
_MIN_PREFIX = 3  # shortest shared prefix worth caching (tokens)
_MIN_SAVING = 0.15  # share prefixes only when that saves at least this fraction of tokens

# weight -> ((version, data_ptr, dtype, shape), packed weight); entries die with the weight
_packed: WeakIdKeyDictionary = WeakIdKeyDictionary()
# conv weight -> (versions of the conv / BatchNorm tensors, (folded weight, folded bias))
_folded: WeakIdKeyDictionary = WeakIdKeyDictionary()
_optimizer_hook: RemovableHandle | None = None  # set on the first packing
_compile_op_registered = False

KV = tuple[torch.Tensor, torch.Tensor]  # one block's (k, v), each (B, Hkv, N, hd)
M = TypeVar("M", bound=nn.Module)


# ---------------------------------------------------------------------------------------
# When it runs
# ---------------------------------------------------------------------------------------


def fast_path_available(x: torch.Tensor) -> bool:
    """Whether the fast path can run on ``x``: oneDNN present, CPU fp32 (or bf16 where the
    CPU has oneDNN's bf16 kernels), no autograd graph being recorded, no CPU autocast (and
    inside ``torch.compile`` only with the op :func:`compile_module` registers)."""
    return (
        _ONEDNN
        and x.device.type == "cpu"
        and (x.dtype == torch.float32 or (x.dtype == torch.bfloat16 and _ONEDNN_BF16))
        and not torch.is_grad_enabled()
        and not torch.is_autocast_enabled("cpu")
        and (_compile_op_registered or not torch.compiler.is_compiling())
    )


def block_supported(block: nn.Module) -> bool:
    """Whether the fast path runs ``block`` itself (other blocks run as ``block(x)``): a
    pre-norm self-attention :class:`TransformerBlock` in eval mode with plain ``nn.Linear``
    layers (not, e.g., quantized ones), a fused ``qkv``, no RoPE, no inner norms and no
    gated MLP."""
    if not isinstance(block, TransformerBlock) or block.training:
        return False
    if type(block.mlp) is not FeedForward:  # a model's own MLP (e.g. ViTamin's GeGLU)
        return False
    attn = block.attn
    linears = (getattr(attn, "qkv", None), attn.proj, block.mlp.fc1, block.mlp.fc2)
    return (
        all(type(m) is nn.Linear for m in linears)
        and block.norm_first
        and block.cross_attn is None
        and attn.fused_qkv
        and attn.rope is None
        and not block.mlp.gated
        and type(attn.norm) is nn.Identity
        and type(block.mlp.norm) is nn.Identity
        and isinstance(block.ls1, (nn.Identity, LayerScale))
        and isinstance(block.ls2, (nn.Identity, LayerScale))
    )


# ---------------------------------------------------------------------------------------
# Kernels: oneDNN products on pre-packed weights
# ---------------------------------------------------------------------------------------


def _forget_stepped(optimizer: torch.optim.Optimizer, args, kwargs) -> None:
    """After any optimizer step: drop the packed copies of the parameters it updated
    (fused optimizers write in place without bumping the version counter)."""
    if _packed or _folded:
        for group in optimizer.param_groups:
            for p in group["params"]:
                _packed.pop(p, None)
                _folded.pop(p, None)


def _packed_weight(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` as a ``(out, in)`` matrix in oneDNN's pre-packed layout, cached until the
    weight changes (a conv weight is flattened to ``(out, C kh kw)``)."""
    global _optimizer_hook
    if weight.is_inference():  # no version counter: cannot tell when it changes
        return weight.reshape(weight.shape[0], -1)
    key = (weight._version, weight.data_ptr(), weight.dtype, weight.shape)
    entry = _packed.get(weight)
    if entry is None or entry[0] != key:
        if _optimizer_hook is None:
            _optimizer_hook = register_optimizer_step_post_hook(_forget_stepped)
        matrix = weight.detach().reshape(weight.shape[0], -1)
        entry = (key, torch.ops.mkldnn._reorder_linear_weight(matrix, _PACK_ROWS))
        _packed[weight] = entry
    return entry[1]


def release_packed_weights(module: nn.Module | None = None) -> None:
    """Free the pre-packed copies of ``module``'s weights (of every weight: ``None``); the
    next fast call packs them again."""
    if module is None:
        _packed.clear()
        _folded.clear()
        return
    for p in module.parameters():
        _packed.pop(p, None)
        _folded.pop(p, None)


def _post_op(act: nn.Module | None) -> tuple[str, str] | None:
    """oneDNN post-op ``(attr, algorithm)`` computing ``act`` exactly, or None."""
    if act is None:
        return "none", ""
    if type(act) is nn.GELU:
        return "gelu", act.approximate  # "none" (erf) or "tanh"
    if type(act) is nn.ReLU:
        return "relu", ""
    if type(act) is nn.SiLU:
        return "swish", ""
    return None


def _linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    act: nn.Module | None = None,
    residual: torch.Tensor | None = None,
) -> torch.Tensor:
    """``act(x @ weight.T + bias) (+ residual)``: one oneDNN call, bias and act fused."""
    post = _post_op(act)
    attr, alg = post if post is not None else ("none", "")
    if torch.compiler.is_compiling():  # the custom op on the plain weight
        matrix = weight.reshape(weight.shape[0], -1)
        out = torch.ops.attn_core.onednn_linear(x, matrix, bias, attr, alg)
    else:
        out = torch.ops.mkldnn._linear_pointwise(x, _packed_weight(weight), bias, attr, [], alg)
    if post is None:
        out = out.mul_(torch.sigmoid(1.702 * out)) if type(act) is QuickGELU else act(out)
    # (oneDNN's fused "add" epilogue measured slower than this in-place add)
    return out if residual is None else out.add_(residual)


def linear_act(
    linear: nn.Linear, x: torch.Tensor, act: nn.Module | None = None, enabled: bool = True
) -> torch.Tensor:
    """``act(linear(x))``: one oneDNN product on pre-packed weights with the activation fused
    where the fast path is available (``enabled``, a plain ``nn.Linear`` of ``x``'s dtype),
    the modules elsewhere."""
    if (
        enabled
        and fast_path_available(x)
        and type(linear) is nn.Linear
        and linear.weight.dtype == x.dtype
        and not torch.compiler.is_compiling()
    ):
        return _linear(x, linear.weight, linear.bias, act)
    x = linear(x)
    return x if act is None else act(x)


def _register_compile_op() -> None:
    """Register ``attn_core::onednn_linear``, the oneDNN product as an opaque op that
    ``torch.compile`` keeps (Inductor fuses everything around it; on CPU it would otherwise
    pick MKL's ``sgemm``, slower here). Compiled code alone calls it: an eager call would
    import the compiler stack (~1 s)."""
    global _compile_op_registered
    if _compile_op_registered or not _ONEDNN:
        return

    @torch.library.custom_op("attn_core::onednn_linear", mutates_args=())
    def onednn_linear(
        x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, attr: str, alg: str
    ) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, attr, [], alg)

    @onednn_linear.register_fake
    def _(x, weight, bias, attr, alg):
        return x.new_empty(x.shape[:-1] + weight.shape[:1])

    _compile_op_registered = True


def compile_module(module: M, **compile_kwargs) -> M:
    """``module.compile(**compile_kwargs)`` (``torch.compile`` in place) with the fast
    path's oneDNN product available to the compiler; returns ``module``."""
    _register_compile_op()
    module.compile(**compile_kwargs)
    return module


# ---------------------------------------------------------------------------------------
# Blocks
# ---------------------------------------------------------------------------------------


def _block_forward(
    blk: TransformerBlock,
    x: torch.Tensor,
    *,
    is_causal: bool = False,
    attn_mask: torch.Tensor | None = None,
    rows: torch.Tensor | None = None,
    prefix: KV | None = None,
    keep_kv: list[KV] | None = None,
) -> torch.Tensor:
    """``blk(x)`` for a :func:`block_supported` block, ``x`` ``(B, N, D)``; ``rows`` ``(B,)``
    keeps only token ``rows[b]`` -> ``(B, 1, D)``. ``prefix``: ``(k, v)`` of ``P`` earlier
    tokens attended before ``x``'s own (``attn_mask`` then covers ``P + N`` keys);
    ``keep_kv`` receives this block's own ``(k, v)``."""
    attn = blk.attn
    B, N, D = x.shape
    H, Hkv, hd = attn.num_heads, attn.num_kv_heads, attn.head_dim
    qkv = _linear(blk.norm1(x), attn.qkv.weight, attn.qkv.bias)  # (B, N, (H + 2 Hkv) hd)
    q, k, v = qkv.split((H * hd, Hkv * hd, Hkv * hd), dim=-1)
    k = attn.k_norm(k.view(B, N, Hkv, hd).transpose(1, 2))  # (B, Hkv, N, hd)
    v = v.view(B, N, Hkv, hd).transpose(1, 2)
    if keep_kv is not None:
        keep_kv.append((k, v))
    if prefix is not None:
        k, v = torch.cat((prefix[0], k), dim=2), torch.cat((prefix[1], v), dim=2)
    mask = attn_mask
    if mask is not None:
        is_causal = False
    if rows is not None:  # one query per sequence: q (B, 1, H hd), x (B, 1, D)
        batch = torch.arange(B, device=x.device)
        q, x = q[batch, rows][:, None], x[batch, rows][:, None]
        Nk = k.shape[2]
        if mask is not None:  # any broadcastable mask -> (B, 1 or H, 1, P + N)
            mask = mask.reshape((1,) * (4 - mask.ndim) + mask.shape)
            mask = mask.expand(B, mask.shape[1], N, Nk)[batch, :, rows][:, :, None]
        elif is_causal:  # query rows[b] (own position) sees keys <= rows[b] + P
            mask = torch.arange(Nk, device=x.device) <= rows[:, None] + (Nk - N)
            mask = mask[:, None, None, :]  # (B, 1, 1, P + N)
        is_causal = False
    Lq = q.shape[1]
    q = attn.q_norm(q.view(B, Lq, H, hd).transpose(1, 2))  # (B, H, Lq, hd)
    o = attention(q, k, v, attn_mask=mask, is_causal=is_causal, backend=attn.backend)
    o = o.transpose(1, 2).reshape(B, Lq, H * hd)  # (B, Lq, H hd)
    if isinstance(blk.ls1, LayerScale):
        x = x + blk.ls1(_linear(o, attn.proj.weight, attn.proj.bias))
    else:
        x = _linear(o, attn.proj.weight, attn.proj.bias, residual=x)

    mlp = blk.mlp
    h = _linear(blk.norm2(x), mlp.fc1.weight, mlp.fc1.bias, act=mlp.act)
    if isinstance(blk.ls2, LayerScale):
        return x + blk.ls2(_linear(h, mlp.fc2.weight, mlp.fc2.bias))
    return _linear(h, mlp.fc2.weight, mlp.fc2.bias, residual=x)


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
            x = _block_forward(
                blk, x, is_causal=is_causal, attn_mask=attn_mask, rows=r, prefix=pre,
                keep_kv=keep_kv,
            )  # fmt: skip
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


def patchify(conv: nn.Conv2d, x: torch.Tensor) -> torch.Tensor:
    """``conv(x)`` channels-last, ``(B, C, H, W)`` -> ``(B, gh, gw, D)``, for a patch
    embedding (kernel == stride, no padding): one fused product on flattened patches where
    the fast path is available, the convolution itself elsewhere."""
    (ph, pw), B, C, H, W = conv.kernel_size, *x.shape
    if not (
        fast_path_available(x)
        and type(conv) is nn.Conv2d
        and conv.stride == conv.kernel_size
        and conv.padding == (0, 0)
        and conv.dilation == (1, 1)
        and conv.groups == 1
        and conv.weight.dtype == x.dtype
    ):
        return conv(x).permute(0, 2, 3, 1)
    gh, gw = H // ph, W // pw  # (like the convolution, drop a remainder)
    x = x[:, :, : gh * ph, : gw * pw].reshape(B, C, gh, ph, gw, pw)
    x = x.permute(0, 2, 4, 1, 3, 5).reshape(B, gh, gw, C * ph * pw)  # (B, gh, gw, C ph pw)
    return _linear(x, conv.weight, conv.bias)  # the conv weight, flattened the same way


def _tensor_key(t: torch.Tensor | None) -> tuple | None:
    return None if t is None else (t._version, t.data_ptr(), t.dtype)


def _folded_conv(
    conv: nn.Conv2d, bn: nn.BatchNorm2d | None, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``conv``'s weight and bias with ``bn`` (eval statistics) folded in, channels-last,
    in ``dtype``: ``w * g / sqrt(var + eps)``, ``(b - mean) * g / sqrt(var + eps) + beta``
    (computed in fp32), cached until one of the tensors changes."""
    global _optimizer_hook
    tensors = (conv.weight, conv.bias)
    if bn is not None:
        tensors += (bn.weight, bn.bias, bn.running_mean, bn.running_var)
    # inference tensors have no version counter: cannot tell when they change, fold each call
    cache = not any(t is not None and t.is_inference() for t in tensors)
    key = (dtype, *(_tensor_key(t) for t in tensors)) if cache else None
    entry = _folded.get(conv.weight) if cache else None
    if entry is not None and entry[0] == key:
        return entry[1]
    if _optimizer_hook is None:
        _optimizer_hook = register_optimizer_step_post_hook(_forget_stepped)
    weight = conv.weight.detach().float()
    bias = None if conv.bias is None else conv.bias.detach().float()
    if bn is not None:
        scale = torch.rsqrt(bn.running_var.float() + bn.eps)
        if bn.weight is not None:
            scale = scale * bn.weight.detach().float()
        shift = -bn.running_mean.float() * scale
        if bias is not None:
            shift = shift + bias * scale
        if bn.bias is not None:
            shift = shift + bn.bias.detach().float()
        weight, bias = weight * scale[:, None, None, None], shift
    weight = weight.to(dtype).contiguous(memory_format=torch.channels_last)
    folded = (weight, None if bias is None else bias.to(dtype))
    if cache:
        _folded[conv.weight] = (key, folded)
    return folded


def conv_bn_act(
    conv: nn.Conv2d,
    bn: nn.BatchNorm2d | None,
    x: torch.Tensor,
    act: nn.Module | None = None,
    residual: torch.Tensor | None = None,
    enabled: bool = True,
) -> torch.Tensor:
    """``act(bn(conv(x)) + residual)`` (``bn``, ``act``, ``residual`` optional).

    On the fast path (``enabled``, :func:`fast_path_available`, ``bn`` in eval mode, a
    plain ``nn.Conv2d`` with zero padding, ReLU / GELU / SiLU or no ``act``) it is one oneDNN
    convolution with the BatchNorm folded into the weights and the activation fused (after
    an in-place residual add when there is one), its output in channels-last memory, where
    the next convolution reads it without a copy. Elsewhere: the modules themselves.
    """
    post = _post_op(act) if residual is None else ("none", "")
    if (
        enabled
        and fast_path_available(x)
        and type(conv) is nn.Conv2d
        and conv.padding_mode == "zeros"
        and isinstance(conv.padding, tuple)  # not "same" / "valid"
        and (bn is None or (type(bn) is nn.BatchNorm2d and not bn.training))
        and post is not None
        and not torch.compiler.is_compiling()
    ):
        weight, bias = _folded_conv(conv, bn, x.dtype)
        x = x.contiguous(memory_format=torch.channels_last)
        out = torch.ops.mkldnn._convolution_pointwise(
            x, weight, bias, conv.padding, conv.stride, conv.dilation, conv.groups,
            post[0], [], post[1],
        )  # fmt: skip
        if residual is None:
            return out
        out = out.add_(residual)  # (the activation then runs as a module, in place for ReLU)
        return out if act is None else act(out)
    out = conv(x) if bn is None else bn(conv(x))
    if residual is not None:
        out = out + residual
    return out if act is None else act(out)


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
    Elsewhere, and inside ``torch.compile`` (the planner is Python over token lists), the
    batch runs at once, cut after its last pooled token.
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
        S = int(pooled.max()) + 1
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
