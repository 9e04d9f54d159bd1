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


LABELS = {0: "tabby cat", 1: "golden retriever", 2: "goldfish"}


@pytest.fixture(scope="module")
def hf_vit(tmp_path_factory):
    """A tiny random transformers ViTForImageClassification (1 block of 2 x 16-channel heads
    at 32 px, 3 named labels; the head scaled up so the classes are far apart) and its
    image processor (transformers' PIL backend, which attn_vision's preprocessing
    reproduces; its torchvision backend's bilinear resize differs by a level here and
    there), saved as transformers saves them; 2 random-noise photos."""
    from transformers import ViTConfig, ViTForImageClassification
    from transformers import ViTImageProcessorPil as ViTImageProcessor

    tmp = tmp_path_factory.mktemp("classify_hf")
    torch.manual_seed(0)
    config = ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                       intermediate_size=64, image_size=32, patch_size=8, id2label=LABELS,
                       label2id={v: k for k, v in LABELS.items()})  # fmt: skip
    model = ViTForImageClassification(config).eval()
    with torch.no_grad():
        model.classifier.weight.mul_(100)
    processor = ViTImageProcessor(size={"height": 32, "width": 32})
    model.save_pretrained(tmp / "vit")
    processor.save_pretrained(tmp / "vit")
    images = tmp / "photos"
    images.mkdir()
    gen = torch.Generator().manual_seed(1)
    for i in range(2):
        pixels = torch.randint(0, 256, (45, 60, 3), generator=gen, dtype=torch.uint8)
        Image.fromarray(pixels.numpy()).save(images / f"{i}.png")
    return model, processor, tmp / "vit", images


def test_a_transformers_folder_prints_its_own_labels(hf_vit, capsys, tmp_path, monkeypatch,
                                                     fake_hub_cache):  # fmt: skip
    """The top-k of apps/classify.py on a transformers folder are transformers' own (its
    processor, its logits, its id2label names); the same as hf-hub:<id> from the cache."""
    from huggingface_hub import constants

    model, processor, folder, images = hf_vit
    args = ["--images", str(images), "--top-k", "3", "--json"]
    assert app.main(["--model", str(folder), *args]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(rows) == 2
    for r in rows:
        inputs = processor(Image.open(r["image"]), return_tensors="pt")
        with torch.no_grad():
            probs = model(**inputs).logits.softmax(-1)[0]
        top = probs.topk(3)
        assert [p["class"] for p in r["predictions"]] == [LABELS[i] for i in top.indices.tolist()]
        assert [p["prob"] for p in r["predictions"]] == pytest.approx(top.values.tolist(), abs=1e-5)
    assert {r["predictions"][0]["class"] for r in rows} <= set(LABELS.values())

    files = {p.name: p.read_bytes() for p in folder.iterdir()}
    fake_hub_cache(tmp_path / "hub", "google/vit-tiny-test", files)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    assert app.main(["--model", "hf-hub:google/vit-tiny-test", *args]) == 0
    again = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["predictions"] for r in again] == [r["predictions"] for r in rows]
    assert app.main(["--model", "hf-hub:google/not-cached", *args]) == 2
    line = error_line(capsys)
    assert "google/not-cached" in line and str(tmp_path / "hub") in line
    assert line.endswith("pass the local file or folder instead (--model FOLDER)."), line
