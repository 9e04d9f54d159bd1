"""Evaluation preprocessing that reproduces timm's for each pretrained tag, on PIL + torch.

timm's eval pipeline for a model is: resize the shorter side to
``floor(input_size / crop_pct)`` with the tag's interpolation, center-crop
``input_size``, convert to a ``[0, 1]`` float tensor, normalise with the tag's
mean / std. :func:`create_transform` does the same steps with PIL and torch, with
torchvision's arithmetic (output sizes, crop offsets, padding), so the tensors equal
``timm.data.create_transform(**resolve_data_config(model=...))``'s exactly -- without
importing torchvision. Settings come from ``model.pretrained_cfg`` (set by
``create_model``), resolved as ``timm.data.resolve_data_config`` does.

``create_transform(model, is_training=True)`` is timm's training pipeline (random resized
crop, flip, RandAugment / TrivialAugment / colour jitter, random erasing) built from
torchvision's transforms, which it imports only then.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from PIL import Image, ImageOps
from torch import nn

from .constants import DEFAULT_CROP_PCT, IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from .registry import _data_cfg, _resolve

__all__ = [
    "EvalTransform",
    "center_crop_or_pad",
    "create_transform",
    "keep_ratio_size",
    "resize",
    "resolve_data_config",
    "shortest_side_size",
    "to_tensor",
]
# timm's interpolation names -> PIL filters (torchvision's mapping for PIL images)
PIL_INTERPOLATION = {
    "nearest": Image.Resampling.NEAREST,
    "bilinear": Image.Resampling.BILINEAR,
    "bicubic": Image.Resampling.BICUBIC,
    "box": Image.Resampling.BOX,
    "hamming": Image.Resampling.HAMMING,
    "lanczos": Image.Resampling.LANCZOS,
}


def resolve_data_config(
    model_or_cfg: nn.Module | dict[str, Any] | str, **overrides: Any
) -> dict[str, Any]:
    """``input_size``, ``interpolation``, ``mean``, ``std``, ``crop_pct``, ``crop_mode``.

    ``model_or_cfg`` is a model from ``create_model`` (its ``pretrained_cfg``), a
    pretrained-cfg dict, or a model name (``"vit_base_patch16_224.augreg_in21k"``).
    Missing entries get timm's defaults; keyword ``overrides`` win.
    """
    if isinstance(model_or_cfg, str):
        _, config, timm_cfg = _resolve(model_or_cfg, {})
        cfg = _data_cfg(timm_cfg, config)
    elif isinstance(model_or_cfg, nn.Module):
        cfg = getattr(model_or_cfg, "pretrained_cfg", None) or {}
    else:
        cfg = dict(model_or_cfg)
    data = {
        "input_size": tuple(cfg.get("input_size") or (3, 224, 224)),
        "interpolation": cfg.get("interpolation") or "bicubic",
        "mean": tuple(cfg.get("mean") or IMAGENET_DEFAULT_MEAN),
        "std": tuple(cfg.get("std") or IMAGENET_DEFAULT_STD),
        "crop_pct": cfg.get("crop_pct") or DEFAULT_CROP_PCT,
        "crop_mode": cfg.get("crop_mode") or "center",
    }
    unknown = set(overrides) - set(data)
    if unknown:
        raise ValueError(f"unknown data config option(s) {sorted(unknown)}; valid: {sorted(data)}")
    data.update({k: v for k, v in overrides.items() if v is not None})
    if cfg.get("crop_offset", "round") != "round":  # a transformers processor's crop
        data["crop_offset"] = cfg["crop_offset"]
    return data


class EvalTransform:
    """PIL image -> normalised ``(C, H, W)`` float tensor: resize, center crop, scale, normalise.

    ``crop_mode="center"`` scales the shorter side to ``floor(size / crop_pct)`` (aspect
    ratio kept), ``"squash"`` scales both sides to it; then the center ``input_size`` crop.
    """

    def __init__(
        self,
        input_size: Sequence[int],
        interpolation: str = "bicubic",
        crop_pct: float = DEFAULT_CROP_PCT,
        crop_mode: str = "center",
        mean: Sequence[float] = IMAGENET_DEFAULT_MEAN,
        std: Sequence[float] = IMAGENET_DEFAULT_STD,
        crop_offset: str = "round",  # center crop offset: torchvision's, or "floor" (transformers)
    ) -> None:
        self.crop_offset = crop_offset
        if interpolation not in PIL_INTERPOLATION:
            raise ValueError(
                f"interpolation must be one of {sorted(PIL_INTERPOLATION)}, got {interpolation!r}"
            )
        if crop_mode not in ("center", "squash"):
            raise ValueError(f"crop_mode must be 'center' or 'squash', got {crop_mode!r}")
        self.size = (int(input_size[-2]), int(input_size[-1]))
        self.interpolation, self.crop_pct, self.crop_mode = interpolation, crop_pct, crop_mode
        self.mean, self.std = tuple(mean), tuple(std)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(size={self.size}, interpolation={self.interpolation!r}, "
            f"crop_pct={self.crop_pct}, crop_mode={self.crop_mode!r}, mean={self.mean}, "
            f"std={self.std})"
        )

    def __call__(self, img: Image.Image) -> torch.Tensor:
        if not isinstance(img, Image.Image):
            raise TypeError(f"expected a PIL image, got {type(img).__name__}")
        h, w = self.size
        scale = (math.floor(h / self.crop_pct), math.floor(w / self.crop_pct))
        if self.crop_mode == "squash":
            new_size = scale
        elif scale[0] == scale[1]:  # shorter side -> scale (torchvision's Resize(int))
            new_size = shortest_side_size(img, scale[0])
        else:  # cover ``scale`` with the aspect ratio kept (timm's ResizeKeepRatio)
            new_size = keep_ratio_size(img, scale, longest=False)
        img = resize(img, new_size, PIL_INTERPOLATION[self.interpolation])
        x = to_tensor(center_crop_or_pad(img, self.size, offset=self.crop_offset))
        mean = torch.as_tensor(self.mean, dtype=x.dtype).view(-1, 1, 1)
        std = torch.as_tensor(self.std, dtype=x.dtype).view(-1, 1, 1)
        return x.sub_(mean).div_(std)


# -- the geometry, shared with attn_clip's transforms (torchvision's arithmetic on PIL) ------
Size = tuple[int, int]  # (height, width)


def resize(img: Image.Image, size: Size, resample: Image.Resampling) -> Image.Image:
    """Resize to ``(h, w)``; an image already that size is returned as it is."""
    h, w = size
    return img if img.size == (w, h) else img.resize((w, h), resample)


def shortest_side_size(img: Image.Image, side: int) -> Size:
    """torchvision's ``Resize(int)``: shorter side -> ``side``, longer side truncated."""
    w, h = img.size
    short, long = min(w, h), max(w, h)
    new_long = int(side * long / short)
    return (new_long, side) if w <= h else (side, new_long)


