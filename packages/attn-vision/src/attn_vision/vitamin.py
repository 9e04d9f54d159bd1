"""ViTamin (Chen et al. 2024, "ViTamin: Designing Scalable Vision Models in the
Vision-Language Era"), as timm builds it (``vitamin_*``).

Shape legend: ``B`` batch, ``C`` channels, ``H`` / ``W`` image size, ``h`` / ``w`` feature
map, ``gh = H / 16``, ``gw = W / 16`` token grid, ``D`` token width, ``K`` classes.

A ViTamin is a :class:`~attn_vision.vit.VisionTransformer` with two changes, exactly the
two keyword arguments timm's ``vitamin.py`` gives its ``VisionTransformer``:

* the patch embedding is a convolutional network (timm's ``HybridEmbed`` over
  ``MbConvStages``, no projection): a stem (3x3 stride-2 conv, LayerNorm2d + GELU, 3x3
  conv), two stages of MBConv blocks (pre-norm inverted bottlenecks: LayerNorm2d, 1x1
  expand x4, GELU, 3x3 depthwise, GELU, 1x1; the first block of each stage has stride 2
  and an average-pool shortcut), then LayerNorm2d + a 3x3 stride-2 conv to ``D``: one
  token per 16 x 16 pixels;
* each block's MLP is :class:`GeGluMlp`: its own LayerNorm, then ``w2(gelu(w0 x) * w1 x)``.

The rest is the ViT: no class token, a learned position embedding (none for
``vitamin_xlarge_*``: ``pos_embed="none"``), pre-norm blocks from attn_core with the usual
attention, average pooling, ``fc_norm``, ``head``. Parameter names are timm's
(``patch_embed.backbone.stem.conv1``, ``patch_embed.backbone.stages.{i}.{j}.pre_norm`` /
``conv1_1x1`` / ``conv2_kxk`` / ``conv3_1x1`` / ``shortcut.expand``,
``patch_embed.backbone.pool.norm`` / ``proj``, ``blocks.{i}.mlp.norm`` / ``w0`` / ``w1`` /
``w2``, ...), so timm checkpoints load unchanged
(:func:`attn_vision.convert.convert_timm_vitamin`).

The blocks run their plain modules: attn_core's fused inference path has no GeGLU MLP.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from attn_core import DropPath
from attn_core.activations import ACTIVATIONS, GATED_ACTIVATIONS
from torch import nn

from .convnext import LayerNorm2d
from .patch_embed import to_2tuple
from .vit import VisionTransformer, ViTConfig

__all__ = ["GeGluMlp", "HybridEmbed", "MbConvLNBlock", "Vitamin", "VitaminConfig"]

STRIDE = 16  # the conv stem's total stride: one token per 16 x 16 pixels
CONV_NORM_EPS = 1e-6  # every LayerNorm2d of the conv stem (timm's default there)
EXPAND_RATIO = 4.0  # MBConv hidden width = 4 x its output width
POS_EMBEDS = ("learn", "none")


@dataclass
class VitaminConfig(ViTConfig):
    """Architecture of a :class:`Vitamin`: the :class:`ViTConfig` fields (ViTamin's
    defaults: ``vitamin_small_224``) plus the conv stem's.

    ``patch_size`` is the stem's total stride, 16; ``patch_bias`` has no meaning (no patch
    projection); ``act`` is the GeGLU MLP's activation."""

    patch_size: int = STRIDE
    embed_dim: int = 384
    depth: int = 14
    num_heads: int = 6
    mlp_ratio: float = 2.0  # GeGLU hidden width = mlp_ratio * D
    class_token: bool = False
    global_pool: str = "avg"
    stem_width: int = 64  # channels of the stem's two 3x3 convs
    conv_dims: tuple[int, int] = (64, 128)  # channels of the two MBConv stages
    conv_depths: tuple[int, int] = (2, 4)  # MBConv blocks per stage
    pos_embed: str = "learn"  # "learn" (a learned absolute position embedding) or "none"

    def __post_init__(self) -> None:
        super().__post_init__()
        self.conv_dims, self.conv_depths = tuple(self.conv_dims), tuple(self.conv_depths)
        if self.patch_size != STRIDE:
            raise ValueError(f"ViTamin's conv stem has stride {STRIDE}: patch_size must be "
                             f"{STRIDE}, got {self.patch_size}")  # fmt: skip
        if len(self.conv_dims) != 2 or len(self.conv_depths) != 2:
            raise ValueError(f"conv_dims and conv_depths give 2 stages, got {self.conv_dims}, "
                             f"{self.conv_depths}")  # fmt: skip
        if self.pos_embed not in POS_EMBEDS:
            raise ValueError(f"pos_embed must be one of {POS_EMBEDS}, got {self.pos_embed!r}")
        if self.act not in ACTIVATIONS or self.act in GATED_ACTIVATIONS:
            raise ValueError(f"act is the GeGLU MLP's activation (e.g. 'gelu'), got {self.act!r}")
        unused = [f for f in ("patch_bias", "rope_ref_grid") if getattr(self, f) is not None]
        unused += [f for f in ("mlp_inner_norm", "rope") if getattr(self, f)]
        if unused:
            raise ValueError(f"{', '.join(unused)}: not used by ViTamin (conv stem, GeGLU MLP)")


