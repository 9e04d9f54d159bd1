"""ResNet (He et al. 2016): BasicBlock (ResNet-18 / 34) and Bottleneck (ResNet-50 / 101 / 152)
stages with pluggable channel attention, and the "D" tweaks (He et al. 2019, "Bag of Tricks":
a deep 3x3 stem, average-pool downsampling in the shortcut).

Shape legend: ``B`` batch, ``C`` channels, ``H`` / ``W`` feature-map size, ``K`` classes.

Each residual block can carry one attention module from
:mod:`attn_vision.channel_attention` (``"se"``, ``"eca"``, ``"cbam"``, ``"coord"``),
applied to the residual branch before the skip is added, as in SE-ResNet.
Names follow timm's ``ResNet`` (``conv1`` (a ``Sequential`` for the deep stem), ``bn1``,
``layer{1-4}.{j}.conv1`` / ``bn1`` / ``conv2`` / ``bn2`` (/ ``conv3`` / ``bn3``) / ``se`` /
``downsample``, ``fc``) so timm's ``resnet18``, ``resnet50``, ``resnet50d``, ``seresnet50``,
``ecaresnet50d``, ... weights load unchanged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.utils.checkpoint
from attn_core import DropPath
from torch import nn

from .channel_attention import create_attn

__all__ = ["BasicBlock", "Bottleneck", "ResNet", "ResNetConfig"]


@dataclass
class ResNetConfig:
    """Architecture of a :class:`ResNet`."""

    layers: tuple[int, ...] = (2, 2, 2, 2)  # blocks per stage (ResNet-18; (3, 4, 6, 3) = 34 / 50)
    block: str = "basic"  # "basic" (two 3x3 convs) or "bottleneck" (1x1, 3x3, 1x1 x 4 wide)
    in_chans: int = 3  # input image channels
    num_classes: int = 1000  # classifier outputs; 0 = no head
    attn_layer: str | None = None  # "se", "eca", "cbam", "coord" or None in every block
    width: int = 64  # planes of stage 1 (stage i: width * 2**i); the 7x7 stem's output
    stem_type: str = ""  # "" (7x7 conv) or "deep" (three 3x3 convs)
    stem_width: int = 32  # deep stem: channels inside it; it outputs 2 * stem_width
    avg_down: bool = False  # shortcut downsampling by 2x2 average pool + 1x1 conv ("D")
    cardinality: int = 1  # bottleneck 3x3 conv groups (ResNeXt: 32, 64)
    base_width: int = 64  # bottleneck width per group at width 64 (ResNeXt 4 / 8, wide 128)
    stride_in_1x1: bool = False  # bottleneck stride on the first 1x1 conv (ResNet v1), not the 3x3
    drop_rate: float = 0.0  # dropout before the classifier
    drop_path_rate: float = 0.0  # stochastic depth on the residual branches

    def __post_init__(self) -> None:
        self.layers = tuple(self.layers)
        if len(self.layers) != 4:
            raise ValueError(f"layers must give the blocks of 4 stages, got {self.layers}")
        if self.block not in ("basic", "bottleneck"):
            raise ValueError(f"block must be 'basic' or 'bottleneck', got {self.block!r}")
        if self.stem_type not in ("", "deep"):
            raise ValueError(f"stem_type must be '' or 'deep', got {self.stem_type!r}")
        bottleneck_only = (self.cardinality, self.base_width, self.stride_in_1x1) != (1, 64, False)
        if self.block == "basic" and bottleneck_only:
            raise ValueError("cardinality / base_width / stride_in_1x1 need block='bottleneck'")


def _downsample(inplanes: int, outplanes: int, stride: int, avg_down: bool) -> nn.Module | None:
    """The shortcut projection on a shape change (timm's ``downsample_conv`` / ``_avg``)."""
    if stride == 1 and inplanes == outplanes:
        return None
    if not avg_down:
        conv = nn.Conv2d(inplanes, outplanes, 1, stride=stride, bias=False)
        return nn.Sequential(conv, nn.BatchNorm2d(outplanes))
    pool = (
        nn.AvgPool2d(2, stride, ceil_mode=True, count_include_pad=False)
        if stride > 1
        else nn.Identity()
    )
    conv = nn.Conv2d(inplanes, outplanes, 1, bias=False)
    return nn.Sequential(pool, conv, nn.BatchNorm2d(outplanes))


class BasicBlock(nn.Module):
    """``act(skip(x) + attn(bn2(conv2(act(bn1(conv1(x)))))))``; skip projects on a shape change."""

    expansion = 1

    def __init__(
        self,
        inplanes: int,
        planes: int,
        stride: int = 1,
        attn_layer: str | None = None,
        drop_path: float = 0.0,
        avg_down: bool = False,
    ) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.act1 = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.se = create_attn(attn_layer, planes)  # timm calls the slot "se" for every kind
        self.act2 = nn.ReLU(inplace=True)
        self.downsample = _downsample(inplanes, planes, stride, avg_down)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, C_in, H, W)`` -> ``(B, C, H / stride, W / stride)``."""
        shortcut = x if self.downsample is None else self.downsample(x)
        x = self.act1(self.bn1(self.conv1(x)))
        x = self.bn2(self.conv2(x))
        if self.se is not None:
            x = self.se(x)
        return self.act2(self.drop_path(x) + shortcut)

    def last_norm(self) -> nn.BatchNorm2d:
        return self.bn2


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (with the stride -- on the 1x1 with ``stride_in_1x1``; grouped for
    ResNeXt), 1x1 expand to ``4 * planes``, attention, + skip."""

    expansion = 4

    def __init__(
        self,
        inplanes: int,
        planes: int,
        stride: int = 1,
        attn_layer: str | None = None,
        drop_path: float = 0.0,
        avg_down: bool = False,
        cardinality: int = 1,
        base_width: int = 64,
        stride_in_1x1: bool = False,
    ) -> None:
        super().__init__()
        outplanes = planes * self.expansion
        width = math.floor(planes * base_width / 64) * cardinality  # ResNeXt / wide
        s1, s3 = (stride, 1) if stride_in_1x1 else (1, stride)
        self.conv1 = nn.Conv2d(inplanes, width, 1, stride=s1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.act1 = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(
            width, width, 3, stride=s3, padding=1, groups=cardinality, bias=False
        )
        self.bn2 = nn.BatchNorm2d(width)
        self.act2 = nn.ReLU(inplace=True)
        self.conv3 = nn.Conv2d(width, outplanes, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(outplanes)
        self.se = create_attn(attn_layer, outplanes)
        self.act3 = nn.ReLU(inplace=True)
        self.downsample = _downsample(inplanes, outplanes, stride, avg_down)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, C_in, H, W)`` -> ``(B, 4 * planes, H / stride, W / stride)``."""
        shortcut = x if self.downsample is None else self.downsample(x)
        x = self.act1(self.bn1(self.conv1(x)))
        x = self.act2(self.bn2(self.conv2(x)))
        x = self.bn3(self.conv3(x))
        if self.se is not None:
            x = self.se(x)
        return self.act3(self.drop_path(x) + shortcut)

    def last_norm(self) -> nn.BatchNorm2d:
        return self.bn3


class ResNet(nn.Module):
    """Stem (7x7 conv or three 3x3 convs, stride 2, + max-pool), four stages of blocks,
    avg pool, ``fc``.

    Build from a config (or its fields as keyword arguments). ``weight_init=False`` skips
    the random init, for weights that are loaded right after.
    """

    def __init__(
        self, config: ResNetConfig | None = None, *, weight_init: bool = True, **kwargs
    ) -> None:
        super().__init__()
        config = config if config is not None else ResNetConfig(**kwargs)
        self.config = c = config
        self.num_classes = c.num_classes
        self.grad_checkpointing = False
        if c.stem_type == "deep":  # timm: conv1.0 / .1 (BN) / .3 / .4 (BN) / .6
            sw, stem_out = c.stem_width, 2 * c.stem_width
            self.conv1 = nn.Sequential(
                nn.Conv2d(c.in_chans, sw, 3, stride=2, padding=1, bias=False),
                nn.BatchNorm2d(sw),
                nn.ReLU(inplace=True),
                nn.Conv2d(sw, sw, 3, padding=1, bias=False),
                nn.BatchNorm2d(sw),
                nn.ReLU(inplace=True),
                nn.Conv2d(sw, stem_out, 3, padding=1, bias=False),
            )
        else:
            stem_out = c.width
            self.conv1 = nn.Conv2d(c.in_chans, stem_out, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(stem_out)
        self.act1 = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        groups = {}
        if c.block == "bottleneck":
            groups = dict(cardinality=c.cardinality, base_width=c.base_width)
            groups["stride_in_1x1"] = c.stride_in_1x1

        block = Bottleneck if c.block == "bottleneck" else BasicBlock
        dpr = torch.linspace(0, c.drop_path_rate, sum(c.layers), device="cpu").tolist()
        inplanes, idx = stem_out, 0
        for i, n in enumerate(c.layers):
            planes = c.width * 2**i
            blocks = []
            for j in range(n):
                stride = 2 if (i > 0 and j == 0) else 1
                args = (stride, c.attn_layer, dpr[idx], c.avg_down)
                blocks.append(block(inplanes, planes, *args, **groups))
                inplanes, idx = planes * block.expansion, idx + 1
            self.add_module(f"layer{i + 1}", nn.Sequential(*blocks))
        self.num_features = inplanes
        self.head_drop = nn.Dropout(c.drop_rate)
        self.fc = nn.Linear(inplanes, c.num_classes) if c.num_classes > 0 else nn.Identity()
        if weight_init:  # skipped when weights are about to be loaded anyway
            self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """Kaiming-normal convs; each block's last BN starts at zero (the block is identity)."""
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        for m in self.modules():
            if isinstance(m, BasicBlock | Bottleneck):
                nn.init.zeros_(m.last_norm().weight)

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Recompute each block in backward (BN statistics then update twice per step, as timm)."""
        self.grad_checkpointing = enable

    def get_classifier(self) -> nn.Module:
        return self.fc

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, C_in, H_img, W_img)`` -> ``(B, C, H_img / 32, W_img / 32)``."""
        if x.ndim != 4 or x.shape[1] != self.config.in_chans:
            raise ValueError(
                f"expected an image batch (B, {self.config.in_chans}, H, W), got {tuple(x.shape)}"
            )
        x = self.maxpool(self.act1(self.bn1(self.conv1(x))))
        for i in range(1, 5):
            for blk in getattr(self, f"layer{i}"):
                if self.grad_checkpointing and torch.is_grad_enabled():
                    x = torch.utils.checkpoint.checkpoint(blk, x, use_reentrant=False)
                else:
                    x = blk(x)
        return x

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """``(B, C, H, W)`` -> ``(B, K)`` logits (or pooled ``(B, C)``)."""
        x = self.head_drop(x.mean((2, 3)))
        return x if pre_logits else self.fc(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))
