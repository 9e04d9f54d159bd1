"""Model names and pretrained tags, read from open_clip's own registry.

``list_models()`` is every open_clip architecture attn_clip can build (the ViT CLIPs:
``ViT-B-32``, ``ViT-B-16``, ``ViT-L-14``, ``ViT-H-14``, ``ViT-bigG-14``, the
``-quickgelu`` variants, ...); ``list_pretrained()`` their ``(name, tag)`` pairs;
``get_pretrained_cfg(name, tag)`` says where open_clip would download the weights from
and how images must be preprocessed for them.
"""

from __future__ import annotations

import difflib
import functools
import os
from dataclasses import dataclass, field

import open_clip
import open_clip.pretrained as oc_pretrained

from .config import CLIPConfig, PreprocessConfig

__all__ = [
    "PretrainedSource",
    "get_model_config",
    "get_pretrained_cfg",
    "list_models",
    "list_pretrained",
    "list_pretrained_tags",
]

HF_WEIGHTS_NAME = "open_clip_pytorch_model.bin"
HF_SAFE_WEIGHTS_NAME = "open_clip_model.safetensors"


@dataclass(frozen=True)
class PretrainedSource:
    """Where a ``(model, tag)`` checkpoint lives and what it expects."""

    model: str  # open_clip architecture name, e.g. "ViT-B-32"
    tag: str  # pretrained tag, e.g. "laion2b_s34b_b79k"
    hf_hub_id: str  # Hugging Face repo id, e.g. "laion/CLIP-ViT-B-32-laion2B-s34B-b79K"
    filenames: tuple[str, ...]  # files to try in order (safetensors first, as open_clip does)
    url: str = ""  # the original (non-hub) download URL, for reference
    quick_gelu: bool = False  # the weights were trained with QuickGELU
    preprocess: PreprocessConfig = field(default_factory=PreprocessConfig)


def _safe_alternatives(filename: str) -> list[str]:
    """The ``.safetensors`` names open_clip tries before a ``.bin`` / ``.pth`` file."""
    if filename == HF_WEIGHTS_NAME:
        return [HF_SAFE_WEIGHTS_NAME]
    if filename.endswith((".bin", ".pth")):
        return [filename[:-4] + ".safetensors"]
    return []


def _supported(name: str) -> CLIPConfig | None:
    cfg = open_clip.get_model_config(name)
    if cfg is None:
        return None
    try:
        return CLIPConfig.from_open_clip(cfg)
    except (ValueError, TypeError, KeyError):
        return None


@functools.cache
def _supported_names() -> tuple[str, ...]:
    return tuple(n for n in open_clip.list_models() if _supported(n) is not None)


def list_models() -> list[str]:
    """open_clip architecture names attn_clip can build (ViT towers, BPE-style text tower)."""
    return list(_supported_names())


def get_model_config(name: str) -> CLIPConfig:
    """The :class:`CLIPConfig` of an open_clip architecture name; clear error if unknown."""
    cfg = open_clip.get_model_config(name)
    if cfg is None:
        close = difflib.get_close_matches(name, list_models(), n=5)
        hint = f"; did you mean {close}?" if close else "; see attn_clip.list_models()"
        raise ValueError(f"unknown model {name!r}{hint}")
    try:
        return CLIPConfig.from_open_clip(cfg)
    except ValueError as e:
        raise ValueError(f"model {name!r} cannot be built by attn_clip: {e}") from None


def list_pretrained(as_str: bool = False) -> list[tuple[str, str]] | list[str]:
    """``(name, tag)`` pairs (or ``"name:tag"`` strings) of every buildable pretrained model."""
    names = set(_supported_names())
    pairs = [(m, t) for m, t in open_clip.list_pretrained() if m in names]
    return [f"{m}:{t}" for m, t in pairs] if as_str else pairs


def list_pretrained_tags(name: str) -> list[str]:
    """The pretrained tags of one architecture (empty if it has none)."""
    return [t for m, t in list_pretrained() if m == name]


def get_pretrained_cfg(name: str, tag: str) -> PretrainedSource:
    """Resolve ``(name, tag)`` to the hub repo/file open_clip downloads and its preprocessing."""
    cfg = oc_pretrained.get_pretrained_cfg(name, tag)
    if not cfg:
        tags = list_pretrained_tags(name)
        raise ValueError(
            f"unknown pretrained tag {tag!r} for {name!r}; known tags: {tags or 'none'} "
            "(or pass pretrained=<path to a checkpoint file>)"
        )
    hub = cfg.get("hf_hub", "")
    if not hub:
        raise ValueError(f"{name}:{tag} has no Hugging Face hub location (url: {cfg.get('url')})")
    repo_id, filename = os.path.split(hub)  # "org/repo/" -> ("org/repo", "")
    filename = filename or HF_WEIGHTS_NAME
    image_size = get_model_config(name).vision.image_size
    return PretrainedSource(
        model=name,
        tag=tag,
        hf_hub_id=repo_id,
        filenames=(*_safe_alternatives(filename), filename),
        url=cfg.get("url", ""),
        quick_gelu=bool(cfg.get("quick_gelu", False)),
        preprocess=PreprocessConfig(
            size=image_size,
            mean=cfg.get("mean", PreprocessConfig.mean),
            std=cfg.get("std", PreprocessConfig.std),
            interpolation=cfg.get("interpolation", "bicubic"),
            resize_mode=cfg.get("resize_mode", "shortest"),
        ),
    )