def _make_divisible(v: float, divisor: int = 8) -> int:
    """timm's ``make_divisible``: the nearest multiple of ``divisor``, at most 10% below."""
    new_v = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return new_v + divisor if new_v < 0.9 * v else new_v


def _conv3x3(in_chs: int, out_chs: int, stride: int = 1, groups: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_chs, out_chs, 3, stride=stride, padding=1, groups=groups)


class Stem(nn.Module):
    """``(B, C, H, W)`` -> ``(B, stem_width, H / 2, W / 2)``: conv, LayerNorm2d + GELU, conv."""

    def __init__(self, in_chs: int, out_chs: int) -> None:
        super().__init__()
        self.conv1 = _conv3x3(in_chs, out_chs, stride=2)
        self.norm1 = LayerNorm2d(out_chs, eps=CONV_NORM_EPS)
        self.act = nn.GELU()
        self.conv2 = _conv3x3(out_chs, out_chs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv2(self.act(self.norm1(self.conv1(x))))


class Downsample2d(nn.Module):
    """A stride-2 block's shortcut: 3x3 average pool (padding not counted), 1x1 conv to
    the new width when it changes."""

    def __init__(self, in_chs: int, out_chs: int) -> None:
        super().__init__()
        self.pool = nn.AvgPool2d(3, stride=2, padding=1, count_include_pad=False)
        self.expand = nn.Conv2d(in_chs, out_chs, 1) if in_chs != out_chs else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.expand(self.pool(x))


class MbConvLNBlock(nn.Module):
    """Pre-norm inverted bottleneck ``shortcut(x) + conv3(gelu(dwconv(gelu(conv1(norm(x))))))``
    on ``(B, C, h, w)``; ``stride=2`` halves ``h`` and ``w`` (in the depthwise conv, and in
    the shortcut by average pooling)."""

    def __init__(self, in_chs: int, out_chs: int, stride: int = 1, drop_path: float = 0.0) -> None:
        super().__init__()
        mid_chs = _make_divisible(out_chs * EXPAND_RATIO)
        if stride == 2:
            self.shortcut = Downsample2d(in_chs, out_chs)
        elif in_chs != out_chs:
            self.shortcut = nn.Conv2d(in_chs, out_chs, 1)
        else:
            self.shortcut = nn.Identity()
        self.pre_norm = LayerNorm2d(in_chs, eps=CONV_NORM_EPS)
        self.conv1_1x1 = nn.Conv2d(in_chs, mid_chs, 1)
        self.act1 = nn.GELU()
        self.conv2_kxk = _conv3x3(mid_chs, mid_chs, stride=stride, groups=mid_chs)
        self.act2 = nn.GELU()
        self.conv3_1x1 = nn.Conv2d(mid_chs, out_chs, 1)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = self.shortcut(x)
        x = self.act1(self.conv1_1x1(self.pre_norm(x)))  # expand
        x = self.act2(self.conv2_kxk(x))  # (strided) depthwise
        return self.drop_path(self.conv3_1x1(x)) + shortcut  # project


class StridedConv(nn.Module):
    """The stem's last step: LayerNorm2d, then a 3x3 stride-2 conv to the token width."""

    def __init__(self, in_chs: int, out_chs: int) -> None:
        super().__init__()
        self.norm = LayerNorm2d(in_chs, eps=CONV_NORM_EPS)
        self.proj = _conv3x3(in_chs, out_chs, stride=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.norm(x))


class MbConvStages(nn.Module):
    """``(B, C, H, W)`` -> ``(B, D, H / 16, W / 16)``: stem, two MBConv stages, strided conv."""

    def __init__(self, c: VitaminConfig) -> None:
        super().__init__()
        self.stem = Stem(c.in_chans, c.stem_width)
        stages, prev = [], c.stem_width
        for dim, depth in zip(c.conv_dims, c.conv_depths, strict=True):
            blocks = [MbConvLNBlock(prev if j == 0 else dim, dim, 2 if j == 0 else 1)
                      for j in range(depth)]  # fmt: skip
            stages.append(nn.Sequential(*blocks))
            prev = dim
        self.stages = nn.Sequential(*stages)
        self.pool = StridedConv(prev, c.embed_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(self.stages(self.stem(x)))


class HybridEmbed(nn.Module):
    """The ViT's ``patch_embed``: the conv ``backbone``'s feature map as ``(B, gh, gw, D)``
    tokens (timm's ``HybridEmbed`` without projection). Any image size works; each conv
    rounds up, so ``gh = ceil(H / 16)``."""

    def __init__(self, c: VitaminConfig) -> None:
        super().__init__()
        self.img_size = to_2tuple(c.img_size)
        self.patch_size = (STRIDE, STRIDE)
        self.grid_size = c.grid_size  # the grid the position embedding is laid out for
        self.num_patches = self.grid_size[0] * self.grid_size[1]
        self.in_chans = c.in_chans
        self.backbone = MbConvStages(c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.ndim != 4 or x.shape[1] != self.in_chans:
            raise ValueError(
                f"expected an image batch (B, {self.in_chans}, H, W), got {tuple(x.shape)}"
            )
        return self.backbone(x).permute(0, 2, 3, 1)  # (B, gh, gw, D)


class GeGluMlp(nn.Module):
    """ViTamin's MLP (timm's ``GeGluMlp``): ``w2(act(w0(norm(x))) * w1(norm(x)))``,
    ``(..., D) -> (..., D)``, with its own LayerNorm (after the block's ``norm2``)."""

    def __init__(self, dim: int, hidden_dim: int, act: str = "gelu", dropout: float = 0.0):
        super().__init__()
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.w0 = nn.Linear(dim, hidden_dim)  # gate, through the activation
        self.act = ACTIVATIONS[act]()
        self.w1 = nn.Linear(dim, hidden_dim)  # value
        self.drop = nn.Dropout(dropout)
        self.w2 = nn.Linear(hidden_dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm(x)
        return self.w2(self.drop(self.act(self.w0(x)) * self.w1(x)))


class Vitamin(VisionTransformer):
    """ViTamin: :class:`VisionTransformer` with the conv-stem ``patch_embed`` and GeGLU
    MLPs (see the module docstring). Build from a config (or its fields as keyword
    arguments); ``weight_init=False`` skips the random init."""

    def __init__(
        self, config: VitaminConfig | None = None, *, weight_init: bool = True, **kwargs
    ) -> None:
        config = config if config is not None else VitaminConfig(**kwargs)
        super().__init__(config, weight_init=False)
        c = config
        self.patch_embed = HybridEmbed(c)
        hidden = int(c.embed_dim * c.mlp_ratio)
        for blk in self.blocks:  # attn_core TransformerBlocks, with ViTamin's MLP
            blk.mlp = GeGluMlp(c.embed_dim, hidden, act=c.act, dropout=c.proj_drop_rate)
        if c.pos_embed == "none":
            self.pos_embed = None
        if weight_init:
            self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """timm's: truncated normal (std 0.02) Linear and position embedding, tiny prefix
        tokens, conv weights normal with std ``sqrt(2 / fan_out)``; zero biases."""
        if self.pos_embed is not None:
            nn.init.trunc_normal_(self.pos_embed, std=0.02)
        for token in (self.cls_token, self.reg_token):
            if token is not None:
                nn.init.normal_(token, std=1e-6)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
            elif isinstance(m, nn.Conv2d):
                fan_out = m.kernel_size[0] * m.kernel_size[1] * m.out_channels // m.groups
                nn.init.normal_(m.weight, 0.0, math.sqrt(2.0 / fan_out))
            if isinstance(m, nn.Linear | nn.Conv2d) and m.bias is not None:
                nn.init.zeros_(m.bias)

    def _pos_embed(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, gh, gw, D)`` -> ``(B, N, D)``; without a position embedding only the
        prefix tokens (if any) are prepended."""
        if self.pos_embed is not None:
            return super()._pos_embed(x)
        B, gh, gw, D = x.shape
        tokens = (self.cls_token, self.dist_token, self.reg_token)
        prefix = [t.expand(B, -1, -1) for t in tokens if t is not None]
        return self.pos_drop(torch.cat(prefix + [x.reshape(B, gh * gw, D)], dim=1))
