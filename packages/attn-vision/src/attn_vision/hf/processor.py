"""A transformers ``preprocessor_config.json`` -> our preprocessing (``pretrained_cfg``).

transformers' image processors resize, center-crop, rescale and normalise; each one of
ours is the same steps as a timm data config that :func:`attn_vision.create_transform`
runs (PIL resampling, then the crop; transformers' crop box is ``floor`` centred:
``crop_offset="floor"``). The processors read, by ``image_processor_type``:

* ``ViTImageProcessor`` (and any processor with ``size = {height, width}``): resize to that
  size (aspect ratio not kept), then the optional center crop (``DeiTImageProcessor``:
  256 -> 224) -- timm's ``crop_mode="squash"`` with ``crop_pct = crop / size``;
* ``BitImageProcessor`` (DINOv2) and others with ``size = {shortest_edge}``: resize the
  shorter side (aspect ratio kept), center crop -- timm's ``"center"`` mode;
* ``ConvNextImageProcessor``: ``crop_pct`` below 384 px (shorter side to
  ``int(shortest_edge / crop_pct)``, crop ``shortest_edge``), a plain resize to
  ``shortest_edge`` squared from 384 on.

Rescaling must be by 1/255 and the crop (if any) square in the same proportion as the
resize; anything else is refused by name (``ValueError``). The tensors equal
transformers' PIL backend (``backend="pil"``; its torchvision backend resamples tensors
and differs by resampling rounding) within float rounding.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from attn_core.hub import CheckpointError

__all__ = ["PREPROCESSOR_CONFIG", "data_config", "read_preprocessor_config"]

PREPROCESSOR_CONFIG = "preprocessor_config.json"
# PIL's resampling codes (transformers' ``resample``) -> timm's interpolation names
RESAMPLE = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic", 4: "box", 5: "hamming"}
# processors whose int ``size`` means the shorter side (transformers' default_to_square=False)
_SHORTEST_EDGE_TYPES = ("BitImageProcessor", "ConvNextImageProcessor", "CLIPImageProcessor")


def read_preprocessor_config(folder: str | os.PathLike) -> dict[str, Any] | None:
    """``folder/preprocessor_config.json`` as a dict, or None if there is none."""
    path = Path(folder) / PREPROCESSOR_CONFIG
    if not path.is_file():
        return None
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"cannot read {path}: {e}") from None
    if not isinstance(cfg, dict):
        raise CheckpointError(f"{path} must hold a JSON object, got {type(cfg).__name__}")
    return cfg


def _size(value: Any, square: bool, name: str) -> dict[str, int]:
    """transformers' ``get_size_dict``: an int (square, or the shorter side), a dict."""
    if isinstance(value, int):
        return {"height": value, "width": value} if square else {"shortest_edge": value}
    if isinstance(value, Mapping) and value and all(isinstance(v, int) for v in value.values()):
        keys = set(value)
        if keys in ({"height", "width"}, {"shortest_edge"}):
            return dict(value)
    raise ValueError(
        f"{name}={value!r} is not supported: expected an int, {{height, width}} or "
        "{shortest_edge}"
    )


def _crop_pct(crop: int, resized: int, name: str) -> float:
    """``crop / resized`` such that timm's ``floor(crop / crop_pct)`` gives ``resized``."""
    pct = crop / resized
    for candidate in (pct, math.nextafter(pct, 0.0)):
        if math.floor(crop / candidate) == resized:
            return candidate
    raise ValueError(f"{name}: cannot express a crop of {crop} from {resized}")  # pragma: no cover


