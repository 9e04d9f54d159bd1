"""The fast path's kernel choices give the plain numbers: ``fused_linear`` on many rows (MKL's
product, the activation and residual after it) and on few (oneDNN's, packed weights),
``channel_multiplier_conv`` (a grouped convolution with one input channel per group),
``inplace_act``, and the channels-last convnet path (``channels_last``, ``pointwise_conv``)
with it switched on and off whatever this CPU's default."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from attn_core import QuickGELU, onednn
from attn_core.fast_inference import (
    channel_multiplier_conv,
    channels_last,
    inplace_act,
    pointwise_conv,
    release_packed_weights,
)
from torch import nn
from torch.testing import assert_close

TOL = {"atol": 1e-4, "rtol": 1e-4}
EXACT = {"atol": 1e-5, "rtol": 1e-5}
CL = torch.channels_last
MKL_ROWS = 64  # (set for the test: on AVX-512 CPUs the default is None, never MKL)


@pytest.mark.parametrize("act", [None, nn.GELU(), nn.GELU("tanh"), nn.ReLU(), QuickGELU()])
@pytest.mark.parametrize("rows", [7, MKL_ROWS + 3])
def test_fused_linear_both_kernels(act, rows, monkeypatch):
    monkeypatch.setattr(onednn, "_MKL_ROWS", MKL_ROWS)
    torch.manual_seed(0)
    x, w, b = torch.randn(1, rows, 48), torch.randn(40, 48) / 7, torch.randn(40)
    residual = torch.randn(1, rows, 40)
    expected = F.linear(x, w, b) if act is None else act(F.linear(x, w, b))
    release_packed_weights()
    with torch.inference_mode(False), torch.no_grad():
        w = w.clone()  # (a normal tensor: the packing cache keys on its version)
        assert_close(onednn.fused_linear(x, w, b, act), expected, **TOL)
        out = onednn.fused_linear(x, w, b, act, residual=residual.clone())
    assert_close(out, expected + residual, **TOL)
    assert (w in onednn._packed) == (rows < MKL_ROWS)  # which kernel ran


@pytest.mark.parametrize(("multiplier", "stride", "bias"), [(2, 2, True), (3, 1, False)])
@pytest.mark.parametrize("memory_format", [torch.contiguous_format, CL])
def test_channel_multiplier_conv(multiplier, stride, bias, memory_format):
    torch.manual_seed(0)
    conv = nn.Conv2d(6, 6 * multiplier, 5, stride, padding=2, groups=6, bias=bias).eval()
    x = torch.randn(2, 6, 13, 11).contiguous(memory_format=memory_format)
    with torch.no_grad():
        out = channel_multiplier_conv(conv, x)
        assert_close(out, conv(x), **TOL)
    assert out.is_contiguous(memory_format=memory_format)  # the layout it was given


@pytest.mark.parametrize(
    "act", [nn.GELU(), nn.GELU("tanh"), nn.ReLU(), nn.SiLU(), QuickGELU(), nn.Tanh(), None]
)
def test_inplace_act(act):
    x = torch.randn(3, 5, 7, generator=torch.Generator().manual_seed(0))
    expected = x.clone() if act is None else act(x)
    with torch.no_grad():
        y = x.clone()
        out = inplace_act(act, y)
        assert_close(out, expected, **EXACT)
        in_place = type(act) in (nn.GELU, nn.ReLU, nn.SiLU, QuickGELU)
        assert (out.data_ptr() == y.data_ptr()) == (in_place or act is None)
        assert torch.equal(y, out if in_place else x)  # (Tanh: a new tensor, y untouched)
        y = x.clone()
        assert_close(inplace_act(act, y, enabled=False), expected, **EXACT)
        assert torch.equal(y, x)  # switched off: the module call
    # under autograd: the module call (x untouched, a gradient)
    y = x.clone().requires_grad_()
    out = inplace_act(nn.GELU(), y)
    out.sum().backward()
    assert torch.equal(y.detach(), x) and y.grad is not None
    assert_close(out, F.gelu(x), **EXACT)


@pytest.fixture(params=[True, False], ids=["channels_last", "nchw"])
def layout(request, monkeypatch):
    """CHANNELS_LAST_CONVS set both ways (this CPU's default is one of them), oneDNN's
    products at every size (as on AVX-512)."""
    monkeypatch.setattr(onednn, "CHANNELS_LAST_CONVS", request.param)
    monkeypatch.setattr(onednn, "_MKL_ROWS", None)
    return request.param


def test_channels_last_only_where_it_is_faster(layout):
    x = torch.randn(2, 4, 5, 6)
    with torch.no_grad():
        assert channels_last(x).is_contiguous(memory_format=CL) == layout
        assert channels_last(x, enabled=False) is x
        one = x[0]
        assert channels_last(one) is one  # (not an image batch)
    assert channels_last(x) is x  # autograd on: no fast path


@pytest.mark.parametrize(
    ("act", "residual", "shape"),
    [
        (nn.GELU(), False, (2, 24, 5, 6)),
        (None, True, (2, 24, 5, 6)),
        (nn.ReLU(), True, (1, 24, 1, 1)),
    ],
)
def test_pointwise_conv_equals_the_modules(layout, act, residual, shape):
    torch.manual_seed(0)
    with torch.inference_mode(False):
        conv = nn.Conv2d(24, 40, 1).eval()  # (normal tensors: the packing cache)
    x = torch.randn(shape)
    res = torch.randn(shape[0], 40, *shape[2:]) if residual else None
    expected = conv(x) if act is None else act(conv(x))
    expected = expected if res is None else expected + res
    release_packed_weights()
    with torch.no_grad():
        for memory_format in (CL, torch.contiguous_format):
            xm = x.contiguous(memory_format=memory_format)
            rm = None if res is None else res.contiguous(memory_format=memory_format)
            out = pointwise_conv(conv, xm, act, rm)
            assert_close(out, expected, **EXACT)
            assert torch.equal(x, xm) and (res is None or torch.equal(res, rm))  # inputs kept
            if memory_format is CL:  # the product over the pixels ran where the flag is set
                assert (conv.weight in onednn._packed) == layout
                assert out.is_contiguous(memory_format=CL)
            release_packed_weights()
        assert_close(pointwise_conv(conv, x.contiguous(memory_format=CL), act, res,
                                    enabled=False), expected, **EXACT)  # fmt: skip
        assert conv.weight not in onednn._packed
        other = nn.Conv2d(24, 40, 1, stride=2).eval()  # not a 1x1 stride-1 conv: the module
        assert_close(pointwise_conv(other, x.contiguous(memory_format=CL)), other(x), **EXACT)
    assert_close(pointwise_conv(conv, x, act, res), expected, **EXACT)  # autograd: the modules
