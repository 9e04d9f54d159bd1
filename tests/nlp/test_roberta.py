"""attn_nlp.roberta: RoBERTa / XLM-R against transformers (tiny random models, saved folders)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest
import torch
from attn_nlp import create_model, save_pretrained
from attn_nlp.hf_configs import hf_config
from attn_nlp.roberta import Config, Encoder, config_from_hf, convert_hf, position_ids
from safetensors.torch import load_file

PAD = 1
TINY = dict(
    vocab_size=1000,
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=128,
    max_position_embeddings=40,
    pad_token_id=PAD,
    layer_norm_eps=1e-5,
)


def randomize(model: torch.nn.Module, seed: int) -> None:
    """Every weight random (transformers zeroes biases and sets LayerNorms to 1 at init, which
    would hide a swapped bias or norm): std 0.3, LayerNorm gains near 1."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "LayerNorm.weight" in name:
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.3 * torch.randn(p.shape, generator=gen))


def make(cls_name: str, directory, seed: int = 0, **overrides):
    """A random transformers model ``cls_name`` saved to ``directory`` (safetensors)."""
    import transformers

    config_cls = transformers.XLMRobertaConfig if "XLM" in cls_name else transformers.RobertaConfig
    torch.manual_seed(seed)
    model = getattr(transformers, cls_name)(config_cls(**{**TINY, **overrides})).eval()
    randomize(model, seed)
    model.save_pretrained(directory)
    return model


