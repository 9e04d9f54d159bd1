"""ConvNeXt (Liu et al. 2022, "A ConvNet for the 2020s"), as timm builds it.

Shape legend: ``B`` batch, ``C`` channels, ``H`` / ``W`` feature-map size, ``K`` classes.

A 4x4 stride-4 patch stem, then four stages (the first keeps the resolution, the others
halve it with LayerNorm + 2x2 stride-2 conv) of blocks ``x + gamma * mlp(norm(dwconv7x7(x)))``
(depthwise 7x7 conv, LayerNorm, ``4 C`` GELU MLP, LayerScale ``gamma``), then average pool,
LayerNorm, classifier (timm's ``NormMlpClassifierHead``; ``head_norm_first``: norm before
the pool). Parameter names are timm's (``stem.{0,1}``, ``stages.{i}.downsample.{0,1}``,
``stages.{i}.blocks.{j}.conv_dw`` / ``norm`` / ``mlp.fc1`` / ``mlp.fc2`` / ``gamma``,
``head.norm``, ``head.pre_logits.fc``, ``head.fc``), so timm checkpoints load unchanged.
``conv_mlp`` (timm's atto ... nano) keeps timm's 1x1-conv MLP layout. ``use_grn``: ConvNeXt V2's
Global Response Normalization after the MLP's GELU (``mlp.grn``; V2 has no LayerScale).

Inference fast path (``fast_inference`` of the blocks and MLPs, on by default; switched for a
whole model by :func:`attn_core.fast_inference.enable` / ``disable``): the depthwise
convolutions and the MLPs' Linear layers run through
:func:`attn_core.fast_inference.conv_bn_act` / :func:`~attn_core.fast_inference.linear_act`
(oneDNN, pre-packed weights, GELU fused, channels-last) where they apply (CPU, eval, no
autograd); elsewhere the same calls run the modules, so there is one forward.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from attn_core import DropPath
from attn_core.fast_inference import conv_bn_act, linear_act
from torch import nn

__all__ = ["ConvNeXt", "ConvNeXtBlock", "ConvNeXtConfig", "GlobalResponseNorm", "LayerNorm2d"]


@dataclass
class ConvNeXtConfig:
    """Architecture of a :class:`ConvNeXt` (field names follow timm's kwargs)."""

    depths: tuple[int, ...] = (3, 3, 9, 3)  # blocks per stage (tiny; small / base: 3, 3, 27, 3)
    dims: tuple[int, ...] = (96, 192, 384, 768)  # channels per stage
    in_chans: int = 3  # input image channels
    num_classes: int = 1000  # classifier outputs; 0 = no head (forward returns pooled features)
    patch_size: int = 4  # stem conv kernel and stride
    kernel_size: int = 7  # depthwise conv kernel
    mlp_ratio: float = 4.0  # block MLP width = mlp_ratio * C
    ls_init_value: float | None = 1e-6  # LayerScale init; None = no gamma
    conv_mlp: bool = False  # 1x1 convs + channels-first LayerNorm (timm's atto ... nano)
    conv_bias: bool = True  # biases in the stem, downsample and depthwise convs
    use_grn: bool = False  # Global Response Norm in the block MLP (ConvNeXt V2; timm's use_grn)
    head_norm_first: bool = False  # norm before the pool (norm_pre) instead of after it
    head_hidden_size: int | None = None  # pre-logits Linear + GELU (convnext_large_mlp, ...)
    norm_eps: float = 1e-6  # LayerNorm epsilon
    head_norm_eps: float | None = None  # the head's (or norm_pre's) epsilon; None = norm_eps
    drop_rate: float = 0.0  # dropout before the classifier
    drop_path_rate: float = 0.0  # stochastic depth, linearly increasing over all blocks

    def __post_init__(self) -> None:
        self.depths, self.dims = tuple(self.depths), tuple(self.dims)
        if len(self.depths) != 4 or len(self.dims) != 4:
            raise ValueError(f"depths and dims must give 4 stages, got {self.depths}, {self.dims}")
        if self.head_norm_first and self.head_hidden_size:
            raise ValueError("head_hidden_size needs head_norm_first=False (as in timm)")


class LayerNorm2d(nn.LayerNorm):
    """LayerNorm over the channels of ``(B, C, H, W)`` maps (timm's ``LayerNorm2d``)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.permute(0, 2, 3, 1)
        x = F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        return x.permute(0, 3, 1, 2)


class GlobalResponseNorm(nn.Module):
    """ConvNeXt V2's GRN (timm's ``GlobalResponseNorm``): ``x + bias + weight * x * n`` with
    ``n`` each channel's spatial L2 norm over the mean of those norms, on ``(B, H, W, C)``
    (``channels_last``) or ``(B, C, H, W)``; ``weight`` / ``bias`` ``(C,)``, zero at init."""

    def __init__(self, dim: int, eps: float = 1e-6, channels_last: bool = True) -> None:
        super().__init__()
        self.eps = eps
        self.spatial_dim, self.channel_dim = ((1, 2), -1) if channels_last else ((2, 3), 1)
        self.wb_shape = (1, 1, 1, -1) if channels_last else (1, -1, 1, 1)
        self.weight = nn.Parameter(torch.zeros(dim))
        self.bias = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x_g = torch.linalg.vector_norm(x, dim=self.spatial_dim, keepdim=True)
        x_n = x_g / (x_g.mean(dim=self.channel_dim, keepdim=True) + self.eps)
        w, b = self.weight.view(self.wb_shape), self.bias.view(self.wb_shape)
        return x + torch.addcmul(b, w, x * x_n)


class _Mlp(nn.Module):
    """``fc2(grn(gelu(fc1(x))))``: Linear layers (channels-last) or 1x1 convs (channels-first);
    the GRN only with ``grn``."""

    fast_inference = True  # attn_core.fast_inference.enable (Linear layers only)

    def __init__(self, dim: int, hidden: int, conv: bool, grn: bool = False) -> None:
        super().__init__()
        layer = (lambda i, o: nn.Conv2d(i, o, 1)) if conv else nn.Linear
        self.fc1, self.act, self.fc2 = layer(dim, hidden), nn.GELU(), layer(hidden, dim)
        self.grn = GlobalResponseNorm(hidden, channels_last=not conv) if grn else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        fast = self.fast_inference  # (1x1 convs: linear_act runs the modules)
        x = linear_act(self.fc1, x, self.act, fast)
        if self.grn is not None:
            x = self.grn(x)
        return linear_act(self.fc2, x, enabled=fast)


class ConvNeXtBlock(nn.Module):
    """``x + drop_path(gamma * mlp(norm(conv_dw(x))))`` on ``(B, C, H, W)``."""

    fast_inference = True  # attn_core.fast_inference.enable (the depthwise conv)

    def __init__(self, dim: int, c: ConvNeXtConfig, drop_path: float = 0.0) -> None:
        super().__init__()
        k = c.kernel_size
        self.conv_mlp = c.conv_mlp
        self.conv_dw = nn.Conv2d(dim, dim, k, padding=k // 2, groups=dim, bias=c.conv_bias)
        self.norm = (LayerNorm2d if c.conv_mlp else nn.LayerNorm)(dim, eps=c.norm_eps)
        self.mlp = _Mlp(dim, int(c.mlp_ratio * dim), c.conv_mlp, c.use_grn)
        gamma = c.ls_init_value is not None
        self.gamma = nn.Parameter(torch.full((dim,), c.ls_init_value)) if gamma else None
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x
        x = conv_bn_act(self.conv_dw, None, x, enabled=self.fast_inference)
        if self.conv_mlp:
            x = self.mlp(self.norm(x))
        else:  # channels-last for LayerNorm and the Linear layers
            x = self.mlp(self.norm(x.permute(0, 2, 3, 1))).permute(0, 3, 1, 2)
        if self.gamma is not None:
            x = x * self.gamma[:, None, None]
        return self.drop_path(x) + shortcut


class _Stage(nn.Module):
    def __init__(
        self, in_dim: int, dim: int, depth: int, c: ConvNeXtConfig, dpr: list[float], down: bool
    ) -> None:
        super().__init__()
        if down:  # stages 2-4, even at an unchanged width (stage 1 keeps the stem's resolution)
            conv = nn.Conv2d(in_dim, dim, 2, stride=2, bias=c.conv_bias)
            self.downsample = nn.Sequential(LayerNorm2d(in_dim, eps=c.norm_eps), conv)
        else:
            self.downsample = nn.Identity()
        self.blocks = nn.Sequential(*(ConvNeXtBlock(dim, c, dpr[j]) for j in range(depth)))


class _Head(nn.Module):
    """timm's ``NormMlpClassifierHead`` (pool, norm, pre-logits, fc) or, with
    ``head_norm_first``, ``ClassifierHead`` (pool, fc)."""

    def __init__(self, dim: int, c: ConvNeXtConfig) -> None:
        super().__init__()
        eps = c.norm_eps if c.head_norm_eps is None else c.head_norm_eps
        self.norm = nn.Identity() if c.head_norm_first else LayerNorm2d(dim, eps=eps)
        self.pre_logits = nn.Sequential()
        if c.head_hidden_size:
            self.pre_logits.add_module("fc", nn.Linear(dim, c.head_hidden_size))
            self.pre_logits.add_module("act", nn.GELU())
            dim = c.head_hidden_size
        self.num_features = dim
        self.drop = nn.Dropout(c.drop_rate)
        self.fc = nn.Linear(dim, c.num_classes) if c.num_classes > 0 else nn.Identity()

    def forward(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        x = self.norm(x.mean((2, 3), keepdim=True)).flatten(1)  # (B, C)
        x = self.drop(self.pre_logits(x))
        return x if pre_logits else self.fc(x)


class ConvNeXt(nn.Module):
    """ConvNeXt: patch stem, four stages, pooled head. Build from a config (or its fields
    as keyword arguments); ``weight_init=False`` skips the random init."""

    def __init__(
        self, config: ConvNeXtConfig | None = None, *, weight_init: bool = True, **kwargs
    ) -> None:
        super().__init__()
        config = config if config is not None else ConvNeXtConfig(**kwargs)
        self.config = c = config
        self.num_classes = c.num_classes
        self.grad_checkpointing = False
        p = c.patch_size
        stem = nn.Conv2d(c.in_chans, c.dims[0], p, stride=p, bias=c.conv_bias)
        self.stem = nn.Sequential(stem, LayerNorm2d(c.dims[0], eps=c.norm_eps))
        dpr = torch.linspace(0, c.drop_path_rate, sum(c.depths), device="cpu").tolist()
        stages, prev, start = [], c.dims[0], 0
        for i, (depth, dim) in enumerate(zip(c.depths, c.dims, strict=True)):
            stages.append(_Stage(prev, dim, depth, c, dpr[start : start + depth], down=i > 0))
            prev, start = dim, start + depth
        self.stages = nn.Sequential(*stages)
        head_eps = c.norm_eps if c.head_norm_eps is None else c.head_norm_eps
        self.norm_pre = LayerNorm2d(prev, eps=head_eps) if c.head_norm_first else nn.Identity()
        self.head = _Head(prev, c)
        self.num_features = self.head.num_features
        if weight_init:
            self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """timm's: truncated-normal (std 0.02) conv / linear weights, zero biases."""
        for m in self.modules():
            if isinstance(m, nn.Conv2d | nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        self.grad_checkpointing = enable

    def get_classifier(self) -> nn.Module:
        return self.head.fc

    def reset_classifier(self, num_classes: int) -> None:
        """A new (randomly initialised) ``num_classes``-way classifier; 0 removes it."""
        self.num_classes = self.config.num_classes = num_classes
        fc = nn.Linear(self.num_features, num_classes) if num_classes > 0 else nn.Identity()
        self.head.fc = fc.to(self.stem[0].weight.device)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, C_in, H_img, W_img)`` -> ``(B, C, H_img / 32, W_img / 32)``."""
        if x.ndim != 4 or x.shape[1] != self.config.in_chans:
            raise ValueError(
                f"expected an image batch (B, {self.config.in_chans}, H, W), got {tuple(x.shape)}"
            )
        x = self.stem(x)
        for stage in self.stages:
            x = stage.downsample(x)
            for blk in stage.blocks:
                if self.grad_checkpointing and torch.is_grad_enabled():
                    x = torch.utils.checkpoint.checkpoint(blk, x, use_reentrant=False)
                else:
                    x = blk(x)
        return self.norm_pre(x)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """``(B, C, H, W)`` -> ``(B, K)`` logits (or the pooled, normed ``(B, C)``)."""
        return self.head(x, pre_logits=pre_logits)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))
