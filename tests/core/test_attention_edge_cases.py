"""Edge cases of ``attention()`` on every CPU backend: empty inputs, half-precision
overflow on ``math``, and NaN / inf stored in padding keys and values."""

import functools
import math

import attn_core
import pytest
import torch
import torch.nn.functional as F
from attn_core import MultiHeadAttention, attention, masks, scaled_dot_product_attention
from attn_core.sliding_window import sliding_window_attention
from torch.testing import assert_close

BACKENDS = ["math", "sdpa", "flex"]


@functools.cache
def _flex_problem() -> str | None:
    """Why flex cannot run here, or None."""
    if "flex" not in attn_core.available_backends():
        return "torch.nn.attention.flex_attention is not available"
    try:
        q = torch.randn(1, 1, 4, 8)
        attention(q, q, q, key_padding_mask=torch.zeros(1, 4, dtype=torch.bool), backend="flex")
    except Exception as err:  # any failure to run means: skip, not fail
        return f"flex does not run here: {type(err).__name__}: {err}"
    return None


@pytest.fixture(params=BACKENDS)
def backend(request) -> str:
    if request.param == "flex" and _flex_problem():
        pytest.skip(_flex_problem())
    return request.param


def grads_ok(backend: str) -> bool:
    return backend != "flex"  # FlexAttention has no backward on CPU


def qkv(B=2, H=4, Lq=5, Lk=6, D=8, Dv=None, Hkv=None, requires_grad=False, dtype=torch.float32):
    Hkv = H if Hkv is None else Hkv
    Dv = D if Dv is None else Dv
    q = torch.randn(B, H, Lq, D, dtype=dtype, requires_grad=requires_grad)
    k = torch.randn(B, Hkv, Lk, D, dtype=dtype, requires_grad=requires_grad)
    v = torch.randn(B, Hkv, Lk, Dv, dtype=dtype, requires_grad=requires_grad)
    return q, k, v


# -- empty inputs ---------------------------------------------------------------------


def empty_mask_kwargs(kind: str, B: int, Lq: int, Lk: int) -> dict:
    if kind == "key_padding":
        return {"key_padding_mask": torch.zeros(B, Lk, dtype=torch.bool)}
    if kind == "bool_mask":
        return {"attn_mask": torch.ones(Lq, Lk, dtype=torch.bool)}
    if kind == "float_mask":
        return {"attn_mask": torch.zeros(B, 1, Lq, Lk)}
    if kind == "causal":
        return {"is_causal": True}
    return {}


@pytest.mark.parametrize(("Lq", "Lk"), [(0, 6), (5, 0), (0, 0)])
@pytest.mark.parametrize("kind", ["none", "key_padding", "bool_mask", "float_mask", "causal"])
@pytest.mark.parametrize("Hkv", [4, 2])
def test_empty_queries_or_keys_give_empty_or_zero_outputs(backend, Lq, Lk, kind, Hkv):
    grad = grads_ok(backend)
    q, k, v = qkv(Lq=Lq, Lk=Lk, Dv=3, Hkv=Hkv, requires_grad=grad)
    out = attention(q, k, v, backend=backend, **empty_mask_kwargs(kind, 2, Lq, Lk))
    assert attn_core.last_backend() == backend
    assert out.shape == (2, 4, Lq, 3) and out.dtype == q.dtype
    assert (out == 0).all()  # Lk == 0: every query is fully masked -> zeros
    if grad:
        (out.sum() + 1.0).backward()
        for t in (q, k, v):
            assert t.grad is not None and t.grad.shape == t.shape
            assert (t.grad == 0).all()


@pytest.mark.parametrize(("Lq", "Lk"), [(0, 6), (5, 0)])
def test_empty_inputs_return_empty_weights(Lq, Lk):
    q, k, v = qkv(Lq=Lq, Lk=Lk, Dv=3)
    kpm = torch.zeros(2, Lk, dtype=torch.bool)
    out, w = attention(q, k, v, key_padding_mask=kpm, is_causal=True, need_weights=True)
    assert out.shape == (2, 4, Lq, 3) and (out == 0).all()
    assert w.shape == (2, 4, Lq, Lk) and w.dtype == q.dtype
    # the reference itself, with and without a mask
    for mask in (None, torch.ones(Lq, Lk, dtype=torch.bool), torch.zeros(Lq, Lk)):
        out, w = scaled_dot_product_attention(q, k, v, mask)
        assert out.shape == (2, 4, Lq, 3) and (out == 0).all() and w.shape == (2, 4, Lq, Lk)


