"""create_model: presets, local directories, save/load round trip, clear errors offline."""

from __future__ import annotations

import json

import pytest
import torch
from attn_core.hub import CheckpointError, WeightsUnavailableError
from attn_nlp import (
    BPETokenizer,
    Transformer,
    create_model,
    get_config,
    list_models,
    save_pretrained,
)


def test_presets():
    assert {"transformer-base", "transformer-big", "transformer-tiny"} <= set(list_models())
    base = get_config("transformer-base")
    assert (base.embed_dim, base.encoder_depth, base.num_heads, base.mlp_dim) == (512, 6, 8, 2048)
    big = get_config("transformer-big")
    assert (big.embed_dim, big.num_heads, big.mlp_dim) == (1024, 16, 4096)
    model = create_model("transformer-tiny", src_vocab_size=100)
    n = sum(p.numel() for p in model.parameters())
    assert isinstance(model, Transformer) and 0 < n < 2_000_000
    with pytest.raises(ValueError, match="divisible"):
        get_config("transformer-tiny", num_heads=5)


def test_unknown_model_is_a_clear_error():
    with pytest.raises(
        WeightsUnavailableError, match="unknown model 'transformer-huge'.*transformer-base"
    ):
        create_model("transformer-huge")
    with pytest.raises(WeightsUnavailableError, match="unknown model ../no/such/dir."):
        create_model("./no/such/dir")


def test_offline_hub_error_names_repo_and_cache(tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(WeightsUnavailableError) as err:
        create_model("Helsinki-NLP/opus-mt-en-zh", cache_dir=tmp_path)
    message = str(err.value)
    assert "Helsinki-NLP/opus-mt-en-zh" in message and str(tmp_path) in message
    assert "local file or folder" in message


def test_one_contract_eval_mode_overrides_and_weight_files(tmp_path):
    model = create_model("transformer-tiny", src_vocab_size=50, max_positions=32)
    assert not model.training  # every create_model returns eval mode
    save_pretrained(model, tmp_path)
    again = create_model(
        "transformer-tiny", tmp_path / "model.safetensors", src_vocab_size=50, max_positions=32
    )
    src, tgt = torch.randint(4, 50, (2, 7)), torch.randint(4, 50, (2, 5))
    torch.testing.assert_close(again(src, tgt), model(src, tgt))
    assert create_model(tmp_path, dropout=0.3).config.dropout == 0.3  # overrides on a folder
    with pytest.raises(CheckpointError, match="shape"):
        create_model(tmp_path, embed_dim=64, num_heads=4)
    with pytest.raises(ValueError, match="no published weights"):
        create_model("transformer-tiny", pretrained=True)


def test_save_and_load_round_trip(tmp_path):
    model = create_model("transformer-tiny", src_vocab_size=50, max_positions=32).eval()
    tok = BPETokenizer.train(
        ["one two three", "four five six"] * 10, vocab_size=50, min_frequency=1
    )
    save_pretrained(model, tmp_path, tokenizer=tok)
    assert (
        json.loads((tmp_path / "config.json").read_text())["model_type"] == "attn_nlp.transformer"
    )
    loaded = create_model(tmp_path)
    src, tgt = torch.randint(4, 50, (2, 7)), torch.randint(4, 50, (2, 5))
    torch.testing.assert_close(loaded(src, tgt), model(src, tgt))
    assert loaded.head.weight is loaded.tgt_embed.weight  # tying survives the round trip
    assert (tmp_path / "tokenizer.json").is_file()


def test_load_rejects_mismatched_weights(tmp_path):
    model = create_model("transformer-tiny", src_vocab_size=50, max_positions=32)
    save_pretrained(model, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["decoder_depth"] = 3
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="missing.*decoder.blocks.2"):
        create_model(tmp_path)


def test_pretrained_false_builds_random_weights(marian_dir):
    fresh = create_model(marian_dir, pretrained=False)
    loaded = create_model(marian_dir)
    assert fresh.config == loaded.config
    assert not torch.equal(fresh.src_embed.weight, loaded.src_embed.weight)


def test_checkpoint_generation_settings_are_used(marian_dir):
    model = create_model(marian_dir)
    gen = model.generation_config
    assert (gen.num_beams, gen.max_length, gen.bad_words_ids) == (4, 24, [[59]])
    assert (gen.eos_token_id, gen.pad_token_id, gen.decoder_start_token_id) == (0, 59, 59)
    assert gen.forced_eos_token_id == 0


def test_torchscript_payload_never_runs(torchscript_payload, tmp_path):
    archive, marker = torchscript_payload
    model = create_model("transformer-tiny", src_vocab_size=50)
    with pytest.raises(CheckpointError):
        create_model("transformer-tiny", pretrained=archive, src_vocab_size=50)
    save_pretrained(model, tmp_path)
    (tmp_path / "model.safetensors").unlink()
    (tmp_path / "pytorch_model.bin").write_bytes(archive.read_bytes())
    with pytest.raises(CheckpointError):
        create_model(tmp_path)
    assert not marker.exists()


def test_building_and_loading_imports_no_reference_library(tmp_path):
    """A fresh interpreter: preset, save, load back -- transformers is never imported."""
    import subprocess
    import sys

    code = (
        "import sys, attn_nlp\n"
        "m = attn_nlp.create_model('transformer-tiny', src_vocab_size=50)\n"
        f"attn_nlp.save_pretrained(m, {str(tmp_path)!r})\n"
        f"attn_nlp.create_model({str(tmp_path)!r})\n"
        "heavy = {'timm', 'open_clip', 'transformers', 'torchvision'}\n"
        "print(sorted({k.split('.')[0] for k in sys.modules} & heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
