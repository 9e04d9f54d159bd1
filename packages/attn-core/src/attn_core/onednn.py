"""The oneDNN kernels of the CPU inference fast path (:mod:`attn_core.fast_inference`).

Shape legend: ``B`` batch, ``N`` tokens, ``C`` channels, ``gh, gw`` patch grid.

They run only where :func:`fast_path_available` says so -- CPU, fp32 / bf16 (bf16 where the
CPU has oneDNN's bf16 kernels: AVX512 or AVX-NE-CONVERT), no autograd, no autocast, oneDNN
present -- and each public function falls back to the plain modules elsewhere, so it is
always safe to call. Each is exact up to float rounding (tests/core/test_fast_inference.py):

* :func:`fused_linear` is one oneDNN call (``torch.ops.mkldnn._linear_pointwise``) with the bias
  and GELU / ReLU / SiLU fused in below ``_MKL_ROWS`` rows per product, and PyTorch's
  ``F.linear`` (MKL's ``sgemm``) with the activation after it from there on (faster for many
  rows: a text batch, a large image batch); :func:`linear_act` is that for an ``nn.Linear``;
* the weights are pre-packed once into oneDNN's blocked layout (a copy the size of the
  weights) and re-packed when they change: the cache checks each weight's version
  counter, which in-place writes bump (``load_state_dict``, ``nn.init``, ``copy_``), and
  its storage (``.to()``), and forgets the parameters of every ``torch.optim`` step
  (fused optimizers do not bump the counter; a global step hook, added on the first
  packing). It dies with the parameters, and :func:`release_packed_weights` frees it
  earlier; call that after writes through ``param.data``, which nothing can see;
* :func:`patchify` computes a patch-embedding convolution as one fused product on
  flattened patches, :func:`pointwise_conv` a 1x1 convolution on channels-last pixels
  (where :func:`channels_last` put a convnet's input: AVX-512 CPUs);
* :func:`inplace_act` runs an activation over a fresh output in place;
* :func:`conv_bn_act` runs ``act(bn(conv(x)) + residual)`` of convolutional networks
  (ResNets, ConvNeXt's depthwise convs) as one oneDNN convolution in channels-last memory,
  the BatchNorm folded into a cached copy of the conv weights (re-folded when any of them
  changes, like the packing).

Nothing is registered with torch at import. Under ``torch.compile`` the fused product
needs a custom op (Inductor cannot lower ``mkldnn._linear_pointwise`` on non-constant
weights); :func:`compile_module` registers it (``attn_core::onednn_linear``) before
compiling. Code compiled without it uses the plain modules; ``torch.export`` (and so the
ONNX export) never sees a oneDNN op once the model's fast path is off
(:func:`attn_core.fast_inference.disable`).
"""

from __future__ import annotations

from typing import TypeVar

import torch
import torch.nn.functional as F
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils.hooks import RemovableHandle
from torch.utils.weak import WeakIdKeyDictionary

from .activations import QuickGELU

