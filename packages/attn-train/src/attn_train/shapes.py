"""A procedurally generated, deterministic captioned-shapes data set (pure PIL + numpy).

Every image is one coloured shape on a random background, e.g. the caption
``"a small red circle at the top left"``::

    from attn_train import shapes
    img = shapes.render_shape("red", "circle", "small", "top left", seed=0)  # 64x64 RGB
    train = shapes.make_dataset(1000, seed=0, split="train")  # seen colour-shape pairs
    test = shapes.make_dataset(200, seed=1, split="heldout")  # never-trained pairs
    shapes.write_dataset("data/shapes", n_train=8000, n_val=600, n_heldout=600)

Factors: ``COLOURS`` (6) x ``SHAPES`` (5) x ``SIZES`` (3 words) x ``POSITIONS`` (9 words),
and per image: the exact size (in the size word's range: the shape's larger side is 0.25 to
0.75 of the image side), the exact place (anywhere in the named third of the room the shape
can move in), a background from near black to near white (flat, a gradient or smooth
blotches; never too close to the shape's colour), the proportions (``ASPECT``,
``STAR_INNER``, ``CROSS_ARM``), colour jitter, rotation (up to ``MAX_ROTATION`` degrees
either way) and pixel noise. ``HELDOUT`` lists the colour-shape combinations kept out of
``split="train"`` so zero-shot accuracy on unseen combinations can be measured (each colour
and each shape is still seen with other partners).

The training data of the bundled ``demo-shapes`` CLIP (docs/training.md). The same
``(colour, shape, size, position, seed)`` always gives the same pixels, and
``make_dataset(n, seed, ...)`` always the same samples.
"""

from __future__ import annotations

import csv
import json
import math
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

__all__ = [
    "ACHROMATIC",
    "COLOURS",
    "HELDOUT",
    "POSITIONS",
    "SHAPES",
    "SIZES",
    "TEMPLATES",
    "UNCOLOURED_TEMPLATES",
    "ShapeSample",
    "caption",
    "class_name",
    "class_text",
    "combos",
    "make_dataset",
    "render_shape",
    "write_dataset",
]

# name -> base RGB (saturated, so they stand out from the low-saturation backgrounds)
COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (215, 35, 35),
    "green": (30, 165, 55),
    "blue": (35, 75, 220),
    "yellow": (245, 215, 30),
    "purple": (140, 50, 195),
    "orange": (245, 130, 20),
}
SHAPES: tuple[str, ...] = ("circle", "square", "triangle", "star", "cross")
# name -> range of the shape's larger side (its bounding box, after rotation) as a fraction
# of the image side; the exact value is drawn per image
SIZES: dict[str, tuple[float, float]] = {
    "small": (0.25, 0.4),
    "medium": (0.4, 0.55),
    "large": (0.55, 0.75),
}
# name -> (row, column): which third of the room the shape can move in (the image side
# minus the shape's), down and across; the exact offset is drawn per image
POSITIONS: dict[str, tuple[int, int]] = {
    "top left": (0, 0),
    "top": (0, 1),
    "top right": (0, 2),
    "left": (1, 0),
    "center": (1, 1),
    "right": (1, 2),
    "bottom left": (2, 0),
    "bottom": (2, 1),
    "bottom right": (2, 2),
}
_WHERE = {
    "top left": "at the top left",
    "top": "at the top",
    "top right": "at the top right",
    "left": "on the left",
    "center": "in the center",
    "right": "on the right",
    "bottom left": "at the bottom left",
    "bottom": "at the bottom",
    "bottom right": "at the bottom right",
}
# colour-shape pairs never shown in split="train" (each colour / shape still seen otherwise)
HELDOUT: tuple[tuple[str, str], ...] = (
    ("red", "triangle"),
    ("green", "star"),
    ("blue", "circle"),
    ("yellow", "cross"),
    ("purple", "square"),
    ("orange", "circle"),
)
# caption templates for caption_style="mixed", with their weights; fields: size colour shape
# where
TEMPLATES: tuple[tuple[str, float], ...] = (
    ("a {size} {colour} {shape} {where}", 0.3),
    ("a {colour} {shape} {where}", 0.1),
    ("a {size} {colour} {shape}", 0.1),
    ("a {colour} {shape}", 0.2),
    ("a photo of a {colour} {shape}", 0.2),
    ("a photo of a {size} {colour} {shape} {where}", 0.1),
)
# uncoloured (black / grey / white) shapes, captioned by their shape, half of the time also
# by their colour: see make_dataset(uncoloured=) ("grey" takes a random level in [60, 200]
# per image: every brightness a colour can have)
ACHROMATIC: dict[str, tuple[int, int, int]] = {
    "black": (22, 22, 22),
    "grey": (130, 130, 130),
    "white": (238, 238, 238),
}
_FILLS = {**COLOURS, **ACHROMATIC}  # every colour a shape can be drawn in
UNCOLOURED_TEMPLATES: tuple[tuple[str, float], ...] = (
    ("a {size} {shape} {where}", 0.2),
    ("a {shape} {where}", 0.1),
    ("a {shape}", 0.1),
    ("a photo of a {shape}", 0.1),
    ("a {size} {colour} {shape} {where}", 0.15),
    ("a {colour} {shape}", 0.15),
    ("a photo of a {colour} {shape}", 0.2),
)
_SUPERSAMPLE = 4  # shapes are drawn at 4x and box-filtered down (anti-aliasing)
# degrees either way. Small on purpose: a small ViT learns rotated shapes from 8 px patches
# far more slowly (supervised, 600 steps: 85% of shapes right unrotated, 75% at +-10
# degrees, 62% at +-25), and every shape should still read as its name ("+" is a cross)
MAX_ROTATION = 10.0
# drawn per image: width / height of the unrotated shape, the star's inner radius (of the
# outer one), half the cross's arm width (of half its length)
ASPECT = (0.87, 1.15)
STAR_INNER = (0.38, 0.55)
CROSS_ARM = (0.25, 0.42)
# the smallest RGB distance between the shape's colour and the mean background under it
MIN_CONTRAST = 70.0


