"""Evaluation preprocessing that reproduces timm's for each pretrained tag.

timm's eval pipeline for a model is: resize the shorter side to
``floor(input_size / crop_pct)`` with the tag's interpolation, center-crop
``input_size``, convert to a ``[0, 1]`` float tensor, normalise with the tag's
mean / std. :func:`create_transform` builds the same thing from torchvision pieces,
reading the settings from ``model.pretrained_cfg`` (set by ``create_model``) exactly as
``timm.data.resolve_data_config`` does.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from PIL import Image
from torch import nn
from torchvision import transforms
from torchvision.transforms import InterpolationMode
from torchvision.transforms import functional as TF

__all__ = ["ResizeKeepRatio", "create_transform", "resolve_data_config"]

IMAGENET_DEFAULT_MEAN = (0.485, 0.456, 0.406)
IMAGENET_DEFAULT_STD = (0.229, 0.224, 0.225)
DEFAULT_CROP_PCT = 0.875


def resolve_data_config(
    model_or_cfg: nn.Module | dict[str, Any] | str, **overrides: Any
) -> dict[str, Any]:
    """``input_size``, ``interpolation``, ``mean``, ``std``, ``crop_pct``, ``crop_mode``.

    ``model_or_cfg`` is a model from ``create_model`` (its ``pretrained_cfg``), a
    pretrained-cfg dict, or a model name (``"vit_base_patch16_224.augreg_in21k"``).
    Missing entries get timm's defaults; keyword ``overrides`` win.
    """
    if isinstance(model_or_cfg, str):
        from .registry import _data_cfg, _resolve

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
    return data


class ResizeKeepRatio(nn.Module):
    """Resize so the image covers ``size`` (h, w) with its aspect ratio kept (timm's rounding)."""

    def __init__(self, size: tuple[int, int], interpolation: InterpolationMode) -> None:
        super().__init__()
        self.size, self.interpolation = tuple(size), interpolation

    def forward(self, img: Image.Image | torch.Tensor) -> Image.Image | torch.Tensor:
        img_h, img_w = TF.get_dimensions(img)[1:]
        ratio = min(img_h / self.size[0], img_w / self.size[1])
        return TF.resize(img, [round(img_h / ratio), round(img_w / ratio)], self.interpolation)


def create_transform(
    model_or_cfg: nn.Module | dict[str, Any] | str, **overrides: Any
) -> transforms.Compose:
    """timm's eval transform for a model: PIL image -> normalised ``(C, H, W)`` float tensor.

    ``overrides`` (``crop_pct=1.0``, ``interpolation="bilinear"``, ...) replace entries of
    the resolved data config (:func:`resolve_data_config`).
    """
    cfg = resolve_data_config(model_or_cfg, **overrides)
    h, w = cfg["input_size"][1:]
    crop_pct = cfg["crop_pct"]
    interpolation = InterpolationMode(cfg["interpolation"])
    scale = (math.floor(h / crop_pct), math.floor(w / crop_pct))
    if cfg["crop_mode"] == "squash":  # both edges scaled (aspect ratio not kept), then cropped
        steps = [transforms.Resize(scale, interpolation=interpolation)]
    elif cfg["crop_mode"] == "center":  # shorter edge scaled, aspect ratio kept
        if scale[0] == scale[1]:
            steps = [transforms.Resize(scale[0], interpolation=interpolation)]
        else:
            steps = [ResizeKeepRatio(scale, interpolation)]
    else:
        raise ValueError(f"crop_mode must be 'center' or 'squash', got {cfg['crop_mode']!r}")
    steps += [
        transforms.CenterCrop((h, w)),
        transforms.ToTensor(),
        transforms.Normalize(mean=cfg["mean"], std=cfg["std"]),
    ]
    return transforms.Compose(steps)
