"""Marian configs: encoder and decoder of different shapes, and every config.json field
either supported (parity with transformers) or refused by name."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from attn_nlp import Transformer, config_from_hf_marian, create_model
from torch.testing import assert_close

TOL = {"atol": 1e-4, "rtol": 1e-4}
PAD = 59  # conftest.PAD

# Deeper, wider-MLP encoder with more heads than the decoder (d_model 32).
ASYMMETRIC = dict(
    encoder_layers=3,
    decoder_layers=2,
    encoder_attention_heads=4,
    decoder_attention_heads=2,
    encoder_ffn_dim=64,
    decoder_ffn_dim=48,
)
SRC = torch.tensor(
    [
        [5, 6, 7, 8, 9, 10, 11, 0],
        [12, 13, 14, 0, PAD, PAD, PAD, PAD],
        [20, 21, 22, 23, 24, 0, PAD, PAD],
    ]
)
DEC = torch.tensor([[PAD, 3, 4, 5, 6], [PAD, 7, 8, 9, 10], [PAD, 11, 12, 13, 14]])

# The BART-era keys an opus-mt config.json converted years ago still carries.
LEGACY_OPUS_MT = {
    "_num_labels": 3,
    "add_bias_logits": False,
    "add_final_layer_norm": False,
    "bad_words_ids": [[PAD]],
    "classif_dropout": 0.0,
    "classifier_dropout": 0.0,
    "gradient_checkpointing": False,
    "max_length": 512,
    "normalize_before": False,
    "normalize_embedding": False,
    "num_beams": 4,
    "num_hidden_layers": 3,
    "static_position_embeddings": True,
}


@pytest.fixture(scope="module", params=["shared", "separate", "shared_untied"])
def saved(request, tmp_path_factory, marian_factory):
    """A saved asymmetric MarianMTModel folder and the transformers model read back from it."""
    from transformers import MarianMTModel

    directory = tmp_path_factory.mktemp(request.param)
    marian_factory(
        directory,
        shared=request.param != "separate",
        eos_bias=2.0,
        tie_word_embeddings=request.param != "shared_untied",
        **ASYMMETRIC,
    )
    return directory, MarianMTModel.from_pretrained(directory).eval()


@pytest.fixture(scope="module")
def pair(saved):
    directory, hf = saved
    return hf, create_model(directory)


def test_each_stack_has_its_own_shape(pair):
    _, ours = pair
    c = ours.config
    assert (c.encoder_depth, c.num_heads, c.mlp_dim) == (3, 4, 64)
    assert (c.decoder_depth, c.decoder_num_heads, c.decoder_mlp_dim) == (2, 2, 48)
    assert len(ours.encoder.blocks) == 3 and len(ours.decoder.blocks) == 2
    assert ours.encoder.blocks[0].attn.num_heads == 4
    dec = ours.decoder.blocks[0]
    assert dec.attn.num_heads == dec.cross_attn.num_heads == 2
    assert dec.mlp.fc1.out_features == 48 and ours.encoder.blocks[0].mlp.fc1.out_features == 64


def test_logits_match_transformers(pair):
    hf, ours = pair
    with torch.no_grad():
        ref = hf(input_ids=SRC, attention_mask=(SRC != PAD).long(), decoder_input_ids=DEC).logits
        out = ours(SRC, DEC)
    assert out.shape == ref.shape
    assert_close(out, ref, **TOL)
    assert ref.std() > 0.1  # informative, not a collapsed random model


@pytest.mark.parametrize(
    "settings",
    [
        {"num_beams": 1, "max_new_tokens": 12},
        {"num_beams": 4, "max_new_tokens": 15},
        {"num_beams": 3, "num_return_sequences": 2, "max_new_tokens": 10, "length_penalty": 0.6},
    ],
    ids=["greedy", "beam4", "beam3x2"],
)
def test_generate_matches_transformers(pair, settings):
    hf, ours = pair
    with torch.no_grad():
        expected = hf.generate(SRC, attention_mask=(SRC != PAD).long(), **settings)
    got = ours.generate(SRC, **settings)
    assert got.tolist() == expected.tolist()


def test_legacy_opus_mt_keys_are_accepted_silently(saved):
    directory, _ = saved
    config = json.loads((directory / "config.json").read_text()) | LEGACY_OPUS_MT
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ours = config_from_hf_marian(config)
    assert ours.encoder_depth == 3  # num_hidden_layers is transformers' alias of encoder_layers


def _config(**changes) -> dict:
    """A tiny Marian config.json as transformers writes it, with ``changes``."""
    from transformers import MarianConfig

    hf = MarianConfig(vocab_size=60, d_model=32, pad_token_id=PAD, decoder_start_token_id=PAD)
    return json.loads(hf.to_json_string()) | ASYMMETRIC | changes


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"normalize_before": True}, "normalize_before=True"),
        ({"add_final_layer_norm": True}, "add_final_layer_norm=True"),
        ({"normalize_embedding": True}, "normalize_embedding=True"),
        ({"static_position_embeddings": False}, "static_position_embeddings=False"),
        ({"add_bias_logits": True}, "add_bias_logits=True"),
        ({"is_decoder": True}, "is_decoder=True"),
        ({"tie_encoder_decoder": True}, "tie_encoder_decoder=True"),
        ({"activation_function": "tanh"}, "activation_function='tanh'"),
        ({"decoder_vocab_size": 70}, "decoder_vocab_size=70"),
        ({"eos_token_id": [0, 5]}, r"eos_token_id=\[0, 5\]"),
        ({"pad_token_id": None}, "pad_token_id=None"),
        ({"hidden_size": 64}, "hidden_size=64 contradicts d_model=32"),
        ({"decoder_attention_heads": 5}, r"decoder_num_heads \(5\)"),
    ],
    ids=lambda v: next(iter(v)) if isinstance(v, dict) else None,
)
def test_unsupported_fields_are_refused_by_name(changes, message):
    with pytest.raises(ValueError, match=message):
        config_from_hf_marian(_config(**changes))


def test_refused_field_in_a_saved_folder(tmp_path, marian_factory):
    marian_factory(tmp_path, **ASYMMETRIC)
    config = json.loads((tmp_path / "config.json").read_text())
    config["normalize_before"] = True
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="normalize_before=True"):
        create_model(tmp_path)


def test_training_only_and_unknown_fields_warn():
    with pytest.warns(UserWarning, match="encoder_layerdrop=0.1"):
        config_from_hf_marian(_config(encoder_layerdrop=0.1))
    with pytest.warns(UserWarning, match=r"unknown key\(s\) \['some_new_switch'\]"):
        config_from_hf_marian(_config(some_new_switch=True))


def test_supported_fields_are_mapped():
    cfg = config_from_hf_marian(
        _config(
            activation_function="gelu_new",
            activation_dropout=0.2,
            attention_dropout=0.05,
            dropout=0.3,
            scale_embedding=False,
            eos_token_id=[0],
        )
    )
    assert (cfg.act, cfg.activation_dropout, cfg.attn_dropout, cfg.dropout) == (
        "gelu_tanh",
        0.2,
        0.05,
        0.3,
    )
    assert not cfg.scale_embedding and cfg.eos_id == 0
    model = Transformer(cfg)
    assert model.decoder.blocks[0].mlp.drop.p == 0.2  # Marian's activation_dropout
    assert model.encoder.blocks[0].dropout == 0.3
