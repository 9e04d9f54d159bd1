"""FastViT (Vasu et al. 2023) and MobileCLIP's MCi image encoders, as timm builds them
(``fastvit_t8`` ... ``fastvit_ma36``, ``fastvit_mci0`` ... ``fastvit_mci4``).

Shape legend: ``B`` batch, ``C`` channels, ``H`` / ``W`` feature-map size, ``N = H * W``
tokens, ``Hd`` heads (of width 32), ``K`` classes.

A convolutional stem (three MobileOne blocks: 3x3 stride 2, depthwise 3x3 stride 2, 1x1),
then 4 stages (MCi3 / MCi4: 5). A stage may start with a stride-2 ``PatchEmbed`` (a 7x7
large-kernel conv with a 3x3 branch, then a 1x1 MobileOne block) and a conditional
position encoding (``RepConditionalPosEnc``: ``x + dwconv7x7(x)``), then its blocks:

* ``RepMixerBlock``: ``x = x + gamma * (mixer(x) - norm(x))`` (``RepMixer``: depthwise
  MobileOne blocks), then ``x + gamma * ConvMlp(x)`` (depthwise 7x7 conv + BN, 1x1 conv,
  GELU, 1x1 conv);
* ``AttentionBlock``: ``x + gamma_1 * attn(norm(x))`` (multi-head self-attention over the
  ``N`` positions; ``norm`` BatchNorm, or LayerNorm2d in MCi3 / MCi4), then
  ``x + gamma_2 * ConvMlp(x)``.

Then ``final_conv`` (a depthwise 3x3 MobileOne block with Squeeze-Excite, ``cls_ratio`` x
wider) and timm's ``ClassifierHead`` (global pool, dropout, ``fc``).

A MobileOne block sums several linear branches (``conv_kxk``: conv + BN, ``conv_scale``:
1x1 conv + BN, ``identity``: a BN alone) before its activation. All of it is linear, so
:meth:`FastVit.reparameterize` folds each such sum into one convolution (``reparam_conv``,
as timm's ``reparameterize_model`` does), and then goes further: every remaining BatchNorm
(the ConvMlp's, an attention block's pre-norm) and every layer scale is folded into the
convolution or Linear next to it. The folded model (``config.inference_mode=True``) has
plain convolutions, GELUs, attention and the Squeeze-Excites, and gives the same outputs
to float rounding; it cannot be trained as FastViT was (no branches, no BN statistics).
``save_pretrained`` records the mode, so a saved folded model loads back folded.

Parameter names are timm's (``stem.{i}.conv_kxk.{j}.conv`` / ``.bn``, ``conv_scale``,
``identity``, ``reparam_conv``, ``stages.{i}.downsample.proj.{0,1}``,
``stages.{i}.pos_emb.pos_enc``, ``stages.{i}.blocks.{j}.token_mixer.mixer`` / ``norm``,
``mlp.conv.conv`` / ``mlp.conv.bn``, ``mlp.fc1`` / ``fc2``, ``layer_scale.gamma``,
``layer_scale_1`` / ``_2``, ``token_mixer.qkv`` / ``proj``, ``final_conv``, ``head.fc``), so
timm's checkpoints load unchanged; timm's *reparameterized* ones go through the folds that
timm leaves out (:func:`attn_vision.convert.convert_timm_fastvit`).

Inference fast path (:func:`attn_core.fast_inference.enable` / ``disable`` switch it): the
unfolded model's conv + BatchNorm pairs (:class:`~attn_vision.mobileone.ConvNorm`) run
through :func:`attn_core.fast_inference.conv_bn_act` (the BatchNorm folded on the fly, ~15%
faster); the folded model's grouped convs with one input channel per group (``PatchEmbed``'s,
``final_conv``'s) as depthwise convs, interleaved
(:func:`attn_core.fast_inference.channel_multiplier_conv`, several times faster than
PyTorch's kernel for them), and its GELUs in place
(:func:`attn_core.fast_inference.inplace_act`). Where channels-last convolutions are the
faster layout (:data:`attn_core.onednn.CHANNELS_LAST_CONVS`: AVX-512 CPUs) the input goes
channels-last (:func:`attn_core.fast_inference.channels_last`), and the ConvMlps' 1x1 convs
run as oneDNN products over the pixels with the GELU fused
(:func:`attn_core.fast_inference.pointwise_conv`); the other convolutions are PyTorch's own
in that layout. On the AVX2 CPU tried, oneDNN's channels-last convolutions measured no faster
than PyTorch's NCHW ones with nothing left to fold (its depthwise ones up to 3x slower), so
there the folded model runs NCHW.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils.checkpoint
from attn_core import DropPath, attention
from attn_core.fast_inference import channels_last, linear_act, pointwise_conv
from torch import nn

from .convnext import LayerNorm2d
from .mobileone import (
    ConvNorm,
    MobileOneBlock,
    ReparamLargeKernelConv,
    bn_scale_shift,
    conv_from,
    identity_kernel,
    timm_conv,
)

__all__ = [
    "AttentionBlock",
    "ConvMlp",
    "FastVit",
    "FastVitConfig",
    "MobileOneBlock",
    "RepConditionalPosEnc",
    "RepMixer",
    "RepMixerBlock",
    "ReparamLargeKernelConv",
    "fastvit_args",
]

TOKEN_MIXERS = ("repmixer", "attention")
NORM_LAYERS = ("batchnorm", "layernorm2d")  # an attention block's pre-norm
GLOBAL_POOLS = ("avg", "max", "avgmax", "catavgmax", "")  # timm's ClassifierHead pool types
HEAD_DIM = 32  # attention head width (timm's Attention default, used by every FastViT)
MLP_KERNEL = 7  # the ConvMlp's depthwise conv


@dataclass
class FastVitConfig:
    """Architecture of a :class:`FastVit` (field names follow timm's ``FastVit`` kwargs;
    the per-stage tuples have one entry per stage)."""

    layers: tuple[int, ...] = (2, 2, 6, 2)  # blocks per stage
    embed_dims: tuple[int, ...] = (64, 128, 256, 512)  # channels per stage
    mlp_ratios: tuple[float, ...] = (4.0, 4.0, 4.0, 4.0)  # ConvMlp hidden width = ratio * C
    token_mixers: tuple[str, ...] = ("repmixer",) * 4  # "repmixer" or "attention" blocks
    # a stage starts with a stride-2 PatchEmbed (so does any stage that changes the width)
    downsamples: tuple[bool, ...] = (False, True, True, True)
    se_downsamples: tuple[bool, ...] = (False,) * 4  # Squeeze-Excite in that PatchEmbed
    pos_embs: tuple[int | None, ...] = (None,) * 4  # RepConditionalPosEnc kernel, or None
    repmixer_kernel_size: int = 3  # RepMixer's depthwise kernel
    down_patch_size: int = 7  # PatchEmbed's large kernel
    down_stride: int = 2  # PatchEmbed's stride
    layer_scale_init_value: float | None = 1e-5  # layer scale init; None = no layer scales
    lkc_use_act: bool = False  # GELU after PatchEmbed's large-kernel conv (MCi)
    stem_use_scale_branch: bool = True  # 1x1 scale branches in the stem (False: MCi3 / MCi4)
    norm_layer: str = "batchnorm"  # attention blocks' norm: "batchnorm" or "layernorm2d"
    norm_eps: float = 1e-5  # epsilon of the "layernorm2d" pre-norm
    cls_ratio: float = 2.0  # final_conv width = cls_ratio * embed_dims[-1]
    global_pool: str = "avg"  # "avg", "max", "avgmax", "catavgmax" or "" (no pooling)
    in_chans: int = 3  # input image channels
    num_classes: int = 1000  # classifier outputs; 0 = no fc (forward returns pooled features)
    drop_rate: float = 0.0  # dropout before the classifier
    proj_drop_rate: float = 0.0  # dropout in the ConvMlps
    drop_path_rate: float = 0.0  # stochastic depth, linearly increasing over all blocks
    inference_mode: bool = False  # the folded layout (FastVit.reparameterize sets it)

    def __post_init__(self) -> None:
        per_stage = ("layers", "embed_dims", "mlp_ratios", "token_mixers", "downsamples",
                     "se_downsamples", "pos_embs")  # fmt: skip
        for name in per_stage:
            setattr(self, name, tuple(getattr(self, name)))
        lengths = {name: len(getattr(self, name)) for name in per_stage}
        if len(set(lengths.values())) != 1:
            raise ValueError(f"the per-stage fields must have one entry per stage, got {lengths}")
        bad = sorted(set(self.token_mixers) - set(TOKEN_MIXERS))
        if bad:
            raise ValueError(f"token_mixers must be among {TOKEN_MIXERS}, got {bad}")
        if self.norm_layer not in NORM_LAYERS:
            raise ValueError(f"norm_layer must be one of {NORM_LAYERS}, got {self.norm_layer!r}")
        if self.global_pool not in GLOBAL_POOLS:
            raise ValueError(f"global_pool must be one of {GLOBAL_POOLS}, got {self.global_pool!r}")
        for dim, mixer in zip(self.embed_dims, self.token_mixers, strict=True):
            if mixer == "attention" and dim % HEAD_DIM:
                raise ValueError(f"an attention stage's width must be a multiple of {HEAD_DIM} "
                                 f"(the head width), got {dim}")  # fmt: skip
        if any(k is not None and k % 2 == 0 for k in self.pos_embs):
            raise ValueError(f"pos_embs kernels must be odd (or None), got {self.pos_embs}")

    @property
    def num_features(self) -> int:
        """Channels of ``forward_features``' output (``final_conv``'s)."""
        return int(self.embed_dims[-1] * self.cls_ratio)


class LayerScale2d(nn.Module):
    """``x * gamma`` with a per-channel ``gamma`` of shape ``(C, 1, 1)`` (timm's)."""

    def __init__(self, dim: int, init_value: float = 1e-5) -> None:
        super().__init__()
        self.gamma = nn.Parameter(torch.full((dim, 1, 1), float(init_value)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gamma


def _layer_scale(dim: int, init_value: float | None, inference_mode: bool) -> nn.Module:
    if init_value is None or inference_mode:  # (folded into the conv / Linear before it)
        return nn.Identity()
    return LayerScale2d(dim, init_value)


def _gamma(layer_scale: nn.Module) -> torch.Tensor | None:
    """A layer scale's ``(C,)`` factors (float64), or None for none."""
    return layer_scale.gamma.double().flatten() if isinstance(layer_scale, LayerScale2d) else None


@torch.no_grad()
def _scale_output(layer: nn.Conv2d | nn.Linear, gamma: torch.Tensor | None) -> None:
    """``layer``'s outputs times ``gamma`` (per output channel), folded into its weights."""
    if gamma is not None:
        shape = (-1,) + (1,) * (layer.weight.ndim - 1)
        layer.weight.copy_(layer.weight.double() * gamma.view(shape))
        layer.bias.copy_(layer.bias.double() * gamma)


class RepMixer(nn.Module):
    """FastViT's token mixer ``x + gamma * (mixer(x) - norm(x))`` on ``(B, C, H, W)``
    (``mixer``: a depthwise MobileOne block; ``norm``: its identity BN alone). Folded: one
    depthwise ``reparam_conv``."""

    def __init__(
        self, dim: int, kernel_size: int = 3, layer_scale_init_value: float | None = 1e-5,
        inference_mode: bool = False,
    ) -> None:  # fmt: skip
        super().__init__()
        self.dim, self.kernel_size = dim, kernel_size
        self.reparam_conv = self.norm = self.mixer = None
        self.layer_scale = nn.Identity()
        if inference_mode:
            self.reparam_conv = timm_conv(dim, dim, kernel_size, groups=dim)
            return
        self.norm = MobileOneBlock(dim, dim, kernel_size, group_size=1, use_act=False,
                                   use_scale_branch=False, num_conv_branches=0)  # fmt: skip
        self.mixer = MobileOneBlock(dim, dim, kernel_size, group_size=1, use_act=False)
        if layer_scale_init_value is not None:
            self.layer_scale = LayerScale2d(dim, layer_scale_init_value)

    def _geometry(self) -> dict[str, int]:
        return dict(padding=self.kernel_size // 2, groups=self.dim)  # depthwise, same size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.reparam_conv is not None:
            return self.reparam_conv(x)
        return x + self.layer_scale(self.mixer(x) - self.norm(x))

    @torch.no_grad()
    def reparameterize(self) -> None:
        if self.reparam_conv is None:
            mixer_w, mixer_b = self.mixer.fused_kernel()
            norm_w, norm_b = self.norm.fused_kernel()
            gamma = _gamma(self.layer_scale)
            gamma = torch.ones_like(mixer_b) if gamma is None else gamma
            eye = identity_kernel(self.dim, self.dim, self.kernel_size, mixer_w.device)
            weight = eye + gamma[:, None, None, None] * (mixer_w - norm_w)
            ref, geometry = next(self.mixer.parameters()), self._geometry()
            self.reparam_conv = conv_from(weight, gamma * (mixer_b - norm_b), ref, **geometry)
            self.norm = self.mixer = None
            self.layer_scale = nn.Identity()


class ConvMlp(nn.Module):
    """FastViT's MLP on ``(B, C, H, W)``: ``fc2(drop(gelu(fc1(conv(x)))))`` (``conv``: a
    depthwise 7x7 conv + BN; ``fc1`` / ``fc2``: 1x1 convs). On the fast path ``fc1`` /
    ``fc2`` run through :func:`attn_core.fast_inference.pointwise_conv` (on a channels-last
    ``x``: oneDNN products over the pixels, the GELU fused; else the convs, the GELU in
    place)."""

    fast_inference = True  # attn_core.fast_inference.enable / disable

    def __init__(self, dim: int, hidden: int, drop: float = 0.0, inference_mode: bool = False):
        super().__init__()
        self.conv = ConvNorm(dim, dim, MLP_KERNEL, groups=dim, inference_mode=inference_mode)
        self.fc1 = nn.Conv2d(dim, hidden, 1)
        self.act = nn.GELU()
        self.fc2 = nn.Conv2d(hidden, dim, 1)
        self.drop = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        fast = self.fast_inference and not self.training  # (dropout: no fast path)
        h = pointwise_conv(self.fc1, self.conv(x), self.act, enabled=fast)
        return self.drop(pointwise_conv(self.fc2, self.drop(h), enabled=fast))


class RepConditionalPosEnc(nn.Module):
    """Conditional position encoding ``x + pos_enc(x)`` (``pos_enc``: a depthwise ``k x k``
    conv with bias) on ``(B, C, H, W)``. Folded: one ``reparam_conv``."""

    def __init__(self, dim: int, kernel_size: int = 7, inference_mode: bool = False) -> None:
        super().__init__()
        self.dim, self.kernel_size = dim, kernel_size
        self.reparam_conv = self.pos_enc = None
        conv = nn.Conv2d(dim, dim, kernel_size, padding=kernel_size // 2, groups=dim)
        if inference_mode:
            self.reparam_conv = conv
        else:
            self.pos_enc = conv

    def _geometry(self) -> dict[str, int]:
        return dict(padding=self.kernel_size // 2, groups=self.dim)  # depthwise, same size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.reparam_conv is not None:
            return self.reparam_conv(x)
        return self.pos_enc(x) + x

    @torch.no_grad()
    def reparameterize(self) -> None:
        if self.reparam_conv is None:
            eye = identity_kernel(self.dim, self.dim, self.kernel_size, self.pos_enc.weight.device)
            weight, bias = eye + self.pos_enc.weight.double(), self.pos_enc.bias.double()
            self.reparam_conv = conv_from(weight, bias, self.pos_enc.weight, **self._geometry())
            self.pos_enc = None


class Attention(nn.Module):
    """Multi-head self-attention over the ``N = H * W`` positions of ``(B, C, H, W)`` (heads
    of width 32; timm's ``qkv`` has no bias, a folded BatchNorm pre-norm gives it one). On
    the fast path its Linears are :func:`attn_core.fast_inference.linear_act`'s products."""

    fast_inference = True  # attn_core.fast_inference.enable / disable

    def __init__(
        self, dim: int, qkv_bias: bool = False, attn_drop: float = 0.0, proj_drop: float = 0.0
    ) -> None:
        super().__init__()
        self.num_heads = dim // HEAD_DIM
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.attn_drop = attn_drop
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, C, H, W = x.shape
        fast = self.fast_inference and not self.training
        x = x.flatten(2).transpose(1, 2)  # (B, N, C); a view of a channels-last x
        qkv = linear_act(self.qkv, x, enabled=fast).reshape(B, H * W, 3, self.num_heads, HEAD_DIM)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)  # 3 x (B, Hd, N, 32)
        x = attention(q, k, v, dropout_p=self.attn_drop if self.training else 0.0)
        x = linear_act(self.proj, x.transpose(1, 2).reshape(B, H * W, C), enabled=fast)  # (B, N, C)
        return self.proj_drop(x).transpose(1, 2).reshape(B, C, H, W)


class RepMixerBlock(nn.Module):
    """``x = token_mixer(x)`` (:class:`RepMixer`), then ``x + gamma * mlp(x)``."""

    def __init__(
        self, dim: int, c: FastVitConfig, mlp_ratio: float, drop_path: float = 0.0
    ) -> None:
        super().__init__()
        fused = c.inference_mode
        self.token_mixer = RepMixer(dim, c.repmixer_kernel_size, c.layer_scale_init_value, fused)
        self.mlp = ConvMlp(dim, int(dim * mlp_ratio), c.proj_drop_rate, fused)
        self.layer_scale = _layer_scale(dim, c.layer_scale_init_value, fused)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.token_mixer(x)
        return x + self.drop_path(self.layer_scale(self.mlp(x)))

    @torch.no_grad()
    def reparameterize(self) -> None:
        """Fold the layer scale into ``mlp.fc2`` (the mixer and MLP conv fold themselves)."""
        _scale_output(self.mlp.fc2, _gamma(self.layer_scale))
        self.layer_scale = nn.Identity()


class AttentionBlock(nn.Module):
    """``x + gamma_1 * token_mixer(norm(x))`` (:class:`Attention`), then ``x + gamma_2 *
    mlp(x)``; ``norm`` is a BatchNorm or a LayerNorm2d (a folded BatchNorm: Identity)."""

    def __init__(
        self, dim: int, c: FastVitConfig, mlp_ratio: float, drop_path: float = 0.0
    ) -> None:
        super().__init__()
        fused, batchnorm = c.inference_mode, c.norm_layer == "batchnorm"
        if batchnorm:
            self.norm = nn.Identity() if fused else nn.BatchNorm2d(dim)
        else:
            self.norm = LayerNorm2d(dim, eps=c.norm_eps)
        self.token_mixer = Attention(dim, qkv_bias=fused and batchnorm)
        self.layer_scale_1 = _layer_scale(dim, c.layer_scale_init_value, fused)
        self.drop_path1 = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.mlp = ConvMlp(dim, int(dim * mlp_ratio), c.proj_drop_rate, fused)
        self.layer_scale_2 = _layer_scale(dim, c.layer_scale_init_value, fused)
        self.drop_path2 = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop_path1(self.layer_scale_1(self.token_mixer(self.norm(x))))
        return x + self.drop_path2(self.layer_scale_2(self.mlp(x)))

    @torch.no_grad()
    def reparameterize(self) -> None:
        """Fold a BatchNorm pre-norm into ``token_mixer.qkv`` (which gains a bias) and the
        layer scales into ``token_mixer.proj`` / ``mlp.fc2``."""
        if type(self.norm) is nn.BatchNorm2d:
            n = self.norm
            scale, shift = bn_scale_shift(n.weight, n.bias, n.running_mean, n.running_var, n.eps)
            qkv = self.token_mixer.qkv
            weight = qkv.weight.double()  # qkv(x * scale + shift) = (W * scale) x + W shift
            bias = weight @ shift + (0 if qkv.bias is None else qkv.bias.double())
            fused = nn.Linear(qkv.in_features, qkv.out_features, device="meta")
            fused.weight = nn.Parameter((weight * scale).to(qkv.weight))
            fused.bias = nn.Parameter(bias.to(qkv.weight))
            self.token_mixer.qkv, self.norm = fused, nn.Identity()
        _scale_output(self.token_mixer.proj, _gamma(self.layer_scale_1))
        _scale_output(self.mlp.fc2, _gamma(self.layer_scale_2))
        self.layer_scale_1 = self.layer_scale_2 = nn.Identity()


class PatchEmbed(nn.Module):
    """A stage's downsampling: ``(B, C_in, H, W)`` -> ``(B, C, H / 2, W / 2)`` through a
    :class:`ReparamLargeKernelConv` (depthwise-grouped, stride 2) and a 1x1
    :class:`MobileOneBlock` (``proj.0`` / ``proj.1``)."""

    def __init__(self, in_chs: int, dim: int, c: FastVitConfig, use_se: bool) -> None:
        super().__init__()
        self.proj = nn.Sequential(
            ReparamLargeKernelConv(
                in_chs, dim, c.down_patch_size, c.down_stride, group_size=1, small_kernel=3,
                use_se=use_se, use_act=c.lkc_use_act, inference_mode=c.inference_mode,
            ),
            MobileOneBlock(dim, dim, 1, inference_mode=c.inference_mode),
        )  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x)


class FastVitStage(nn.Module):
    """Optional :class:`PatchEmbed` (``downsample``), optional
    :class:`RepConditionalPosEnc` (``pos_emb``), then the blocks."""

    def __init__(self, in_chs: int, i: int, c: FastVitConfig, dpr: Sequence[float]) -> None:
        super().__init__()
        dim = c.embed_dims[i]
        if c.downsamples[i] or in_chs != dim:
            self.downsample = PatchEmbed(in_chs, dim, c, c.se_downsamples[i])
        else:
            self.downsample = nn.Identity()
        k = c.pos_embs[i]
        self.pos_emb = (
            nn.Identity() if k is None else RepConditionalPosEnc(dim, k, c.inference_mode)
        )
        block = RepMixerBlock if c.token_mixers[i] == "repmixer" else AttentionBlock
        self.blocks = nn.Sequential(*(block(dim, c, c.mlp_ratios[i], p) for p in dpr))


class ClassifierHead(nn.Module):
    """timm's ``ClassifierHead``: global pool, dropout, ``fc``; ``(B, C, H, W)`` -> ``(B, K)``."""

    def __init__(self, dim: int, num_classes: int, pool: str, drop_rate: float = 0.0) -> None:
        super().__init__()
        self.pool = pool
        self.num_features = dim * 2 if pool == "catavgmax" else dim  # pooled width
        self.drop = nn.Dropout(drop_rate)
        self.fc = nn.Linear(self.num_features, num_classes) if num_classes > 0 else nn.Identity()

    def global_pool(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, C, H, W)`` -> ``(B, C)`` (``catavgmax``: ``(B, 2C)``; ``""``: unchanged)."""
        if self.pool == "":
            return x
        if self.pool == "avg":  # (only the pool asked for: a max over (H, W) costs as much)
            return x.mean((2, 3))
        amax = x.amax((2, 3))
        if self.pool == "max":
            return amax
        avg = x.mean((2, 3))
        return 0.5 * (avg + amax) if self.pool == "avgmax" else torch.cat((avg, amax), dim=1)

    def forward(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        x = self.drop(self.global_pool(x))
        return x if pre_logits else self.fc(x)


class FastVit(nn.Module):
    """FastViT / MCi: stem, stages, ``final_conv``, head (see the module docstring). Build
    from a config (or its fields as keyword arguments); ``weight_init=False`` skips the
    random init."""

    fast_inference = True  # channels-last input where that is faster (AVX-512)

    def __init__(
        self, config: FastVitConfig | None = None, *, weight_init: bool = True, **kwargs
    ) -> None:
        super().__init__()
        config = config if config is not None else FastVitConfig(**kwargs)
        self.config = c = config
        self.num_classes = c.num_classes
        self.grad_checkpointing = False
        fused, scale, dim0 = c.inference_mode, c.stem_use_scale_branch, c.embed_dims[0]
        self.stem = nn.Sequential(
            MobileOneBlock(c.in_chans, dim0, 3, 2, use_scale_branch=scale, inference_mode=fused),
            MobileOneBlock(dim0, dim0, 3, 2, group_size=1, use_scale_branch=scale,
                           inference_mode=fused),
            MobileOneBlock(dim0, dim0, 1, use_scale_branch=scale, inference_mode=fused),
        )  # fmt: skip
        dpr = torch.linspace(0, c.drop_path_rate, sum(c.layers), device="cpu").tolist()
        stages, prev, start = [], dim0, 0
        for i, depth in enumerate(c.layers):
            stages.append(FastVitStage(prev, i, c, dpr[start : start + depth]))
            prev, start = c.embed_dims[i], start + depth
        self.stages = nn.Sequential(*stages)
        self.num_features = c.num_features
        self.final_conv = MobileOneBlock(prev, self.num_features, 3, group_size=1, use_se=True,
                                         inference_mode=fused)  # fmt: skip
        self.head = ClassifierHead(self.num_features, c.num_classes, c.global_pool, c.drop_rate)
        self.head_hidden_size = self.head.num_features
        if weight_init:
            self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """timm's: truncated-normal (std 0.02) Linear weights and ConvMlp convs, zero biases
        (the other convs keep PyTorch's default init)."""
        mlp_convs = [m for mlp in self.modules() if isinstance(mlp, ConvMlp)
                     for m in mlp.modules() if isinstance(m, nn.Conv2d)]  # fmt: skip
        for m in [m for m in self.modules() if isinstance(m, nn.Linear)] + mlp_convs:
            nn.init.trunc_normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)

    @torch.no_grad()
    def reparameterize(self) -> FastVit:
        """Fold every multi-branch block, BatchNorm and layer scale into single convolutions
        / Linears (see the module docstring), in place; sets ``config.inference_mode``.
        A no-op on a folded model; returns ``self``."""

        def fold(module: nn.Module) -> None:  # parents first: they read their branches' tensors
            if module is not self and hasattr(module, "reparameterize"):
                module.reparameterize()
            for child in module.children():  # (after the fold: the folded ones)
                fold(child)

        fold(self)
        self.config = dataclasses.replace(self.config, inference_mode=True)  # (a new config)
        return self

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        self.grad_checkpointing = enable

    def get_classifier(self) -> nn.Module:
        return self.head.fc

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        """A new (randomly initialised) ``num_classes``-way ``fc`` (0 removes it), and
        optionally another pooling."""
        pool = self.config.global_pool if global_pool is None else global_pool
        if pool not in GLOBAL_POOLS:
            raise ValueError(f"global_pool must be one of {GLOBAL_POOLS}, got {pool!r}")
        self.num_classes = self.config.num_classes = num_classes
        self.config.global_pool = pool
        head = ClassifierHead(self.num_features, num_classes, pool, self.config.drop_rate)
        ref = next(self.stem.parameters())
        self.head = head.to(ref.device, ref.dtype)
        self.head_hidden_size = self.head.num_features

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, C_in, H, W)`` -> ``(B, num_features, H / s, W / s)``, ``s`` = 32 (5 stages: 64)."""
        if x.ndim != 4 or x.shape[1] != self.config.in_chans:
            raise ValueError(
                f"expected an image batch (B, {self.config.in_chans}, H, W), got {tuple(x.shape)}"
            )
        x = self.stem(channels_last(x, enabled=self.fast_inference and not self.training))
        for stage in self.stages:
            x = stage.pos_emb(stage.downsample(x))
            for blk in stage.blocks:
                if self.grad_checkpointing and torch.is_grad_enabled():
                    x = torch.utils.checkpoint.checkpoint(blk, x, use_reentrant=False)
                else:
                    x = blk(x)
        return self.final_conv(x)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """``(B, C, H, W)`` -> ``(B, K)`` logits (or the pooled ``(B, C)`` features)."""
        return self.head(x, pre_logits=pre_logits)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))


# --- timm's keyword arguments ----------------------------------------------------------------
# timm FastVit kwargs that are FastVitConfig fields of the same name and meaning
SAME_ARGS = {
    "layers", "embed_dims", "token_mixers", "downsamples", "se_downsamples",
    "repmixer_kernel_size", "down_patch_size", "down_stride", "layer_scale_init_value",
    "lkc_use_act", "stem_use_scale_branch", "cls_ratio", "in_chans", "num_classes",
    "drop_rate", "proj_drop_rate", "drop_path_rate", "inference_mode",
}  # fmt: skip
TIMM_LAYER_NORM_EPS = 1e-6  # timm's LayerNorm2d default


def _named(value: Any) -> tuple[str, dict[str, Any]]:
    """``(class name, partial keywords)`` of a layer class or a ``functools.partial`` of one."""
    if isinstance(value, functools.partial) and not value.args:
        return getattr(value.func, "__name__", ""), dict(value.keywords)
    return getattr(value, "__name__", repr(value)), {}


def _cpe_kernel(layer: Any) -> int | None:
    """The kernel size of timm's ``RepConditionalPosEnc`` (or a ``partial`` of it with a
    square ``spatial_shape``; timm's default 7x7), else None."""
    name, kw = _named(layer)
    shape = kw.get("spatial_shape", (7, 7))
    shape = (shape, shape) if isinstance(shape, int) else tuple(shape)
    if name != "RepConditionalPosEnc" or set(kw) - {"spatial_shape"} or shape[0] != shape[1]:
        return None
    return int(shape[0])


def fastvit_args(kwargs: dict[str, Any], base: Any = None) -> tuple[dict[str, Any], list[str]]:
    """timm ``FastVit`` kwargs -> ``(FastVitConfig args, what we cannot express)``.

    ``pos_embs`` entries (``RepConditionalPosEnc`` or a ``partial`` of it with a square
    ``spatial_shape``) become kernel sizes; ``norm_layer`` (``BatchNorm2d``, timm's
    ``LayerNorm2d`` or a ``partial`` with ``eps``) becomes ``norm_layer`` / ``norm_eps``.
    Layer classes are recognized by name (timm is not imported). A None value is skipped,
    as ``timm.create_model`` drops it. ``base`` is unused (the translators' common
    signature)."""
    args: dict[str, Any] = {}
    unsupported: list[str] = []
    for key, value in kwargs.items():
        if value is None:
            continue
        if key in SAME_ARGS:
            args[key] = tuple(value) if isinstance(value, list | tuple) else value
        elif key == "mlp_ratios":
            args[key] = tuple(float(r) for r in value)
        elif key == "global_pool" and value in GLOBAL_POOLS:
            args[key] = value
        elif key == "pos_embs":
            args[key] = tuple(None if layer is None else _cpe_kernel(layer) for layer in value)
            bad = [f"pos_embs entry {layer!r}" for layer, k in zip(value, args[key], strict=True)
                   if layer is not None and k is None]  # fmt: skip
            unsupported += bad
        elif key == "norm_layer":
            name, kw = _named(value)
            if name == "BatchNorm2d" and not kw:
                args[key] = "batchnorm"
            elif name == "LayerNorm2d" and set(kw) <= {"eps"}:
                args.update(norm_layer="layernorm2d",
                            norm_eps=float(kw.get("eps", TIMM_LAYER_NORM_EPS)))  # fmt: skip
            else:
                unsupported.append(f"norm_layer={value!r}")
        elif (key == "act_layer" and _named(value) == ("GELU", {})) or (
            key == "fork_feat" and not value
        ):
            continue  # (FastViT's only activation; the classification layout)
        else:
            unsupported.append(f"{key}={value!r}")
    return args, unsupported
