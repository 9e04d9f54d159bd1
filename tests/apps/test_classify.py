"""apps/classify.py: a saved attn_vision folder (as finetune_vit.py writes it) classifies
images with its own class names and preprocessing; bad input is one line and exit 2."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch
from PIL import Image

APP = Path(__file__).resolve().parents[2] / "apps" / "classify.py"
CLASSES = ["circle", "square", "star"]


@pytest.fixture
def app(monkeypatch):
    monkeypatch.syspath_prepend(str(APP.parent))
    spec = importlib.util.spec_from_file_location("classify_app", APP)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def saved(tmp_path):
    import attn_vision

    model = attn_vision.create_model(
        "vit_tiny_patch16_224", num_classes=3, img_size=32, depth=2, embed_dim=32, num_heads=2
    )
    model.pretrained_cfg["label_names"] = CLASSES
    folder = attn_vision.save_pretrained(model, tmp_path / "model")
    images = tmp_path / "images"
    images.mkdir()
    for colour in ("red", "blue"):
        Image.new("RGB", (40, 30), colour).save(images / f"{colour}.png")
    return model, folder, images


def test_top_k_with_the_saved_class_names(app, saved, capsys):
    import attn_vision

    model, folder, images = saved
    args = ["--model", str(folder), "--images", str(images), "--top-k", "2", "--json"]
    assert app.main(args) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [Path(r["image"]).name for r in rows] == ["blue.png", "red.png"]
    transform = attn_vision.create_transform(model)
    for r in rows:
        with torch.no_grad():
            x = transform(Image.open(r["image"]).convert("RGB"))[None]
            probs = model.eval()(x).softmax(-1)[0]
        top = probs.topk(2)
        assert [p["class"] for p in r["predictions"]] == [CLASSES[i] for i in top.indices]
        assert [p["prob"] for p in r["predictions"]] == pytest.approx(top.values.tolist())
    assert app.main(["--model", str(folder), "--image", str(images / "red.png")]) == 0
    out = capsys.readouterr().out
    assert out.startswith(str(images / "red.png")) and "%" in out


def test_bad_input_is_one_line_and_2(app, saved, capsys, tmp_path, torchscript_payload):
    _, folder, images = saved
    archive, marker = torchscript_payload
    cases = [
        (["--model", str(folder)], "no images"),
        (["--model", str(folder), "--image", str(tmp_path / "nope.png")], "image not found"),
        (["--model", "vit_tiny_patchh16_224", "--image", str(images / "red.png")], "unknown"),
        (["--model", str(folder), "--images", str(images / "red.png")], "is a file"),
        (["--model", "resnet18", "--pretrained", str(archive), "--images", str(images)], "refus"),
    ]
    for args, needle in cases:
        assert app.main(args) == 2, args
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: ") and needle in err[0], err
    assert not marker.exists()
