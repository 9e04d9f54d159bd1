"""The fast path's kernel choices give the plain numbers: ``fused_linear`` on many rows (MKL's
product, the activation and residual after it) and on few (oneDNN's, packed weights), and
``channel_multiplier_conv`` (a grouped convolution with one input channel per group)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from attn_core import QuickGELU, onednn
from attn_core.fast_inference import channel_multiplier_conv, release_packed_weights
from torch import nn
from torch.testing import assert_close

TOL = {"atol": 1e-4, "rtol": 1e-4}


@pytest.mark.parametrize("act", [None, nn.GELU(), nn.GELU("tanh"), nn.ReLU(), QuickGELU()])
@pytest.mark.parametrize("rows", [7, onednn._MKL_ROWS + 3])
def test_fused_linear_both_kernels(act, rows):
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
    assert (w in onednn._packed) == (rows < onednn._MKL_ROWS)  # which kernel ran


@pytest.mark.parametrize(("multiplier", "stride", "bias"), [(2, 2, True), (3, 1, False)])
def test_channel_multiplier_conv(multiplier, stride, bias):
    torch.manual_seed(0)
    conv = nn.Conv2d(6, 6 * multiplier, 5, stride, padding=2, groups=6, bias=bias).eval()
    x = torch.randn(2, 6, 13, 11)
    with torch.no_grad():
        assert_close(channel_multiplier_conv(conv, x), conv(x), **TOL)
