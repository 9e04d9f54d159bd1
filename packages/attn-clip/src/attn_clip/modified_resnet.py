"""OpenAI CLIP's ModifiedResNet image tower (RN50, RN101, RN50x4, RN50x16, RN50x64).

Shape legend: ``B`` batch, ``C`` channels, ``H`` / ``W`` feature-map size, ``E`` output
(joint embedding) width.

A ResNet with three changes (Radford et al. 2021): a stem of three 3x3 convs and an average
pool (not one 7x7 conv and a max pool); anti-aliased downsampling (a stride-``s`` average
pool before the 1x1 expansion conv and in the shortcut, instead of strided convs); and an
attention pool instead of the global average: the mean of the ``H * W`` final features,
plus a position embedding, attends over all of them (plus itself) with multi-head
attention (through :func:`attn_core.attention`), then ``c_proj`` maps it to ``E``.

Inference fast path (``fast_inference``, on by default; switched for a whole model by
:func:`attn_core.fast_inference.enable` / ``disable``): every conv + BatchNorm (+ ReLU)
runs through :func:`attn_core.fast_inference.conv_bn_act` -- one oneDNN convolution on
folded weights, channels-last -- where it applies (CPU, eval, no autograd); elsewhere the
same call runs the modules, so there is one forward.

Parameter names are open_clip's ``ModifiedResNet`` (``conv1..3``, ``bn1..3``,
``layer{1-4}.{j}.conv1..3`` / ``bn1..3`` / ``downsample.{0,1}``,
``attnpool.positional_embedding`` / ``q_proj`` / ``k_proj`` / ``v_proj`` / ``c_proj``).
"""

from __future__ import annotations

from collections import OrderedDict

import torch
from attn_core import attention
from attn_core.fast_inference import conv_bn_act
from torch import nn

__all__ = ["AttentionPool2d", "Bottleneck", "ModifiedResNet"]


