"""attn_nlp.m2m100: the M2M100 / NLLB encoder against transformers' M2M100Encoder.

Tiny random transformers models (d_model 64, 2 encoder layers, real structure), every
parameter randomised (LayerNorms too, so a swapped norm cannot pass), saved with
``save_pretrained`` in each checkpoint form and loaded with ``attn_nlp.create_model``.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from attn_nlp import create_model, save_pretrained
from attn_nlp import m2m100 as m

PAD = 1
VOCAB = 1000


def hf_config(**overrides):
    from transformers import M2M100Config

    fields = dict(
        vocab_size=VOCAB,
        d_model=64,
        encoder_layers=2,
        decoder_layers=1,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=128,
        decoder_ffn_dim=96,
        max_position_embeddings=64,
        pad_token_id=PAD,
        encoder_layerdrop=0.0,
        decoder_layerdrop=0.0,
    )
    return M2M100Config(**{**fields, **overrides})


def randomise(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Every parameter random (norm weights around 1), so each one matters."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if "layer_norm" in name and name.endswith("weight"):
                p.copy_(1 + 0.2 * noise)
            else:
                p.copy_(0.2 * noise)
    return model.eval()


def hf_encoder(seed: int = 0, **overrides):
    from transformers import M2M100Model

    torch.manual_seed(seed)
    return randomise(M2M100Model(hf_config(**overrides)).encoder, seed)


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    """(B, L) ids with right padding, left padding and a full row; the padding mask."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(2, VOCAB, (4, 12), generator=g)
    ids[1, 7:] = PAD  # right-padded (NLLB's tokenizers)
    ids[2, :5] = PAD  # left-padded: positions count only the real tokens
    ids[3, 3:] = PAD
    return ids, ids.eq(PAD)


def reference(hf, ids, padding):
    with torch.no_grad():
        mask = None if padding is None else (~padding).long()
        return hf(input_ids=ids, attention_mask=mask).last_hidden_state


def ours_out(model, ids, padding):
    with torch.no_grad():
        return model(ids, padding)


