"""apps/classify.py: a saved attn_vision folder (as finetune_vit.py writes it) classifies
images with its own class names and preprocessing; bad input is one line and exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import classify as app  # apps/classify.py
import pytest
import torch
from _support.apps import error_line
from PIL import Image

CLASSES = ["circle", "square", "star"]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    import attn_vision

    tmp_path = tmp_path_factory.mktemp("classify")
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


def test_top_k_with_the_saved_class_names(saved, capsys):
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


def test_bad_input_is_one_line_and_2(saved, capsys, tmp_path, torchscript_payload):
    _, folder, images = saved
    archive, marker = torchscript_payload
    cases = [
        (["--model", str(folder)], "no images"),
        (["--model", str(folder), "--image", str(tmp_path / "nope.png")], "image not found"),
        (["--model", "vit_tiny_patchh16_224", "--image", str(images / "red.png")], "unknown"),
        (["--model", str(folder), "--images", str(images / "red.png")], "is a file"),
        (["--model", "resnet18", "--image", str(images / "red.png")], "random weights"),
        (["--model", str(folder), "--image", str(tmp_path / "e.png")], "empty file"),
        (["--model", "resnet18", "--pretrained", str(archive), "--images", str(images)], "refus"),
    ]
    (tmp_path / "e.png").write_bytes(b"")
    for args, needle in cases:
        assert app.main(args) == 2, args
        assert needle in error_line(capsys), args
    assert not marker.exists()


def test_a_model_name_needs_weights_or_random_weights(saved, capsys):
    """A name without --pretrained would classify with random weights: refused in one line
    naming the way out; --random-weights runs it (to try the app)."""
    images = saved[2]
    argv = ["--model", "vit_tiny_patch16_224", "--image", str(images / "red.png")]
    assert app.main(argv) == 2
    line = error_line(capsys)
    assert "random weights" in line and "--pretrained" in line and "--random-weights" in line
    assert app.main([*argv, "--random-weights", "--top-k", "1", "--json"]) == 0
    (row,) = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert len(row["predictions"]) == 1 and row["predictions"][0]["index"] in range(1000)