__all__ = [
    "compile_module",
    "conv_bn_act",
    "fast_path_available",
    "channels_last",
    "fused_linear",
    "inplace_act",
    "linear_act",
    "patchify",
    "pointwise_conv",
    "release_packed_weights",
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
# ATen's vector ISA for this CPU ("AVX2", "AVX512", ...; the ATEN_CPU_CAPABILITY variable
# overrides it). On the AVX-512 EPYC (Zen 4) tried, at 1 thread, oneDNN's products measured
# ahead of MKL's sgemm at every size (3-33% at 64-6,160 rows, widths 80-2,048) and depthwise
# convolutions took 20-55% less time in channels-last memory than in NCHW (python -m
# benchmarks.mobileclip --kernels); on the AVX2 EPYC tried, neither (below).
_AVX512 = torch.backends.cpu.get_cpu_capability() == "AVX512"
# From this many rows per product on (None: never), MKL's sgemm (``F.linear``, the activation
# after it) runs the product instead of oneDNN: on the AVX2 EPYC at 1 thread, MKL measured
# 15-25% ahead from 256 rows on at widths 512 / 768 idle (min of 11; oneDNN's fused erf-GELU
# costing 30-40% of the product), oneDNN ahead only below ~32 rows; under load (median of 7)
# the two were mixed at 128-400 rows and MKL ahead from ~800: 1024, where every measurement
# agrees. On AVX-512: never (above).
_MKL_ROWS: int | None = None if _AVX512 else 1024
# Whether convnets whose convolutions PyTorch runs itself (a folded FastViT) go channels-last,
# their 1x1 convolutions as oneDNN products over the pixels (:func:`pointwise_conv`): on
# AVX-512 (above); on the AVX2 EPYC their NCHW kernels measured as fast or faster
CHANNELS_LAST_CONVS = _AVX512

# weight -> ((version, data_ptr, dtype, shape), packed weight); entries die with the weight
_packed: WeakIdKeyDictionary = WeakIdKeyDictionary()
# conv weight -> (versions of the conv / BatchNorm tensors, (folded weight, folded bias))
_folded: WeakIdKeyDictionary = WeakIdKeyDictionary()
_optimizer_hook: RemovableHandle | None = None  # set on the first packing
_compile_op_registered = False

M = TypeVar("M", bound=nn.Module)


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


def inplace_act(act: nn.Module | None, x: torch.Tensor, enabled: bool = True) -> torch.Tensor:
    """``act(x)`` (``x`` for None), written over ``x`` on the fast path (``enabled``,
    :func:`fast_path_available`) for a GELU / ReLU / SiLU / QuickGELU module; ``act(x)``
    elsewhere. Only for an ``x`` nothing else reads (a layer's fresh output). Saves
    allocating (and first touching) a tensor the size of ``x``: 3-10% of a folded
    FastViT-MCi2 at batch 8 (NCHW, on the AVX-512 EPYC at 1 thread)."""
    if act is None:
        return x
    if enabled and type(act) in (nn.GELU, nn.ReLU, nn.SiLU, QuickGELU) and fast_path_available(x):
        if type(act) is nn.GELU:
            return torch.ops.aten.gelu_(x, approximate=act.approximate)
        if type(act) is QuickGELU:
            return x.mul_(torch.sigmoid(1.702 * x))
        return x.relu_() if type(act) is nn.ReLU else F.silu(x, inplace=True)
    return act(x)


def fused_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    act: nn.Module | None = None,
    residual: torch.Tensor | None = None,
) -> torch.Tensor:
    """``act(x @ weight.T + bias) (+ residual)``: one oneDNN call, bias and act fused (from
    ``_MKL_ROWS`` rows of ``x`` on, fp32: ``F.linear``, then the act and the residual)."""
    rows = x.numel() // max(x.shape[-1], 1)
    mkl = _MKL_ROWS is not None and rows >= _MKL_ROWS
    if mkl and x.dtype == torch.float32 and not torch.compiler.is_compiling():
        out = F.linear(x, weight.reshape(weight.shape[0], -1), bias)  # MKL's sgemm
        out = inplace_act(act, out)
        return out if residual is None else out.add_(residual)
    post = _post_op(act)
    attr, alg = post if post is not None else ("none", "")
    if torch.compiler.is_compiling():  # the custom op on the plain weight
        matrix = weight.reshape(weight.shape[0], -1)
        out = torch.ops.attn_core.onednn_linear(x, matrix, bias, attr, alg)
    else:
        out = torch.ops.mkldnn._linear_pointwise(x, _packed_weight(weight), bias, attr, [], alg)
    if post is None:
        out = inplace_act(act, out)
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
        return fused_linear(x, linear.weight, linear.bias, act)
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
    return fused_linear(x, conv.weight, conv.bias)  # the conv weight, flattened the same way


def channels_last(x: torch.Tensor, enabled: bool = True) -> torch.Tensor:
    """``x`` ``(B, C, H, W)`` in channels-last memory where the fast path is available
    (``enabled``, :func:`fast_path_available`) and convolutions run faster that way
    (:data:`CHANNELS_LAST_CONVS`: AVX-512); ``x`` itself elsewhere. PyTorch's convolutions
    keep the layout they are given, so one call at a convnet's input sets it throughout."""
    if enabled and CHANNELS_LAST_CONVS and x.ndim == 4 and fast_path_available(x):
        return x.contiguous(memory_format=torch.channels_last)
    return x


def pointwise_conv(
    conv: nn.Conv2d,
    x: torch.Tensor,
    act: nn.Module | None = None,
    residual: torch.Tensor | None = None,
    enabled: bool = True,
) -> torch.Tensor:
    """``act(conv(x)) (+ residual)`` for a 1x1 convolution (stride 1, no padding, one group),
    ``(B, C, H, W)`` -> ``(B, C', H, W)``. On a channels-last ``x`` where the fast path is
    available (``enabled``, :func:`fast_path_available`, :data:`CHANNELS_LAST_CONVS`): one
    :func:`fused_linear` over the ``B H W`` pixel rows (the activation fused, the residual
    added in place), its output channels-last: 7-18% faster than the convolution in either
    layout at FastViT-MCi2's ConvMlp shapes (batch 1, the AVX-512 EPYC at 1 thread).
    Elsewhere the modules (the activation in place: :func:`inplace_act`)."""
    if (
        enabled
        and CHANNELS_LAST_CONVS
        and fast_path_available(x)
        and type(conv) is nn.Conv2d
        and conv.kernel_size == (1, 1)
        and conv.stride == (1, 1)
        and conv.padding == (0, 0)
        and conv.groups == 1
        and conv.weight.dtype == x.dtype
        and x.is_contiguous(memory_format=torch.channels_last)
        and not torch.compiler.is_compiling()
    ):
        res = None if residual is None else residual.permute(0, 2, 3, 1)  # (B, H, W, C')
        out = fused_linear(x.permute(0, 2, 3, 1), conv.weight, conv.bias, act, res)
        return out.permute(0, 3, 1, 2)  # (B, H, W, C') -> (B, C', H, W), channels-last
    out = inplace_act(act, conv(x), enabled)
    return out if residual is None else out + residual


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
