"""Model names and pretrained tags, read from open_clip's own registry.

``list_models()`` is every open_clip architecture attn_clip can build (the ViT CLIPs:
``ViT-B-32``, ``ViT-B-16``, ``ViT-L-14``, ``ViT-H-14``, ``ViT-bigG-14``, the
``-quickgelu`` variants, ...); ``list_pretrained()`` their ``(name, tag)`` pairs;
``get_pretrained_cfg(name, tag)`` says where open_clip would download the weights from
and how images must be preprocessed for them.

attn_clip also has *bundled* models of its own, whose weights ship inside the package
(no network): ``demo-shapes``, a small CLIP trained by ``scripts/train_clip.py`` on the
generated shapes of :mod:`attn_clip.shapes` (tag ``shapes``, the default for
``pretrained=True``). ``list_models(include_bundled=True)`` lists them too.
"""

from __future__ import annotations

import difflib
import functools
import os
from dataclasses import dataclass, field
from pathlib import Path

import open_clip
import open_clip.pretrained as oc_pretrained

from .config import CLIPConfig, PreprocessConfig

__all__ = [
    "BUNDLED_MODELS",
    "PretrainedSource",
    "default_pretrained_tag",
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
    file: str = ""  # a weights file shipped inside attn_clip (bundled models): no download


@dataclass(frozen=True)
class BundledModel:
    """A model of attn_clip's own: an open_clip-style config and weights in the package."""

    config: dict  # open_clip model config (``embed_dim``, ``vision_cfg``, ``text_cfg``)
    weights: dict[str, str]  # pretrained tag -> file name under attn_clip/weights/
    preprocess: PreprocessConfig  # how images must be prepared for the weights


WEIGHTS_DIR = Path(__file__).parent / "weights"

BUNDLED_MODELS: dict[str, BundledModel] = {
    # 32 px images, 8 px patches (16 patches + class token); a 3-block, 128-wide ViT and a
    # 2-block, 32-wide causal text tower over OpenAI's BPE; ~2.3 M parameters (~4.6 MB fp16).
    "demo-shapes": BundledModel(
        config={
            "embed_dim": 64,
            "vision_cfg": {
                "image_size": 32,
                "patch_size": 8,
                "width": 128,
                "layers": 3,
                "head_width": 32,
                "mlp_ratio": 4.0,
            },
            "text_cfg": {
                "context_length": 24,
                "vocab_size": 49408,
                "width": 32,
                "heads": 2,
                "layers": 2,
                "mlp_ratio": 4.0,
            },
        },
        weights={"shapes": "demo-shapes.safetensors"},
        preprocess=PreprocessConfig(size=32),
    ),
}


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


def list_models(include_bundled: bool = False) -> list[str]:
    """open_clip architecture names attn_clip can build (ViT towers, BPE-style text tower).

    ``include_bundled=True`` adds attn_clip's own models (``demo-shapes``) at the end.
    """
    names = list(_supported_names())
    return names + list(BUNDLED_MODELS) if include_bundled else names


def get_model_config(name: str) -> CLIPConfig:
    """The :class:`CLIPConfig` of an open_clip architecture name; clear error if unknown."""
    if name in BUNDLED_MODELS:
        return CLIPConfig.from_open_clip(BUNDLED_MODELS[name].config)
    cfg = open_clip.get_model_config(name)
    if cfg is None:
        close = difflib.get_close_matches(name, list_models(include_bundled=True), n=5)
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
    if name in BUNDLED_MODELS:
        return list(BUNDLED_MODELS[name].weights)
    return [t for m, t in list_pretrained() if m == name]


def default_pretrained_tag(name: str) -> str | None:
    """The tag ``pretrained=True`` means: a bundled model's own weights (else None)."""
    bundled = BUNDLED_MODELS.get(name)
    return next(iter(bundled.weights)) if bundled else None


def get_pretrained_cfg(name: str, tag: str) -> PretrainedSource:
    """Resolve ``(name, tag)`` to the hub repo/file open_clip downloads and its preprocessing.

    For a bundled model the source is the file inside the package (``file``).
    """
    bundled = BUNDLED_MODELS.get(name)
    if bundled is not None:
        if tag not in bundled.weights:
            raise ValueError(
                f"unknown pretrained tag {tag!r} for {name!r}; known tags: {list(bundled.weights)}"
            )
        filename = bundled.weights[tag]
        return PretrainedSource(
            model=name,
            tag=tag,
            hf_hub_id="",
            filenames=(filename,),
            preprocess=bundled.preprocess,
            file=str(WEIGHTS_DIR / filename),
        )
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
