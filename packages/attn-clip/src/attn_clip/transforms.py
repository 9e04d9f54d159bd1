"""Image preprocessing: PIL image -> normalized ``(3, H, W)`` float tensor (PIL + torch only).

Inference (``is_train=False``) reproduces open_clip's ``image_transform`` for the three
resize modes that come with the pretrained weights:

* ``shortest`` -- resize the shorter side to the target, then center crop (OpenAI);
* ``longest``  -- resize the longer side to the target, then center pad with ``fill_color``;
* ``squash``   -- resize to the target, ignoring the aspect ratio (SigLIP, CLIPA).

then RGB, ``[0, 1]`` floats and ``(x - mean) / std``. open_clip runs torchvision's
transforms on PIL images, and those call PIL's own ``Image.resize`` / ``crop`` /
``ImageOps.expand``; the same calls here give the same pixels without importing
torchvision. The image keeps its mode until after the crop, as there (an RGBA image is
resized with premultiplied alpha, a palette image with nearest-neighbour, as PIL does).
One deliberate difference: for a non-square target with ``shortest``, open_clip always
resizes bicubic; here ``interpolation`` is honoured there too.

Training uses a random resized crop (``scale=(0.9, 1.0)``) as open_clip does by default,
drawing the same random numbers as torchvision's ``RandomResizedCrop``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from attn_vision.patch_embed import to_2tuple
from attn_vision.transforms import (
    Size,
    center_crop_or_pad,
    keep_ratio_size,
    resize,
    shortest_side_size,
    to_tensor,
)
from PIL import Image

from .config import PreprocessConfig

__all__ = ["image_transform"]

_RESAMPLE = {"bicubic": Image.Resampling.BICUBIC, "bilinear": Image.Resampling.BILINEAR}


def _random_resized_crop_box(
    img: Image.Image,
    scale: tuple[float, float] = (0.9, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
) -> tuple[int, int, int, int]:
    """``(top, left, h, w)`` of a random crop: torchvision's ``RandomResizedCrop.get_params``,
    drawing the same numbers from torch's global generator."""
    width, height = img.size
    area = height * width
    log_ratio = torch.log(torch.tensor(ratio))
    for _ in range(10):
        target_area = area * torch.empty(1).uniform_(scale[0], scale[1]).item()
        aspect = torch.exp(torch.empty(1).uniform_(log_ratio[0], log_ratio[1])).item()
        w = int(round(math.sqrt(target_area * aspect)))
        h = int(round(math.sqrt(target_area / aspect)))
        if 0 < w <= width and 0 < h <= height:
            top = int(torch.randint(0, height - h + 1, size=(1,)).item())
            left = int(torch.randint(0, width - w + 1, size=(1,)).item())
            return top, left, h, w
    in_ratio = width / height  # fallback: the central crop with the nearest allowed aspect
    if in_ratio < min(ratio):
        w, h = width, int(round(width / min(ratio)))
    elif in_ratio > max(ratio):
        w, h = int(round(height * max(ratio))), height
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


class ImageTransform:
    """PIL image -> normalized ``(3, H, W)`` tensor for one :class:`PreprocessConfig`."""

    def __init__(self, cfg: PreprocessConfig | None = None, is_train: bool = False) -> None:
        self.cfg = cfg or PreprocessConfig()
        self.is_train = is_train
        self.size: Size = to_2tuple(self.cfg.size)
        self.resample = _RESAMPLE[self.cfg.interpolation]
        self.mean = torch.tensor(self.cfg.mean, dtype=torch.float32).view(-1, 1, 1)
        self.std = torch.tensor(self.cfg.std, dtype=torch.float32).view(-1, 1, 1)

    def resize_and_crop(self, img: Image.Image) -> Image.Image:
        """The geometric part: an image of exactly ``size``, still in its own mode."""
        cfg, size = self.cfg, self.size
        if self.is_train:
            top, left, h, w = _random_resized_crop_box(img)
            return resize(img.crop((left, top, left + w, top + h)), size, self.resample)
        if cfg.resize_mode == "squash":
            return resize(img, size, self.resample)
        if cfg.resize_mode == "longest":
            img = resize(img, keep_ratio_size(img, size, longest=True), self.resample)
            return center_crop_or_pad(img, size, cfg.fill_color)
        if size[0] == size[1]:  # shortest, square target: torchvision's Resize(int)
            img = resize(img, shortest_side_size(img, size[0]), self.resample)
        else:
            img = resize(img, keep_ratio_size(img, size, longest=False), self.resample)
        return center_crop_or_pad(img, size)

    def __call__(self, img: Image.Image) -> torch.Tensor:
        if not isinstance(img, Image.Image):
            raise TypeError(f"image_transform expects a PIL image, got {type(img).__name__}")
        img = self.resize_and_crop(img).convert("RGB")
        return to_tensor(img).sub_(self.mean).div_(self.std)

    def __repr__(self) -> str:
        return f"ImageTransform({self.cfg}, is_train={self.is_train})"


def image_transform(
    cfg: PreprocessConfig | None = None, is_train: bool = False
) -> Callable[[Image.Image], torch.Tensor]:
    """The preprocessing for ``cfg`` (defaults: 224, OpenAI mean/std, bicubic, shortest)."""
    return ImageTransform(cfg, is_train)
