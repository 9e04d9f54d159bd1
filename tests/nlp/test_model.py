"""The encoder-decoder itself: shapes, masks, tying, gradients, position limits."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from attn_nlp import Transformer, TransformerConfig, get_config


def tiny(**overrides) -> Transformer:
    cfg = dict(
        src_vocab_size=40,
        embed_dim=32,
        encoder_depth=2,
        decoder_depth=2,
        num_heads=4,
        mlp_dim=64,
        max_positions=16,
        dropout=0.0,
    )
    return Transformer(TransformerConfig(**{**cfg, **overrides})).eval()


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("pos_embed", ["sinusoidal", "sinusoidal_interleaved", "learned"])
def test_forward_shapes_and_every_parameter_learns(norm_first, pos_embed):
    model = tiny(norm_first=norm_first, pos_embed=pos_embed).train()
    src, tgt = torch.randint(4, 40, (3, 9)), torch.randint(4, 40, (3, 6))
    logits = model(src, tgt)
    assert logits.shape == (3, 6, 40)
    logits.logsumexp(-1).mean().backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_decoder_is_causal_and_padding_is_ignored():
    model = tiny()
    src, tgt = torch.randint(4, 40, (1, 7)), torch.randint(4, 40, (1, 6))
    base = model(src, tgt)
    changed = tgt.clone()
    changed[0, 4:] = 5  # future tokens must not change earlier logits
    torch.testing.assert_close(model(src, changed)[:, :4], base[:, :4])
    padded = torch.cat((src, torch.zeros(1, 3, dtype=torch.long)), dim=1)  # pad_id = 0
    torch.testing.assert_close(model(padded, tgt), base, atol=1e-5, rtol=1e-5)


def test_tied_and_untied_embeddings():
    shared = tiny()
    assert shared.src_embed is shared.tgt_embed and shared.head.weight is shared.tgt_embed.weight
    separate = tiny(share_embeddings=False, tgt_vocab_size=30, tie_output=False)
    assert separate.head.weight is not separate.tgt_embed.weight
    assert separate(torch.randint(4, 40, (1, 5)), torch.randint(4, 30, (1, 3))).shape == (1, 3, 30)
    with pytest.raises(ValueError, match="share_embeddings"):
        TransformerConfig(src_vocab_size=40, tgt_vocab_size=30)


def test_bad_inputs_are_clear_errors():
    model = tiny()
    with pytest.raises(ValueError, match="max_positions"):
        model(torch.randint(4, 40, (1, 17)), torch.randint(4, 40, (1, 3)))
    with pytest.raises(ValueError, match="outside"):
        model(torch.full((1, 3), 40), torch.randint(4, 40, (1, 3)))
    with pytest.raises(ValueError, match="long tensor"):
        model.encode(torch.ones(1, 3))


def test_generate_starts_with_the_decoder_start_token():
    model = tiny()
    out = model.generate(torch.randint(4, 40, (2, 5)), num_beams=1, max_new_tokens=8)
    assert out.shape == (2, 9) or (out.shape[0] == 2 and out.shape[1] <= 9)
    assert out[:, 0].eq(model.config.decoder_start_id).all()


def test_preset_configs_are_consistent():
    for name in ("transformer-base", "transformer-big", "transformer-tiny"):
        cfg = get_config(name)
        assert cfg.embed_dim % cfg.num_heads == 0 and cfg.final_norm == cfg.norm_first


def test_decoder_can_have_its_own_heads_and_mlp_width():
    model = tiny(encoder_depth=3, decoder_num_heads=2, decoder_mlp_dim=48, activation_dropout=0.2)
    enc, dec = model.encoder.blocks[0], model.decoder.blocks[0]
    assert (enc.attn.num_heads, enc.mlp.fc1.out_features) == (4, 64)
    assert (dec.attn.num_heads, dec.cross_attn.num_heads, dec.mlp.fc1.out_features) == (2, 2, 48)
    assert enc.mlp.drop.p == dec.mlp.drop.p == 0.2
    assert model(torch.randint(4, 40, (2, 6)), torch.randint(4, 40, (2, 4))).shape == (2, 4, 40)
    same = tiny()  # None = the encoder's values (and dropout inside the MLP)
    assert same.decoder.blocks[0].attn.num_heads == 4
    assert same.decoder.blocks[0].mlp.fc1.out_features == 64
    with pytest.raises(ValueError, match=r"decoder_num_heads \(5\)"):
        tiny(decoder_num_heads=5)


def test_config_from_dict_round_trips_and_refuses_unknown_keys():
    cfg = TransformerConfig(src_vocab_size=40, embed_dim=32, num_heads=4, decoder_num_heads=2)
    saved = {"model_type": "attn_nlp.transformer", **cfg.to_dict()}  # what save_pretrained writes
    assert TransformerConfig.from_dict(saved) == cfg
    new_keys = ("decoder_num_heads", "decoder_mlp_dim", "activation_dropout")
    old = {k: v for k, v in saved.items() if k not in new_keys}  # an older config.json
    assert TransformerConfig.from_dict(old) == dataclasses.replace(cfg, decoder_num_heads=None)
    with pytest.raises(ValueError, match=r"unknown TransformerConfig key\(s\) \['heads', 'x'\]"):
        TransformerConfig.from_dict({**saved, "heads": 2, "x": 1})
    with pytest.raises(ValueError, match="model_type 'attn_nlp.lm'"):
        TransformerConfig.from_dict({**saved, "model_type": "attn_nlp.lm"})
