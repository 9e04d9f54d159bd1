import logging
import math
import os
import subprocess
import sys

import attn_core
import pytest
import torch
import torch.nn.functional as F
from attn_core import AttentionBackendError, attention, masks, scaled_dot_product_attention
from torch.testing import assert_close

CPU_BACKENDS = [b for b in ("math", "sdpa", "flex") if b in attn_core.available_backends()]


def qkv(B=2, H=4, Lq=6, Lk=7, D=8, Hkv=None, requires_grad=False):
    Hkv = H if Hkv is None else Hkv
    q = torch.randn(B, H, Lq, D, requires_grad=requires_grad)
    k = torch.randn(B, Hkv, Lk, D, requires_grad=requires_grad)
    v = torch.randn(B, Hkv, Lk, D, requires_grad=requires_grad)
    return q, k, v


def test_reference_matches_the_formula_and_is_batched_over_any_leading_dims():
    q, k, v = torch.randn(3, 5, 8), torch.randn(3, 6, 8), torch.randn(3, 6, 4)
    out, w = scaled_dot_product_attention(q, k, v)
    expected_w = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(8), dim=-1)
    assert_close(w, expected_w)
    assert_close(out, expected_w @ v)
    assert_close(w.sum(-1), torch.ones(3, 5))
    out5, _ = scaled_dot_product_attention(q[None, None], k[None, None], v[None, None])
    assert_close(out5[0, 0], out)


@pytest.mark.parametrize("case", ["none", "bool", "float", "causal", "scale"])
def test_reference_matches_torch_sdpa(case):
    q, k, v = qkv(Lq=6, Lk=6)
    mask, kwargs = None, {}
    if case == "bool":
        mask = torch.rand(2, 1, 6, 6) > 0.3
        mask[..., 0] = True  # torch keeps NaN-free only when every row sees a key
    elif case == "float":
        mask = torch.randn(2, 4, 6, 6)
    elif case == "causal":
        kwargs["is_causal"] = True
    elif case == "scale":
        kwargs["scale"] = 0.3
    out, _ = scaled_dot_product_attention(q, k, v, mask, **kwargs)
    assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask, **kwargs))


CASES = ["none", "bool_mask", "float_mask", "key_padding", "causal", "causal_cache", "mixed", "gqa"]


def build_case(case):
    Lq, Lk, Hkv = 6, 6, None
    if case == "causal_cache":
        Lq, Lk = 3, 7
    if case == "gqa":
        Hkv = 2
    q, k, v = qkv(Lq=Lq, Lk=Lk, Hkv=Hkv)
    kwargs = {}
    if case in ("bool_mask", "mixed"):
        kwargs["attn_mask"] = torch.rand(Lq, Lk) > 0.4
    if case == "float_mask":
        kwargs["attn_mask"] = torch.randn(2, 1, Lq, Lk)
    if case in ("key_padding", "mixed", "gqa"):
        kwargs["key_padding_mask"] = masks.padding_mask([Lk, Lk - 2])
    if case in ("causal", "causal_cache", "mixed", "gqa"):
        kwargs["is_causal"] = True
    return q, k, v, kwargs


