"""attn_nlp.t5: the T5 / mT5 encoder against transformers (random init, saved, loaded back).

Tiny ``MT5EncoderModel`` / ``T5EncoderModel`` (width 64, 2 layers, real structure) are saved
with ``save_pretrained`` and loaded by ``attn_nlp.create_model(folder)``; the last hidden
states match on a padded batch longer than ``relative_attention_max_distance``.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from attn_nlp import create_model, save_pretrained, t5
from attn_nlp.hf_configs import hf_config
from torch.testing import assert_close

transformers = pytest.importorskip("transformers")

VOCAB, PAD = 1000, 0
TINY = dict(d_model=64, num_heads=4, d_ff=128, num_layers=2, vocab_size=VOCAB, pad_token_id=PAD)
CASES = {
    # name: (reference class, config class, fields on top of TINY)
    "mt5": ("MT5EncoderModel", "MT5Config", dict(d_kv=16)),  # inner 4 * 16 = d_model
    "t5-relu-wide-heads": ("T5EncoderModel", "T5Config", dict(d_kv=24)),  # inner 96 != 64
    "mt5-few-buckets": (
        "MT5EncoderModel",
        "MT5Config",
        dict(d_kv=8, relative_attention_num_buckets=8, relative_attention_max_distance=20),
    ),
}
LENGTHS = (150, 97, 3, 1)  # the longest beyond max_distance 128: every bucket is used


def _reference(case: str, seed: int = 0):
    model_cls, config_cls, fields = CASES[case]
    config = getattr(transformers, config_cls)(**TINY, **fields)
    torch.manual_seed(seed)
    model = getattr(transformers, model_cls)(config).eval()
    with torch.no_grad():  # T5's init makes the bias tiny; large scores expose a wrong bucket
        for name, p in model.named_parameters():
            if "relative_attention_bias" in name:
                p.normal_(0.0, 2.0)
    return model


def _batch(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids ``(4, 150)`` (no pad id inside a sequence) and the padding mask."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB, (len(LENGTHS), max(LENGTHS)), generator=g)
    padding = torch.arange(max(LENGTHS))[None, :] >= torch.tensor(LENGTHS)[:, None]
    return ids.masked_fill(padding, PAD), padding


def _hf_hidden(model, ids: torch.Tensor, padding: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=(~padding).long()).last_hidden_state


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """case -> a folder written by the reference's ``save_pretrained`` (safetensors)."""
    out = {}
    for case in CASES:
        out[case] = tmp_path_factory.mktemp(case)
        _reference(case).save_pretrained(out[case])
    return out


@pytest.mark.parametrize("case", list(CASES))
def test_matches_transformers_with_padding(folders, case):
    model_cls = getattr(transformers, CASES[case][0])
    ref = model_cls.from_pretrained(folders[case], attn_implementation="eager").eval()
    model = create_model(folders[case])
    assert isinstance(model, t5.Encoder) and not model.training
    ids, padding = _batch()
    with torch.no_grad():
        ours = model(ids, key_padding_mask=padding)
    assert ours.shape == (len(LENGTHS), max(LENGTHS), 64)
    # T5 masks keys only: every position of a sequence with a real token is defined
    assert_close(ours, _hf_hidden(ref, ids, padding), atol=1e-4, rtol=1e-4)
    if case == "mt5":  # transformers' default (sdpa) path gives the same
        sdpa = model_cls.from_pretrained(folders[case], attn_implementation="sdpa").eval()
        assert_close(ours, _hf_hidden(sdpa, ids, padding), atol=1e-4, rtol=1e-4)
        # no mask = attend to every token
        with torch.no_grad():
            full = ref(input_ids=ids[:, :40]).last_hidden_state
            assert_close(model(ids[:, :40]), full, atol=1e-4, rtol=1e-4)


