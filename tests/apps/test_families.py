"""apps/zero_shot.py and apps/retrieval.py with the other image towers: a ConvNeXt CLIP
(timm ConvNeXt + open_clip's MLP projection head), an OpenAI ResNet CLIP (ModifiedResNet),
an EVA02-CLIP (timm Eva: RoPE, SwiGLU, its classifier head as the projection) and a ViTamin
CLIP (MBConv stem, GeGLU blocks), tiny
and random, saved in open_clip's folder layout. Both apps load the folder, zero-shot
scores equal the library's on the same model, and an index built with the folder answers
text and image queries with the library's cosines.

The apps' ``main`` runs in process (a real zero_shot.py process: tests/apps/test_zero_shot.py);
each family's folder is built once."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import retrieval  # apps/retrieval.py
import torch
import zero_shot  # apps/zero_shot.py
from PIL import Image, ImageDraw

LABELS = ["red circle", "blue square", "green triangle"]


def tiny_folder(family: str, folder: Path) -> Path:
    """A random CLIP of open_clip's ``convnext_large_d`` / ``RN50`` / ``EVA02-B-16`` /
    ``ViTamin-S`` kind,
    shrunk, saved."""
    import attn_clip

    if family == "convnext":
        cfg = attn_clip.get_model_config("convnext_large_d")  # timm_proj="mlp"
        convnext = {**cfg.vision.convnext, "depths": (1, 1, 1, 1), "dims": (8, 16, 24, 32)}
        vision = replace(cfg.vision, image_size=64, convnext=convnext)
    elif family == "eva":  # 4 x 4 patches, RoPE positions scaled onto its 16 x 16 grid
        cfg = attn_clip.get_model_config("EVA02-B-16")
        vision = replace(cfg.vision, image_size=64, width=32, head_width=16, layers=1)
    elif family == "vitamin":  # MBConv stem (stride 16) + GeGLU blocks, average pooled
        cfg = attn_clip.get_model_config("ViTamin-S")
        stem = {"stem_width": 8, "conv_dims": (8, 16), "conv_depths": (1, 1), "pos_embed": "learn"}
        vision = replace(cfg.vision, image_size=64, width=32, head_width=16, layers=1, vitamin=stem)
    else:
        cfg = attn_clip.get_model_config("RN50")
        vision = replace(cfg.vision, image_size=64, layers=(1, 1, 1, 1), width=8, head_width=32)
    text = replace(cfg.text, width=32, heads=2, layers=1, context_length=16)
    model = attn_clip.create_model(replace(cfg, embed_dim=24, vision=vision, text=text))
    attn_clip.save_pretrained(model, folder)
    return folder


@pytest.fixture(scope="module")
def gallery(tmp_path_factory) -> Path:
    """Six drawn shapes in a folder."""
    root = tmp_path_factory.mktemp("gallery")
    for i, (colour, shape) in enumerate(
        [("red", "circle"), ("blue", "square"), ("green", "triangle")] * 2
    ):
        image = Image.new("RGB", (80, 70), "white")
        draw = ImageDraw.Draw(image)
        box = (10 + 3 * i, 8, 60 + 2 * i, 58)
        if shape == "circle":
            draw.ellipse(box, fill=colour)
        elif shape == "square":
            draw.rectangle(box, fill=colour)
        else:
            draw.polygon([(box[0], box[3]), (box[2], box[3]), (35, box[1])], fill=colour)
        image.save(root / f"{colour}_{shape}_{i}.png")
    return root


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """family -> its tiny saved folder, built on first use."""
    built: dict[str, Path] = {}

    def get(family: str) -> Path:
        if family not in built:
            built[family] = tiny_folder(family, tmp_path_factory.mktemp(family))
        return built[family]

    return get


def library_scores(folder: Path, image_path: Path) -> torch.Tensor:
    """What attn_clip computes for LABELS on one image (the apps' default template)."""
    import attn_clip

    model, preprocess, tokenizer = attn_clip.create_model_and_transforms(str(folder))
    classifier = attn_clip.build_zero_shot_classifier(model, tokenizer, LABELS)
    with Image.open(image_path) as im:
        return attn_clip.predict(model, preprocess(im)[None], classifier)[0]


@pytest.mark.parametrize("family", ["convnext", "resnet", "eva", "vitamin"])
def test_zero_shot_and_retrieval_apps(family, folders, gallery, tmp_path, capsys):
    import attn_clip

    folder = folders(family)
    model = attn_clip.create_model(str(folder))
    assert model.config.vision.tower == {"eva": "vit", "vitamin": "vit"}.get(family, family)
    assert (model.config.vision.eva is not None) == (family == "eva")
    assert (model.config.vision.vitamin is not None) == (family == "vitamin")

    assert zero_shot.main(["--model", str(folder), "--images", str(gallery), "--labels",
                           *LABELS, "--json"]) == 0  # fmt: skip
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(records) == 6
    image = gallery / "blue_square_1.png"
    record = next(r for r in records if r["image"] == str(image))
    got = {p["label"]: p["prob"] for p in record["predictions"]}
    want = library_scores(folder, image)
    torch.testing.assert_close(torch.tensor([got[label] for label in LABELS]), want)

    index = tmp_path / f"{family}.idx"
    assert retrieval.main(["index", str(gallery), "--out", str(index), "--model",
                           str(folder), "--json"]) == 0  # fmt: skip
    assert json.loads(capsys.readouterr().out)["images"] == 6
    argv = ["search", str(index), "--text", "a red circle", "--image", str(image)]
    assert retrieval.main([*argv, "--top-k", "6", "--json"]) == 0
    text_hits, image_hits = (json.loads(x) for x in capsys.readouterr().out.splitlines())
    assert image_hits["hits"][0]["path"].endswith(image.name)  # the image itself first
    _, preprocess, tokenizer = attn_clip.create_model_and_transforms(str(folder))
    with torch.no_grad():
        query = model.encode_text(tokenizer(["a red circle"]), normalize=True)[0]
        for hit in text_hits["hits"]:
            with Image.open(gallery / Path(hit["path"]).name) as im:
                emb = model.encode_image(preprocess(im)[None], normalize=True)[0]
            assert abs(hit["score"] - float(emb @ query)) < 1e-4, hit


def test_explain_needs_a_vit_tower(folders, gallery, tmp_path, capsys):
    """--explain with a ResNet tower: one line, exit 2, no heatmap written."""
    folder = folders("resnet")
    heat = tmp_path / "heat.png"
    argv = ["--model", str(folder), "--image", str(gallery / "red_circle_0.png")]
    assert zero_shot.main([*argv, "--labels", *LABELS, "--explain", str(heat)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--explain needs a ViT image tower" in err[0], err
    assert not heat.exists()


def test_explain_with_an_eva_tower(folders, gallery, tmp_path, capsys):
    """--explain reads an EVA02 tower's attention (its RoPE blocks included)."""
    folder = folders("eva")
    heat = tmp_path / "heat.png"
    argv = ["--model", str(folder), "--image", str(gallery / "red_circle_0.png")]
    assert zero_shot.main([*argv, "--labels", *LABELS, "--explain", str(heat)]) == 0
    assert heat.is_file() and heat.stat().st_size > 0