def dense_reference(q, k, v, attn_mask=None, key_padding_mask=None, is_causal=False):
    """Expand GQA by repetition, fold every mask into one bool mask, call the reference."""
    H = q.shape[1]
    k = k.repeat_interleave(H // k.shape[1], dim=1)
    v = v.repeat_interleave(H // v.shape[1], dim=1)
    mask = attn_mask
    if key_padding_mask is not None:
        mask = masks.combine_masks(mask, ~key_padding_mask[:, None, None, :])
    out, _ = scaled_dot_product_attention(q, k, v, mask, is_causal=is_causal)
    return out


@pytest.mark.parametrize("backend", CPU_BACKENDS + [None])
@pytest.mark.parametrize("case", CASES)
def test_attention_matches_reference_on_every_backend(backend, case):
    q, k, v, kwargs = build_case(case)
    out = attention(q, k, v, backend=backend, **kwargs)
    assert_close(out, dense_reference(q, k, v, **kwargs), atol=1e-5, rtol=1e-5)
    assert attn_core.last_backend() == (backend or "sdpa")


def test_cross_attention_shapes_match_torch_sdpa():
    # Lq != Lk and Dv != D, as in encoder-decoder cross-attention
    q, k, v = torch.randn(2, 4, 5, 8), torch.randn(2, 4, 9, 8), torch.randn(2, 4, 9, 12)
    mask = torch.rand(2, 1, 5, 9) > 0.3
    mask[..., 0] = True
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert_close(scaled_dot_product_attention(q, k, v, mask)[0], ref)
    for backend in CPU_BACKENDS:
        assert_close(attention(q, k, v, attn_mask=mask, backend=backend), ref, atol=1e-5, rtol=1e-5)


def test_gqa_matches_torch_sdpa_with_expanded_heads():
    q, k, v = qkv(H=8, Hkv=2, Lq=7, Lk=7)
    ref = F.scaled_dot_product_attention(
        q, k.repeat_interleave(4, dim=1), v.repeat_interleave(4, dim=1), is_causal=True
    )
    for backend in CPU_BACKENDS:
        assert_close(attention(q, k, v, is_causal=True, backend=backend), ref)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("kind", ["bool", "float", "key_padding"])
def test_fully_masked_rows_give_zeros_and_finite_gradients(backend, kind):
    grad = backend != "flex"  # FlexAttention has no CPU backward
    q, k, v = qkv(Lq=5, Lk=6, requires_grad=grad)
    kwargs = {}
    if kind == "bool":
        mask = torch.rand(2, 1, 5, 6) > 0.5
        mask[:, :, 2] = False
        mask[:, :, 3, 0] = True
        kwargs["attn_mask"] = mask
        dead = (slice(None), slice(None), 2)
    elif kind == "float":
        mask = torch.randn(2, 4, 5, 6)
        mask[0, 1, 4] = float("-inf")
        kwargs["attn_mask"] = mask
        dead = (0, 1, 4)
    else:
        kwargs["key_padding_mask"] = masks.padding_mask([6, 0])
        dead = (1,)
    out = attention(q, k, v, backend=backend, **kwargs)
    assert not out.isnan().any()
    assert (out[dead] == 0).all()
    assert_close(out, dense_reference(q, k, v, **kwargs), atol=1e-5, rtol=1e-5)
    if grad:
        out.square().sum().backward()
        for t in (q, k, v):
            assert torch.isfinite(t.grad).all()
        assert (q.grad[dead] == 0).all()


def test_need_weights_uses_math_and_returns_weights():
    q, k, v = qkv()
    kpm = masks.padding_mask([7, 4])
    out, w = attention(q, k, v, key_padding_mask=kpm, need_weights=True)
    assert attn_core.last_backend() == "math"
    assert w.shape == (2, 4, 6, 7)
    assert_close(w.sum(-1), torch.ones(2, 4, 6))
    assert (w[1, :, :, 4:] == 0).all()
    assert_close(out, attention(q, k, v, key_padding_mask=kpm, backend="sdpa"))
    with pytest.raises(AttentionBackendError, match="need_weights"):
        attention(q, k, v, need_weights=True, backend="sdpa")


def test_use_backend_context_manager_forces_and_restores():
    q, k, v = qkv()
    with attn_core.use_backend("math"):
        attention(q, k, v)
        assert attn_core.last_backend() == "math"
        with attn_core.use_backend(None):
            attention(q, k, v)
            assert attn_core.last_backend() == "sdpa"
    attention(q, k, v)
    assert attn_core.last_backend() == "sdpa"
    with pytest.raises(AttentionBackendError, match="unknown attention backend 'fast'"):
        attn_core.use_backend("fast").__enter__()


def test_forced_backend_that_cannot_serve_raises():
    q, k, v = qkv()
    with pytest.raises(AttentionBackendError, match="flash_attn"):
        attention(q, k, v, backend="flash_attn")  # CPU float32: never servable here
    if "flex" in CPU_BACKENDS:
        with pytest.raises(AttentionBackendError, match="dropout"):
            attention(q, k, v, dropout_p=0.1, backend="flex")


def test_debug_log_names_the_backend(caplog):
    q, k, v = qkv()
    with caplog.at_level(logging.DEBUG, logger="attn_core.attention"):
        attention(q, k, v, backend="math")
    assert "backend=math" in caplog.text


def test_environment_variable_forces_a_backend():
    code = (
        "import torch, attn_core; q = torch.randn(1, 1, 2, 4);"
        "attn_core.attention(q, q, q); print(attn_core.last_backend())"
    )
    env = dict(os.environ, ATTN_CORE_BACKEND="math")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.strip() == "math", out.stderr


def test_dropout_is_applied_only_when_asked():
    q, k, v = qkv()
    base = attention(q, k, v, backend="math")
    dropped = attention(q, k, v, dropout_p=0.5, backend="math")
    assert not torch.allclose(base, dropped)
    assert attention(q, k, v, dropout_p=0.5, backend="sdpa").shape == base.shape


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"attn_mask": torch.ones(5, 5, dtype=torch.bool)}, r"\(B, H, Lq, Lk\) = \(2, 4, 6, 7\)"),
        ({"attn_mask": torch.ones(6, 7, dtype=torch.int32)}, "bool"),
        ({"key_padding_mask": torch.zeros(2, 6, dtype=torch.bool)}, r"\(B, Lk\) = \(2, 7\)"),
    ],
)
def test_bad_masks_raise_value_error(kwargs, match):
    q, k, v = qkv()
    with pytest.raises(ValueError, match=match):
        attention(q, k, v, **kwargs)


def test_bad_tensors_raise_value_error():
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"q \(B, H, Lq, D\)"):
        attention(q[0], k[0], v[0])
    with pytest.raises(ValueError, match="multiple of key/value heads"):
        attention(q, k[:, :3], v[:, :3])
    with pytest.raises(ValueError, match="dtype"):
        attention(q, k.double(), v)
    with pytest.raises(ValueError, match="same B, Hkv, Lk"):
        attention(q, k, v[:, :, :5])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cuda_backends_match_math(dtype):
    q, k, v = (t.cuda().to(dtype) for t in qkv(Lq=64, Lk=64, D=64))
    ref = attention(q.float(), k.float(), v.float(), is_causal=True, backend="math")
    backends = ["sdpa", "flex"] + (["flash_attn"] if "flash_attn" in CPU_BACKENDS else [])
    for backend in backends:
        out = attention(q, k, v, is_causal=True, backend=backend)
        assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)