def batch(seed: int = 0, length: int = 12) -> tuple[torch.Tensor, torch.Tensor]:
    """Ids ``(4, length)`` with right padding, left padding, none, and a long pad run."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, TINY["vocab_size"], (4, length), generator=gen)
    ids[:, 0] = 0  # <s>
    ids[0, 8:] = PAD
    ids[1, :3] = PAD
    ids[3, 2:] = PAD
    return ids, ids == PAD


@pytest.fixture(scope="module")
def xlmr(tmp_path_factory):
    directory = tmp_path_factory.mktemp("xlmr")
    return make("XLMRobertaModel", directory, type_vocab_size=1), directory


@pytest.fixture(scope="module")
def roberta(tmp_path_factory):
    directory = tmp_path_factory.mktemp("roberta")
    return make("RobertaModel", directory, seed=1, type_vocab_size=2), directory


@torch.no_grad()
def test_xlmr_matches_transformers_with_padding(xlmr):
    hf, directory = xlmr
    ours = create_model(directory)
    assert isinstance(ours, Encoder) and not ours.training and ours.pooler is None
    assert ours.config.type_vocab_size == 1 and ours.width == 64
    ids, kpm = batch()
    ref = hf(input_ids=ids, attention_mask=(~kpm).long()).last_hidden_state
    # padded query rows are defined here (they attend to the row's real tokens): compare all
    torch.testing.assert_close(ours(ids, key_padding_mask=kpm), ref, atol=1e-5, rtol=1e-5)
    # no mask: everyone attends to the pads too, as transformers without attention_mask
    torch.testing.assert_close(ours(ids), hf(input_ids=ids).last_hidden_state)


@torch.no_grad()
def test_roberta_matches_transformers_with_token_types_and_pooler(roberta):
    hf, directory = roberta
    ids, kpm = batch(seed=1)
    types = (torch.arange(ids.shape[1]) >= 5).long().expand_as(ids).contiguous()
    ref = hf(input_ids=ids, attention_mask=(~kpm).long(), token_type_ids=types)
    ours = create_model(directory, add_pooling_layer=True)  # RobertaModel has pooler.* keys
    hidden = ours(ids, key_padding_mask=kpm, token_type_ids=types)
    torch.testing.assert_close(hidden, ref.last_hidden_state, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours.pool(hidden), ref.pooler_output, atol=1e-5, rtol=1e-5)
    # token types default to 0, as transformers'
    untyped = ours(ids, key_padding_mask=kpm)
    ref = hf(input_ids=ids, attention_mask=(~kpm).long()).last_hidden_state
    torch.testing.assert_close(untyped, ref, atol=1e-5, rtol=1e-5)
    # without add_pooling_layer the checkpoint's pooler.* is dropped, pool() says how to get it
    plain = create_model(directory)
    torch.testing.assert_close(plain(ids, key_padding_mask=kpm), untyped, rtol=0, atol=0)
    with pytest.raises(ValueError, match="add_pooling_layer=True"):
        plain.pool(hidden)


@pytest.mark.parametrize("act", ["gelu_new", "relu", "silu"])
@torch.no_grad()
def test_other_activations(tmp_path, act):
    hf = make("RobertaModel", tmp_path, seed=2, hidden_act=act)
    ours = create_model(tmp_path)
    ids, kpm = batch(seed=2)
    ref = hf(input_ids=ids, attention_mask=(~kpm).long()).last_hidden_state
    torch.testing.assert_close(ours(ids, key_padding_mask=kpm), ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("cls_name", ["XLMRobertaForMaskedLM", "RobertaForMaskedLM"])
@torch.no_grad()
def test_masked_lm_checkpoint_loads(tmp_path, cls_name):
    hf = make(cls_name, tmp_path, seed=3)
    keys = load_file(tmp_path / "model.safetensors")
    assert any(k.startswith("roberta.") for k in keys) and any(
        k.startswith("lm_head.") for k in keys
    )
    ours = create_model(tmp_path)
    ids, kpm = batch(seed=3)
    ref = hf.roberta(input_ids=ids, attention_mask=(~kpm).long()).last_hidden_state
    torch.testing.assert_close(ours(ids, key_padding_mask=kpm), ref, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="missing keys.*pooler.dense.weight"):
        create_model(tmp_path, add_pooling_layer=True)  # the masked-LM form has no pooler


def test_convert_is_strict(xlmr):
    _, directory = xlmr
    state = load_file(directory / "model.safetensors")
    config = create_model(directory, pretrained=False).config
    assert set(convert_hf(state, config)) == set(Encoder(config).state_dict())
    # the buffers old checkpoints saved are dropped by name
    old = {**state, "embeddings.position_ids": torch.arange(40)[None]}
    old["embeddings.token_type_ids"] = torch.zeros(1, 40, dtype=torch.long)
    assert set(convert_hf(old, config)) == set(convert_hf(state, config))
    missing = {k: v for k, v in state.items() if k != "encoder.layer.1.output.dense.bias"}
    with pytest.raises(ValueError, match=r"missing keys: \['encoder.layer.1.output.dense.bias'\]"):
        convert_hf(missing, config)
    with pytest.raises(ValueError, match=r"unexpected keys: \['encoder.layer.2.output.dense.bias"):
        convert_hf({**state, "encoder.layer.2.output.dense.bias": torch.zeros(64)}, config)
    with pytest.raises(ValueError, match="unexpected keys.*classifier.dense.weight"):
        convert_hf({**state, "classifier.dense.weight": torch.zeros(2, 64)}, config)
    both = {**state, "roberta.embeddings.LayerNorm.bias": state["embeddings.LayerNorm.bias"]}
    with pytest.raises(ValueError, match="both with and without the 'roberta.' prefix"):
        convert_hf(both, config)
    wide = {**state, "encoder.layer.0.attention.self.key.weight": torch.zeros(64, 32)}
    with pytest.raises(ValueError, match=r"layer.0.attention.self.key.weight has shape \(64, 32\)"):
        convert_hf(wide, config)


@pytest.mark.parametrize(
    ("key", "value", "match"),
    [
        ("position_embedding_type", "relative_key", "position_embedding_type='relative_key'"),
        ("is_decoder", True, "is_decoder=True"),
        ("add_cross_attention", True, "add_cross_attention=True"),
        ("hidden_act", "mish", "hidden_act='mish'"),
        ("pad_token_id", None, "pad_token_id=None"),
        ("rotary_dim", 16, r"unknown key\(s\) \['rotary_dim'\]"),
        ("model_type", "bert", "model_type 'bert' is not a RoBERTa config"),
    ],
)
def test_config_refuses_what_it_cannot_compute(key, value, match):
    hf = {**hf_config("xlm-roberta-base"), key: value}
    with pytest.raises(ValueError, match=match):
        config_from_hf(hf)


def test_config_refused_through_a_folder(xlmr, tmp_path):
    _, directory = xlmr
    hf = json.loads((directory / "config.json").read_text())
    (tmp_path / "config.json").write_text(
        json.dumps({**hf, "position_embedding_type": "relative_key_query"})
    )
    (tmp_path / "model.safetensors").write_bytes((directory / "model.safetensors").read_bytes())
    with pytest.raises(ValueError, match="position_embedding_type='relative_key_query'"):
        create_model(tmp_path)


@pytest.mark.parametrize("kind", ["roberta", "xlm-roberta"])
def test_config_defaults_are_transformers(kind):
    """A config.json without the architecture keys builds what transformers builds from it."""
    from transformers import AutoConfig

    hf = AutoConfig.for_model(kind)
    ours = config_from_hf({"model_type": kind})
    assert (ours.vocab_size, ours.embed_dim, ours.depth, ours.num_heads, ours.mlp_dim) == (
        hf.vocab_size,
        hf.hidden_size,
        hf.num_hidden_layers,
        hf.num_attention_heads,
        hf.intermediate_size,
    )
    assert (ours.max_positions, ours.type_vocab_size, ours.pad_id, ours.norm_eps) == (
        hf.max_position_embeddings,
        hf.type_vocab_size,
        hf.pad_token_id,
        hf.layer_norm_eps,
    )
    assert (ours.dropout, ours.attn_dropout) == (
        hf.hidden_dropout_prob,
        hf.attention_probs_dropout_prob,
    )


def test_positions_are_transformers(xlmr):
    from transformers.models.roberta.modeling_roberta import RobertaEmbeddings

    ids, _ = batch(length=10)
    ids = torch.cat([ids, torch.full((1, 10), PAD)])  # an all-pad row too
    for pad in (PAD, 0):
        expected = RobertaEmbeddings.create_position_ids_from_input_ids(ids, pad)
        torch.testing.assert_close(position_ids(ids, pad), expected, rtol=0, atol=0)


@torch.no_grad()
def test_save_pretrained_round_trip(roberta, tmp_path):
    _, directory = roberta
    ours = create_model(directory, add_pooling_layer=True)
    save_pretrained(ours, tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["model_type"] == "attn_nlp.roberta" and saved["add_pooling_layer"] is True
    again = create_model(tmp_path)
    assert again.config == ours.config
    for (k, a), (k2, b) in zip(ours.state_dict().items(), again.state_dict().items(), strict=True):
        assert k == k2 and torch.equal(a, b), k
    ids, kpm = batch(seed=4)
    hidden = again(ids, key_padding_mask=kpm)
    torch.testing.assert_close(hidden, ours(ids, key_padding_mask=kpm), rtol=0, atol=0)
    torch.testing.assert_close(again.pool(hidden), ours.pool(hidden), rtol=0, atol=0)
    with pytest.raises(ValueError, match="unknown Config key"):
        Config.from_dict({**ours.config.to_dict(), "relative": True})


@torch.no_grad()
def test_input_checks(xlmr):
    _, directory = xlmr
    ours = create_model(directory)
    assert ours.config.max_length == 40 - PAD - 1
    ids = torch.randint(3, 1000, (2, 39))
    with pytest.raises(ValueError, match="39 non-pad tokens; this model takes at most 38"):
        ours(ids)
    ids[:, -5:] = PAD  # 34 real tokens in 39 slots: positions fit, as in transformers
    assert ours(ids, key_padding_mask=ids == PAD).shape == (2, 39, 64)
    with pytest.raises(ValueError, match=r"\(B, L\) long tensor"):
        ours(ids.int())
    with pytest.raises(ValueError, match=r"outside \[0, 1000\)"):
        ours(ids + 1000)
    with pytest.raises(ValueError, match=r"token_type_ids outside \[0, 1\)"):
        ours(ids, token_type_ids=torch.ones_like(ids))
    with pytest.raises(ValueError, match="token_type_ids must be a long tensor"):
        ours(ids, token_type_ids=torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="divisible"):
        Config(embed_dim=64, num_heads=5)
    with pytest.raises(ValueError, match="act 'mish'"):
        Config(act="mish")


def test_pad_rows_get_no_gradient(xlmr):
    """padding_idx as in transformers: fine-tuning leaves the pad embeddings alone."""
    _, directory = xlmr
    ours = create_model(directory).train()
    ids, kpm = batch()
    ours(ids, key_padding_mask=kpm).sum().backward()
    assert ours.word_embeddings.weight.grad[PAD].abs().sum() == 0
    assert ours.position_embeddings.weight.grad[PAD].abs().sum() == 0
    assert ours.word_embeddings.weight.grad[ids[0, 1]].abs().sum() > 0


def test_shipped_architectures_build_offline():
    """create_model(<hub id>, pretrained=False) = transformers' model from the same
    config.json (built on the meta device: no memory); xlm-roberta-base built for real."""
    from transformers import RobertaConfig, RobertaModel, XLMRobertaConfig, XLMRobertaModel

    def count(model: torch.nn.Module) -> int:
        return sum(p.numel() for p in model.parameters())

    counts = {}
    for name in ("roberta-base", "xlm-roberta-base", "xlm-roberta-large"):
        entry = hf_config(name)
        classes = (
            (XLMRobertaConfig, XLMRobertaModel)
            if entry["model_type"] == "xlm-roberta"
            else (RobertaConfig, RobertaModel)
        )
        fields = {k: v for k, v in entry.items() if k != "model_type"}
        with torch.device("meta"):
            ref = classes[1](classes[0](**fields), add_pooling_layer=False)
            ours = Encoder(config_from_hf(entry))
            pooled = Encoder(dataclasses.replace(config_from_hf(entry), add_pooling_layer=True))
            ref_pooled = classes[1](classes[0](**fields))
        assert count(ours) == count(ref), name
        assert count(pooled) == count(ref_pooled), name
        counts[name] = count(ref)
    model = create_model("xlm-roberta-base", pretrained=False)
    assert isinstance(model, Encoder) and model.config == config_from_hf(
        hf_config("xlm-roberta-base")
    )
    assert count(model) == counts["xlm-roberta-base"]
    ids = torch.tensor([[0, 35378, 2, PAD]])
    with torch.no_grad():
        assert model(ids, key_padding_mask=ids == PAD).shape == (1, 4, 768)


def test_loading_a_folder_imports_no_transformers(xlmr):
    """``import attn_nlp.roberta`` and loading a transformers folder need no transformers."""
    _, directory = xlmr
    code = f"""
import sys
import attn_nlp.roberta
import torch
from attn_nlp import create_model

model = create_model({str(directory)!r})
model(torch.tensor([[0, 5, 2, 1]]), key_padding_mask=torch.tensor([[False] * 3 + [True]]))
bad = [m for m in ("transformers", "open_clip", "timm") if m in sys.modules]
assert not bad, bad
"""
    subprocess.run([sys.executable, "-c", code], check=True)
