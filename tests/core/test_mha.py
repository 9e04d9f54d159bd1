import attn_core
import pytest
import torch
from attn_core import KVCache, MultiHeadAttention, RotaryEmbedding, masks
from torch import nn
from torch.testing import assert_close

TOL = {"atol": 1e-5, "rtol": 1e-5}


def torch_mha(kdim=None, vdim=None, bias=True):
    return nn.MultiheadAttention(32, 4, bias=bias, kdim=kdim, vdim=vdim, batch_first=True).eval()


@pytest.mark.parametrize("backend", ["math", "sdpa"])
@pytest.mark.parametrize("case", ["plain", "causal", "bool_mask", "float_mask", "padding", "both"])
def test_self_attention_matches_nn_multihead_attention(backend, case):
    ref = torch_mha()
    ours = MultiHeadAttention.from_torch(ref).eval()
    x = torch.randn(3, 7, 32)
    ours_kw, ref_kw = {}, {}
    if case == "causal":
        ours_kw["is_causal"] = True
        ref_kw["attn_mask"] = ~masks.causal_mask(7)  # torch: bool True = NOT allowed
    if case in ("bool_mask", "both"):
        allowed = torch.rand(7, 7) > 0.3
        allowed[:, 0] = True
        ours_kw["attn_mask"], ref_kw["attn_mask"] = allowed, ~allowed
    if case == "float_mask":
        bias = torch.randn(7, 7)
        ours_kw["attn_mask"] = ref_kw["attn_mask"] = bias
    if case in ("padding", "both"):
        kpm = masks.padding_mask([7, 5, 3])
        ours_kw["key_padding_mask"] = ref_kw["key_padding_mask"] = kpm
    with attn_core.use_backend(backend):
        out, w = ours(x, need_weights=backend == "math", **ours_kw)
    ref_out, ref_w = ref(x, x, x, need_weights=True, **ref_kw)
    assert_close(out, ref_out, **TOL)
    if backend == "math":
        assert w.shape == (3, 4, 7, 7)
        assert_close(w.mean(1), ref_w, **TOL)  # torch averages the heads


def test_cross_attention_matches_nn_multihead_attention():
    ref = torch_mha()
    ours = MultiHeadAttention.from_torch(ref).eval()
    q, mem = torch.randn(2, 5, 32), torch.randn(2, 9, 32)
    kpm = masks.padding_mask([9, 4])
    out, _ = ours(q, mem, key_padding_mask=kpm)
    assert_close(out, ref(q, mem, mem, key_padding_mask=kpm)[0], **TOL)
    value = torch.randn(2, 9, 32)
    assert_close(ours(q, mem, value)[0], ref(q, mem, value)[0], **TOL)


def test_kdim_vdim_and_no_bias_match_nn_multihead_attention():
    ref = torch_mha(kdim=12, vdim=20, bias=False)
    ours = MultiHeadAttention.from_torch(ref).eval()
    assert not ours.fused_qkv
    q, k, v = torch.randn(2, 5, 32), torch.randn(2, 6, 12), torch.randn(2, 6, 20)
    assert_close(ours(q, k, v)[0], ref(q, k, v)[0], **TOL)
    with pytest.raises(ValueError, match="pass key and value"):
        ours(q)


def test_batch_second_torch_module_matches_after_transpose():
    ref = nn.MultiheadAttention(32, 4).eval()  # batch_first=False
    ours = MultiHeadAttention.from_torch(ref).eval()
    x = torch.randn(6, 2, 32)  # (L, B, E)
    assert_close(ours(x.transpose(0, 1))[0].transpose(0, 1), ref(x, x, x)[0], **TOL)


def test_fused_qkv_is_one_linear():
    mha = MultiHeadAttention(32, 4, num_kv_heads=2)
    assert isinstance(mha.qkv, nn.Linear) and mha.qkv.out_features == 32 + 2 * 16
    assert not hasattr(mha, "q_proj")


def test_gqa_equals_mha_with_repeated_kv_heads():
    gqa = MultiHeadAttention(32, 4, num_kv_heads=2).eval()
    mha = MultiHeadAttention(32, 4).eval()
    hd = 8
    with torch.no_grad():
        wq, wk, wv = gqa.qkv.weight.split((32, 16, 16))
        bq, bk, bv = gqa.qkv.bias.split((32, 16, 16))

        def rep(t):  # (Hkv * hd, ...) -> (H * hd, ...): each kv head serves 2 query heads
            return t.view(2, hd, *t.shape[1:]).repeat_interleave(2, dim=0).flatten(0, 1)

        mha.qkv.weight.copy_(torch.cat((wq, rep(wk), rep(wv))))
        mha.qkv.bias.copy_(torch.cat((bq, rep(bk), rep(bv))))
        mha.proj.load_state_dict(gqa.proj.state_dict())
    x = torch.randn(2, 6, 32)
    assert_close(gqa(x, is_causal=True)[0], mha(x, is_causal=True)[0], **TOL)
    mqa = MultiHeadAttention(32, 4, num_kv_heads=1)
    assert mqa(x)[0].shape == (2, 6, 32)


