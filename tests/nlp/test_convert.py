"""Converters: Marian (opus-mt) and torch.nn.Transformer weights give the same numbers."""

from __future__ import annotations

import pytest
import torch
from attn_nlp import (
    Transformer,
    TransformerDecoder,
    TransformerEncoder,
    config_from_hf_marian,
    convert_hf_marian,
    convert_torch_transformer,
    create_model,
)
from attn_nlp.layers import sinusoidal_table
from torch import nn
from torch.testing import assert_close

TOL = {"atol": 1e-4, "rtol": 1e-4}
PAD = 59  # conftest.PAD

SRC = torch.tensor([[5, 6, 7, 8, 9, 10, 0], [11, 12, 13, 14, 0, PAD, PAD]])
DEC = torch.tensor([[PAD, 3, 4, 5, 6], [PAD, 7, 8, 9, 10]])


@pytest.fixture(scope="module", params=["shared", "separate", "bin"])
def pair(request, tmp_path_factory, marian_factory):
    """(transformers model, our model) loaded from the same saved directory."""
    from transformers import MarianMTModel

    directory = tmp_path_factory.mktemp(request.param)
    fmt = "bin" if request.param == "bin" else "safetensors"
    marian_factory(directory, shared=request.param != "separate", fmt=fmt)
    return MarianMTModel.from_pretrained(directory).eval(), create_model(directory)


def test_encoder_output_matches_marian(pair):
    hf, ours = pair
    with torch.no_grad():
        ref = hf.get_encoder()(input_ids=SRC, attention_mask=(SRC != PAD).long()).last_hidden_state
        out = ours.encode(SRC)
    assert_close(out, ref, **TOL)
    assert ref.std() > 0.1  # informative, not a collapsed random model


def test_decoder_logits_match_marian(pair):
    hf, ours = pair
    with torch.no_grad():
        ref = hf(input_ids=SRC, attention_mask=(SRC != PAD).long(), decoder_input_ids=DEC).logits
        out = ours(SRC, DEC)
    assert out.shape == ref.shape
    assert_close(out, ref, **TOL)


def test_marian_sinusoids_match_transformers():
    from transformers.models.marian.modeling_marian import MarianSinusoidalPositionalEmbedding

    for dim in (32, 33):
        ref = MarianSinusoidalPositionalEmbedding(50, dim).create_weight()
        assert_close(sinusoidal_table(50, dim, "concat"), ref, atol=1e-6, rtol=0)


def test_interleaved_sinusoids_follow_the_paper():
    table = sinusoidal_table(10, 8, "interleaved")
    pos, i = 7, 2
    assert table[pos, 2 * i].item() == pytest.approx(
        torch.tensor(pos / 10000 ** (2 * i / 8)).sin().item()
    )
    assert table[pos, 2 * i + 1].item() == pytest.approx(
        torch.tensor(pos / 10000 ** (2 * i / 8)).cos().item()
    )


def test_converter_is_loud_on_missing_and_unexpected_keys(tmp_path, marian_factory):
    from transformers import MarianMTModel

    marian_factory(tmp_path)
    hf = MarianMTModel.from_pretrained(tmp_path)
    sd = dict(hf.state_dict())
    cfg = config_from_hf_marian(hf.config.to_dict())
    convert_hf_marian(sd, cfg)  # the full state dict converts
    broken = dict(sd)
    del broken["model.encoder.layers.1.fc1.weight"]
    broken["model.encoder.layers.9.fc1.weight"] = torch.zeros(1)
    with pytest.raises(
        ValueError, match=r"missing keys.*layers\.1\.fc1\.weight.*unexpected keys.*layers\.9"
    ):
        convert_hf_marian(broken, cfg)
    untied = dict(sd, **{"lm_head.weight": torch.zeros_like(sd["lm_head.weight"])})
    with pytest.raises(ValueError, match="lm_head.weight should be tied"):
        convert_hf_marian(untied, cfg)


def test_marian_config_rejects_other_models():
    with pytest.raises(ValueError, match="not a Marian config"):
        config_from_hf_marian({"model_type": "bart"})


@pytest.mark.parametrize("act", ["relu", "gelu"])
def test_post_norm_stacks_match_torch_transformer(act):
    D, H, F = 32, 4, 64
    ref = nn.Transformer(D, H, 2, 2, F, dropout=0.0, activation=act, batch_first=True).eval()
    ref.encoder.use_nested_tensor = False  # keep padded rows (the fast path zeroes them)
    ours = nn.ModuleDict(
        {
            "encoder": TransformerEncoder(D, 2, H, F, act=act, final_norm=True),
            "decoder": TransformerDecoder(D, 2, H, F, act=act, final_norm=True),
        }
    ).eval()
    ours.load_state_dict(convert_torch_transformer(ref.state_dict()))
    src, tgt = torch.randn(2, 7, D), torch.randn(2, 5, D)
    src_pad = torch.tensor([[False] * 7, [False] * 4 + [True] * 3])
    with torch.no_grad():
        expected = ref(
            src,
            tgt,
            tgt_mask=nn.Transformer.generate_square_subsequent_mask(5),
            tgt_is_causal=True,
            src_key_padding_mask=src_pad,
            memory_key_padding_mask=src_pad,
        )
        memory = ours["encoder"](src, src_pad)
        out = ours["decoder"](tgt, memory, memory_key_padding_mask=src_pad)
    assert_close(out, expected, **TOL)


def test_torch_converter_is_loud():
    ref = nn.Transformer(16, 2, 1, 1, 32, batch_first=True)
    sd = ref.state_dict()
    sd["encoder.layers.0.extra"] = torch.zeros(1)
    with pytest.raises(ValueError, match="unexpected keys"):
        convert_torch_transformer(sd)


def test_converted_model_is_a_plain_transformer(pair):
    _, ours = pair
    assert isinstance(ours, Transformer)
    assert not ours.training
    assert ours.config.act == "silu"
    assert ours.config.decoder_start_id == PAD
