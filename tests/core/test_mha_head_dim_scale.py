"""attn_core options T5 needs: ``MultiHeadAttention(head_dim=, scale=)`` (inner width
``H * hd`` other than ``E``, unscaled scores), ``TransformerBlock(attn_head_dim=, attn_scale=)``
(eager and fused paths) and the gated ``geglu_tanh`` MLP, each against the formula."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from attn_core import MultiHeadAttention, TransformerBlock, onednn
from attn_core.blocks import FeedForward
from attn_core.fast_inference import block_supported, release_packed_weights, run_blocks
from torch.testing import assert_close

TOL = {"atol": 1e-5, "rtol": 1e-5}


def _formula(x, ctx, wq, wk, wv, wo, heads, scale, mask=None):
    """softmax(scale * q k^T + mask) v over heads, written out; x (B, L, E) -> (B, L, E)."""
    B, L, _ = x.shape
    q = (x @ wq.T).view(B, L, heads, -1).transpose(1, 2)
    k = (ctx @ wk.T).view(B, ctx.shape[1], heads, -1).transpose(1, 2)
    v = (ctx @ wv.T).view(B, ctx.shape[1], heads, -1).transpose(1, 2)
    scores = scale * q @ k.transpose(-1, -2)
    if mask is not None:
        scores = scores + mask
    out = (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, L, -1)
    return out @ wo.T


@pytest.mark.parametrize("scale", [None, 1.0, 0.3])
def test_head_dim_and_scale_self_attention(scale):
    torch.manual_seed(0)
    E, H, hd = 30, 4, 12  # E not divisible by H: allowed once head_dim is given
    mha = MultiHeadAttention(E, H, head_dim=hd, scale=scale, bias=False).eval()
    assert mha.qkv.weight.shape == (3 * H * hd, E) and mha.proj.weight.shape == (E, H * hd)
    x = torch.randn(2, 9, E)
    bias = torch.randn(1, H, 9, 9)  # an additive float mask (T5's position bias)
    padding = torch.zeros(2, 9, dtype=torch.bool)
    padding[1, 6:] = True
    with torch.no_grad():
        out, _ = mha(x, attn_mask=bias, key_padding_mask=padding)
        wq, wk, wv = mha.qkv.weight.chunk(3)
        mask = bias + torch.where(padding, -math.inf, 0.0)[:, None, None, :]
        want = _formula(x, x, wq, wk, wv, mha.proj.weight, H, scale or hd**-0.5, mask)
    assert out.shape == (2, 9, E)
    assert_close(out, want, **TOL)
    # weights from the math backend honour the scale too
    _, weights = mha(x, need_weights=True)
    q = (x @ wq.T).view(2, 9, H, hd).transpose(1, 2)
    k = (x @ wk.T).view(2, 9, H, hd).transpose(1, 2)
    assert_close(weights, ((scale or hd**-0.5) * q @ k.transpose(-1, -2)).softmax(-1), **TOL)


def test_head_dim_cross_attention_and_inner_norm():
    torch.manual_seed(1)
    E, H, hd, C = 16, 2, 20, 10
    mha = MultiHeadAttention(E, H, head_dim=hd, kdim=C, vdim=C, scale=1.0, bias=False)
    assert mha.q_proj.weight.shape == (H * hd, E) and mha.k_proj.weight.shape == (H * hd, C)
    x, ctx = torch.randn(2, 5, E), torch.randn(2, 7, C)
    with torch.no_grad():
        out, _ = mha(x, ctx)
        w = (mha.q_proj.weight, mha.k_proj.weight, mha.v_proj.weight, mha.proj.weight)
        assert_close(out, _formula(x, ctx, *w, H, 1.0), **TOL)
    normed = MultiHeadAttention(E, H, head_dim=hd, inner_norm=torch.nn.LayerNorm)
    assert normed.norm.normalized_shape == (H * hd,)
    assert normed(x)[0].shape == (2, 5, E)


def test_head_dim_checks():
    with pytest.raises(ValueError, match="divisible"):
        MultiHeadAttention(30, 4)
    with pytest.raises(ValueError, match="head_dim"):
        MultiHeadAttention(32, 4, head_dim=0)
    assert "head_dim=12" in repr(MultiHeadAttention(30, 4, head_dim=12, scale=1.0))


@pytest.mark.parametrize("gate_last", [True, False])
def test_geglu_tanh_feed_forward(gate_last):
    torch.manual_seed(2)
    ff = FeedForward(8, 16, act="geglu_tanh", bias=False, gate_last=gate_last)
    assert ff.gated and ff.fc1.weight.shape == (32, 8)
    x = torch.randn(3, 8)
    first, second = (x @ ff.fc1.weight.T).chunk(2, dim=-1)
    value, gate = (first, second) if gate_last else (second, first)
    want = (F.gelu(gate, approximate="tanh") * value) @ ff.fc2.weight.T
    assert_close(ff(x), want, **TOL)


def test_block_passes_head_dim_and_scale_and_fused_path_agrees():
    torch.manual_seed(3)
    kw = dict(bias=False, mlp_bias=False, attn_head_dim=24, attn_scale=1.0)
    blocks = torch.nn.ModuleList(TransformerBlock(64, 4, **kw) for _ in range(2)).eval()
    assert blocks[0].attn.inner_dim == 96 and blocks[0].attn.scale == 1.0
    x = torch.randn(2, 7, 64)
    mask = torch.randn(1, 4, 7, 7)
    with torch.no_grad():
        eager = blocks[1](blocks[0](x, attn_mask=mask), attn_mask=mask)
        blk, a = blocks[0], blocks[0].attn
        h = blk.norm1(x)
        y = x + _formula(h, h, *a.qkv.weight.chunk(3), a.proj.weight, 4, 1.0, mask)
        assert_close(blk(x, attn_mask=mask), y + blk.mlp(blk.norm2(y)), **TOL)
    if not (onednn._ONEDNN and all(block_supported(b) for b in blocks)):
        pytest.skip("no oneDNN fast path here")
    release_packed_weights()
    with torch.inference_mode():
        fused = run_blocks(blocks, x, attn_mask=mask)
    assert len(onednn._packed) == 8  # the fused kernels ran
    assert_close(fused, eager, **TOL)