def keep_ratio_size(img: Image.Image, size: Size, longest: bool) -> Size:
    """Scale so the longest side fits in ``size`` (``longest``) or the image covers it,
    keeping the aspect ratio (rounded), as timm's ``ResizeKeepRatio`` does."""
    w, h = img.size
    ratio_h, ratio_w = h / size[0], w / size[1]
    ratio = max(ratio_h, ratio_w) if longest else min(ratio_h, ratio_w)
    return round(h / ratio), round(w / ratio)


def center_crop_or_pad(
    img: Image.Image, size: Size, fill: int = 0, offset: str = "round"
) -> Image.Image:
    """torchvision's ``center_crop``: pad with ``fill`` where the image is smaller than
    ``size``, then take the rounded center box (``offset="floor"``: transformers' box)."""
    th, tw = size
    w, h = img.size
    if tw > w or th > h:
        left, top = max(tw - w, 0) // 2, max(th - h, 0) // 2
        right, bottom = max(tw - w, 0) - left, max(th - h, 0) - top
        bands = len(img.getbands())
        color = fill if bands == 1 else (fill,) * bands  # as torchvision's pad fills
        palette = img.getpalette() if img.mode == "P" else None
        img = ImageOps.expand(img, border=(left, top, right, bottom), fill=color)
        if palette is not None:
            img.putpalette(palette)
        w, h = img.size
        if (w, h) == (tw, th):
            return img
    if offset == "floor":
        return img.crop(((w - tw) // 2, (h - th) // 2, (w - tw) // 2 + tw, (h - th) // 2 + th))
    top, left = int(round((h - th) / 2.0)), int(round((w - tw) / 2.0))
    return img.crop((left, top, left + tw, top + th))


def to_tensor(img: Image.Image) -> torch.Tensor:
    """torchvision's ``to_tensor``: ``(C, H, W)``, 8-bit images scaled to ``[0, 1]``."""
    little = sys.byteorder == "little"
    dtypes = {"I": np.int32, "I;16" if little else "I;16B": np.int16, "F": np.float32}
    x = torch.from_numpy(np.array(img, dtypes.get(img.mode, np.uint8), copy=True))
    if img.mode == "1":
        x = 255 * x
    x = x.view(img.height, img.width, len(img.getbands())).permute(2, 0, 1).contiguous()
    return x.to(torch.get_default_dtype()).div(255) if x.dtype == torch.uint8 else x


def create_transform(
    model_or_cfg: nn.Module | dict[str, Any] | str,
    is_training: bool = False,
    *,
    scale: Sequence[float] = (0.08, 1.0),
    hflip: float = 0.5,
    auto_augment: str | None = None,
    color_jitter: float = 0.4,
    re_prob: float = 0.0,
    **overrides: Any,
) -> Callable[[Image.Image], torch.Tensor]:
    """timm's transform for a model: PIL image -> normalised ``(C, H, W)`` float tensor.

    ``overrides`` (``crop_pct=1.0``, ``interpolation="bilinear"``, ...) replace entries of
    the resolved data config (:func:`resolve_data_config`). The eval transform (default) is
    an :class:`EvalTransform`; ``is_training=True`` gives timm's training pipeline from
    torchvision pieces (needs torchvision): ``RandomResizedCrop(input_size, scale)``, a
    horizontal flip with probability ``hflip``, ``auto_augment`` ``"rand"`` (RandAugment,
    2 ops, magnitude 9), ``"trivial"`` (TrivialAugmentWide) or None (``ColorJitter`` of
    brightness / contrast / saturation ``color_jitter``), to tensor, normalise, then
    ``RandomErasing(p=re_prob, value="random")``. The training keywords are ignored for eval.
    """
    data = resolve_data_config(model_or_cfg, **overrides)
    if not is_training:
        return EvalTransform(**data)
    if auto_augment not in (None, "none", "rand", "trivial"):
        raise ValueError(f"auto_augment must be 'rand', 'trivial' or None, got {auto_augment!r}")
    from torchvision import transforms as T

    interp = T.InterpolationMode(data["interpolation"])
    size = data["input_size"][1:]
    steps: list[Any] = [T.RandomResizedCrop(size, scale=tuple(scale), interpolation=interp)]
    if hflip > 0:
        steps.append(T.RandomHorizontalFlip(hflip))
    if auto_augment == "rand":
        steps.append(T.RandAugment(num_ops=2, magnitude=9, interpolation=interp))
    elif auto_augment == "trivial":
        steps.append(T.TrivialAugmentWide(interpolation=interp))
    elif color_jitter > 0:
        steps.append(T.ColorJitter(*(color_jitter,) * 3))
    steps += [T.ToTensor(), T.Normalize(data["mean"], data["std"])]
    if re_prob > 0:
        steps.append(T.RandomErasing(p=re_prob, value="random"))
    return T.Compose(steps)