@pytest.mark.parametrize("num_kv_heads", [4, 2, 1])
@pytest.mark.parametrize("interleaved", [False, True])
def test_kv_cache_decoding_equals_full_causal_forward(num_kv_heads, interleaved):
    rope = RotaryEmbedding(8, interleaved=interleaved)
    mha = MultiHeadAttention(32, 4, num_kv_heads=num_kv_heads, rope=rope, qk_norm=True).eval()
    x = torch.randn(2, 9, 32)
    full, _ = mha(x, is_causal=True)
    cache = KVCache()
    prefill, _ = mha(x[:, :4], is_causal=True, kv_cache=cache)  # a prompt, then one by one
    steps = [prefill] + [
        mha(x[:, t : t + 1], is_causal=True, kv_cache=cache)[0] for t in range(4, 9)
    ]
    assert cache.seq_len == 9
    assert_close(torch.cat(steps, dim=1), full, **TOL)


def test_passing_query_as_key_and_value_is_self_attention():
    mha = MultiHeadAttention(32, 4, rope=True).eval()
    x = torch.randn(2, 5, 32)
    assert_close(mha(x, x)[0], mha(x)[0])
    assert_close(mha(x, x, x, is_causal=True)[0], mha(x, is_causal=True)[0])
    cache = KVCache()
    prompt, new = x[:, :3], x[:, 3:]
    mha(prompt, prompt, prompt, is_causal=True, kv_cache=cache)
    step, _ = mha(new, new, new, is_causal=True, kv_cache=cache)
    assert cache.seq_len == 5
    assert_close(step, mha(x, is_causal=True)[0][:, 3:], **TOL)


def test_cross_attention_cache_is_filled_once_and_reused():
    mha = MultiHeadAttention(32, 4).eval()
    mem, q = torch.randn(2, 5, 32), torch.randn(2, 3, 32)
    cache = KVCache()
    first, _ = mha(q[:, :1], mem, kv_cache=cache)
    key = cache.key
    second, _ = mha(q[:, 1:], mem, kv_cache=cache)
    assert cache.key is key and cache.seq_len == 5
    assert_close(torch.cat((first, second), 1), mha(q, mem)[0], **TOL)


def test_kv_cache_reorder_and_errors():
    cache = KVCache()
    k = torch.arange(3.0).view(3, 1, 1, 1).expand(3, 2, 4, 8)
    cache.update(k, k)
    cache.reorder(torch.tensor([2, 2, 0]))
    assert cache.key[:, 0, 0, 0].tolist() == [2.0, 2.0, 0.0]
    with pytest.raises(ValueError, match="do not match the cache"):
        cache.update(torch.zeros(3, 1, 1, 8), torch.zeros(3, 1, 1, 8))
    cache.reset()
    assert cache.is_empty and cache.seq_len == 0


def test_bad_construction_and_input_raise_value_error():
    with pytest.raises(ValueError, match=r"embed_dim \(30\) must be divisible by num_heads \(4\)"):
        MultiHeadAttention(30, 4)
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        MultiHeadAttention(32, 4, num_kv_heads=3)
    mha = MultiHeadAttention(32, 4)
    with pytest.raises(ValueError, match=r"\(B, Lq, 32\)"):
        mha(torch.randn(2, 5, 16))
    with pytest.raises(ValueError, match=r"\(B, H, Lq, Lk\)"):
        mha(torch.randn(2, 5, 32), attn_mask=torch.ones(4, 4, dtype=torch.bool))


def test_dropout_only_in_training_and_all_parameters_get_gradients():
    mha = MultiHeadAttention(32, 4, dropout=0.5, qk_norm=True)
    x = torch.randn(2, 6, 32)
    mha.train()
    a, _ = mha(x)
    b, _ = mha(x)
    assert not torch.allclose(a, b)
    (a.sum() + b.sum()).backward()
    for name, p in mha.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
    mha.eval()
    assert_close(mha(x)[0], mha(x)[0])
