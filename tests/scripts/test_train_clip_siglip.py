"""scripts/train_clip.py fine-tuning a SigLIP checkpoint with the sigmoid loss: a tiny
random-init SigLIP (timm-style image tower with the MAP head, SigLIP text tower, logit
bias) in open_clip's folder layout, its sentencepiece tokenizer inside, two steps of
``--loss siglip``; every part of the model trains and the result loads back."""

from __future__ import annotations

import io
import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from _support.train import shapes_data
from safetensors.torch import load_file


@pytest.fixture(scope="module")
def tc():
    import train_clip

    return train_clip


def siglip_checkpoint(folder: Path, captions: list[str]) -> Path:
    """``open_clip_config.json`` + ``open_clip_model.safetensors`` of a tiny SigLIP, and a
    sentencepiece (T5-style, as SigLIP's) tokenizer trained on ``captions``."""
    import attn_clip
    import sentencepiece as spm

    cfg = attn_clip.get_model_config("ViT-B-16-SigLIP")
    v = replace(cfg.vision, image_size=32, patch_size=8, width=32, layers=1, head_width=16)
    t = replace(cfg.text, width=32, heads=2, layers=1, context_length=16, vocab_size=64)
    attn_clip.save_pretrained(
        attn_clip.create_model(replace(cfg, embed_dim=32, vision=v, text=t)), folder
    )
    out = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(captions), model_writer=out, vocab_size=48, model_type="unigram",
        pad_id=0, eos_id=1, unk_id=2, bos_id=-1, minloglevel=2,
    )  # fmt: skip
    (folder / "spiece.model").write_bytes(out.getvalue())
    (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "T5Tokenizer"}))
    return folder


def test_siglip_checkpoint_fine_tunes_with_the_sigmoid_loss(tc, tmp_path_factory, tmp_path):
    pytest.importorskip("sentencepiece")
    pytest.importorskip("transformers")
    import attn_clip

    data = shapes_data(tmp_path_factory)
    captions = [line.split(",", 1)[1] for line in (data / "train.csv").read_text().splitlines()[1:]]
    folder = siglip_checkpoint(tmp_path / "siglip", captions * 4)
    oc_config = json.loads((folder / "open_clip_config.json").read_text())["model_cfg"]
    assert oc_config["vision_cfg"]["timm_model_name"] == "vit_base_patch16_siglip_224"
    start = attn_clip.create_model(str(folder)).state_dict()

    out = tmp_path / "run"
    args = ["--model", str(folder), "--train-data", str(data / "train.csv"), "--loss", "siglip"]
    args += ["--batch-size", "8", "--max-steps", "2", "--lr", "1e-3", "--warmup", "1"]
    tc.main([*args, "--threads", "1", "--quiet", "--log-every", "1", "--out", str(out)])

    logs = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in logs if "loss" in r and "event" not in r]
    assert len(losses) == 2 and all(torch.isfinite(torch.tensor(losses)))
    tuned = load_file(out / "last" / "model.safetensors")
    for key in ("logit_bias", "logit_scale", "visual.trunk.attn_pool.latent", "text.proj.bias"):
        assert not torch.equal(tuned[key], start[key]), key  # the SigLIP parts train
    final = attn_clip.create_model(str(out / "final"))
    assert final.config.vision.pool_type == "map" and final.logit_bias is not None
    assert all(torch.equal(v, tuned[k]) for k, v in final.state_dict().items())
