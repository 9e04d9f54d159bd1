import pytest
import torch
from attn_core import AdditiveAttention, masks
from torch.testing import assert_close


def test_matches_the_bahdanau_formula_per_example():
    attn = AdditiveAttention(6, 5, 7)
    q, keys = torch.randn(3, 6), torch.randn(3, 4, 5)
    out, w = attn(q, keys)
    for b in range(3):
        e = torch.stack(
            [
                attn.score.weight[0] @ torch.tanh(attn.query_proj(q[b]) + attn.key_proj(keys[b, j]))
                for j in range(4)
            ]
        )
        expected_w = torch.softmax(e, dim=0)
        assert_close(w[b], expected_w)
        assert_close(out[b], expected_w @ keys[b])


def test_variable_length_keys_with_padding_mask_equal_unpadded():
    attn = AdditiveAttention(8, 8, 16, out_dim=4, value_dim=10)
    q, keys, values = torch.randn(2, 3, 8), torch.randn(2, 6, 8), torch.randn(2, 6, 10)
    kpm = masks.padding_mask([6, 2])
    out, w = attn(q, keys, values, key_padding_mask=kpm)
    assert out.shape == (2, 3, 4) and w.shape == (2, 3, 6)
    assert (w[1, :, 2:] == 0).all()
    short_out, short_w = attn(q[1:], keys[1:, :2], values[1:, :2])
    assert_close(out[1:], short_out)
    assert_close(w[1:, :, :2], short_w)


def test_seed_myattn_shapes_fuse_query_and_context():
    # the seed's MyAttn: Q (1, 1, 32) attends over 32 words of 64 features and fuses to 32
    attn = AdditiveAttention(32, 64, 32, out_dim=32)
    q, v = torch.randn(1, 1, 32), torch.randn(1, 32, 64)
    out, w = attn(q, v)
    assert out.shape == (1, 1, 32) and w.shape == (1, 1, 32)
    assert_close(out, attn.combine(torch.cat((q, w @ v), dim=-1)))


def test_fully_padded_row_is_zero_and_bad_shapes_raise():
    attn = AdditiveAttention(4, 4, 8)
    q, keys = torch.randn(2, 4), torch.randn(2, 3, 4, requires_grad=True)
    out, w = attn(q, keys, key_padding_mask=masks.padding_mask([3, 0]))
    assert (out[1] == 0).all() and (w[1] == 0).all()
    out.sum().backward()
    assert torch.isfinite(keys.grad).all()
    with pytest.raises(ValueError, match=r"\(B, Lk, 4\)"):
        attn(q, torch.randn(2, 3, 5))
    with pytest.raises(ValueError, match=r"query must be"):
        attn(torch.randn(2, 5), keys)
