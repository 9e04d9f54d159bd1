"""attn_vision: ViT, Swin, ResNet, ConvNeXt, ViTamin, FastViT / MobileCLIP's MCi and
channel/spatial attention on attn_core, loading timm weights.

The ViT presets are timm's whole ``VisionTransformer`` family that our config expresses
(ViT, DeiT, DeiT-3, DINOv2 (+ registers), SigLIP, CLIP-trained ViTs, ...): see
``python -m attn_vision.timm_table --coverage``.

Quick start::

    import attn_vision
    model = attn_vision.create_model("vit_base_patch16_224", pretrained=True)  # eval mode
    transform = attn_vision.create_transform(model)
    logits = model(transform(image)[None])

Hugging Face transformers folders (``save_pretrained``'s ``config.json`` + weights) and hub
ids load the same way, with transformers' numbers and the folder's label names and
preprocessing: ``create_model("hf-hub:facebook/dinov2-small")``, ``create_model(folder)``;
see ``python -m attn_vision.hf --coverage`` for the architectures that load.

FastViT / MCi models (``fastvit_*``) and the MCi ViT (``vit_base_mci_224``) train with
multi-branch blocks and run folded: ``model.reparameterize()`` merges every branch, BatchNorm
and layer scale into single convolutions (in place; ``save_pretrained`` keeps it folded).

Names are imported on first use, and nothing here imports timm, open_clip, transformers
or torchvision: building a model or loading one from a local file stays light. Weights
are fetched, read and checked by :mod:`attn_core.hub` (catch its ``WeightsError``).
See docs/vision.md.
"""

# ruff: noqa: F401  (the TYPE_CHECKING imports below re-export __all__)
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "attention_pool": ["AttentionPoolLatent"],
    "channel_attention": [
        "CBAM",
        "ChannelAttention",
        "CoordinateAttention",
        "EfficientChannelAttention",
        "SpatialAttention",
        "SqueezeExcite",
        "create_attn",
    ],
    "convert": [
        "convert_timm_fastvit",
        "convert_timm_resnet",
        "convert_timm_swin",
        "convert_timm_vit",
        "convert_timm_vit_mci",
        "convert_timm_vitamin",
    ],
    "fastvit": ["FastVit", "FastVitConfig"],
    "hf.vit": ["Dinov2LinearClassifier"],
    "mobileone": ["MobileOneBlock", "ReparamLargeKernelConv"],
    "patch_embed": ["PatchEmbed", "resample_abs_pos_embed"],
    "pretrained": ["PretrainedLocation", "get_pretrained_cfg", "resolve_pretrained"],
    "registry": [
        "create_model",
        "get_model_config",
        "list_models",
        "register_model",
        "save_pretrained",
        "timm_model_config",
    ],
    "resnet": ["ResNet", "ResNetConfig"],
    "swin": ["SwinConfig", "SwinTransformer"],
    "transforms": ["create_transform", "resolve_data_config"],
    "visualize": [
        "attention_heatmap",
        "attention_rollout",
        "cls_attention",
        "save_attention_heatmap",
    ],
    "vit": ["VisionTransformer", "ViTConfig"],
    "vit_mci": ["MciVisionTransformer", "MciViTConfig"],
    "vitamin": ["Vitamin", "VitaminConfig"],
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}

__version__ = "0.1.0"
__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        value = getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'attn_vision' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)


if TYPE_CHECKING:  # the same names, eagerly, for type checkers and IDEs
    from .attention_pool import AttentionPoolLatent
    from .channel_attention import (
        CBAM,
        ChannelAttention,
        CoordinateAttention,
        EfficientChannelAttention,
        SpatialAttention,
        SqueezeExcite,
        create_attn,
    )
    from .convert import (
        convert_timm_fastvit,
        convert_timm_resnet,
        convert_timm_swin,
        convert_timm_vit,
        convert_timm_vit_mci,
        convert_timm_vitamin,
    )
    from .fastvit import FastVit, FastVitConfig
    from .hf.vit import Dinov2LinearClassifier
    from .mobileone import MobileOneBlock, ReparamLargeKernelConv
    from .patch_embed import PatchEmbed, resample_abs_pos_embed
    from .pretrained import PretrainedLocation, get_pretrained_cfg, resolve_pretrained
    from .registry import (
        create_model,
        get_model_config,
        list_models,
        register_model,
        save_pretrained,
        timm_model_config,
    )
    from .resnet import ResNet, ResNetConfig
    from .swin import SwinConfig, SwinTransformer
    from .transforms import create_transform, resolve_data_config
    from .visualize import (
        attention_heatmap,
        attention_rollout,
        cls_attention,
        save_attention_heatmap,
    )
    from .vit import VisionTransformer, ViTConfig
    from .vit_mci import MciVisionTransformer, MciViTConfig
    from .vitamin import Vitamin, VitaminConfig
