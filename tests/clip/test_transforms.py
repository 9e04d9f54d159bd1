"""Preprocessing equals open_clip's image_transform for every resize mode."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from attn_clip import PreprocessConfig, image_transform
from open_clip.transform import image_transform as oc_image_transform
from PIL import Image


def _image(h: int, w: int, mode: str = "RGB") -> Image.Image:
    rng = np.random.default_rng(h * 1000 + w)
    img = Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8))
    return img.convert(mode)


@pytest.mark.parametrize("resize_mode", ["shortest", "longest", "squash"])
@pytest.mark.parametrize("interpolation", ["bicubic", "bilinear"])
@pytest.mark.parametrize("size", [(37, 61), (80, 45), (20, 20)])
def test_matches_open_clip(resize_mode, interpolation, size):
    cfg = PreprocessConfig(
        size=32, mean=(0.5, 0.4, 0.3), std=(0.2, 0.3, 0.25), interpolation=interpolation,
        resize_mode=resize_mode, fill_color=0,
    )  # fmt: skip
    ref = oc_image_transform(
        32, is_train=False, mean=cfg.mean, std=cfg.std, resize_mode=resize_mode,
        interpolation=interpolation,
    )  # fmt: skip
    img = _image(*size)
    out = image_transform(cfg)(img)
    assert out.shape == (3, 32, 32)
    torch.testing.assert_close(out, ref(img), atol=1e-6, rtol=0)


def test_non_rgb_and_non_square_target():
    gray = _image(40, 50, "L")
    out = image_transform(PreprocessConfig(size=(24, 32)))(gray)
    assert out.shape == (3, 24, 32)
    ref = oc_image_transform((24, 32), is_train=False)(gray)
    torch.testing.assert_close(out, ref, atol=1e-6, rtol=0)


def test_train_transform_shape_and_errors():
    out = image_transform(PreprocessConfig(size=32), is_train=True)(_image(50, 70))
    assert out.shape == (3, 32, 32)
    with pytest.raises(ValueError, match="resize_mode"):
        PreprocessConfig(resize_mode="crop")
    with pytest.raises(ValueError, match="interpolation"):
        PreprocessConfig(interpolation="nearest")