def test_config_from_hf_reads_the_architecture(folders):
    config = json.loads((folders["t5-relu-wide-heads"] / "config.json").read_text())
    cfg = t5.config_from_hf(config)
    assert (cfg.embed_dim, cfg.depth, cfg.num_heads, cfg.head_dim, cfg.mlp_dim) == (
        64,
        2,
        4,
        24,
        128,
    )
    assert cfg.feed_forward == "relu" and cfg.inner_dim == 96
    few = t5.config_from_hf(json.loads((folders["mt5-few-buckets"] / "config.json").read_text()))
    assert (few.relative_buckets, few.relative_max_distance, few.feed_forward) == (
        8,
        20,
        "gated-gelu",
    )
    # keys missing from config.json take transformers' defaults of that model_type
    for model_type, config_cls in (("t5", "T5Config"), ("mt5", "MT5Config")):
        ref = getattr(transformers, config_cls)()
        cfg = t5.config_from_hf({"model_type": model_type})
        assert (
            cfg.vocab_size,
            cfg.embed_dim,
            cfg.depth,
            cfg.num_heads,
            cfg.head_dim,
            cfg.mlp_dim,
        ) == (
            ref.vocab_size,
            ref.d_model,
            ref.num_layers,
            ref.num_heads,
            ref.d_kv,
            ref.d_ff,
        )
        assert cfg.feed_forward == ref.feed_forward_proj and cfg.norm_eps == ref.layer_norm_epsilon


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"feed_forward_proj": "gated-silu"}, "feed_forward_proj"),
        ({"feed_forward_proj": "gelu"}, "feed_forward_proj"),
        # transformers computes with a saved dense_act_fn / is_gated_act over the proj name
        ({"feed_forward_proj": "gated-gelu", "dense_act_fn": "gelu"}, "dense_act_fn"),
        ({"feed_forward_proj": "relu", "is_gated_act": True}, "is_gated_act"),
        ({"is_decoder": True}, "is_decoder"),
        ({"pruned_heads": {"0": [1]}}, "pruned_heads"),
        ({"model_type": "bert"}, "model_type"),
        ({"d_model": 64, "hidden_size": 32}, "hidden_size"),
    ],
)
def test_config_from_hf_refuses_what_it_cannot_compute(fields, named):
    with pytest.raises(ValueError, match=named):
        t5.config_from_hf({"model_type": "mt5", **fields})


def test_refused_field_in_a_folder(folders, tmp_path):
    config = json.loads((folders["mt5"] / "config.json").read_text())
    config["feed_forward_proj"] = "gated-silu"
    config.pop("dense_act_fn", None)
    config.pop("is_gated_act", None)
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "model.safetensors").write_bytes(
        (folders["mt5"] / "model.safetensors").read_bytes()
    )
    with pytest.raises(ValueError, match="gated-silu"):
        create_model(tmp_path)


def test_config_checks_its_fields():
    with pytest.raises(ValueError, match="feed_forward"):
        t5.Config(feed_forward="swiglu")
    with pytest.raises(ValueError, match="relative_buckets"):
        t5.Config(relative_buckets=2)
    with pytest.raises(ValueError, match="relative_max_distance"):
        t5.Config(relative_buckets=32, relative_max_distance=8)
    with pytest.raises(ValueError, match="head_dim"):
        t5.Config(head_dim=0)
    with pytest.raises(ValueError, match="unknown Config key"):
        t5.Config.from_dict({"width": 64, "d_model": 64})


@pytest.mark.parametrize("num_buckets, max_distance", [(32, 128), (8, 20), (9, 16), (4, 3)])
@pytest.mark.parametrize("bidirectional", [True, False])
def test_relative_position_bucket_matches_transformers(num_buckets, max_distance, bidirectional):
    from transformers.models.t5.modeling_t5 import T5Attention

    offsets = torch.arange(-400, 401)
    kw = dict(bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance)
    ours = t5.relative_position_bucket(offsets, **kw)
    assert torch.equal(ours, T5Attention._relative_position_bucket(offsets, **kw))
    assert ours.min() >= 0 and ours.max() < num_buckets


def test_conditional_generation_checkpoint_loads(tmp_path):
    """The hub form (MT5ForConditionalGeneration): decoder and LM head dropped by name."""
    config = transformers.MT5Config(**TINY, d_kv=16, num_decoder_layers=1)
    torch.manual_seed(3)
    ref = transformers.MT5ForConditionalGeneration(config).eval()
    ref.save_pretrained(tmp_path)
    model = create_model(tmp_path)
    ids, padding = _batch()
    with torch.no_grad():
        want = ref.encoder(input_ids=ids, attention_mask=(~padding).long()).last_hidden_state
        assert_close(model(ids, key_padding_mask=padding), want, atol=1e-4, rtol=1e-4)
    # the in-memory state dict carries every tied copy (encoder / decoder embed_tokens,
    # lm_head): accepted, the encoder's checked against shared.weight
    state = ref.state_dict()
    assert {"encoder.embed_tokens.weight", "lm_head.weight"} <= set(state)
    converted = t5.convert_hf(state, model.config)
    assert set(converted) == set(model.state_dict())
    state = dict(state)
    state["encoder.embed_tokens.weight"] = state["shared.weight"] + 1.0
    with pytest.raises(ValueError, match="encoder.embed_tokens.weight"):
        t5.convert_hf(state, model.config)


def test_bare_stack_as_open_clip_stores_it():
    """open_clip keeps ``MT5Model().encoder`` (a T5Stack): keys without ``encoder.``."""
    ref = _reference("mt5", seed=4)
    stack = ref.encoder.state_dict()
    assert "embed_tokens.weight" in stack and "block.0.layer.0.SelfAttention.q.weight" in stack
    cfg = t5.config_from_hf(ref.config.to_dict())
    model = t5.Encoder(cfg).eval()
    model.load_state_dict(t5.convert_hf(stack, cfg))
    ids, padding = _batch(seed=5)
    with torch.no_grad():
        assert_close(
            model(ids, key_padding_mask=padding),
            _hf_hidden(ref, ids, padding),
            atol=1e-4,
            rtol=1e-4,
        )
    # an encoder-only state dict with shared.weight only (no encoder.embed_tokens) also loads
    state = {k: v for k, v in ref.state_dict().items() if k != "encoder.embed_tokens.weight"}
    assert "shared.weight" in state
    assert set(t5.convert_hf(state, cfg)) == set(model.state_dict())


