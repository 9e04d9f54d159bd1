"""Structural reparameterization: multi-branch convolutions that fold into one.

Shape legend: ``B`` batch, ``C`` channels, ``H`` / ``W`` feature-map size, ``k`` kernel
size, ``g`` groups.

A convolution followed by an eval-mode BatchNorm is one affine map, and so is a sum of such
branches over the same input with the same stride (a smaller kernel is a larger one padded
with zeros; the identity is a kernel with a 1 at the centre). Trained with the branches
(which train better), such a block runs as the single convolution they add up to
(RepVGG, Ding et al. 2021; MobileOne, Vasu et al. 2023; RepLKNet, Ding et al. 2022):

* :class:`ConvNorm`: ``bn(conv(x))`` (+ an activation), timm's ``ConvNormAct``;
* :class:`MobileOneBlock`: ``act(se(conv_kxk(x) + conv_scale(x) + identity(x)))``;
* :class:`ReparamLargeKernelConv`: ``act(se(large_conv(x) + small_conv(x)))``.

Each has ``reparameterize()``, which replaces its branches in place by the one
convolution (``reparam_conv``, timm's name; a ConvNorm keeps ``conv``, given a bias, and
drops ``bn``), and ``inference_mode=True`` builds that folded layout directly (to load a
folded checkpoint). The kernels are summed in float64, so a folded block gives its branches'
outputs to fp32 rounding. The tensor functions (:func:`bn_scale_shift`,
:func:`identity_kernel`, :func:`pad_kernel`) are what :mod:`attn_vision.convert` folds
checkpoints with. Parameter names are timm's, so its checkpoints load unchanged.

An unfolded :class:`ConvNorm` runs through :func:`attn_core.fast_inference.conv_bn_act` (its
``fast_inference`` flag, switched by :func:`attn_core.fast_inference.enable` / ``disable``):
one oneDNN convolution with the BatchNorm folded on the fly and the GELU fused where the fast
path applies (~15% faster for an unfolded FastViT). Folded blocks, under the same flag:
a grouped conv with one input channel per group (the downsampling's, ``final_conv``) runs as
depthwise convs (:func:`attn_core.fast_inference.channel_multiplier_conv`, several times
faster), a 1x1 conv through :func:`attn_core.fast_inference.pointwise_conv` (a oneDNN product
over the pixels of a channels-last input, the GELU fused), other GELUs in place
(:func:`attn_core.fast_inference.inplace_act`); the other folded convolutions are plain
``nn.Conv2d`` calls (on the AVX2 CPU tried, oneDNN's channels-last kernels measured no faster
than PyTorch's with nothing left to fold, its depthwise ones up to 3x slower).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from attn_core.fast_inference import (
    channel_multiplier_conv,
    conv_bn_act,
    inplace_act,
    pointwise_conv,
)
from torch import nn

from .channel_attention import SqueezeExcite

__all__ = [
    "ConvNorm",
    "MobileOneBlock",
    "ReparamLargeKernelConv",
    "bn_scale_shift",
    "conv_from",
    "identity_kernel",
    "pad_kernel",
    "timm_conv",
]

BN_EPS = 1e-5  # nn.BatchNorm2d's (what every BatchNorm here and in timm's FastViT uses)


# --- the tensor algebra (float64) ------------------------------------------------------
def bn_scale_shift(
    weight: torch.Tensor,
    bias: torch.Tensor,
    running_mean: torch.Tensor,
    running_var: torch.Tensor,
    eps: float = BN_EPS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """An eval-mode BatchNorm as ``x * scale + shift`` per channel: ``(C,)`` each, float64."""
    scale = weight.double() / torch.sqrt(running_var.double() + eps)
    return scale, bias.double() - running_mean.double() * scale


def _bn(bn: nn.BatchNorm2d) -> tuple[torch.Tensor, torch.Tensor]:
    return bn_scale_shift(bn.weight, bn.bias, bn.running_mean, bn.running_var, bn.eps)


def identity_kernel(
    channels: int, groups: int, kernel_size: int, device: torch.device | None = None
) -> torch.Tensor:
    """The ``(C, C / g, k, k)`` float64 kernel of the identity map (a 1 at the centre)."""
    per_group = channels // groups
    kernel = torch.zeros(channels, per_group, kernel_size, kernel_size,
                         dtype=torch.float64, device=device)  # fmt: skip
    idx = torch.arange(channels, device=device)
    kernel[idx, idx % per_group, kernel_size // 2, kernel_size // 2] = 1.0
    return kernel


def pad_kernel(kernel: torch.Tensor, size: int) -> torch.Tensor:
    """A ``(..., k, k)`` kernel centred in ``size x size`` zeros: the same map, once the
    conv's padding grows by ``(size - k) / 2``."""
    pad = (size - kernel.shape[-1]) // 2
    return F.pad(kernel, [pad] * 4)


def conv_from(
    weight: torch.Tensor, bias: torch.Tensor, like: torch.Tensor, **geometry
) -> nn.Conv2d:
    """An ``nn.Conv2d`` holding ``weight`` / ``bias`` (cast to ``like``'s device and dtype)
    with ``geometry`` (``stride``, ``padding``, ``groups``)."""
    out_chs, in_per_group, k, _ = weight.shape
    with torch.device("meta"):  # (no random init: the parameters are replaced right away)
        conv = nn.Conv2d(in_per_group * geometry.get("groups", 1), out_chs, k, **geometry)
    conv.weight = nn.Parameter(weight.to(like.device, like.dtype))
    conv.bias = nn.Parameter(bias.to(like.device, like.dtype))
    return conv


def timm_conv(
    in_chs: int,
    out_chs: int,
    kernel_size: int,
    stride: int = 1,
    groups: int = 1,
    bias: bool = True,
    padding: int | None = None,
) -> nn.Conv2d:
    """timm's ``create_conv2d``: padding ``((stride - 1) + (k - 1)) // 2`` unless given."""
    if padding is None:
        padding = ((stride - 1) + (kernel_size - 1)) // 2
    return nn.Conv2d(in_chs, out_chs, kernel_size, stride, padding, groups=groups, bias=bias)


def _geometry(conv: nn.Conv2d) -> dict:
    return dict(stride=conv.stride, padding=conv.padding, groups=conv.groups)


def _act(act: nn.Module) -> nn.Module | None:
    return None if isinstance(act, nn.Identity) else act


# --- blocks ------------------------------------------------------------------------------
class ConvNorm(nn.Module):
    """``act(bn(conv(x)))`` on ``(B, C, H, W)`` (timm's ``ConvNormAct``: ``conv`` / ``bn``;
    ``act`` GELU or none). Folded (or ``inference_mode``): ``conv`` with a bias, ``bn`` None;
    ``norm=False`` builds that conv-with-bias from the start (no BatchNorm at all)."""

    fast_inference = True  # attn_core.fast_inference.enable

    def __init__(
        self,
        in_chs: int,
        out_chs: int,
        kernel_size: int,
        stride: int = 1,
        groups: int = 1,
        padding: int | None = None,
        act: bool = False,
        norm: bool = True,
        inference_mode: bool = False,
    ) -> None:
        super().__init__()
        has_bn = norm and not inference_mode
        self.conv = timm_conv(in_chs, out_chs, kernel_size, stride, groups, not has_bn, padding)
        self.bn = nn.BatchNorm2d(out_chs) if has_bn else None
        self.act = nn.GELU() if act else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        fast = self.fast_inference and self.bn is not None  # (folded: a plain conv is as fast)
        return conv_bn_act(self.conv, self.bn, x, _act(self.act), enabled=fast)

    def fused_kernel(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(weight, bias)`` (float64) of the one convolution equal to ``bn(conv(x))``."""
        weight = self.conv.weight.double()
        bias = torch.zeros_like(weight[:, 0, 0, 0]) if self.conv.bias is None else self.conv.bias
        if self.bn is None:
            return weight, bias.double()
        scale, shift = _bn(self.bn)
        return weight * scale[:, None, None, None], bias.double() * scale + shift

    @torch.no_grad()
    def reparameterize(self) -> None:
        """Fold ``bn`` into ``conv`` (in place; a no-op without one)."""
        if self.bn is not None:
            self.conv = conv_from(*self.fused_kernel(), self.conv.weight, **_geometry(self.conv))
            self.bn = None


class MobileOneBlock(nn.Module):
    """MobileOne block: ``act(se(sum of branches))`` on ``(B, C, H, W)``.

    Branches: ``num_conv_branches`` ``k x k`` conv + BN (``conv_kxk``), a 1x1 conv + BN
    (``conv_scale``, when ``k > 1`` and ``use_scale_branch``) and a BatchNorm alone
    (``identity``, when the block keeps the shape). Folded: one ``reparam_conv``.
    ``group_size`` is timm's (0: a dense conv, 1: depthwise); ``use_se``: a Squeeze-Excite
    (timm's, reduction 1/16) before the GELU.
    """

    # the folded path: attn_core.fast_inference.channel_multiplier_conv, pointwise_conv and
    # inplace_act
    fast_inference = True

    def __init__(
        self,
        in_chs: int,
        out_chs: int,
        kernel_size: int,
        stride: int = 1,
        group_size: int = 0,
        use_se: bool = False,
        use_act: bool = True,
        use_scale_branch: bool = True,
        num_conv_branches: int = 1,
        inference_mode: bool = False,
    ) -> None:
        super().__init__()
        self.in_chs, self.out_chs = in_chs, out_chs
        self.kernel_size, self.stride = kernel_size, stride
        self.groups = in_chs // group_size if group_size else 1
        self.se = SqueezeExcite(out_chs, rd_divisor=1) if use_se else nn.Identity()
        self.act = nn.GELU() if use_act else nn.Identity()
        self.reparam_conv = self.identity = self.conv_kxk = self.conv_scale = None
        if inference_mode:
            self.reparam_conv = timm_conv(in_chs, out_chs, kernel_size, stride, self.groups)
            return
        if in_chs == out_chs and stride == 1:
            self.identity = nn.BatchNorm2d(in_chs)
        if num_conv_branches > 0:
            self.conv_kxk = nn.ModuleList(
                ConvNorm(in_chs, out_chs, kernel_size, stride, self.groups)
                for _ in range(num_conv_branches)
            )
        if kernel_size > 1 and use_scale_branch:
            self.conv_scale = ConvNorm(in_chs, out_chs, 1, stride, self.groups)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, C_in, H, W)`` -> ``(B, C_out, H / stride, W / stride)``."""
        if self.reparam_conv is not None:
            fast = self.fast_inference and not self.training
            if self.kernel_size == 1 and isinstance(self.se, nn.Identity):
                return pointwise_conv(self.reparam_conv, x, _act(self.act), enabled=fast)
            x = channel_multiplier_conv(self.reparam_conv, x, enabled=fast)
            return inplace_act(self.act, self.se(x), enabled=fast)
        out = self.identity(x) if self.identity is not None else 0
        if self.conv_scale is not None:
            out = out + self.conv_scale(x)
        for branch in self.conv_kxk or ():
            out = out + branch(x)
        return self.act(self.se(out))

    def fused_kernel(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(weight, bias)`` (float64) of the one ``k x k`` conv equal to the branch sum."""
        if self.reparam_conv is not None:
            return self.reparam_conv.weight.double(), self.reparam_conv.bias.double()
        k, device = self.kernel_size, self._ref().device
        weight = torch.zeros(self.out_chs, self.in_chs // self.groups, k, k,
                             dtype=torch.float64, device=device)  # fmt: skip
        bias = torch.zeros(self.out_chs, dtype=torch.float64, device=device)
        for branch in self.conv_kxk or ():
            w, b = branch.fused_kernel()
            weight, bias = weight + w, bias + b
        if self.conv_scale is not None:
            w, b = self.conv_scale.fused_kernel()
            weight, bias = weight + pad_kernel(w, k), bias + b
        if self.identity is not None:
            scale, shift = _bn(self.identity)
            eye = identity_kernel(self.in_chs, self.groups, k, device)
            weight, bias = weight + eye * scale[:, None, None, None], bias + shift
        return weight, bias

    def _ref(self) -> torch.Tensor:
        """A tensor of the branches (their device and dtype)."""
        branches = (self.identity, self.conv_scale, self.conv_kxk, self.reparam_conv)
        return next(next(b.parameters()) for b in branches if b is not None)

    @torch.no_grad()
    def reparameterize(self) -> None:
        """Fold the branches into ``reparam_conv`` (in place; a no-op once folded)."""
        if self.reparam_conv is None:
            k, s = self.kernel_size, self.stride
            geometry = dict(stride=s, padding=((s - 1) + (k - 1)) // 2, groups=self.groups)
            self.reparam_conv = conv_from(*self.fused_kernel(), self._ref(), **geometry)
            self.identity = self.conv_kxk = self.conv_scale = None


class ReparamLargeKernelConv(nn.Module):
    """RepLKNet's large-kernel conv: ``act(se(large_conv(x) + small_conv(x)))`` on
    ``(B, C, H, W)`` (two conv + BN branches, the same stride; ``group_size`` as in
    :class:`MobileOneBlock`; ``use_se``: a Squeeze-Excite with reduction 1/4). Folded: one
    ``reparam_conv`` (the small kernel padded to the large one)."""

    # the folded path: attn_core.fast_inference.channel_multiplier_conv and inplace_act
    fast_inference = True

    def __init__(
        self,
        in_chs: int,
        out_chs: int,
        kernel_size: int,
        stride: int,
        group_size: int,
        small_kernel: int = 3,
        use_se: bool = False,
        use_act: bool = False,
        inference_mode: bool = False,
    ) -> None:
        super().__init__()
        if small_kernel > kernel_size:
            raise ValueError(
                f"small_kernel ({small_kernel}) must be <= kernel_size ({kernel_size})"
            )
        self.kernel_size = kernel_size
        groups = in_chs // group_size if group_size else 1
        self.reparam_conv = self.large_conv = self.small_conv = None
        if inference_mode:
            self.reparam_conv = timm_conv(in_chs, out_chs, kernel_size, stride, groups)
        else:
            self.large_conv = ConvNorm(in_chs, out_chs, kernel_size, stride, groups)
            self.small_conv = ConvNorm(in_chs, out_chs, small_kernel, stride, groups)
        self.se = SqueezeExcite(out_chs, rd_ratio=0.25) if use_se else nn.Identity()
        self.act = nn.GELU() if use_act else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, C_in, H, W)`` -> ``(B, C_out, H / stride, W / stride)``."""
        if self.reparam_conv is None:
            return self.act(self.se(self.large_conv(x) + self.small_conv(x)))
        x = channel_multiplier_conv(self.reparam_conv, x, enabled=self.fast_inference)
        return inplace_act(self.act, self.se(x), enabled=self.fast_inference)

    @torch.no_grad()
    def reparameterize(self) -> None:
        """Fold both branches into ``reparam_conv`` (in place; a no-op once folded)."""
        if self.reparam_conv is None:
            weight, bias = self.large_conv.fused_kernel()
            small_w, small_b = self.small_conv.fused_kernel()
            weight, bias = weight + pad_kernel(small_w, self.kernel_size), bias + small_b
            large = self.large_conv.conv
            self.reparam_conv = conv_from(weight, bias, large.weight, **_geometry(large))
            self.large_conv = self.small_conv = None
