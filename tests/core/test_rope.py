import pytest
import torch
from attn_core import RotaryEmbedding
from torch.testing import assert_close


def complex_rope(x, base=10000.0, offset=0):
    """The paper's / Meta Llama's form: adjacent pairs as complex numbers times e^{i m theta}."""
    D, L = x.shape[-1], x.shape[-2]
    theta = base ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
    angles = torch.arange(offset, offset + L, dtype=torch.float64)[:, None] * theta
    xc = torch.view_as_complex(x.double().reshape(*x.shape[:-1], D // 2, 2))
    return torch.view_as_real(xc * torch.polar(torch.ones_like(angles), angles)).flatten(-2)


def test_interleaved_layout_equals_complex_multiplication():
    x = torch.randn(2, 3, 10, 16, dtype=torch.float64)
    rope = RotaryEmbedding(16, interleaved=True).double()
    assert_close(rope(x, offset=5), complex_rope(x, offset=5))


def test_half_split_layout_is_the_interleaved_one_with_channels_permuted():
    x = torch.randn(2, 3, 10, 16, dtype=torch.float64)
    perm = torch.cat((torch.arange(0, 16, 2), torch.arange(1, 16, 2)))  # (x0,x2,..,x1,x3,..)
    half = RotaryEmbedding(16, interleaved=False).double()
    inter = RotaryEmbedding(16, interleaved=True).double()
    assert_close(half(x[..., perm])[..., perm.argsort()], inter(x))


def test_half_split_matches_rotate_half_formula():
    x = torch.randn(1, 2, 6, 8)
    inv = 10000 ** (-torch.arange(0, 8, 2).float() / 8)
    freqs = torch.arange(6).float()[:, None] * inv
    emb = torch.cat((freqs, freqs), dim=-1)
    x1, x2 = x[..., :4], x[..., 4:]
    expected = x * emb.cos() + torch.cat((-x2, x1), dim=-1) * emb.sin()  # GPT-NeoX / HF Llama
    assert_close(RotaryEmbedding(8)(x), expected)


@pytest.mark.parametrize("interleaved", [False, True])
def test_scores_depend_only_on_relative_position(interleaved):
    rope = RotaryEmbedding(8, interleaved=interleaved)
    q, k = torch.randn(8), torch.randn(8)

    def score(m, n):
        return (rope(q.expand(1, 1, 1, 8), m) * rope(k.expand(1, 1, 1, 8), n)).sum()

    assert_close(score(3, 1), score(10, 8))
    assert_close(score(0, 0), (q * k).sum())


def test_partial_rotary_leaves_the_rest_untouched_and_bad_dims_raise():
    x = torch.randn(1, 1, 4, 16)
    out = RotaryEmbedding(8)(x, offset=2)
    assert_close(out[..., 8:], x[..., 8:])
    assert not torch.allclose(out[..., :8], x[..., :8])
    with pytest.raises(ValueError, match="even"):
        RotaryEmbedding(7)
    with pytest.raises(ValueError, match="exceeds"):
        RotaryEmbedding(32)(x)