def _check(colour: str, shape: str, size: str, position: str) -> None:
    for value, known, what in (
        (colour, _FILLS, "colour"),
        (shape, SHAPES, "shape"),
        (size, SIZES, "size"),
        (position, POSITIONS, "position"),
    ):
        if value not in known:
            raise ValueError(f"unknown {what} {value!r}; expected one of {list(known)}")


def class_name(colour: str, shape: str) -> str:
    """ImageFolder class (folder) name: ``"red_circle"``."""
    return f"{colour}_{shape}"


def class_text(name: str) -> str:
    """Class folder name -> words for a prompt: ``"red_circle"`` -> ``"red circle"``."""
    return name.replace("_", " ")


def caption(colour: str, shape: str, size: str, position: str, template: str | None = None) -> str:
    """``"a small red circle at the top left"`` (or ``template`` filled with the same fields)."""
    _check(colour, shape, size, position)
    template = template or TEMPLATES[0][0]
    return template.format(size=size, colour=colour, shape=shape, where=_WHERE[position])


def combos(split: str = "all") -> list[tuple[str, str]]:
    """Colour-shape pairs of a split: ``"train"`` (seen), ``"heldout"`` (unseen) or ``"all"``."""
    every = [(c, s) for c in COLOURS for s in SHAPES]
    if split == "all":
        return every
    if split == "train":
        return [p for p in every if p not in HELDOUT]
    if split == "heldout":
        return list(HELDOUT)
    raise ValueError(f"split must be 'train', 'heldout' or 'all', got {split!r}")


# -- rendering ---------------------------------------------------------------------------


def _outline(shape: str, rng: random.Random) -> list[tuple[float, float]]:
    """Vertices of ``shape`` around the origin, 2 wide, y down (before aspect, rotation and
    scale); the star's and the cross's proportions are drawn from ``rng``."""
    if shape == "circle":
        return [(math.cos(a), math.sin(a)) for a in (2 * math.pi * k / 96 for k in range(96))]
    if shape == "square":
        return [(-1, -1), (1, -1), (1, 1), (-1, 1)]
    if shape == "triangle":  # apex up, base at the bottom
        return [(0, -1), (1, 1), (-1, 1)]
    if shape == "star":
        inner = rng.uniform(*STAR_INNER)
        radii = [1.0 if k % 2 == 0 else inner for k in range(10)]
        angles = [-math.pi / 2 + math.pi * k / 5 for k in range(10)]
        return [(r * math.cos(a), r * math.sin(a)) for r, a in zip(radii, angles, strict=True)]
    if shape == "cross":
        w = rng.uniform(*CROSS_ARM)  # half the arm width
        return [
            (-w, -1), (w, -1), (w, -w), (1, -w), (1, w), (w, w),
            (w, 1), (-w, 1), (-w, w), (-1, w), (-1, -w), (-w, -w),
        ]  # fmt: skip
    raise ValueError(f"no outline for {shape!r}")