class Bottleneck(nn.Module):
    """1x1, 3x3, (average pool), 1x1 to ``4 * planes``, + the (pooled, projected) shortcut."""

    expansion = 4
    fast_inference = True  # attn_core.fast_inference.enable

    def __init__(self, inplanes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        out = planes * self.expansion
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.act1 = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.act2 = nn.ReLU(inplace=True)
        self.avgpool = nn.AvgPool2d(stride) if stride > 1 else nn.Identity()
        self.conv3 = nn.Conv2d(planes, out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out)
        self.act3 = nn.ReLU(inplace=True)
        self.downsample = None
        if stride > 1 or inplanes != out:  # open_clip's names: "-1" (pool), "0", "1"
            self.downsample = nn.Sequential(
                OrderedDict(
                    [
                        ("-1", nn.AvgPool2d(stride)),
                        ("0", nn.Conv2d(inplanes, out, 1, bias=False)),
                        ("1", nn.BatchNorm2d(out)),
                    ]
                )
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        fast = self.fast_inference
        shortcut = x
        if self.downsample is not None:
            pool, conv, bn = self.downsample
            shortcut = conv_bn_act(conv, bn, pool(x), enabled=fast)
        x = conv_bn_act(self.conv1, self.bn1, x, self.act1, enabled=fast)
        x = self.avgpool(conv_bn_act(self.conv2, self.bn2, x, self.act2, enabled=fast))
        return conv_bn_act(self.conv3, self.bn3, x, self.act3, residual=shortcut, enabled=fast)


class AttentionPool2d(nn.Module):
    """``(B, C, H, W)`` -> ``(B, E)``: the mean feature attends over ``[mean, features]``."""

    def __init__(
        self, grid: int, embed_dim: int, num_heads: int, output_dim: int, weight_init: bool = True
    ) -> None:
        super().__init__()
        if embed_dim % num_heads:
            raise ValueError(f"width {embed_dim} must be divisible by heads ({num_heads})")
        self.grid, self.num_heads = grid, num_heads
        self.positional_embedding = nn.Parameter(torch.empty(grid**2 + 1, embed_dim))
        if weight_init:
            nn.init.normal_(self.positional_embedding, std=embed_dim**-0.5)
        self.k_proj = nn.Linear(embed_dim, embed_dim)
        self.q_proj = nn.Linear(embed_dim, embed_dim)
        self.v_proj = nn.Linear(embed_dim, embed_dim)
        self.c_proj = nn.Linear(embed_dim, output_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, C, H, W = x.shape
        if (H, W) != (self.grid, self.grid):
            raise ValueError(
                f"the attention pool expects a {self.grid}x{self.grid} feature map "
                f"({self.grid * 32} px images), got {H}x{W}"
            )
        x = x.flatten(2).transpose(1, 2)  # (B, HW, C)
        x = torch.cat((x.mean(dim=1, keepdim=True), x), dim=1)  # (B, 1 + HW, C)
        x = x + self.positional_embedding.to(x.dtype)

        def heads(t: torch.Tensor) -> torch.Tensor:  # (B, L, C) -> (B, heads, L, C / heads)
            return t.unflatten(-1, (self.num_heads, -1)).transpose(1, 2)

        # only the mean token's output is used: it is the one query
        q, k, v = heads(self.q_proj(x[:, :1])), heads(self.k_proj(x)), heads(self.v_proj(x))
        out = attention(q, k, v).transpose(1, 2).reshape(B, C)  # (B, C)
        return self.c_proj(out)


class ModifiedResNet(nn.Module):
    """``(B, 3, S, S)`` images -> ``(B, E)`` embeddings (``S = image_size``).

    Args:
        layers: bottleneck blocks per stage, e.g. ``(3, 4, 6, 3)`` for RN50.
        output_dim: the joint embedding width ``E``.
        heads: attention-pool heads (open_clip: ``width * 32 // 64``).
        image_size: input side; the attention pool's position embedding is laid out for it.
        width: stem output channels; stage ``i`` has ``width * 2**i`` planes.
        weight_init: False skips the random init (weights are about to be loaded).
    """

    fast_inference = True  # attn_core.fast_inference.enable (the stem; blocks: their own)

    def __init__(
        self,
        layers: tuple[int, ...],
        output_dim: int,
        heads: int,
        image_size: int = 224,
        width: int = 64,
        weight_init: bool = True,
    ) -> None:
        super().__init__()
        self.output_dim, self.image_size = output_dim, image_size
        half = width // 2
        self.conv1 = nn.Conv2d(3, half, 3, stride=2, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(half)
        self.act1 = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(half, half, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(half)
        self.act2 = nn.ReLU(inplace=True)
        self.conv3 = nn.Conv2d(half, width, 3, padding=1, bias=False)
        self.bn3 = nn.BatchNorm2d(width)
        self.act3 = nn.ReLU(inplace=True)
        self.avgpool = nn.AvgPool2d(2)
        inplanes = width
        for i, n in enumerate(layers):
            planes, stride = width * 2**i, 1 if i == 0 else 2
            blocks = [Bottleneck(inplanes, planes, stride)]
            inplanes = planes * Bottleneck.expansion
            blocks += [Bottleneck(inplanes, planes) for _ in range(1, n)]
            self.add_module(f"layer{i + 1}", nn.Sequential(*blocks))
        self.attnpool = AttentionPool2d(
            image_size // 32, width * 32, heads, output_dim, weight_init=weight_init
        )
        if weight_init:
            self.init_parameters()

    @torch.no_grad()
    def init_parameters(self) -> None:
        """open_clip's: attention-pool projections ~ N(0, C**-0.5), each block's bn3 zero."""
        std = self.attnpool.c_proj.in_features**-0.5
        pool = self.attnpool
        for proj in (pool.q_proj, pool.k_proj, pool.v_proj, pool.c_proj):
            nn.init.normal_(proj.weight, std=std)
        for name, p in self.named_parameters():
            if name.endswith("bn3.weight") and name.startswith("layer"):
                nn.init.zeros_(p)

    def stem(self, x: torch.Tensor) -> torch.Tensor:
        fast = self.fast_inference
        x = conv_bn_act(self.conv1, self.bn1, x, self.act1, enabled=fast)
        x = conv_bn_act(self.conv2, self.bn2, x, self.act2, enabled=fast)
        x = conv_bn_act(self.conv3, self.bn3, x, self.act3, enabled=fast)
        return self.avgpool(x)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, 3, S, S)`` -> ``(B, 32 * width, S / 32, S / 32)``."""
        x = self.stem(x.to(self.conv1.weight.dtype))
        for i in range(1, 5):
            x = getattr(self, f"layer{i}")(x)
        return x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.attnpool(self.forward_features(x))
