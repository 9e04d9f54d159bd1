"""Image preprocessing: PIL image -> normalized ``(3, H, W)`` float tensor.

Inference (``is_train=False``) reproduces open_clip's ``image_transform`` for the three
resize modes that come with the pretrained weights:

* ``shortest`` -- resize the shorter side to the target, then center crop (OpenAI);
* ``longest``  -- resize the longer side to the target, then center pad with ``fill_color``;
* ``squash``   -- resize to the target, ignoring the aspect ratio (SigLIP, CLIPA).

Training uses ``RandomResizedCrop(scale=(0.9, 1.0))`` as open_clip does by default.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torchvision.transforms.functional as TF
from attn_vision.patch_embed import to_2tuple
from PIL import Image
from torchvision import transforms as T

from .config import PreprocessConfig

__all__ = ["image_transform"]

_MODES = {"bicubic": T.InterpolationMode.BICUBIC, "bilinear": T.InterpolationMode.BILINEAR}


class _ResizeKeepRatio:
    """Scale so the ``longest`` (or shortest) side matches the target, keeping the aspect."""

    def __init__(self, size: tuple[int, int], interpolation, longest: bool) -> None:
        self.size, self.interpolation, self.longest = size, interpolation, longest

    def __call__(self, img: Image.Image) -> Image.Image:
        w, h = img.size
        rh, rw = h / self.size[0], w / self.size[1]
        ratio = max(rh, rw) if self.longest else min(rh, rw)
        return TF.resize(img, [round(h / ratio), round(w / ratio)], self.interpolation)


class _CenterCropOrPad:
    """Pad (with ``fill``) where the image is smaller than ``size``, then center crop."""

    def __init__(self, size: tuple[int, int], fill: int = 0) -> None:
        self.size, self.fill = size, fill

    def __call__(self, img: Image.Image) -> Image.Image:
        th, tw = self.size
        w, h = img.size
        if tw > w or th > h:
            pad = [max(tw - w, 0) // 2, max(th - h, 0) // 2]
            pad += [max(tw - w, 0) - pad[0], max(th - h, 0) - pad[1]]  # left, top, right, bottom
            img = TF.pad(img, pad, fill=self.fill)
        return TF.center_crop(img, [th, tw])


def _to_rgb(img: Image.Image | torch.Tensor) -> Image.Image | torch.Tensor:
    return img if isinstance(img, torch.Tensor) else img.convert("RGB")


def _to_tensor(img: Image.Image | torch.Tensor) -> torch.Tensor:
    return img if isinstance(img, torch.Tensor) else TF.to_tensor(img)


def image_transform(
    cfg: PreprocessConfig | None = None, is_train: bool = False
) -> Callable[[Image.Image], torch.Tensor]:
    """A torchvision pipeline for ``cfg`` (defaults: 224, OpenAI mean/std, bicubic, shortest)."""
    cfg = cfg or PreprocessConfig()
    size = to_2tuple(cfg.size)
    interp = _MODES[cfg.interpolation]
    normalize = T.Normalize(mean=cfg.mean, std=cfg.std)
    if is_train:
        steps = [T.RandomResizedCrop(size, scale=(0.9, 1.0), interpolation=interp)]
    elif cfg.resize_mode == "squash":
        steps = [T.Resize(size, interpolation=interp)]
    elif cfg.resize_mode == "longest":
        steps = [
            _ResizeKeepRatio(size, interp, longest=True),
            _CenterCropOrPad(size, cfg.fill_color),
        ]
    elif size[0] == size[1]:  # shortest, square: torchvision's shorter-side resize
        steps = [T.Resize(size[0], interpolation=interp), T.CenterCrop(size)]
    else:
        steps = [_ResizeKeepRatio(size, interp, longest=False), T.CenterCrop(size)]
    return T.Compose([*steps, _to_rgb, _to_tensor, normalize])
