"""attn_train.shapes: deterministic rendering that shows what the caption says; data sets."""

from __future__ import annotations

import csv
import json
from collections import Counter

import numpy as np
import pytest
from attn_train import shapes


def colour_mask(img, colour: str, tol: float = 60.0) -> np.ndarray:
    """Pixels within ``tol`` (RGB distance) of the colour's base value."""
    a = np.asarray(img, dtype=np.float32)
    base = {**shapes.COLOURS, **shapes.ACHROMATIC}[colour]
    return np.linalg.norm(a - np.array(base), axis=-1) < tol


def box(mask: np.ndarray) -> tuple[int, int, int, int]:
    """``(left, top, width, height)`` of the mask's pixels."""
    ys, xs = np.nonzero(mask)
    return int(xs.min()), int(ys.min()), int(xs.max() - xs.min() + 1), int(ys.max() - ys.min() + 1)


def test_same_arguments_same_pixels_and_seed_changes_them():
    a = shapes.render_shape("red", "star", "large", "top left", seed=3)
    b = shapes.render_shape("red", "star", "large", "top left", seed=3)
    c = shapes.render_shape("red", "star", "large", "top left", seed=4)
    assert a.size == (64, 64) and a.mode == "RGB"
    assert a.tobytes() == b.tobytes()
    assert a.tobytes() != c.tobytes()
    assert shapes.render_shape("blue", "cross", seed=0, image_size=48).size == (48, 48)


@pytest.mark.parametrize("position", list(shapes.POSITIONS))
def test_the_shape_is_where_the_caption_says(position):
    """Its offset lies in the named third of the room it can move in (image minus shape)."""
    row, col = shapes.POSITIONS[position]
    for seed in range(4):
        img = shapes.render_shape("blue", "square", "small", position, seed=seed, noise=0)
        left, top, w, h = box(colour_mask(img, "blue"))
        for offset, extent, third in ((left, w, col), (top, h, row)):
            where = offset / (64 - extent)
            assert third / 3 - 0.06 <= where <= (third + 1) / 3 + 0.06, (seed, offset, extent)


def test_sizes_are_in_their_ranges_and_the_colour_is_right():
    sides = {}
    for size, (lo, hi) in shapes.SIZES.items():
        sides[size] = []
        for seed, shape in enumerate(shapes.SHAPES * 2):
            img = shapes.render_shape("orange", shape, size, "center", seed=seed, noise=0)
            mask = colour_mask(img, "orange")
            side = max(box(mask)[2:]) / 64
            assert lo - 0.04 <= side <= hi + 0.04, (size, shape, side)
            sides[size].append(side)
            for other in ("blue", "green", "purple"):
                assert colour_mask(img, other).sum() < mask.sum() / 10
    assert max(sides["small"]) < min(sides["large"])
    assert min(sides["small"]) < 0.3 and max(sides["large"]) > 0.68  # 0.25 ... 0.75 covered


def test_shapes_fill_their_box_as_geometry_says():
    def fill(shape, seed):
        mask = colour_mask(
            shapes.render_shape("red", shape, "large", "center", seed, noise=0), "red"
        )
        _, _, w, h = box(mask)
        return mask.sum() / (w * h)

    for seed in range(6):
        assert 0.72 < fill("circle", seed) < 0.84  # pi / 4
        assert fill("square", seed) > 0.7  # (a square turned by 10 degrees fills 0.74)
        assert 0.42 < fill("triangle", seed) < 0.56  # 1 / 2
        assert fill("star", seed) < 0.52 and fill("star", seed) < fill("circle", seed) - 0.2
        assert 0.35 < fill("cross", seed) < 0.72


def test_backgrounds_run_from_dark_to_light_and_the_shape_stands_out():
    means, seen_kinds = [], set()
    for seed in range(120):
        colour = ("yellow", "purple", "black", "white", "grey")[seed % 5]
        img = np.asarray(
            shapes.render_shape(colour, "square", "small", "top left", seed, noise=0), np.float32
        )
        corner = img[-12:, -12:].reshape(-1, 3)  # background only (the shape is top left)
        means.append(corner.mean())
        seen_kinds.add(float(np.ptp(corner)) > 6)  # flat or not
        if colour in ("yellow", "purple"):  # saturated: always far from the background
            inside = colour_mask(img, colour)
            assert inside.sum() > 10
            under = img[inside].mean(axis=0)
            assert np.linalg.norm(under - corner.mean(axis=0)) > shapes.MIN_CONTRAST / 2
    assert min(means) < 40 and max(means) > 215
    assert seen_kinds == {True, False}


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


def test_uncoloured_shapes_are_named_by_shape_and_sometimes_their_own_colour():
    plain = shapes.make_dataset(60, seed=3, split="train")
    mixed = shapes.make_dataset(60, seed=3, split="train", uncoloured=0.5)
    assert mixed[:60] == plain  # the coloured part does not change
    extra = mixed[60:]
    assert len(extra) == 30 and all(s.uncoloured for s in extra)
    assert {s.colour for s in extra} == set(shapes.ACHROMATIC)
    assert Counter(s.shape for s in extra) == {s: 6 for s in shapes.SHAPES}
    named = 0
    for s in extra:
        words = s.caption.split()
        assert s.shape in words and not set(words) & set(shapes.COLOURS)
        assert not set(words) & (set(shapes.ACHROMATIC) - {s.colour})
        named += s.colour in words
    assert 5 < named < 25  # about half name the colour too
    bw = next(s for s in extra if s.colour in ("black", "white"))
    assert colour_mask(bw.image(), bw.colour).sum() > 20
    # grey shapes take a random level: other seeds, other greys
    greys = [
        np.asarray(shapes.render_shape("grey", "square", "large", "center", seed=i, noise=0))
        for i in range(4)
    ]
    centre = [g[32, 32].astype(int) for g in greys]
    assert all(np.ptp(c) <= 36 for c in centre)  # grey, give or take the colour jitter
    assert np.ptp([c.mean() for c in centre]) > 20
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
