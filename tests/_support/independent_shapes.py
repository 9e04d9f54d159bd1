"""Shapes drawn by other code than the training generator (``attn_train.shapes``): numpy /
PIL masks on flat backgrounds of any shade, sharing no code and no colour values with it.
The renderer of tests/clip/test_demo_shapes.py (the demo CLIP's independent check), here so
that the demo CoCa's test (tests/clip/test_demo_shapes_coca.py) draws the same images."""

from __future__ import annotations

import math

import numpy as np
from PIL import Image, ImageDraw

COLOURS = {
    "red": (225, 30, 40),
    "green": (40, 160, 60),
    "blue": (40, 70, 210),
    "yellow": (240, 220, 40),
    "purple": (135, 55, 190),
    "orange": (240, 140, 30),
}
SHAPES = ("circle", "square", "triangle", "star", "cross")
CLASSES = [f"{c} {s}" for c in COLOURS for s in SHAPES]


def draw_shape(colour: str, shape: str, rng: np.random.Generator) -> Image.Image:
    """An upright ``shape`` filling a square box of 0.25-0.75 of the image side, anywhere
    inside a 48-160 px image with a flat background of any shade (from black to white,
    at least 80 RGB units from the shape's colour); numpy masks (circle, square, cross) or
    a PIL polygon (triangle, star), drawn at 4x and averaged down."""
    n, ss = int(rng.integers(48, 161)), 4
    big = n * ss
    fill = np.array(COLOURS[colour], float) + rng.uniform(-15, 15, 3)
    while True:
        background = rng.uniform(0, 255) + rng.uniform(-20, 20, 3)
        if np.linalg.norm(background - fill) > 80:
            break
    side = rng.uniform(0.25, 0.75)
    cx, cy = rng.uniform(side / 2, 1 - side / 2, 2) * big
    half = side / 2 * big
    yy, xx = np.mgrid[0:big, 0:big] + 0.5
    dx, dy = np.abs(xx - cx), np.abs(yy - cy)
    if shape == "circle":
        mask = dx**2 + dy**2 <= half**2
    elif shape == "square":
        mask = (dx <= half) & (dy <= half)
    elif shape == "cross":
        arm = half * rng.uniform(0.28, 0.4)
        mask = ((dx <= arm) & (dy <= half)) | ((dy <= arm) & (dx <= half))
    else:
        if shape == "triangle":  # apex up, as wide as it is tall
            pts = [(cx, cy - half), (cx + half, cy + half), (cx - half, cy + half)]
        else:  # a five-pointed star
            inner = rng.uniform(0.38, 0.5)
            pts = []
            for k in range(10):
                r, a = half * (1 if k % 2 == 0 else inner), -math.pi / 2 + k * math.pi / 5
                pts.append((cx + r * math.cos(a), cy + r * math.sin(a)))
        canvas = Image.new("L", (big, big), 0)
        ImageDraw.Draw(canvas).polygon(pts, fill=255)
        mask = np.asarray(canvas) > 127
    alpha = mask.reshape(n, ss, n, ss).mean(axis=(1, 3))[..., None]
    img = background * (1 - alpha) + fill * alpha
    return Image.fromarray(np.clip(np.rint(img), 0, 255).astype(np.uint8), "RGB")


def independent_set(per_class: int = 10, seed: int = 0) -> list[tuple[Image.Image, str]]:
    rng = np.random.default_rng(seed)
    return [(draw_shape(*name.split(), rng), name) for name in CLASSES for _ in range(per_class)]
