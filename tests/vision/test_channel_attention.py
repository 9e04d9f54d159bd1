"""SE / ECA / CBAM match timm's modules with copied weights; CoordAtt matches the paper's code."""

from __future__ import annotations

import pytest
import torch
from attn_vision import (
    CBAM,
    CoordinateAttention,
    EfficientChannelAttention,
    SqueezeExcite,
    create_attn,
)
from timm.layers.cbam import CbamModule
from timm.layers.eca import EcaModule
from timm.layers.squeeze_excite import SEModule
from torch import nn

TOL = dict(atol=1e-5, rtol=1e-5)


@pytest.fixture
def copy_and_compare(randomize):
    """Randomise the reference, copy its state dict into ours (same names), compare outputs."""

    def check(ref: nn.Module, ours: nn.Module, x: torch.Tensor) -> None:
        randomize(ref, reinit=False)
        ours.load_state_dict(ref.state_dict(), strict=True)
        ref.eval(), ours.eval()
        with torch.no_grad():
            torch.testing.assert_close(ours(x), ref(x), **TOL)

    return check


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"rd_ratio": 0.25}, {"rd_channels": 12, "add_maxpool": True}, {"bias": False}],
)
def test_squeeze_excite_matches_timm(kwargs, copy_and_compare) -> None:
    copy_and_compare(SEModule(64, **kwargs), SqueezeExcite(64, **kwargs), torch.randn(2, 64, 9, 7))


@pytest.mark.parametrize(("channels", "k"), [(64, 3), (256, 5), (1024, 5)])
def test_eca_matches_timm(channels, k, copy_and_compare) -> None:
    ours = EfficientChannelAttention(channels)
    assert ours.kernel_size == k  # adaptive kernel size from the channel count
    copy_and_compare(EcaModule(channels), ours, torch.randn(2, channels, 5, 6))


def test_eca_fixed_kernel_matches_timm(copy_and_compare) -> None:
    copy_and_compare(
        EcaModule(None, kernel_size=7),
        EfficientChannelAttention(kernel_size=7),
        torch.randn(2, 32, 4, 4),
    )
    with pytest.raises(ValueError, match="odd"):
        EfficientChannelAttention(kernel_size=4)


@pytest.mark.parametrize("kwargs", [{}, {"rd_ratio": 0.25, "spatial_kernel_size": 3}])
def test_cbam_matches_timm(kwargs, copy_and_compare) -> None:
    copy_and_compare(CbamModule(64, **kwargs), CBAM(64, **kwargs), torch.randn(2, 64, 10, 8))


class _PaperCoordAtt(nn.Module):
    """The authors' CoordAtt (github.com/houqb/CoordAttention), used as the reference."""

    def __init__(self, inp: int, oup: int, reduction: int = 32) -> None:
        super().__init__()
        self.pool_h = nn.AdaptiveAvgPool2d((None, 1))
        self.pool_w = nn.AdaptiveAvgPool2d((1, None))
        mip = max(8, inp // reduction)
        self.conv1 = nn.Conv2d(inp, mip, kernel_size=1, stride=1, padding=0)
        self.bn1 = nn.BatchNorm2d(mip)
        self.act = nn.Hardswish()  # h_swish: x * relu6(x + 3) / 6
        self.conv_h = nn.Conv2d(mip, oup, kernel_size=1, stride=1, padding=0)
        self.conv_w = nn.Conv2d(mip, oup, kernel_size=1, stride=1, padding=0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x
        n, c, h, w = x.size()
        x_h = self.pool_h(x)
        x_w = self.pool_w(x).permute(0, 1, 3, 2)
        y = torch.cat([x_h, x_w], dim=2)
        y = self.act(self.bn1(self.conv1(y)))
        x_h, x_w = torch.split(y, [h, w], dim=2)
        x_w = x_w.permute(0, 1, 3, 2)
        a_h = self.conv_h(x_h).sigmoid()
        a_w = self.conv_w(x_w).sigmoid()
        return identity * a_w * a_h


@pytest.mark.parametrize("channels", [64, 512])
def test_coordinate_attention_matches_the_papers_code(channels, copy_and_compare) -> None:
    ours = CoordinateAttention(channels)
    assert ours.conv1.out_channels == max(8, channels // 32)
    copy_and_compare(_PaperCoordAtt(channels, channels), ours, torch.randn(2, channels, 6, 9))


def test_coordinate_attention_gates_are_separable(randomize) -> None:
    """out / x factorises into a per-row gate times a per-column gate."""
    m = randomize(CoordinateAttention(16), reinit=False).eval()
    x = torch.rand(1, 16, 5, 7) + 0.5
    with torch.no_grad():
        g = m(x) / x  # (1, C, H, W) = a_h (1, C, H, 1) * a_w (1, C, 1, W)
    rank1 = g[:, :, :, :1] * g[:, :, :1, :] / g[:, :, :1, :1]
    torch.testing.assert_close(g, rank1, **TOL)


@pytest.mark.parametrize("kind", ["se", "eca", "cbam", "coord"])
def test_modules_keep_shape_and_pass_gradients(kind) -> None:
    m = create_attn(kind, 32)
    x = torch.randn(2, 32, 7, 5, requires_grad=True)
    y = m(x)
    assert y.shape == x.shape
    y.square().sum().backward()
    assert torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0
    for name, p in m.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name


def test_create_attn_names() -> None:
    assert create_attn(None, 8) is None
    assert isinstance(create_attn("se", 8, rd_ratio=0.5), SqueezeExcite)
    with pytest.raises(ValueError, match="unknown attention 'nope'"):
        create_attn("nope", 8)
    with pytest.raises(ValueError, match="unknown activation"):
        SqueezeExcite(8, act_layer="nope")
