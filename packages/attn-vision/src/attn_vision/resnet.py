"""A small ResNet (He et al. 2016, BasicBlock: ResNet-18 / 34) with pluggable channel attention.

Shape legend: ``B`` batch, ``C`` channels, ``H`` / ``W`` feature-map size, ``K`` classes.

Each residual block can carry one attention module from
:mod:`attn_vision.channel_attention` (``"se"``, ``"eca"``, ``"cbam"``, ``"coord"``),
applied to the residual branch before the skip is added, as in SE-ResNet.
Names follow timm's ``ResNet`` (``conv1``, ``bn1``, ``layer{1-4}.{j}.conv1`` / ``bn1`` /
``conv2`` / ``bn2`` / ``se`` / ``downsample.{0,1}``, ``fc``) so timm's ``resnet18``,
``resnet34``, ``seresnet18``, ... weights load unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.utils.checkpoint
from attn_core import DropPath
from torch import nn

from .channel_attention import create_attn

__all__ = ["BasicBlock", "ResNet", "ResNetConfig"]


@dataclass
class ResNetConfig:
    """Architecture of a :class:`ResNet`."""

    layers: tuple[int, ...] = (2, 2, 2, 2)  # BasicBlocks per stage (ResNet-18; (3, 4, 6, 3) = 34)
    in_chans: int = 3  # input image channels
    num_classes: int = 1000  # classifier outputs; 0 = no head
    attn_layer: str | None = None  # "se", "eca", "cbam", "coord" or None in every block
    stem_width: int = 64  # channels of the stem and stage 1; stage i has 64 * 2**i
    drop_rate: float = 0.0  # dropout before the classifier
    drop_path_rate: float = 0.0  # stochastic depth on the residual branches

    def __post_init__(self) -> None:
        self.layers = tuple(self.layers)
        if len(self.layers) != 4:
            raise ValueError(f"layers must give the blocks of 4 stages, got {self.layers}")


class BasicBlock(nn.Module):
    """``act(skip(x) + attn(bn2(conv2(act(bn1(conv1(x)))))))``; skip projects on a shape change."""

    def __init__(
        self,
        inplanes: int,
        planes: int,
        stride: int = 1,
        attn_layer: str | None = None,
        drop_path: float = 0.0,
    ) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.act1 = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.se = create_attn(attn_layer, planes)  # timm calls the slot "se" for every kind
        self.act2 = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or inplanes != planes:
            self.downsample = nn.Sequential(
                nn.Conv2d(inplanes, planes, 1, stride=stride, bias=False), nn.BatchNorm2d(planes)
            )
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, C_in, H, W)`` -> ``(B, C, H / stride, W / stride)``."""
        shortcut = x if self.downsample is None else self.downsample(x)
        x = self.act1(self.bn1(self.conv1(x)))
        x = self.bn2(self.conv2(x))
        if self.se is not None:
            x = self.se(x)
        return self.act2(self.drop_path(x) + shortcut)


class ResNet(nn.Module):
    """Stem (7x7 conv, stride 2 + max-pool), four stages of BasicBlocks, avg pool, ``fc``.

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
        w = c.stem_width
        self.conv1 = nn.Conv2d(c.in_chans, w, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(w)
        self.act1 = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)

        dpr = torch.linspace(0, c.drop_path_rate, sum(c.layers), device="cpu").tolist()
        inplanes, idx = w, 0
        for i, n in enumerate(c.layers):
            planes = w * 2**i
            blocks = []
            for j in range(n):
                stride = 2 if (i > 0 and j == 0) else 1
                blocks.append(BasicBlock(inplanes, planes, stride, c.attn_layer, dpr[idx]))
                inplanes, idx = planes, idx + 1
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
            if isinstance(m, BasicBlock):
                nn.init.zeros_(m.bn2.weight)

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