def test_forced_backend_still_refuses_empty_calls_it_could_not_serve():
    q, k, v = qkv(Lk=0)
    with pytest.raises(attn_core.AttentionBackendError, match="flash_attn"):
        attention(q, k, v, backend="flash_attn")  # CPU float32


@pytest.mark.parametrize("causal", [True, False])
def test_sliding_window_attention_of_an_empty_sequence(causal):
    q, k, v = qkv(Lq=0, Lk=0, Hkv=2)
    out = sliding_window_attention(q, k, v, 4, causal=causal, global_tokens=2)
    assert out.shape == (2, 4, 0, 8)


def test_multi_head_attention_with_no_keys_or_no_queries():
    mha = MultiHeadAttention(16, num_heads=4).eval()
    out, w = mha(torch.randn(2, 3, 16), torch.randn(2, 0, 16), need_weights=True)
    assert out.shape == (2, 3, 16) and w.shape == (2, 4, 3, 0)
    assert_close(out, mha.proj.bias.expand(2, 3, 16))  # zero attention output -> the bias
    out, _ = mha(torch.randn(2, 0, 16), torch.randn(2, 5, 16))
    assert out.shape == (2, 0, 16)


# -- half precision on math -----------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("masked", [False, True])
def test_half_inputs_with_large_logits_stay_finite_on_math(dtype, masked):
    # |q . k| ~ 8e4 overflows float16 (max 65504) before the scale is applied
    q, k, v = qkv(Lq=6, Lk=7, D=64, dtype=dtype)
    q, k = q * 100, k * 100
    kwargs = {"key_padding_mask": masks.padding_mask([7, 4])} if masked else {}
    if dtype == torch.float16:
        assert not torch.isfinite(q @ k.transpose(-2, -1)).all()  # the hazard is real
    out, w = attention(q, k, v, backend="math", need_weights=True, **kwargs)
    assert out.dtype == w.dtype == dtype
    assert torch.isfinite(out).all() and torch.isfinite(w).all()
    ref = attention(q.float(), k.float(), v.float(), backend="math", **kwargs)
    tol = {"atol": 1e-2, "rtol": 1e-2} if dtype == torch.float16 else {"atol": 4e-2, "rtol": 4e-2}
    assert_close(out.float(), ref, **tol)
    assert_close(out, attention(q, k, v, backend="sdpa", **kwargs), **tol)


def test_float32_math_is_the_plain_formula_bit_for_bit():
    q, k, v = qkv(Lq=6, Lk=7, D=16)
    out, w = scaled_dot_product_attention(q, k, v)
    expected_w = F.softmax(torch.matmul(q, k.transpose(-2, -1)) * (1 / math.sqrt(16)), dim=-1)
    assert torch.equal(w, expected_w)
    assert torch.equal(out, torch.matmul(expected_w, v))


def test_float64_math_is_computed_in_float64():
    q, k, v = qkv(Lq=6, Lk=7, dtype=torch.float64)
    out, w = scaled_dot_product_attention(q, k, v)
    assert out.dtype == w.dtype == torch.float64
    assert_close(out, F.scaled_dot_product_attention(q, k, v), atol=1e-12, rtol=1e-12)


# -- NaN / inf in padding -------------------------------------------------------------

PAD_KINDS = ["key_padding", "float_key_padding", "attn_mask_row", "float_attn_mask_row", "Lq1"]


def padding_case(kind: str, Lq: int, Lk: int):
    """``(kwargs, padded (B, Lk) bool)``: masks that hide the last keys of sequence 1."""
    padded = masks.padding_mask([Lk, Lk - 3])  # (B, Lk), True = padding
    padded[0, 1] = True  # ... and one key in the middle of sequence 0
    if kind == "key_padding":
        return {"key_padding_mask": padded}, padded
    if kind == "float_key_padding":
        return {"key_padding_mask": masks.to_additive(~padded)}, padded
    if kind == "attn_mask_row":  # (B, 1, 1, Lk), True = may attend, as Hugging Face builds it
        return {"attn_mask": ~padded[:, None, None, :]}, padded
    if kind == "float_attn_mask_row":  # (B, H, 1, Lk) additive, with a random bias
        bias = torch.randn(2, 4, 1, Lk).masked_fill(padded[:, None, None, :], float("-inf"))
        return {"attn_mask": bias}, padded
    assert Lq == 1  # "Lq1": a decoding step, any mask has one query row
    return {"attn_mask": ~padded[:, None, None, :], "is_causal": True}, padded


