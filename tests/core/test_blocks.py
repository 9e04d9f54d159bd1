from functools import partial

import pytest
import torch
from attn_core import FeedForward, KVCache, MultiHeadAttention, TransformerBlock, masks
from attn_core.blocks import DropPath, LayerScale
from torch import nn
from torch.testing import assert_close

TOL = {"atol": 1e-5, "rtol": 1e-5}


def copy_linear(dst: nn.Linear, src: nn.Linear) -> None:
    dst.load_state_dict(src.state_dict())


def from_torch_layer(layer, norm_first, cross=False):
    act = "relu" if layer.activation is torch.nn.functional.relu else "gelu"
    block = TransformerBlock(
        32, 4, mlp_hidden_dim=64, act=act, norm_first=norm_first, cross_attention=cross
    ).eval()
    block.attn = MultiHeadAttention.from_torch(layer.self_attn).eval()
    copy_linear(block.mlp.fc1, layer.linear1)
    copy_linear(block.mlp.fc2, layer.linear2)
    block.norm1.load_state_dict(layer.norm1.state_dict())
    if cross:
        block.cross_attn = MultiHeadAttention.from_torch(layer.multihead_attn).eval()
        block.norm_cross.load_state_dict(layer.norm2.state_dict())
        block.norm2.load_state_dict(layer.norm3.state_dict())
    else:
        block.norm2.load_state_dict(layer.norm2.state_dict())
    return block


@pytest.mark.parametrize("norm_first", [True, False])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_encoder_block_matches_nn_transformer_encoder_layer(norm_first, activation):
    ref = nn.TransformerEncoderLayer(
        32, 4, 64, dropout=0.0, activation=activation, batch_first=True, norm_first=norm_first
    ).eval()
    block = from_torch_layer(ref, norm_first)
    x = torch.randn(2, 7, 32)
    kpm = masks.padding_mask([7, 4])
    assert_close(block(x, key_padding_mask=kpm), ref(x, src_key_padding_mask=kpm), **TOL)
    causal = nn.Transformer.generate_square_subsequent_mask(7)
    assert_close(block(x, is_causal=True), ref(x, src_mask=causal, is_causal=True), **TOL)


@pytest.mark.parametrize("norm_first", [True, False])
def test_decoder_block_matches_nn_transformer_decoder_layer(norm_first):
    ref = nn.TransformerDecoderLayer(
        32, 4, 64, dropout=0.0, batch_first=True, norm_first=norm_first
    ).eval()
    block = from_torch_layer(ref, norm_first, cross=True)
    tgt, memory = torch.randn(2, 6, 32), torch.randn(2, 9, 32)
    mkpm = masks.padding_mask([9, 5])
    causal = nn.Transformer.generate_square_subsequent_mask(6)
    expected = ref(tgt, memory, tgt_mask=causal, tgt_is_causal=True, memory_key_padding_mask=mkpm)
    ours = block(tgt, memory, is_causal=True, context_key_padding_mask=mkpm)
    assert_close(ours, expected, **TOL)


@pytest.mark.parametrize("norm_first", [True, False])
def test_decoder_block_cached_decoding_equals_full_forward(norm_first):
    block = TransformerBlock(32, 4, cross_attention=True, norm_first=norm_first, rope=True).eval()
    tgt, memory = torch.randn(2, 6, 32), torch.randn(2, 9, 32)
    full = block(tgt, memory, is_causal=True)
    cache, cross_cache = KVCache(), KVCache()
    steps = [
        block(tgt[:, t : t + 1], memory, is_causal=True, kv_cache=cache, cross_kv_cache=cross_cache)
        for t in range(6)
    ]
    assert_close(torch.cat(steps, dim=1), full, **TOL)


@pytest.mark.parametrize("act", ["gelu", "gelu_tanh", "quick_gelu", "relu", "silu", "swiglu"])
def test_feedforward_activations(act):
    ff = FeedForward(16, 24, act=act)
    assert ff(torch.randn(3, 16)).shape == (3, 16)
    if act == "swiglu":
        assert ff.fc1.out_features == 48
        x = torch.randn(3, 16)
        a, g = ff.fc1(x).chunk(2, dim=-1)
        assert_close(ff(x), ff.fc2(a * torch.nn.functional.silu(g)))
    with pytest.raises(ValueError, match="unknown activation"):
        FeedForward(16, act="tanhh")


def test_layer_scale_drop_path_and_gradients():
    block = TransformerBlock(
        32, 4, layer_scale=1e-3, drop_path=0.5, num_kv_heads=2, cross_attention=True, context_dim=12
    )
    assert isinstance(block.ls1, LayerScale) and isinstance(block.drop_path1, DropPath)
    x, ctx = torch.randn(4, 5, 32), torch.randn(4, 3, 12)
    block.train()
    block(x, ctx).sum().backward()
    for name, p in block.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
    block.eval()
    assert_close(block(x, ctx), block(x, ctx))
    with pytest.raises(ValueError, match="pass context"):
        block(x)


def test_drop_path_keeps_expectation():
    dp = DropPath(0.25).train()
    x = torch.ones(20000, 1)
    out = dp(x)
    assert set(out.unique().tolist()) <= {0.0, torch.tensor(1 / 0.75).item()}
    assert abs(out.mean().item() - 1.0) < 0.03
    assert torch.equal(dp.eval()(x), x)


@pytest.mark.slow
def test_block_compiles_without_graph_breaks():
    block = TransformerBlock(32, 4, num_kv_heads=2).eval()
    x = torch.randn(2, 8, 32)
    kpm = masks.padding_mask([8, 5])
    compiled = torch.compile(block, fullgraph=True)  # fullgraph: any graph break raises
    with torch.no_grad():
        assert_close(compiled(x, key_padding_mask=kpm), block(x, key_padding_mask=kpm), **TOL)


def test_need_weights_returns_self_attention_weights_and_same_output():
    block = TransformerBlock(32, 4, qk_norm=True, norm_layer=partial(nn.LayerNorm, eps=1e-6)).eval()
    assert block.attn.q_norm.eps == 1e-6  # qk_norm uses the block's norm layer, as timm
    x = torch.randn(2, 5, 32)
    out, w = block(x, need_weights=True, is_causal=True)
    assert_close(out, block(x, is_causal=True), **TOL)
    assert w.shape == (2, 4, 5, 5)
    assert_close(w, block.attn(block.norm1(x), need_weights=True, is_causal=True)[1])
