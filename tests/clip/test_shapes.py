"""attn_clip.shapes: deterministic rendering that shows what the caption says; data sets."""

from __future__ import annotations

import csv
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from attn_clip import shapes


def colour_mask(img, colour: str, tol: float = 60.0) -> np.ndarray:
    """Pixels within ``tol`` (RGB distance) of the colour's base value."""
    a = np.asarray(img, dtype=np.float32)
    base = {**shapes.COLOURS, **shapes.ACHROMATIC}[colour]
    return np.linalg.norm(a - np.array(base), axis=-1) < tol


def test_same_arguments_same_pixels_and_seed_changes_them():
    a = shapes.render_shape("red", "star", "large", "top left", seed=3)
    b = shapes.render_shape("red", "star", "large", "top left", seed=3)
    c = shapes.render_shape("red", "star", "large", "top left", seed=4)
    assert a.size == (64, 64) and a.mode == "RGB"
    assert a.tobytes() == b.tobytes()
    assert a.tobytes() != c.tobytes()
    assert shapes.render_shape("blue", "cross", seed=0, image_size=32).size == (32, 32)


@pytest.mark.parametrize("position", list(shapes.POSITIONS))
def test_the_shape_is_where_the_caption_says(position):
    img = shapes.render_shape("blue", "square", "small", position, seed=7, noise=0)
    ys, xs = np.nonzero(colour_mask(img, "blue"))
    assert len(xs) > 20
    row, col = shapes.POSITIONS[position]
    # the centroid falls into the named third of the image
    assert int(xs.mean() // (64 / 3)) == col and int(ys.mean() // (64 / 3)) == row


def test_sizes_are_ordered_and_the_colour_is_right():
    areas = {}
    for size in shapes.SIZES:
        img = shapes.render_shape("orange", "circle", size, "center", seed=1, noise=0)
        areas[size] = colour_mask(img, "orange").sum()
        for other in ("blue", "green", "purple"):
            assert colour_mask(img, other).sum() < areas[size] / 10
    assert areas["small"] < areas["medium"] < areas["large"]
    assert 0.7 < areas["small"] / (np.pi * (shapes.SIZES["small"] * 0.95 * 64 / 2) ** 2) < 1.1


def test_shapes_differ_in_area_as_geometry_says():
    def area(shape):
        img = shapes.render_shape("red", shape, "large", "center", seed=2, noise=0)
        return colour_mask(img, "red").sum()

    # same bounding radius: the circle covers more than the star, the star less than a cross
    assert area("circle") > area("square") > area("triangle")
    assert area("star") < area("cross")


def test_captions_and_class_names():
    assert shapes.caption("red", "circle", "small", "top left") == (
        "a small red circle at the top left"
    )
    assert shapes.caption("blue", "star", "large", "center") == "a large blue star in the center"
    assert shapes.caption("green", "cross", "medium", "right", "a photo of a {colour} {shape}") == (
        "a photo of a green cross"
    )
    assert shapes.class_name("red", "circle") == "red_circle"
    assert shapes.class_text("red_circle") == "red circle"
    with pytest.raises(ValueError, match="unknown colour 'pink'"):
        shapes.render_shape("pink", "circle")
    with pytest.raises(ValueError, match="unknown position"):
        shapes.caption("red", "circle", "small", "middle")


def test_splits_hold_out_pairs_but_keep_every_colour_and_shape():
    train, held = shapes.combos("train"), shapes.combos("heldout")
    assert len(train) + len(held) == len(shapes.COLOURS) * len(shapes.SHAPES)
    assert not set(train) & set(held)
    assert {c for c, _ in train} == set(shapes.COLOURS)
    assert {s for _, s in train} == set(shapes.SHAPES)
    with pytest.raises(ValueError, match="split"):
        shapes.combos("test")


def test_make_dataset_is_deterministic_balanced_and_respects_the_split():
    a = shapes.make_dataset(96, seed=5, split="train")
    b = shapes.make_dataset(96, seed=5, split="train")
    assert a == b and a != shapes.make_dataset(96, seed=6, split="train")
    counts = Counter((s.colour, s.shape) for s in a)
    assert set(counts) == set(shapes.combos("train")) and set(counts.values()) == {4}
    assert a[0].image().tobytes() == b[0].image().tobytes()
    held = shapes.make_dataset(30, seed=0, split="heldout", caption_style="full")
    assert {(s.colour, s.shape) for s in held} == set(shapes.HELDOUT)
    for s in held:
        assert s.caption == shapes.caption(s.colour, s.shape, s.size, s.position)
    mixed = {s.caption.split(" ")[1] for s in shapes.make_dataset(200, seed=0)}
    assert "photo" in mixed and len({s.caption for s in a}) > 50


def test_uncoloured_shapes_are_named_by_shape_only():
    plain = shapes.make_dataset(60, seed=3, split="train")
    mixed = shapes.make_dataset(60, seed=3, split="train", uncoloured=0.5)
    assert mixed[:60] == plain  # the coloured part does not change
    extra = mixed[60:]
    assert len(extra) == 30 and all(s.uncoloured for s in extra)
    assert {s.colour for s in extra} == set(shapes.ACHROMATIC)
    assert Counter(s.shape for s in extra) == {s: 6 for s in shapes.SHAPES}
    for s in extra:
        assert s.shape in s.caption and not any(c in s.caption for c in shapes.COLOURS)
        assert s.caption.split()[1] not in shapes.ACHROMATIC
    bw = next(s for s in extra if s.colour in ("black", "white"))
    assert colour_mask(bw.image(), bw.colour).sum() > 20
    # grey shapes take a random level: two seeds, two different greys
    greys = [
        np.asarray(shapes.render_shape("grey", "square", "large", "center", seed=i, noise=0))
        for i in (0, 1)
    ]
    centre = [g[32, 32].astype(int) for g in greys]
    assert all(np.ptp(c) <= 36 for c in centre)  # grey, give or take the colour jitter
    assert abs(centre[0].mean() - centre[1].mean()) > 10
    with pytest.raises(ValueError, match="uncoloured"):
        shapes.make_dataset(5, uncoloured=-1)


def test_write_dataset_layout(tmp_path):
    meta = shapes.write_dataset(
        tmp_path, n_train=30, n_val=6, n_heldout=6, image_size=32, uncoloured=0.2
    )
    assert meta["counts"] == {"train": 36, "val": 6, "heldout": 6}
    with open(tmp_path / "train.csv", newline="") as f:
        extra = [r for r in csv.DictReader(f) if r["filepath"].startswith("train_uncoloured/")]
    assert len(extra) == 6 and all((tmp_path / r["filepath"]).is_file() for r in extra)
    assert len(list((tmp_path / "train").rglob("*.png"))) == 30
    assert json.loads((tmp_path / "meta.json").read_text())["heldout"] == meta["heldout"]
    names = (tmp_path / "classnames.txt").read_text().splitlines()
    assert len(names) == 30 and "red circle" in names
    with open(tmp_path / "heldout.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 6
    for row in rows:
        path = tmp_path / row["filepath"]
        assert path.is_file() and path.parent.name in meta["heldout"]
        colour, shape = path.parent.name.split("_")
        assert row["title"].startswith("a ") and f"{colour} {shape}" in row["title"]
    train_classes = {p.name for p in (tmp_path / "train").iterdir()}
    assert not train_classes & set(meta["heldout"])


# -- the bundled demo model -----------------------------------------------------------------


def test_demo_shapes_is_registered_with_bundled_weights():
    import attn_clip
    from attn_clip.registry import BUNDLED_MODELS, default_pretrained_tag

    assert "demo-shapes" in attn_clip.list_models()  # bundled models are always listed
    assert "demo-shapes:shapes" in attn_clip.list_models(pretrained=True)
    cfg = attn_clip.get_model_config("demo-shapes")
    assert (cfg.vision.image_size, cfg.vision.patch_size) == (32, 8)
    assert default_pretrained_tag("demo-shapes") == "shapes"
    assert attn_clip.list_pretrained_tags("demo-shapes") == ["shapes"]
    src = attn_clip.get_pretrained_cfg("demo-shapes", "shapes")
    path = Path(src.file)
    assert path.is_file() and path.parent.name == "weights" and not src.hf_hub_id
    assert path.stat().st_size < 6_000_000  # "a few MB"
    assert src.preprocess == BUNDLED_MODELS["demo-shapes"].preprocess
    with pytest.raises(ValueError, match="pretrained=True needs a model with bundled weights"):
        attn_clip.create_model("ViT-B-32", pretrained=True)
    with pytest.raises(ValueError, match="unknown pretrained tag 'openai'.*shapes"):
        attn_clip.get_pretrained_cfg("demo-shapes", "openai")


def test_demo_shapes_loads_offline_and_names_unseen_pairs(monkeypatch):
    import attn_clip
    import attn_clip.factory
    import torch

    def no_network(*args, **kwargs):
        raise AssertionError("the bundled model must not touch the hub")

    from attn_core import hub

    monkeypatch.setattr(hub, "download", no_network)
    model, preprocess, tokenizer = attn_clip.create_model_and_transforms(
        "demo-shapes", pretrained=True
    )
    assert model.preprocess_cfg.size == 32
    names = [f"{c} {s}" for c, s in shapes.combos("all")]  # all 30, 24 of them seen
    classifier = attn_clip.build_zero_shot_classifier(model, tokenizer, names, ["a photo of a {}"])
    samples = shapes.make_dataset(30, seed=2024, split="heldout", image_size=32)
    images = torch.stack([preprocess(s.image()) for s in samples])
    pred = attn_clip.predict(model, images, classifier).argmax(dim=-1).tolist()
    right = [names[p] == f"{s.colour} {s.shape}" for p, s in zip(pred, samples, strict=True)]
    assert sum(right) >= 23, [names[p] for p in pred]  # never-trained pairs (26 of 30)
    # the same scenes rendered at 64 px and resized by the model's own preprocessing
    big = [shapes.render_shape(s.colour, s.shape, s.size, s.position, s.seed) for s in samples]
    pred = attn_clip.predict(model, torch.stack([preprocess(b) for b in big]), classifier)
    pred = pred.argmax(dim=-1).tolist()
    right = [names[p] == f"{s.colour} {s.shape}" for p, s in zip(pred, samples, strict=True)]
    assert sum(right) >= 25, [names[p] for p in pred]  # (29 of 30)