def _place(
    pts: list[tuple[float, float]], rng: random.Random, size: str, position: str, n: float
) -> list[tuple[float, float]]:
    """``pts`` stretched, rotated, scaled to a drawn size and moved to a drawn place in an
    ``n`` x ``n`` image (the whole shape stays inside)."""
    aspect = math.exp(rng.uniform(math.log(ASPECT[0]), math.log(ASPECT[1])))
    sx, sy = math.sqrt(aspect), 1 / math.sqrt(aspect)
    angle = math.radians(rng.uniform(-MAX_ROTATION, MAX_ROTATION))
    c, s = math.cos(angle), math.sin(angle)
    pts = [(x * sx * c - y * sy * s, x * sx * s + y * sy * c) for x, y in pts]
    x0, y0 = min(x for x, _ in pts), min(y for _, y in pts)
    w, h = max(x for x, _ in pts) - x0, max(y for _, y in pts) - y0
    scale = rng.uniform(*SIZES[size]) * n / max(w, h)  # the larger side of the bounding box
    row, col = POSITIONS[position]
    left = (n - w * scale) * rng.uniform(col / 3, (col + 1) / 3)
    top = (n - h * scale) * rng.uniform(row / 3, (row + 1) / 3)
    return [(left + (x - x0) * scale, top + (y - y0) * scale) for x, y in pts]


def _muted(rng: random.Random) -> np.ndarray:
    """A low-saturation colour from near black to near white: a grey level, a small tint."""
    grey = rng.uniform(5, 250)
    return np.clip([grey + rng.uniform(-22, 22) for _ in range(3)], 0, 255)


def _background(rng: random.Random, nrng: np.random.Generator, n: int) -> np.ndarray:
    """``(n, n, 3)`` float background: flat, a linear gradient, or smooth blotches."""
    kind = rng.choice(("flat", "gradient", "blotches"))
    if kind == "flat":
        return np.broadcast_to(_muted(rng), (n, n, 3)).astype(np.float32)
    if kind == "gradient":
        a, b = _muted(rng), _muted(rng)
        theta = rng.uniform(0, 2 * math.pi)
        yy, xx = np.mgrid[0:n, 0:n] / max(1, n - 1)
        t = (np.cos(theta) * xx + np.sin(theta) * yy)[..., None]
        t = (t - t.min()) / max(1e-6, float(t.max() - t.min()))
        return (a * (1 - t) + b * t).astype(np.float32)
    base = _muted(rng)
    coarse = nrng.normal(0, 18, size=(4, 4, 3)) + base
    img = Image.fromarray(np.clip(coarse, 0, 255).astype(np.uint8))
    return np.asarray(img.resize((n, n), Image.BICUBIC), dtype=np.float32)


def render_shape(
    colour: str,
    shape: str,
    size: str = "medium",
    position: str = "center",
    seed: int = 0,
    image_size: int = 64,
    noise: float | None = None,
) -> Image.Image:
    """One ``image_size`` x ``image_size`` RGB image of a ``size`` ``colour`` ``shape``.

    ``seed`` fixes everything random: the exact size (in ``SIZES[size]``) and place (in the
    ``position`` third of the free room, see ``POSITIONS``), the proportions, the rotation,
    the background, colour jitter and pixel noise (std ``noise``, or drawn from ``[0, 10]``
    when None). Same arguments, same pixels.
    """
    _check(colour, shape, size, position)
    rng = random.Random(f"shape-{seed}-{colour}-{shape}-{size}-{position}-{image_size}")
    nrng = np.random.default_rng(rng.getrandbits(64))
    n, big = image_size, image_size * _SUPERSAMPLE

    mask = Image.new("L", (big, big), 0)
    ImageDraw.Draw(mask).polygon(_place(_outline(shape, rng), rng, size, position, big), fill=255)
    alpha = np.asarray(mask.resize((n, n), Image.BOX), dtype=np.float32)[..., None] / 255.0

    fill = np.array(_FILLS[colour], dtype=np.float32)
    if colour == "grey":
        fill[:] = rng.uniform(60, 200)  # (jittered per channel below, like every colour)
    fill = fill + np.array([rng.uniform(-18, 18) for _ in range(3)], dtype=np.float32)
    inside = alpha[..., 0] > 0.5
    for _ in range(100):  # a background the shape stands out from (found within a few tries)
        background = _background(rng, nrng, n)
        under = background[inside].mean(axis=0) if inside.any() else background.mean((0, 1))
        if np.linalg.norm(under - fill) >= MIN_CONTRAST:
            break
    img = background * (1 - alpha) + fill * alpha
    sigma = rng.uniform(0, 10) if noise is None else noise
    if sigma > 0:
        img = img + nrng.normal(0, sigma, size=img.shape)
    return Image.fromarray(np.clip(np.rint(img), 0, 255).astype(np.uint8), "RGB")