def assert_same_real_tokens(ours, ref, padding):
    keep = ~padding  # HF's padded query rows are not part of the contract
    torch.testing.assert_close(ours[keep], ref[keep], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(
    "overrides",
    [dict(scale_embedding=True), dict(scale_embedding=False, activation_function="gelu_new")],
    ids=["scaled-relu", "unscaled-gelu_new"],
)
def test_bare_encoder_folder_matches_transformers(tmp_path, overrides):
    hf = hf_encoder(**overrides)
    hf.save_pretrained(tmp_path)  # open_clip's text.transformer form: embed_tokens, layers, ...
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "m2m_100"
    model = create_model(tmp_path)
    assert isinstance(model, m.Encoder) and not model.training
    assert model.config.scale_embedding is overrides["scale_embedding"]
    ids, padding = batch()
    assert_same_real_tokens(ours_out(model, ids, padding), reference(hf, ids, padding), padding)
    # no mask: every token attended to (positions still skip the pad tokens)
    torch.testing.assert_close(
        ours_out(model, ids, None), reference(hf, ids, None), atol=1e-4, rtol=1e-4
    )


def test_conditional_generation_checkpoint_loads(tmp_path):
    from transformers import M2M100ForConditionalGeneration

    torch.manual_seed(0)
    hf = randomise(M2M100ForConditionalGeneration(hf_config()), seed=3)
    hf.save_pretrained(tmp_path)  # the hub form: model.shared, model.encoder/decoder, lm_head
    model = create_model(tmp_path)
    ids, padding = batch()
    ref = reference(hf.model.encoder, ids, padding)
    assert_same_real_tokens(ours_out(model, ids, padding), ref, padding)

    # the in-memory state dict too: every tied copy present (as pytorch_model.bin files hold)
    state = hf.state_dict()
    assert {"lm_head.weight", "model.encoder.embed_tokens.weight"} <= set(state)
    converted = m.convert_hf(state, model.config)
    assert set(converted) == set(model.state_dict())


def test_m2m100_model_state_dict_loads():
    from transformers import M2M100Model

    torch.manual_seed(0)
    hf = randomise(M2M100Model(hf_config()), seed=4)
    model = m.Encoder(m.config_from_hf(hf_config().to_dict())).eval()
    state = {k: v for k, v in hf.state_dict().items() if k != "encoder.embed_tokens.weight"}
    model.load_state_dict(m.convert_hf(state, model.config))  # shared.weight alone is enough
    ids, padding = batch()
    ref = reference(hf.encoder, ids, padding)
    assert_same_real_tokens(ours_out(model, ids, padding), ref, padding)


def test_longer_than_max_positions_grows_the_table_like_transformers():
    hf = hf_encoder(max_position_embeddings=8)
    model = m.Encoder(m.config_from_hf(hf.config.to_dict())).eval()
    model.load_state_dict(m.convert_hf(hf.state_dict(), model.config))
    ids = torch.randint(2, VOCAB, (2, 13), generator=torch.Generator().manual_seed(2))
    ids[1, 10:] = PAD
    padding = ids.eq(PAD)
    assert model.embed_positions.table.shape[0] == 8 + 2
    assert_same_real_tokens(ours_out(model, ids, padding), reference(hf, ids, padding), padding)
    assert model.embed_positions.table.shape[0] == 10  # the buffer itself is unchanged


@pytest.mark.parametrize("dim", [64, 63])
def test_sinusoidal_table_is_transformers_bit_for_bit(dim):
    from transformers.models.m2m_100.modeling_m2m_100 import (
        M2M100SinusoidalPositionalEmbedding as Reference,
    )

    ours = m.sinusoidal_table(66, dim, PAD)
    assert torch.equal(ours, Reference.get_embedding(66, dim, PAD))
    assert ours[PAD].abs().sum() == 0
    ids = torch.tensor([[5, 6, PAD, 7], [PAD, PAD, 8, 9]])
    ref_ids = Reference.create_position_ids_from_input_ids(ids, PAD)
    assert torch.equal(m.position_ids(ids, PAD), ref_ids)


def test_nllb_table_entry_builds_the_real_architecture():
    """create_model(<hub id>, pretrained=False) from the shipped config.json, no network; both
    models on the meta device (no 256k x 1024 embedding allocated)."""
    from attn_nlp.hf_configs import hf_config as table_entry
    from transformers import M2M100Config
    from transformers.models.m2m_100.modeling_m2m_100 import M2M100Encoder

    for name in ("facebook/nllb-200-distilled-600M", "facebook/nllb-200-distilled-1.3B"):
        entry = table_entry(name)
        with torch.device("meta"):
            ours = create_model(name, pretrained=False)
            ref = M2M100Encoder(
                M2M100Config(**{k: v for k, v in entry.items() if k != "model_type"})
            )
        assert isinstance(ours, m.Encoder)
        c = ours.config
        assert (c.vocab_size, c.embed_dim, c.pad_id, c.max_positions) == (256206, 1024, 1, 1024)
        assert (c.depth, c.num_heads, c.mlp_dim) == (
            entry["encoder_layers"],
            16,
            entry["encoder_ffn_dim"],
        )
        assert c.scale_embedding and c.act == "relu" and c.attn_dropout == 0.1
        count = sum(p.numel() for p in ours.parameters())
        assert count == sum(p.numel() for p in ref.parameters())
        assert ours.embed_tokens.weight.shape == ref.embed_tokens.weight.shape == (256206, 1024)
        assert len(ours.blocks) == len(ref.layers) == c.depth


def test_save_pretrained_round_trip(tmp_path):
    hf = hf_encoder()
    model = m.Encoder(m.config_from_hf(hf.config.to_dict())).eval()
    model.load_state_dict(m.convert_hf(hf.state_dict(), model.config))
    save_pretrained(model, tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["model_type"] == m.MODEL_TYPE == "attn_nlp.m2m100"
    again = create_model(tmp_path)
    assert type(again) is m.Encoder and again.config == model.config
    for k, v in model.state_dict().items():
        assert torch.equal(again.state_dict()[k], v), k
    assert not any("embed_positions" in k for k in again.state_dict())  # rebuilt, not stored
    ids, padding = batch()
    assert torch.equal(ours_out(again, ids, padding), ours_out(model, ids, padding))
    with pytest.raises(ValueError, match="unknown Config key.*'hidden'"):
        m.Config.from_dict({**model.config.to_dict(), "hidden": 3})


def _state():
    return dict(hf_encoder(max_position_embeddings=16).state_dict())


def test_bad_keys_are_named():
    config = m.config_from_hf(hf_config(max_position_embeddings=16).to_dict())
    state = _state()
    del state["layers.1.fc1.weight"]
    with pytest.raises(ValueError, match=r"missing keys: \['layers.1.fc1.weight'\]"):
        m.convert_hf(state, config)
    state = _state()
    state["layers.0.self_attn.extra"] = torch.zeros(1)
    state["layers.2.fc1.weight"] = torch.zeros(1)  # a layer more than the config says
    with pytest.raises(
        ValueError, match=r"unexpected keys: \['layers.0.self_attn.extra', 'layers.2.fc1.weight'\]"
    ):
        m.convert_hf(state, config)
    state = _state()
    del state["embed_tokens.weight"]
    with pytest.raises(ValueError, match=r"missing keys: \['embed_tokens.weight'\]"):
        m.convert_hf(state, config)
    # a decoder key is only dropped in the forms that have a decoder
    state = {**_state(), "lm_head.weight": torch.zeros(VOCAB, 64)}
    with pytest.raises(ValueError, match=r"unexpected keys: \['lm_head.weight'\]"):
        m.convert_hf(state, config)
    # the encoder's own embedding differs from the shared one: ambiguous, refused
    prefixed = {f"encoder.{k}": v for k, v in _state().items()}
    prefixed["shared.weight"] = prefixed["encoder.embed_tokens.weight"] + 1
    with pytest.raises(ValueError, match="encoder.embed_tokens.weight differs from shared"):
        m.convert_hf(prefixed, config)


def test_saved_position_table_is_checked_and_dropped():
    config = m.config_from_hf(hf_config(max_position_embeddings=16).to_dict())
    state = _state()
    state["embed_positions.weights"] = m.sinusoidal_table(18, 64, PAD)
    assert "embed_positions.weights" not in m.convert_hf(state, config)
    state["embed_positions.weights"] = torch.randn(18, 64)  # learned positions
    with pytest.raises(ValueError, match="embed_positions.weights .* not M2M100's sinusoidal"):
        m.convert_hf(state, config)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (dict(model_type="nllb-moe"), "'nllb-moe'"),
        (dict(model_type="bart"), "model_type='bart'"),
        (dict(num_experts=128, encoder_sparse_step=4), "num_experts"),
        (dict(activation_function="tanh"), "activation_function='tanh'"),
        (dict(normalize_before=False), "normalize_before=False"),
        (dict(add_final_layer_norm=False), "add_final_layer_norm=False"),
        (dict(static_position_embeddings=False), "static_position_embeddings"),
        (dict(hidden_size=128), "hidden_size=128 contradicts d_model=64"),
        (dict(pad_token_id=None), "pad_token_id=None"),
        (dict(encoder_attention_heads=5), r"embed_dim \(64\) must be divisible by num_heads \(5\)"),
    ],
)
def test_math_changing_fields_are_refused_by_name(change, message):
    config = {**hf_config().to_dict(), **change}
    with pytest.raises(ValueError, match=message):
        m.config_from_hf(config)


