"""Channel and spatial attention for CNN feature maps: SE, ECA, CBAM, Coordinate Attention.

Shape legend: ``B`` batch, ``C`` channels, ``H`` / ``W`` height / width, ``R`` reduced
(bottleneck) channels, ``k`` 1-D / 2-D kernel size.

Each module maps ``(B, C, H, W) -> (B, C, H, W)``: it computes a gate in ``(0, 1)``
from pooled statistics and multiplies the input by it, so any of them drops into a
residual block (see :mod:`attn_vision.resnet`). Arguments and parameter names follow
timm (``channels`` first, ``rd_ratio``, ``rd_channels``, ``rd_divisor``, ``act_layer``,
``gate_layer``; ``fc1`` / ``fc2`` / ``conv`` / ``bn``) so timm's ``SEModule``,
``EcaModule`` and ``CbamModule`` weights load unchanged. "Attention" here is gating,
not softmax(QK^T)V, so these do not go through :func:`attn_core.attention`.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable

import torch
from torch import nn

__all__ = [
    "CBAM",
    "ChannelAttention",
    "CoordinateAttention",
    "EfficientChannelAttention",
    "SpatialAttention",
    "SqueezeExcite",
    "create_attn",
    "make_divisible",
]

LayerSpec = str | Callable[..., nn.Module] | None

_LAYERS: dict[str, Callable[[], nn.Module]] = {
    "relu": nn.ReLU,
    "silu": nn.SiLU,
    "swish": nn.SiLU,
    "gelu": nn.GELU,
    "hard_swish": nn.Hardswish,
    "sigmoid": nn.Sigmoid,
    "hard_sigmoid": nn.Hardsigmoid,
    "tanh": nn.Tanh,
}


def _layer(spec: LayerSpec) -> nn.Module:
    """An activation / gate module from a name (``"sigmoid"``) or a class (``nn.ReLU``)."""
    if spec is None:
        return nn.Identity()
    if isinstance(spec, str):
        if spec not in _LAYERS:
            raise ValueError(f"unknown activation {spec!r}; expected one of {sorted(_LAYERS)}")
        return _LAYERS[spec]()
    return spec()


def make_divisible(
    v: float, divisor: int = 8, min_value: int | None = None, round_limit: float = 0.9
) -> int:
    """Round ``v`` to a multiple of ``divisor``, at least ``min_value`` and ``round_limit * v``."""
    min_value = min_value or divisor
    new_v = max(min_value, int(v + divisor / 2) // divisor * divisor)
    if new_v < round_limit * v:
        new_v += divisor
    return new_v


class SqueezeExcite(nn.Module):
    """Squeeze-and-Excitation (Hu et al. 2018): ``x * gate(fc2(act(fc1(mean_hw(x)))))``.

    Args:
        channels: ``C``.
        rd_ratio: bottleneck ``R = C * rd_ratio`` (rounded to ``rd_divisor``).
        rd_channels: set ``R`` directly.
        add_maxpool: squeeze with ``0.5 * (mean + max)`` instead of the mean.
        bias: biases in the 1x1 convolutions.
        act_layer, norm_layer, gate_layer: bottleneck activation, optional norm, gate.
    """

    def __init__(
        self,
        channels: int,
        rd_ratio: float = 1.0 / 16,
        rd_channels: int | None = None,
        rd_divisor: int = 8,
        add_maxpool: bool = False,
        bias: bool = True,
        act_layer: LayerSpec = nn.ReLU,
        norm_layer: Callable[[int], nn.Module] | None = None,
        gate_layer: LayerSpec = "sigmoid",
    ) -> None:
        super().__init__()
        self.add_maxpool = add_maxpool
        if not rd_channels:
            rd_channels = make_divisible(channels * rd_ratio, rd_divisor, round_limit=0.0)
        self.fc1 = nn.Conv2d(channels, rd_channels, kernel_size=1, bias=bias)
        self.bn = norm_layer(rd_channels) if norm_layer is not None else nn.Identity()
        self.act = _layer(act_layer)
        self.fc2 = nn.Conv2d(rd_channels, channels, kernel_size=1, bias=bias)
        self.gate = _layer(gate_layer)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = x.mean((2, 3), keepdim=True)  # (B, C, 1, 1) squeeze
        if self.add_maxpool:
            s = 0.5 * s + 0.5 * x.amax((2, 3), keepdim=True)
        s = self.fc2(self.act(self.bn(self.fc1(s))))  # (B, C, 1, 1) excite
        return x * self.gate(s)


class EfficientChannelAttention(nn.Module):
    """ECA (Wang et al. 2020): a 1-D conv across the channel means instead of an MLP.

    With ``channels`` given the kernel size adapts to it,
    ``k = odd(|log2(C) + beta| / gamma)`` (at least 3); otherwise ``kernel_size`` is used.
    """

    def __init__(
        self,
        channels: int | None = None,
        kernel_size: int = 3,
        gamma: float = 2,
        beta: float = 1,
        gate_layer: LayerSpec = "sigmoid",
    ) -> None:
        super().__init__()
        if channels is not None:
            t = int(abs(math.log(channels, 2) + beta) / gamma)
            kernel_size = max(t if t % 2 else t + 1, 3)
        if kernel_size % 2 != 1:
            raise ValueError(f"kernel_size must be odd, got {kernel_size}")
        self.kernel_size = kernel_size
        self.conv = nn.Conv1d(1, 1, kernel_size, padding=(kernel_size - 1) // 2, bias=False)
        self.gate = _layer(gate_layer)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, C = x.shape[:2]
        y = self.conv(x.mean((2, 3)).view(B, 1, C))  # (B, 1, C): each channel sees k neighbours
        return x * self.gate(y).view(B, C, 1, 1)


class ChannelAttention(nn.Module):
    """CBAM's channel half: a shared MLP over the avg- and max-pooled channel vectors."""

    def __init__(
        self,
        channels: int,
        rd_ratio: float = 1.0 / 16,
        rd_channels: int | None = None,
        rd_divisor: int = 1,
        act_layer: LayerSpec = nn.ReLU,
        gate_layer: LayerSpec = "sigmoid",
        mlp_bias: bool = False,
    ) -> None:
        super().__init__()
        if not rd_channels:
            rd_channels = make_divisible(channels * rd_ratio, rd_divisor, round_limit=0.0)
        self.fc1 = nn.Conv2d(channels, rd_channels, 1, bias=mlp_bias)
        self.act = _layer(act_layer)
        self.fc2 = nn.Conv2d(rd_channels, channels, 1, bias=mlp_bias)
        self.gate = _layer(gate_layer)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        avg = self.fc2(self.act(self.fc1(x.mean((2, 3), keepdim=True))))  # (B, C, 1, 1)
        mx = self.fc2(self.act(self.fc1(x.amax((2, 3), keepdim=True))))
        return x * self.gate(avg + mx)