def data_config(preprocessor: Mapping[str, Any] | None, config: Any) -> dict[str, Any]:
    """A ``preprocessor_config.json`` -> the model's ``pretrained_cfg`` entries
    (``input_size``, ``interpolation``, ``crop_pct``, ``crop_mode``, ``crop_offset``,
    ``mean``, ``std``; ``processor_size``: keep this ``input_size``, whatever the model's
    ``img_size``). None (no file): timm's defaults at the model's image size."""
    if preprocessor is None:
        return {}
    p = preprocessor
    kind = str(p.get("image_processor_type") or p.get("feature_extractor_type") or "")
    # (older hub folders name the class ViTFeatureExtractor, ConvNextFeatureExtractor, ...)
    kind = (
        kind.removesuffix("Fast").removesuffix("Pil").replace("FeatureExtractor", "ImageProcessor")
    )
    if not p.get("do_resize", True):
        raise ValueError(
            "do_resize=False is not supported: images of any size would reach the model"
        )
    if p.get("do_rescale", True):
        factor = float(p.get("rescale_factor", 1 / 255))
        if not math.isclose(factor, 1 / 255, rel_tol=1e-6):
            raise ValueError(f"rescale_factor={factor} is not supported: expected 1/255")
    else:
        raise ValueError("do_rescale=False is not supported: expected pixels scaled by 1/255")
    for key in ("do_pad", "do_reduce_labels", "longest_edge"):
        if p.get(key):
            raise ValueError(f"{key}={p[key]!r} is not supported")
    size = _size(p.get("size", 224), kind not in _SHORTEST_EDGE_TYPES, "size")
    crop = _size(p["crop_size"], True, "crop_size") if p.get("do_center_crop") else None
    if crop is not None and crop["height"] != crop["width"] and "shortest_edge" in size:
        raise ValueError(f"crop_size={p['crop_size']!r}: expected a square crop")
    out: dict[str, Any] = {
        "interpolation": RESAMPLE.get(int(p.get("resample", 2)), None),
        "crop_offset": "floor",
        "processor_size": True,  # input_size is the processor's, not the model's img_size
    }
    if out["interpolation"] is None:
        raise ValueError(f"resample={p['resample']!r} is not supported: expected 0-5")
    if kind == "ConvNextImageProcessor":
        s = size.get("shortest_edge")
        if s is None:
            raise ValueError(f"size={p['size']!r}: ConvNextImageProcessor expects shortest_edge")
        pct = float(p.get("crop_pct") or 224 / 256)
        # transformers: below 384 the shorter side to int(s / crop_pct), then an s x s crop
        out.update(input_size=(config.in_chans, s, s), crop_mode="center" if s < 384 else "squash",
                   crop_pct=pct if s < 384 else 1.0)  # fmt: skip
    elif "shortest_edge" in size:
        if crop is None:
            raise ValueError(
                "size={shortest_edge} without do_center_crop is not supported: the images "
                "would keep their aspect ratio (no fixed size)"
            )
        s, c = size["shortest_edge"], crop["height"]
        out.update(input_size=(config.in_chans, c, c), crop_mode="center",
                   crop_pct=_crop_pct(c, s, "crop_size"))  # fmt: skip
    else:
        h, w = size["height"], size["width"]
        ch, cw = (crop["height"], crop["width"]) if crop else (h, w)
        if ch * w != cw * h:
            raise ValueError(
                f"crop_size={p['crop_size']!r} from size={p['size']!r} is not supported: "
                "expected the same proportion of height and width"
            )
        pct = _crop_pct(ch, h, "crop_size")
        if math.floor(cw / pct) != w:
            raise ValueError(f"crop_size={p['crop_size']!r} from size={p['size']!r}: unsupported")
        out.update(input_size=(config.in_chans, ch, cw), crop_mode="squash", crop_pct=pct)
    if p.get("do_normalize", True):
        out["mean"] = tuple(float(v) for v in p.get("image_mean", (0.5, 0.5, 0.5)))
        out["std"] = tuple(float(v) for v in p.get("image_std", (0.5, 0.5, 0.5)))
    else:
        out["mean"], out["std"] = (0.0,) * config.in_chans, (1.0,) * config.in_chans
    return out