def test_folder_with_refused_field_and_ignored_fields(tmp_path):
    config = {
        **hf_config().to_dict(),
        "decoder_layers": 7,  # decoder sizes, generation settings: not the encoder's math
        "num_beams": 5,
        "init_std": 1.0,
    }
    cfg = m.config_from_hf(config)
    assert (cfg.depth, cfg.embed_dim, cfg.mlp_dim, cfg.num_heads) == (2, 64, 128, 4)
    (tmp_path / "config.json").write_text(json.dumps({**config, "activation_function": "prelu"}))
    with pytest.raises(ValueError, match="activation_function='prelu'"):
        create_model(tmp_path, pretrained=False)
    with pytest.warns(UserWarning, match="encoder_layerdrop=0.05 is ignored"):
        m.config_from_hf({**config, "encoder_layerdrop": 0.05})


def test_bad_inputs_are_clear_errors():
    config = m.Config(vocab_size=50, embed_dim=16, depth=1, num_heads=2, mlp_dim=32)
    model = m.Encoder(config).eval()
    ids = torch.randint(2, 50, (2, 5))
    with pytest.raises(ValueError, match=r"input_ids must be a \(B, L\) long tensor"):
        model(ids.float())
    with pytest.raises(ValueError, match=r"outside \[0, 50\)"):
        model(ids + 50)
    with pytest.raises(
        ValueError, match=r"key_padding_mask must be a bool tensor of shape \(2, 5\)"
    ):
        model(ids, ids.eq(PAD).long())
    with pytest.raises(ValueError, match="act must be one of"):
        m.Config(act="gelu_new")


def test_loading_a_folder_imports_no_transformers(tmp_path):
    """A fresh interpreter: import, load an HF encoder folder, run it -- transformers (and
    the other reference libraries) never imported."""
    hf_encoder().save_pretrained(tmp_path)
    code = (
        "import sys, torch, attn_nlp.m2m100, attn_nlp\n"
        f"model = attn_nlp.create_model({str(tmp_path)!r})\n"
        "model(torch.tensor([[5, 6, 1]]), torch.tensor([[False, False, True]]))\n"
        "heavy = {'timm', 'open_clip', 'transformers', 'torchvision'}\n"
        "print(sorted({k.split('.')[0] for k in sys.modules} & heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
