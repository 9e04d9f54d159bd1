"""apps/zero_shot.py with a MobileCLIP folder, offline: a tiny random ``MobileCLIP-S2``-kind
CLIP (a FastViT / MCi2 tower, one block per stage, narrow; a bidirectional text tower) with
MobileCLIP's preprocessing (mean 0 / std 1, bilinear, shortest side), saved unfolded and,
after ``model.visual.reparameterize()``, folded. With the network shut off the app loads
both folders; its probabilities equal the library's on the same folder, and the folded
folder's equal the unfolded one's.

The app's ``main`` runs in process (a real zero_shot.py process: tests/apps/test_zero_shot.py)."""

from __future__ import annotations

import json
import socket
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import zero_shot  # apps/zero_shot.py
from PIL import Image, ImageDraw
from torch import nn

LABELS = ["red circle", "blue square", "green triangle"]


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """One intra-op thread: tiny convolutions; on a busy 2-core machine a second thread
    mostly waits."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> tuple[Path, Path]:
    """``(unfolded, folded)`` folders of one random tiny MobileCLIP (BatchNorm statistics
    and layer scales away from their defaults, so that folding changes the tensors)."""
    import attn_clip

    cfg = attn_clip.get_model_config("MobileCLIP-S2")
    fastvit = {**cfg.vision.fastvit, "layers": (1, 1, 1, 1), "embed_dims": (8, 16, 32, 64)}
    vision = replace(cfg.vision, image_size=64, fastvit=fastvit)
    text = replace(cfg.text, width=32, heads=2, layers=1, context_length=16)
    torch.manual_seed(0)
    model = attn_clip.create_model(replace(cfg, embed_dim=24, vision=vision, text=text))
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.normal_(0.0, 0.1)
                m.running_var.uniform_(0.5, 1.5)
        for name, p in model.named_parameters():
            if name.endswith("gamma"):
                p.uniform_(0.2, 1.0)
    pre = attn_clip.get_pretrained_cfg("MobileCLIP-S2", "datacompdr").preprocess
    model.preprocess_cfg = replace(pre, size=64)
    root = tmp_path_factory.mktemp("mobileclip")
    unfolded = attn_clip.save_pretrained(model, root / "unfolded")
    model.visual.reparameterize()  # (in place: the same model, folded)
    folded = attn_clip.save_pretrained(model, root / "folded")
    return unfolded, folded


@pytest.fixture(scope="module")
def gallery(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("gallery")
    for i, (colour, shape) in enumerate([("red", "circle"), ("blue", "square"), ("green", "x")]):
        image = Image.new("RGB", (80, 70), "white")
        draw = ImageDraw.Draw(image)
        box = (10 + 3 * i, 8, 60 + 2 * i, 58)
        (draw.ellipse if shape == "circle" else draw.rectangle)(box, fill=colour)
        image.save(root / f"{colour}_{shape}.png")
    return root


@pytest.fixture
def offline(monkeypatch):
    """No network: the hub offline, and any connection attempt an error."""
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)

    def refuse(*args, **kwargs):
        raise OSError("the network was used")

    monkeypatch.setattr(socket.socket, "connect", refuse)


def _app_probs(folder: Path, gallery: Path, capsys) -> dict[str, list[float]]:
    argv = ["--model", str(folder), "--images", str(gallery), "--labels", *LABELS, "--json"]
    assert zero_shot.main(argv) == 0, capsys.readouterr().err
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(records) == 3
    out = {}
    for r in records:
        got = {p["label"]: p["prob"] for p in r["predictions"]}
        out[Path(r["image"]).name] = [got[label] for label in LABELS]
    return out


def test_zero_shot_app_with_mobileclip_folders_offline(folders, gallery, offline, capsys):
    import attn_clip

    unfolded, folded = folders
    app = {f: _app_probs(f, gallery, capsys) for f in folders}
    for folder in folders:
        model, preprocess, tokenizer = attn_clip.create_model_and_transforms(str(folder))
        v = model.config.vision
        assert v.tower == "fastvit" and v.fastvit["inference_mode"] == (folder == folded)
        pre = model.preprocess_cfg
        assert (pre.mean, pre.std, pre.interpolation) == ((0.0,) * 3, (1.0,) * 3, "bilinear")
        classifier = attn_clip.build_zero_shot_classifier(model, tokenizer, LABELS)
        for name, probs in app[folder].items():
            with Image.open(gallery / name) as im:
                want = attn_clip.predict(model, preprocess(im)[None], classifier)[0]
            torch.testing.assert_close(torch.tensor(probs), want)
    for name, probs in app[unfolded].items():
        torch.testing.assert_close(torch.tensor(app[folded][name]), torch.tensor(probs))