# -- data sets ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ShapeSample:
    """One generated example; ``image()`` renders it (deterministically)."""

    colour: str
    shape: str
    size: str
    position: str
    seed: int  # render seed
    caption: str
    image_size: int = 64

    @property
    def class_name(self) -> str:
        return class_name(self.colour, self.shape)

    @property
    def uncoloured(self) -> bool:
        """A black / grey / white shape (not one of the 30 classes)."""
        return self.colour in ACHROMATIC

    def image(self) -> Image.Image:
        return render_shape(
            self.colour, self.shape, self.size, self.position, self.seed, self.image_size
        )


def make_dataset(
    n: int,
    seed: int = 0,
    split: str = "train",
    image_size: int = 64,
    caption_style: str = "mixed",
    pairs: Sequence[tuple[str, str]] | None = None,
    uncoloured: float = 0.0,
) -> list[ShapeSample]:
    """``n`` samples, class-balanced over the colour-shape pairs of ``split``.

    ``caption_style``: ``"full"`` (always ``"a {size} {colour} {shape} {where}"``) or
    ``"mixed"`` (one of :data:`TEMPLATES` per sample, by weight). ``pairs`` overrides the
    split's colour-shape pairs. ``uncoloured``: add ``round(n * uncoloured)`` black,
    grey or white shapes (every shape equally often), after the ``n`` coloured ones,
    captioned by their shape (``"a small star at the top"``) or, half of the time, by
    their colour and shape (``"a photo of a black star"``; :data:`UNCOLOURED_TEMPLATES`).
    They teach shape features that do not depend on the colour, and captions in which
    every colour word goes with every shape -- what lets a never-seen colour-shape pair
    be recognised -- without showing any held-out pair. Images are rendered lazily by
    ``sample.image()``.
    """
    if caption_style not in ("full", "mixed"):
        raise ValueError(f"caption_style must be 'full' or 'mixed', got {caption_style!r}")
    if uncoloured < 0:
        raise ValueError(f"uncoloured must be >= 0 (a fraction of n), got {uncoloured}")
    pairs = list(pairs) if pairs is not None else combos(split)
    if not pairs:
        raise ValueError("no colour-shape pairs to draw from")
    rng = random.Random(f"dataset-{seed}-{split}")
    samples = _draw(rng, pairs, n, image_size, TEMPLATES, caption_style == "full")
    m = round(n * uncoloured)
    if m:
        rng = random.Random(f"dataset-{seed}-{split}-uncoloured")
        plain = [(c, s) for c in ACHROMATIC for s in SHAPES]
        samples += _draw(rng, plain, m, image_size, UNCOLOURED_TEMPLATES, False)
    return samples


def _draw(
    rng: random.Random,
    pairs: list[tuple[str, str]],
    n: int,
    image_size: int,
    templates_weights: Sequence[tuple[str, float]],
    first_template_only: bool,
) -> list[ShapeSample]:
    order: list[tuple[str, str]] = []
    while len(order) < n:  # every pair equally often, in random order
        block = list(pairs)
        rng.shuffle(block)
        order += block
    templates = [t for t, _ in templates_weights]
    weights = [w for _, w in templates_weights]
    samples = []
    for colour, shape in order[:n]:
        size = rng.choice(list(SIZES))
        position = rng.choice(list(POSITIONS))
        template = templates[0] if first_template_only else rng.choices(templates, weights)[0]
        text = caption(colour, shape, size, position, template)
        render_seed = rng.getrandbits(31)
        samples.append(ShapeSample(colour, shape, size, position, render_seed, text, image_size))
    return samples


