"""Preprocessing equals open_clip's image_transform (torchvision on PIL) for every resize
mode and interpolation, without importing torchvision."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch
from attn_clip import PreprocessConfig, image_transform
from open_clip.transform import image_transform as oc_image_transform
from PIL import Image
from skimage.data import chelsea
from torchvision import transforms as T

PHOTO = Image.fromarray(chelsea())  # 451 x 300 RGB


def _noise(h: int, w: int, mode: str = "RGB") -> Image.Image:
    rng = np.random.default_rng(h * 1000 + w)
    return Image.fromarray(rng.integers(0, 256, (h, w, 4), dtype=np.uint8), "RGBA").convert(mode)


IMAGES = {
    "photo": PHOTO,
    "tall": PHOTO.resize((45, 173)),
    "wide": PHOTO.resize((300, 41)),
    "grey": PHOTO.convert("L").resize((77, 50)),
    "rgba": _noise(60, 90, "RGBA"),
    "palette": PHOTO.convert("P").resize((64, 40)),
    "tiny": _noise(7, 5),
}


def _reference(cfg: PreprocessConfig):
    return oc_image_transform(
        cfg.size, is_train=False, mean=cfg.mean, std=cfg.std, resize_mode=cfg.resize_mode,
        interpolation=cfg.interpolation, fill_color=cfg.fill_color,
    )  # fmt: skip


# Not (shortest, bilinear, non-square): open_clip resizes bicubic there whatever the
# interpolation asked for; attn_clip honours it.
CASES = [
    (mode, interp, size)
    for mode in ("shortest", "longest", "squash")
    for interp in ("bicubic", "bilinear")
    for size in (32, 224, (24, 40))
    if not (mode == "shortest" and interp == "bilinear" and size == (24, 40))
]


@pytest.mark.parametrize(("resize_mode", "interpolation", "size"), CASES)
def test_matches_open_clip(resize_mode, interpolation, size):
    cfg = PreprocessConfig(
        size=size, mean=(0.5, 0.4, 0.3), std=(0.2, 0.3, 0.25), interpolation=interpolation,
        resize_mode=resize_mode, fill_color=0 if resize_mode != "longest" else 77,
    )  # fmt: skip
    ours, ref = image_transform(cfg), _reference(cfg)
    for name, img in IMAGES.items():
        out = ours(img)
        assert out.dtype == torch.float32 and out.shape == (3, *ref(img).shape[1:]), name
        torch.testing.assert_close(out, ref(img), atol=0, rtol=0, msg=name)


def test_default_config_is_openai_preprocessing():
    out = image_transform()(PHOTO)
    assert out.shape == (3, 224, 224)
    torch.testing.assert_close(out, oc_image_transform(224, is_train=False)(PHOTO), atol=0, rtol=0)


def test_train_transform_draws_as_torchvision():
    cfg = PreprocessConfig(size=32)
    ref = T.Compose([
        T.RandomResizedCrop(32, scale=(0.9, 1.0), interpolation=T.InterpolationMode.BICUBIC),
        lambda img: img.convert("RGB"), T.ToTensor(), T.Normalize(cfg.mean, cfg.std),
    ])  # fmt: skip
    ours = image_transform(cfg, is_train=True)
    for seed, img in enumerate(IMAGES.values()):
        torch.manual_seed(seed)
        out = ours(img)
        torch.manual_seed(seed)
        torch.testing.assert_close(out, ref(img), atol=0, rtol=0)
    square = _noise(64, 64)
    assert not torch.equal(ours(square), ours(square))  # random crops


def test_errors():
    with pytest.raises(ValueError, match="resize_mode"):
        PreprocessConfig(resize_mode="crop")
    with pytest.raises(ValueError, match="interpolation"):
        PreprocessConfig(interpolation="nearest")
    with pytest.raises(TypeError, match="PIL image"):
        image_transform()(torch.zeros(3, 8, 8))


def test_no_torchvision_import():
    code = (
        "import sys; from attn_clip import image_transform; from PIL import Image; "
        "image_transform()(Image.new('RGB', (50, 40))); "
        "image_transform(is_train=True)(Image.new('RGB', (50, 40))); "
        "print('torchvision' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
