import pytest
import torch
from attn_core import attention, sliding_window_attention, sliding_window_mask
from torch.testing import assert_close
from torch.utils._python_dispatch import TorchDispatchMode


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize(
    ("L", "window", "g"), [(37, 5, 0), (37, 8, 3), (16, 16, 0), (10, 40, 2), (9, 1, 0)]
)
def test_equals_dense_attention_with_the_sliding_window_mask(causal, L, window, g):
    q, k, v = (torch.randn(2, 3, L, 8) for _ in range(3))
    mask = sliding_window_mask(L, window, causal, global_tokens=g)
    dense = attention(q, k, v, attn_mask=mask, backend="math")
    out = sliding_window_attention(q, k, v, window, causal=causal, global_tokens=g)
    assert_close(out, dense, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("chunk_size", [1, 3, 7, 64])
@pytest.mark.parametrize("causal", [True, False])
def test_any_chunk_size_gives_the_same_result(chunk_size, causal):
    q, k, v = (torch.randn(1, 2, 45, 8) for _ in range(3))
    mask = sliding_window_mask(45, 9, causal, global_tokens=2)
    dense = attention(q, k, v, attn_mask=mask, backend="math")
    out = sliding_window_attention(
        q, k, v, 9, causal=causal, global_tokens=2, chunk_size=chunk_size
    )
    assert_close(out, dense, atol=1e-5, rtol=1e-5)


def test_gqa_and_gradients():
    q = torch.randn(1, 4, 20, 8, requires_grad=True)
    k = torch.randn(1, 2, 20, 8, requires_grad=True)
    v = torch.randn(1, 2, 20, 8, requires_grad=True)
    out = sliding_window_attention(q, k, v, 4)
    dense = attention(
        q,
        k.repeat_interleave(2, 1),
        v.repeat_interleave(2, 1),
        attn_mask=sliding_window_mask(20, 4),
    )
    assert_close(out, dense, atol=1e-5, rtol=1e-5)
    out.sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


class LargestTensor(TorchDispatchMode):
    """Record the element count of the largest tensor any op produces."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


@pytest.mark.parametrize("causal", [True, False])
def test_memory_grows_with_length_times_window_not_length_squared(causal):
    B, H, D, window = 1, 2, 8, 16
    largest = {}
    for L in (512, 2048):
        q = torch.randn(B, H, L, D)
        with LargestTensor() as probe:
            sliding_window_attention(q, q, q, window, causal=causal, backend="math")
        largest[L] = probe.largest
        assert probe.largest <= 3 * B * H * L * max(window, D)  # O(L * w), never O(L^2)
    assert largest[2048] <= 4.5 * largest[512]  # 4x the length -> ~4x the memory


def test_bad_arguments_raise():
    q = torch.randn(1, 1, 8, 4)
    with pytest.raises(ValueError, match="window"):
        sliding_window_attention(q, q, q, 0)
    with pytest.raises(ValueError, match="global_tokens"):
        sliding_window_attention(q, q, q, 2, global_tokens=-1)
    with pytest.raises(ValueError, match=r"\(B, H, L, D\)"):
        sliding_window_attention(q, q[:, :, :4], q, 2)