def test_missing_and_unexpected_keys_are_named():
    ref = _reference("t5-relu-wide-heads")
    cfg = t5.config_from_hf(ref.config.to_dict())
    state = ref.state_dict()
    gone = "encoder.block.1.layer.1.DenseReluDense.wo.weight"
    with pytest.raises(ValueError, match=f"missing keys: \\['{gone}'\\]"):
        t5.convert_hf({k: v for k, v in state.items() if k != gone}, cfg)
    extra = "encoder.block.1.layer.0.SelfAttention.relative_attention_bias.weight"
    with pytest.raises(ValueError, match=f"unexpected keys: \\['{extra}'\\]"):
        t5.convert_hf({**state, extra: torch.zeros(32, 4)}, cfg)
    no_embed = {k: v for k, v in state.items() if "embed_tokens" not in k and k != "shared.weight"}
    with pytest.raises(ValueError, match="shared.weight"):
        t5.convert_hf(no_embed, cfg)
    # a gated checkpoint read as relu: wi_0 / wi_1 unexpected, wi missing
    gated = _reference("mt5").state_dict()
    with pytest.raises(ValueError, match="wi_0"):
        t5.convert_hf(gated, t5.Config(**{**cfg.to_dict(), "head_dim": 16}))


def test_save_pretrained_round_trip(folders, tmp_path):
    model = create_model(folders["t5-relu-wide-heads"])
    save_pretrained(model, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == t5.MODEL_TYPE == "attn_nlp.t5"
    again = create_model(tmp_path)
    assert again.config == model.config
    for name, tensor in model.state_dict().items():
        assert torch.equal(again.state_dict()[name], tensor), name
    ids, padding = _batch()
    with torch.no_grad():
        assert torch.equal(again(ids, padding), model(ids, padding))


def test_input_checks(folders):
    model = create_model(folders["mt5"])
    ids, padding = _batch()
    with pytest.raises(ValueError, match="input_ids"):
        model(ids.float())
    with pytest.raises(ValueError, match="key_padding_mask"):
        model(ids, padding.float())
    with pytest.raises(ValueError, match="key_padding_mask"):
        model(ids, padding[:, :10])


def test_dropout_is_training_only():
    cfg = t5.Config(vocab_size=50, embed_dim=32, depth=1, num_heads=2, head_dim=16, mlp_dim=64)
    torch.manual_seed(0)
    plain = t5.Encoder(cfg).eval()
    dropped = t5.Encoder(t5.Config(**{**cfg.to_dict(), "dropout": 0.5}))
    dropped.load_state_dict(plain.state_dict())
    ids = torch.randint(0, 50, (2, 7))
    assert not torch.allclose(dropped.train()(ids), plain(ids))
    assert torch.equal(dropped.eval()(ids), plain(ids))


@pytest.mark.parametrize("name", ["google/mt5-base", "google/mt5-xl"])
def test_shipped_architecture_builds_offline(name):
    """``create_model(hub id, pretrained=False)`` builds the real encoder from the shipped
    table; on the meta device, compared with transformers built from the same entry."""
    with torch.device("meta"):
        model = create_model(name, pretrained=False)
        ref = transformers.MT5EncoderModel(transformers.MT5Config.from_dict(hf_config(name)))
    assert isinstance(model, t5.Encoder)
    count = sum(p.numel() for p in model.parameters())
    assert count == sum(p.numel() for p in ref.parameters())
    converted = t5.convert_hf(ref.state_dict(), model.config)
    ours = model.state_dict()
    assert {k: v.shape for k, v in converted.items()} == {k: v.shape for k, v in ours.items()}


def test_building_and_loading_imports_no_transformers(folders, tmp_path):
    """A fresh interpreter loads a Hugging Face T5 folder and our own; no transformers."""
    code = (
        "import sys, attn_nlp.t5, attn_nlp\n"
        "assert 'transformers' not in sys.modules, 'import attn_nlp.t5'\n"
        f"m = attn_nlp.create_model({str(folders['mt5'])!r})\n"
        f"attn_nlp.save_pretrained(m, {str(tmp_path)!r})\n"
        f"attn_nlp.create_model({str(tmp_path)!r})\n"
        "heavy = {'timm', 'open_clip', 'transformers', 'torchvision'}\n"
        "print(sorted({k.split('.')[0] for k in sys.modules} & heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr
