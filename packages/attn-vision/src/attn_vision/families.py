"""The model families: config dataclass, model class and the converter of each.

A leaf under :mod:`attn_vision.registry` (which re-exports ``FAMILIES``) and
:mod:`attn_vision.hf` (the Hugging Face loader), so both build models from one table
without importing each other.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from torch import nn

from .convert import (
    convert_timm_convnext,
    convert_timm_fastvit,
    convert_timm_resnet,
    convert_timm_swin,
    convert_timm_vit,
    convert_timm_vit_mci,
    convert_timm_vitamin,
)
from .convnext import ConvNeXt, ConvNeXtConfig
from .fastvit import FastVit, FastVitConfig
from .hf.vit import Dinov2LinearClassifier, convert_dinov2_linear
from .resnet import ResNet, ResNetConfig
from .swin import SwinConfig, SwinTransformer
from .vit import VisionTransformer, ViTConfig
from .vit_mci import MciVisionTransformer, MciViTConfig
from .vitamin import Vitamin, VitaminConfig

__all__ = ["FAMILIES", "make_config"]

# family -> (config dataclass, model class, converter from timm's state dict -- for
# "dinov2_linear", which timm does not have, from our own)
FAMILIES: dict[str, tuple[type, type[nn.Module], Any]] = {
    "vit": (ViTConfig, VisionTransformer, convert_timm_vit),
    "swin": (SwinConfig, SwinTransformer, convert_timm_swin),
    "resnet": (ResNetConfig, ResNet, convert_timm_resnet),
    "convnext": (ConvNeXtConfig, ConvNeXt, convert_timm_convnext),
    "vitamin": (VitaminConfig, Vitamin, convert_timm_vitamin),
    "fastvit": (FastVitConfig, FastVit, convert_timm_fastvit),
    "vit_mci": (MciViTConfig, MciVisionTransformer, convert_timm_vit_mci),
    # transformers' Dinov2ForImageClassification: a ViT whose head reads [CLS] + patch mean
    "dinov2_linear": (ViTConfig, Dinov2LinearClassifier, convert_dinov2_linear),
}


def make_config(config_cls: type, args: dict[str, Any]) -> Any:
    """``config_cls(**args)``; ``ValueError`` naming unknown fields (and the valid ones)."""
    valid = {f.name for f in dataclasses.fields(config_cls) if f.init}
    unknown = sorted(set(args) - valid)
    if unknown:
        raise ValueError(
            f"unknown option(s) {unknown} for {config_cls.__name__}; valid: {sorted(valid)}"
        )
    return config_cls(**args)