def write_dataset(
    root: str | Path,
    n_train: int = 8000,
    n_val: int = 600,
    n_heldout: int = 600,
    seed: int = 0,
    image_size: int = 64,
    caption_style: str = "mixed",
    progress: bool = False,
    uncoloured: float = 0.0,
    shard_size: int | None = None,
) -> dict:
    """Write the data set under ``root`` and return its metadata (also ``root/meta.json``).

    Layout (ImageFolder class = ``colour_shape``; CSVs in open_clip's convention,
    ``filepath,title`` with paths relative to the CSV)::

        root/train/<class>/<i>.png    seen pairs      root/train.csv
        root/val/<class>/<i>.png      seen pairs      root/val.csv      (different images)
        root/heldout/<class>/<i>.png  unseen pairs    root/heldout.csv
        root/classnames.txt           all 30 class names ("red circle"), one per line
        root/meta.json                factors, held-out pairs, counts, seed

    With ``uncoloured`` (see :func:`make_dataset`) the uncoloured training shapes go to
    ``root/train_uncoloured/<shape>/`` (not an ImageFolder class) and into ``train.csv``.
    Validation and held-out captions are always the full ``caption_style="full"`` kind.

    With ``shard_size`` the training split is written as webdataset shards instead, in
    img2dataset's layout (:class:`attn_vision.wds.ShardWriter`: ``root/train/00000.tar`` of
    ``shard_size`` samples, ``{key}.jpg`` / ``.txt`` / ``.json`` (``class``, ``label``) and
    ``.cls`` (the class's line in ``classnames.txt``; none for an uncoloured shape), a
    ``.parquet`` beside each); ``meta["train_shards"]`` is their brace pattern.
    """
    root = Path(root)
    splits = {
        "train": (n_train, "train", caption_style, seed),
        "val": (n_val, "train", "full", seed + 1),
        "heldout": (n_heldout, "heldout", "full", seed + 2),
    }
    counts, meta_shards = {}, None
    for name, (n, split, style, split_seed) in splits.items():
        if n <= 0:
            continue
        extra = uncoloured if name == "train" else 0.0
        samples = make_dataset(n, split_seed, split, image_size, style, uncoloured=extra)
        iterator = samples
        if progress:
            from tqdm import tqdm

            iterator = tqdm(samples, desc=name, unit="img")
        if name == "train" and shard_size is not None:
            counts[name], meta_shards = len(samples), _write_shards(root, iterator, shard_size)
            continue
        rows = []
        for i, s in enumerate(iterator):
            folder = (
                Path(f"{name}_uncoloured") / s.shape if s.uncoloured else Path(name) / s.class_name
            )
            rel = folder / f"{i:06d}.png"
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            s.image().save(root / rel)
            rows.append((rel.as_posix(), s.caption))
        with open(root / f"{name}.csv", "w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f)
            writer.writerow(["filepath", "title"])
            writer.writerows(rows)
        counts[name] = len(samples)
    names = [class_text(class_name(c, s)) for c, s in combos("all")]
    (root / "classnames.txt").write_text("\n".join(names) + "\n", encoding="utf-8")
    meta = {
        "seed": seed,
        "image_size": image_size,
        "caption_style": caption_style,
        "uncoloured": uncoloured,
        "counts": counts,
        "colours": list(COLOURS),
        "shapes": list(SHAPES),
        "sizes": list(SIZES),
        "positions": list(POSITIONS),
        "heldout": [class_name(c, s) for c, s in HELDOUT],
    }
    if meta_shards is not None:
        meta["train_shards"] = meta_shards
    (root / "meta.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    return meta


def _write_shards(root: Path, samples: Iterable[ShapeSample], shard_size: int) -> str:
    """The training samples as shards in ``root/train``; returns their brace pattern
    (relative to ``root``)."""
    from attn_vision.wds import ShardWriter

    index = {class_name(c, s): i for i, (c, s) in enumerate(combos("all"))}
    with ShardWriter(root / "train", shard_size) as writer:
        for s in samples:
            label = None if s.uncoloured else index[s.class_name]
            meta = {"class": None if s.uncoloured else s.class_name, "label": label}
            writer.write(s.image(), s.caption, meta, cls=label)
    return Path(writer.spec).relative_to(root).as_posix()