class SpatialAttention(nn.Module):
    """CBAM's spatial half: a ``k x k`` conv + BN over the channel mean and max maps."""

    def __init__(self, kernel_size: int = 7, gate_layer: LayerSpec = "sigmoid") -> None:
        super().__init__()
        # conv.conv / conv.bn: timm's ConvNormAct names, so CbamModule weights load as-is
        self.conv = nn.Sequential(
            OrderedDict(
                conv=nn.Conv2d(2, 1, kernel_size, padding=kernel_size // 2, bias=False),
                bn=nn.BatchNorm2d(1),
            )
        )
        self.gate = _layer(gate_layer)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = torch.cat(
            [x.mean(dim=1, keepdim=True), x.amax(dim=1, keepdim=True)], dim=1
        )  # (B, 2, H, W)
        return x * self.gate(self.conv(s))  # (B, 1, H, W) gate broadcast over C


class CBAM(nn.Module):
    """Convolutional Block Attention Module (Woo et al. 2018): channel gate, then spatial gate."""

    def __init__(
        self,
        channels: int,
        rd_ratio: float = 1.0 / 16,
        rd_channels: int | None = None,
        rd_divisor: int = 1,
        spatial_kernel_size: int = 7,
        act_layer: LayerSpec = nn.ReLU,
        gate_layer: LayerSpec = "sigmoid",
        mlp_bias: bool = False,
    ) -> None:
        super().__init__()
        self.channel = ChannelAttention(
            channels, rd_ratio, rd_channels, rd_divisor, act_layer, gate_layer, mlp_bias
        )
        self.spatial = SpatialAttention(spatial_kernel_size, gate_layer)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.spatial(self.channel(x))


class CoordinateAttention(nn.Module):
    """Coordinate Attention (Hou et al. 2021): gates that keep one spatial direction.

    Average-pool along W to get a ``(B, C, H, 1)`` column profile and along H to get a
    ``(B, C, 1, W)`` row profile, encode both with one shared 1x1 conv + BN + h-swish,
    then split them back into a per-row gate ``a_h`` and a per-column gate ``a_w``:
    ``out = x * a_h * a_w``. Names follow the authors' code (``conv1``, ``bn1``,
    ``conv_h``, ``conv_w``); ``R = max(min_channels, C * rd_ratio)``.
    """

    def __init__(
        self,
        channels: int,
        rd_ratio: float = 1.0 / 32,
        rd_channels: int | None = None,
        min_channels: int = 8,
        act_layer: LayerSpec = nn.Hardswish,
        gate_layer: LayerSpec = "sigmoid",
    ) -> None:
        super().__init__()
        if not rd_channels:
            rd_channels = max(min_channels, int(channels * rd_ratio))
        self.conv1 = nn.Conv2d(channels, rd_channels, 1)
        self.bn1 = nn.BatchNorm2d(rd_channels)
        self.act = _layer(act_layer)
        self.conv_h = nn.Conv2d(rd_channels, channels, 1)
        self.conv_w = nn.Conv2d(rd_channels, channels, 1)
        self.gate = _layer(gate_layer)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, C, H, W = x.shape
        x_h = x.mean(dim=3, keepdim=True)  # (B, C, H, 1)
        x_w = x.mean(dim=2, keepdim=True).transpose(2, 3)  # (B, C, W, 1)
        y = self.act(self.bn1(self.conv1(torch.cat([x_h, x_w], dim=2))))  # (B, R, H + W, 1)
        y_h, y_w = y.split([H, W], dim=2)
        a_h = self.gate(self.conv_h(y_h))  # (B, C, H, 1)
        a_w = self.gate(self.conv_w(y_w.transpose(2, 3)))  # (B, C, 1, W)
        return x * a_h * a_w


_ATTN: dict[str, type[nn.Module]] = {
    "se": SqueezeExcite,
    "eca": EfficientChannelAttention,
    "cbam": CBAM,
    "coord": CoordinateAttention,
}


def create_attn(attn_type: str | None, channels: int, **kwargs) -> nn.Module | None:
    """Build ``"se"``, ``"eca"``, ``"cbam"`` or ``"coord"`` attention (``None`` -> ``None``)."""
    if attn_type is None or attn_type == "":
        return None
    if attn_type not in _ATTN:
        raise ValueError(
            f"unknown attention {attn_type!r}; expected one of {sorted(_ATTN)} or None"
        )
    return _ATTN[attn_type](channels, **kwargs)
