"""Image-only backbones as index models: which model names are attn_vision's, building one,
and its embedding (the pooled features, L2-normalized).

An index can be made with an attn_vision model instead of a CLIP: DINOv2
(``hf-hub:facebook/dinov2-small``, timm's ``vit_small_patch14_dinov2.lvd142m``), a
transformers ViT / Swin / ConvNeXt / ResNet folder, a ``scripts/finetune_vit.py`` run. Such
an index is searched by image only: the model has no text tower.

Which library a name belongs to (:func:`model_kind`), as its user would expect:

* a folder (or ``local-dir:PATH``) or ``hf-hub:<repo id>``: its config says.
  ``open_clip_config.json``, or a ``config.json`` of a transformers CLIP / SigLIP / SigLIP2
  (``model_type`` ``clip`` / ``siglip`` / ``siglip2``), is a CLIP; any other ``config.json``
  (a transformers vision model, ``model_type`` ``vit`` / ``dinov2`` / ``swin`` / ...; an
  ``attn_vision.save_pretrained`` folder) is attn_vision's, which names what it cannot read.
  Without a config it is a CLIP (attn_clip says what is missing).
* a name: attn_clip's first (open_clip's architectures, ``demo-shapes``), then
  attn_vision's (timm's names, with or without a ``.tag``). The few open_clip configs named
  after their timm tower (``convnext_base``, ``swin_base_patch4_window7_224``, ...) are
  CLIPs; timm's tag (``convnext_base.fb_in1k``) names the image backbone.

The embedding of an image is what the backbone pools before its classifier
(``forward_pre_logits``; ``forward_head(..., pre_logits=True)``), L2-normalized so that
scores are cosine similarities. For DINOv2 that is the [CLS] token after the final norm:
transformers' ``pooler_output`` of ``Dinov2Model``, what DINOv2's users retrieve with.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from attn_core import hub

__all__ = ["CLIP_MODEL_TYPES", "brings_weights", "load_backbone", "model_kind", "pooled"]

CLIP_MODEL_TYPES = ("clip", "siglip", "siglip2")  # transformers config.json read by attn_clip
HF_HUB_PREFIX, LOCAL_DIR_PREFIX = "hf-hub:", "local-dir:"
_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def _config_kind(open_clip_config: bool, config: Path | None) -> str:
    """The kind a folder's / hub repo's config files make it (see the module docstring)."""
    if open_clip_config or config is None:
        return "clip"
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return "clip"  # unreadable: attn_clip's loader says so, naming the file
    if isinstance(data, dict) and data.get("model_type", "clip") not in CLIP_MODEL_TYPES:
        return "vision"  # a transformers vision model (model_type vit, dinov2, ...)
    if isinstance(data, dict) and "model_type" not in data and "architecture" in data:
        return "vision"  # attn_vision's save_pretrained (or timm's) config.json
    return "clip"


def model_kind(name: str | os.PathLike, **hub_kwargs: Any) -> str:
    """``"clip"`` or ``"vision"``: which library builds the model ``name`` (the rule in the
    module docstring). An ``hf-hub:`` name's config files are fetched (cached) with
    ``hub_kwargs`` (``cache_dir``, ``local_files_only``); when none can be, it is left to
    attn_clip, whose error names the repo and the cache."""
    text = str(name)
    if text.startswith(HF_HUB_PREFIX):
        repo = text[len(HF_HUB_PREFIX) :]
        for filename in ("open_clip_config.json", "config.json"):
            try:
                path = hub.download(repo, filename, **hub_kwargs)
            except hub.WeightsUnavailableError:
                continue
            return _config_kind(filename == "open_clip_config.json", path)
        return "clip"
    path = Path(text[len(LOCAL_DIR_PREFIX) :] if text.startswith(LOCAL_DIR_PREFIX) else text)
    if path.is_dir():
        config = path / "config.json"
        return _config_kind((path / "open_clip_config.json").is_file(),
                            config if config.is_file() else None)  # fmt: skip
    import attn_clip

    try:
        attn_clip.get_model_config(text)
        return "clip"
    except (ValueError, KeyError):
        pass
    from attn_vision.registry import get_model_spec

    try:
        get_model_spec(text)  # the arch (a bad tag is create_model's to name)
    except ValueError:
        return "clip"  # neither knows it: attn_clip's error names its close matches
    return "vision"


def brings_weights(name: str | os.PathLike) -> bool:
    """Whether ``name`` comes with its weights (a folder, ``hf-hub:``, ``local-dir:``)."""
    text = str(name)
    return text.startswith((HF_HUB_PREFIX, LOCAL_DIR_PREFIX)) or Path(text).is_dir()


def load_backbone(
    name: str | os.PathLike,
    pretrained: str | os.PathLike | None = None,
    *,
    device: torch.device,
    precision: str = "fp32",
) -> tuple[torch.nn.Module, Any]:
    """``(model in eval mode on device, preprocess)`` of an attn_vision model: a folder /
    ``hf-hub:`` name with its own weights, or a timm name with timm's weights for its tag
    (``pretrained`` None) or ``pretrained`` (a tag of its arch, or a checkpoint file).
    ``attn_vision.create_model``'s errors as they are."""
    import attn_vision

    if precision not in _DTYPES:
        raise ValueError(f"precision must be one of {sorted(_DTYPES)}, got {precision!r}")
    text = str(name)
    if text.startswith(LOCAL_DIR_PREFIX):
        text = text[len(LOCAL_DIR_PREFIX) :]
    if brings_weights(text):
        if pretrained is not None:
            raise ValueError(f"{text} brings its own weights: pass no pretrained= with it")
        weights: Any = None
    else:
        weights = True if pretrained is None else pretrained
    model = attn_vision.create_model(text, pretrained=weights)
    preprocess = attn_vision.create_transform(model)
    return model.to(device=device, dtype=_DTYPES[precision]).eval(), preprocess


def pooled(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``(B, C, H, W)`` preprocessed images -> ``(B, D)`` L2-normalized pooled features of
    attn_vision ``model`` (in the model's dtype)."""
    x = x.to(next(model.parameters()).dtype)
    if hasattr(model, "forward_pre_logits"):
        features = model.forward_pre_logits(x)
    else:
        features = model.forward_head(model.forward_features(x), pre_logits=True)
    return F.normalize(features, dim=-1)
