"""KVCache(capacity=C): the reserved buffer gives what concatenating gives (decoding through
MultiHeadAttention, beam reorders, growing past C, a new batch size), writes each step in
place, and refuses a bad capacity."""

from __future__ import annotations

import pytest
import torch
from attn_core import KVCache, MultiHeadAttention, RotaryEmbedding
from torch.testing import assert_close


def _decode(mha, x, cache, prompt=3, reorders=None):
    """Prefill ``prompt`` tokens, then one token at a time; ``reorders[t]`` (an index) is
    applied to the cache and to ``x`` before step ``t``. The outputs, concatenated."""
    outs = [mha(x[:, :prompt], is_causal=True, kv_cache=cache)[0]]
    for t in range(prompt, x.shape[1]):
        if reorders and t in reorders:
            cache.reorder(reorders[t])
            x = x[reorders[t]]
        outs.append(mha(x[:, t : t + 1], is_causal=True, kv_cache=cache)[0])
    return torch.cat(outs, dim=1)


@pytest.mark.parametrize("capacity", [4, 9, 32])  # grows twice / exactly / room to spare
def test_reserved_cache_decodes_as_the_concatenating_one(capacity):
    torch.manual_seed(0)
    mha = MultiHeadAttention(32, 4, num_kv_heads=2, rope=RotaryEmbedding(8)).eval()
    x = torch.randn(3, 9, 32)
    reorders = {5: torch.tensor([2, 2, 0]), 7: torch.tensor([1, 0, 0])}
    plain, reserved = KVCache(), KVCache(capacity)
    expected = _decode(mha, x, plain, reorders=reorders)
    got = _decode(mha, x, reserved, reorders=reorders)
    assert_close(got, expected, rtol=0, atol=0)
    assert reserved.seq_len == plain.seq_len == 9
    assert_close(reserved.key, plain.key, rtol=0, atol=0)
    assert_close(reserved.value, plain.value, rtol=0, atol=0)


def test_steps_write_into_one_buffer():
    cache = KVCache(capacity=8)
    k = torch.randn(2, 4, 3, 16)
    cache.update(k, k + 1)
    base = cache.key.data_ptr()
    for step in range(5):
        new = torch.full((2, 4, 1, 16), float(step))
        key, value = cache.update(new, new)
        assert key.data_ptr() == base and key.shape == (2, 4, 4 + step, 16)
        assert_close(key[:, :, -1], new[:, :, 0])
        assert_close(value[:, :, :3], k + 1)
    cache.reorder(torch.tensor([1, 0]))
    assert cache.key.data_ptr() == base  # rows swapped in place
    assert_close(cache.key[:, :, :3], k.flip(0))
    cache.update(torch.zeros(2, 4, 1, 16), torch.zeros(2, 4, 1, 16))  # 9 > 8: it grows
    assert cache.seq_len == 9 and cache.key.data_ptr() != base
    assert_close(cache.key[:, :, :3], k.flip(0))


def test_new_batch_size_reset_and_bad_capacity():
    cache = KVCache(capacity=4)
    k = torch.arange(3.0).view(3, 1, 1, 1).expand(3, 2, 2, 8)
    cache.update(k, k)
    cache.reorder(torch.tensor([2, 0]))  # beams dropped: 2 rows from here on
    key, _ = cache.update(torch.ones(2, 2, 1, 8), torch.ones(2, 2, 1, 8))
    assert key.shape == (2, 2, 3, 8) and key[:, 0, 0, 0].tolist() == [2.0, 0.0]
    with pytest.raises(ValueError, match="do not match the cache"):
        cache.update(torch.zeros(3, 2, 1, 8), torch.zeros(3, 2, 1, 8))
    cache.reset()
    assert cache.is_empty and cache.seq_len == 0
    cache.update(torch.ones(1, 2, 1, 8), torch.ones(1, 2, 1, 8))  # a fresh batch after reset
    assert cache.key.shape == (1, 2, 1, 8)
    for bad in (0, -1, True):
        with pytest.raises(ValueError, match="capacity must be a positive int or None"):
            KVCache(capacity=bad)
