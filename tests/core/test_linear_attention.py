"""Tests for attn_core.linear_attention: exact quadratic references, FAVOR+ convergence, modules."""

from __future__ import annotations

import io
import math

import pytest
import torch
from attn_core.linear_attention import (
    LinearAttention,
    PerformerAttention,
    elu_feature_map,
    favor_features,
    linear_attention,
    orthogonal_random_features,
)

f64 = torch.float64


def _qkv(B=2, H=3, L=11, Fw=5, Dv=4, seed=0, dtype=f64):
    g = torch.Generator().manual_seed(seed)
    q = elu_feature_map(torch.randn(B, H, L, Fw, generator=g, dtype=dtype))
    k = elu_feature_map(torch.randn(B, H, L, Fw, generator=g, dtype=dtype))
    v = torch.randn(B, H, L, Dv, generator=g, dtype=dtype)
    return q, k, v


def _quadratic(q, k, v, causal=False):
    """Explicit (L, L) form: phi_q phi_k^T, row-normalised, then @ v."""
    a = q @ k.transpose(-2, -1)
    if causal:
        L = q.shape[-2]
        a = a * torch.ones(L, L, dtype=torch.bool).tril()
    return (a / a.sum(-1, keepdim=True)) @ v


def _softmax_attention(q, k, v, causal=False):
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        L = q.shape[-2]
        s = s.masked_fill(~torch.ones(L, L, dtype=torch.bool).tril(), float("-inf"))
    return torch.softmax(s, dim=-1) @ v


# ---------------------------------------------------------------- linear_attention


def test_noncausal_matches_quadratic():
    q, k, v = _qkv()
    out = linear_attention(q, k, v)
    assert out.shape == v.shape
    torch.testing.assert_close(out, _quadratic(q, k, v), atol=1e-5, rtol=0)


@pytest.mark.parametrize("chunk_size", [1, 3, 4, 64])
def test_causal_matches_masked_quadratic(chunk_size):
    q, k, v = _qkv(L=13)  # 13 is not a multiple of 3, 4 or 64
    out = linear_attention(q, k, v, causal=True, chunk_size=chunk_size)
    torch.testing.assert_close(out, _quadratic(q, k, v, causal=True), atol=1e-5, rtol=0)


def test_causal_long_sequence_chunking_is_exact():
    q, k, v = _qkv(B=1, H=2, L=1000, Fw=8, Dv=8, dtype=torch.float32)
    one_chunk = linear_attention(q, k, v, causal=True, chunk_size=1000)
    torch.testing.assert_close(linear_attention(q, k, v, causal=True), one_chunk)
    torch.testing.assert_close(linear_attention(q, k, v, causal=True, chunk_size=37), one_chunk)


def test_causal_gradients_match_quadratic():
    q, k, v = (t.requires_grad_() for t in _qkv(L=10))
    linear_attention(q, k, v, causal=True, chunk_size=3).square().sum().backward()
    grads = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    _quadratic(q, k, v, causal=True).square().sum().backward()
    for got, t in zip(grads, (q, k, v), strict=True):
        torch.testing.assert_close(got, t.grad, atol=1e-8, rtol=1e-6)


@pytest.mark.parametrize("causal", [False, True])
def test_key_padding_equals_unpadded(causal):
    q, k, v = _qkv(B=2, L=9)
    mask = torch.zeros(2, 9, dtype=torch.bool)
    mask[0, 6:] = True  # right padding
    mask[1, [1, 4, 5]] = True  # holes anywhere
    out = linear_attention(q, k, v, causal=causal, key_padding_mask=mask, chunk_size=4)
    for b in range(2):
        keep = ~mask[b]
        sub = [t[b : b + 1, :, keep] for t in (q, k, v)]
        ref = linear_attention(*sub, causal=causal, chunk_size=4)
        torch.testing.assert_close(out[b : b + 1, :, keep], ref, atol=1e-10, rtol=0)


def test_all_keys_padded_is_finite_zero():
    q, k, v = _qkv(B=1, L=5)
    out = linear_attention(q, k, v, key_padding_mask=torch.ones(1, 5, dtype=torch.bool))
    assert torch.equal(out, torch.zeros_like(out))


def test_half_inputs_computed_in_float32():
    q, k, v = _qkv(L=20, dtype=torch.float32)
    ref = linear_attention(q, k, v, causal=True)
    out = linear_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), causal=True)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), ref, atol=3e-2, rtol=3e-2)


def test_bad_shapes_raise():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="expected q, k"):
        linear_attention(q, k[:, :, :-1], v)


# ---------------------------------------------------------------- FAVOR+


def _favor_error(num_features, seed, causal=False, L=64, D=16):
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(1, 2, L, D, generator=g, dtype=f64) * 0.5 for _ in range(2))
    v = torch.randn(1, 2, L, D, generator=g, dtype=f64)
    proj = orthogonal_random_features(num_features, D, generator=g, dtype=f64)
    qf = favor_features(q, proj, is_query=True)
    kf = favor_features(k, proj, is_query=False)
    out = linear_attention(qf, kf, v, causal=causal)
    return (out - _softmax_attention(q, k, v, causal)).abs().mean().item()


def test_favor_error_shrinks_with_more_features():
    errors = [sum(_favor_error(m, s) for s in range(3)) / 3 for m in (16, 256, 4096)]
    # measured: ~0.041, ~0.012, ~0.0038 (error ~ 1 / sqrt(m))
    assert errors[0] > errors[1] > errors[2]
    assert errors[2] < errors[0] / 5
    assert errors[2] < 0.01


def test_favor_causal_close_to_causal_softmax():
    assert _favor_error(4096, seed=7, causal=True) < 0.015


def test_favor_features_positive_and_shift_invariant():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 6, 8, generator=g, dtype=f64)
    proj = orthogonal_random_features(32, 8, generator=g, dtype=f64)
    phi = favor_features(x, proj, is_query=False)
    assert phi.shape == (2, 6, 32) and (phi > 0).all()
    # stabiliser uses only detached maxima: features stay differentiable and finite
    big = (x * 30).requires_grad_()
    favor_features(big, proj, is_query=True).sum().backward()
    assert torch.isfinite(big.grad).all()


def test_orthogonal_random_features_blocks():
    g = torch.Generator().manual_seed(0)
    w = orthogonal_random_features(20, 8, generator=g, dtype=f64)  # blocks of 8, 8, 4 rows
    assert w.shape == (20, 8)
    for block in (w[:8], w[8:16], w[16:]):
        gram = block @ block.T
        off_diag = gram - torch.diag(torch.diagonal(gram))
        assert off_diag.abs().max() < 1e-5
    assert not torch.allclose(w.norm(dim=-1), w.norm(dim=-1)[0])  # chi-distributed norms
    again = orthogonal_random_features(20, 8, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(again.double(), w)  # seeded -> reproducible


# ---------------------------------------------------------------- modules


def _modules(causal):
    torch.manual_seed(0)
    return [
        LinearAttention(16, 4, causal=causal),
        PerformerAttention(16, 4, num_features=32, causal=causal),
    ]


@pytest.mark.parametrize("causal", [False, True])
def test_module_shape_and_gradients(causal):
    x = torch.randn(2, 7, 16)
    for mod in _modules(causal):
        out = mod(x, key_padding_mask=torch.tensor([[False] * 7, [False] * 5 + [True] * 2]))
        assert out.shape == x.shape
        out.square().sum().backward()
        for name, p in mod.named_parameters():
            assert p.grad is not None and torch.isfinite(p.grad).all(), name
            assert p.grad.abs().sum() > 0, name


@pytest.mark.parametrize("future_scale", [1.0, 5.0, 20.0])
def test_causal_module_ignores_future(future_scale):
    # large future tokens once leaked into the past through the Performer key stabiliser
    x = torch.randn(2, 10, 16)
    x2 = x.clone()
    x2[:, 6:] = torch.randn(2, 4, 16) * future_scale
    for mod in _modules(causal=True):
        mod.eval()
        torch.testing.assert_close(mod(x)[:, :6], mod(x2)[:, :6], atol=0, rtol=0)
        assert not torch.allclose(mod(x)[:, 6:], mod(x2)[:, 6:])


def test_module_layer_names():
    for mod in _modules(causal=False):
        assert {n for n, _ in mod.named_children()} == {"qkv", "proj"}
        assert mod.qkv.weight.shape == (48, 16) and mod.proj.weight.shape == (16, 16)


@pytest.mark.parametrize("cls", [LinearAttention, PerformerAttention])
def test_module_bad_config_raises(cls):
    with pytest.raises(ValueError, match="divisible"):
        cls(10, 3)
    with pytest.raises(ValueError, match="expected x"):
        cls(16, 4)(torch.randn(2, 5, 8))
    with pytest.raises(ValueError, match="expected x"):
        cls(16, 4)(torch.randn(5, 16))


def test_performer_projection_saved_and_redrawn():
    torch.manual_seed(0)
    mod = PerformerAttention(16, 4, num_features=24).eval()
    assert mod.projection.shape == (24, 4) and "projection" in mod.state_dict()
    x = torch.randn(1, 5, 16)
    buf = io.BytesIO()
    torch.save(mod.state_dict(), buf)
    buf.seek(0)
    clone = PerformerAttention(16, 4, num_features=24).eval()
    clone.load_state_dict(torch.load(buf))
    torch.testing.assert_close(clone(x), mod(x))

    before = mod.projection.clone()
    mod.redraw_projection(torch.Generator().manual_seed(3))
    assert not torch.equal(before, mod.projection)

    redrawing = PerformerAttention(16, 4, num_features=24, redraw=True)
    p0 = redrawing.projection.clone()
    redrawing.eval()(x)
    assert torch.equal(p0, redrawing.projection)  # eval: fixed
    redrawing.train()(x)
    assert not torch.equal(p0, redrawing.projection)  # training forward: fresh draw