def poison(t: torch.Tensor, padded: torch.Tensor, value: float) -> torch.Tensor:
    """``t`` ``(B, Hkv, Lk, D)`` with ``value`` at the padded keys (out of place)."""
    return t.detach().masked_fill(padded[:, None, :, None], value)


@pytest.mark.parametrize("kind", PAD_KINDS)
@pytest.mark.parametrize("Hkv", [4, 2])
@pytest.mark.parametrize("garbage", [float("nan"), float("inf")])
def test_garbage_in_padding_keys_and_values_never_reaches_the_output(backend, kind, Hkv, garbage):
    Lq = 1 if kind == "Lq1" else 5
    q, k, v = qkv(Lq=Lq, Lk=8, Hkv=Hkv)
    kwargs, padded = padding_case(kind, Lq, 8)
    clean = attention(q, poison(k, padded, 0.0), poison(v, padded, 0.0), backend=backend, **kwargs)
    assert torch.isfinite(clean).all()
    # same output whatever the padding holds: zeros, random numbers or garbage
    assert_close(attention(q, k, v, backend=backend, **kwargs), clean, atol=1e-6, rtol=1e-6)
    grad = grads_ok(backend)
    kg, vg = poison(k, padded, garbage), poison(v, padded, garbage)
    qg = q.clone().requires_grad_(grad)
    kg.requires_grad_(grad)
    vg.requires_grad_(grad)
    out = attention(qg, kg, vg, backend=backend, **kwargs)
    assert torch.equal(out, clean)  # the zeroing makes the kernel's inputs identical
    if grad:
        out.square().sum().backward()
        for t in (qg, kg, vg):
            assert torch.isfinite(t.grad).all()
        assert (kg.grad.masked_select(padded[:, None, :, None]) == 0).all()
        assert (vg.grad.masked_select(padded[:, None, :, None]) == 0).all()


@pytest.mark.parametrize("kind", ["key_padding", "attn_mask_row"])
def test_garbage_in_padding_with_weights(kind):
    q, k, v = qkv(Lq=5, Lk=8)
    kwargs, padded = padding_case(kind, 5, 8)
    kn, vn = poison(k, padded, float("nan")), poison(v, padded, float("nan"))
    out, w = attention(q, kn, vn, need_weights=True, is_causal=True, **kwargs)
    ref, ref_w = attention(q, k, v, need_weights=True, is_causal=True, **kwargs)
    assert torch.isfinite(out).all() and torch.isfinite(w).all()
    assert_close(out, ref) and assert_close(w, ref_w)
    assert (w.masked_select(padded[:, None, None, :]) == 0).all()


def test_fully_padded_sequence_with_garbage_gives_zeros(backend):
    q, k, v = qkv(Lq=5, Lk=6)
    kpm = masks.padding_mask([4, 0], max_len=6)  # sequence 1 is all padding
    out = attention(
        q, k, poison(v, kpm, float("nan")), key_padding_mask=kpm, is_causal=True, backend=backend
    )
    assert torch.isfinite(out).all() and (out[1] == 0).all()
    clean = attention(q, k, v, key_padding_mask=kpm, is_causal=True, backend=backend)
    assert_close(out, clean)


@pytest.mark.parametrize("cross", [True, False])
def test_multi_head_attention_ignores_garbage_in_padding(backend, cross):
    torch.manual_seed(0)
    mha = MultiHeadAttention(32, num_heads=4, num_kv_heads=2, backend=backend).eval()
    x = torch.randn(2, 6, 32)
    mem = torch.randn(2, 9, 32) if cross else x
    kpm = masks.padding_mask([9, 5] if cross else [6, 3])
    garbage = mem.masked_fill(kpm[..., None], float("nan"))
    zeros = mem.masked_fill(kpm[..., None], 0.0)
    with torch.no_grad():
        if cross:
            out, _ = mha(x, garbage, key_padding_mask=kpm)
            ref, _ = mha(x, zeros, key_padding_mask=kpm)
            ref_other, _ = mha(x, mem, key_padding_mask=kpm)
        else:  # the padded tokens' own outputs are not masked (their queries are NaN)
            out, _ = mha(garbage, key_padding_mask=kpm, is_causal=True)
            ref, _ = mha(zeros, key_padding_mask=kpm, is_causal=True)
            ref_other, _ = mha(mem, key_padding_mask=kpm, is_causal=True)
            keep = ~kpm
            out, ref, ref_other = out[keep], ref[keep], ref_other[keep]
    assert torch.isfinite(out).all()
    assert_close(out, ref, atol=1e-6, rtol=1e-6)
    assert_close(out, ref_other, atol=1e-5, rtol=1e-5)
