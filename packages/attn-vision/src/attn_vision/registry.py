"""Named model presets and ``create_model`` / ``list_models``, the timm way.

Names are timm's (``vit_base_patch16_224``, ``swin_tiny_patch4_window7_224``,
``resnet18``, ...) and accept timm's pretrained tag after a dot
(``vit_base_patch16_224.augreg2_in21k_ft_in1k``); a bare name means timm's default tag.
As in timm, the tag's pretrained config supplies defaults for ``num_classes``,
``in_chans`` and (for fixed-size models) ``img_size``; keyword overrides win.
Presets that timm does not have (``resnet18_eca``, ...) have no pretrained weights.
"""

from __future__ import annotations

import dataclasses
import difflib
import fnmatch
import os
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from .convert import convert_timm_resnet, convert_timm_swin, convert_timm_vit
from .pretrained import (
    download_pretrained,
    get_pretrained_cfg,
    load_state_dict_file,
    resolve_pretrained,
)
from .resnet import ResNet, ResNetConfig
from .swin import SwinConfig, SwinTransformer
from .transforms import DEFAULT_CROP_PCT, IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from .vit import VisionTransformer, ViTConfig

__all__ = ["create_model", "get_model_config", "list_models", "register_model"]

# preprocessing of presets timm has no pretrained cfg for: timm's own defaults
DEFAULT_DATA_CFG = {
    "input_size": (3, 224, 224),
    "interpolation": "bicubic",
    "crop_pct": DEFAULT_CROP_PCT,
    "crop_mode": "center",
    "mean": IMAGENET_DEFAULT_MEAN,
    "std": IMAGENET_DEFAULT_STD,
}

# family -> (config dataclass, model class, converter from timm's state dict)
FAMILIES: dict[str, tuple[type, type[nn.Module], Any]] = {
    "vit": (ViTConfig, VisionTransformer, convert_timm_vit),
    "swin": (SwinConfig, SwinTransformer, convert_timm_swin),
    "resnet": (ResNetConfig, ResNet, convert_timm_resnet),
}


@dataclass(frozen=True)
class ModelSpec:
    family: str  # key of FAMILIES
    args: dict[str, Any] = field(default_factory=dict)  # preset config fields
    timm_weights: bool = True  # timm has this architecture (pretrained cfgs and weights)


_MODELS: dict[str, ModelSpec] = {}


def register_model(name: str, family: str, timm_weights: bool = True, **args: Any) -> None:
    """Register preset ``name`` of ``family`` ("vit", "swin", "resnet") with config ``args``."""
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; expected one of {sorted(FAMILIES)}")
    _MODELS[name] = ModelSpec(family, args, timm_weights)


# --- presets ---------------------------------------------------------------------------
_clip = dict(pre_norm=True, norm_eps=1e-5)
for _name, _args in {
    "vit_tiny_patch16_224": dict(patch_size=16, embed_dim=192, depth=12, num_heads=3),
    "vit_small_patch16_224": dict(patch_size=16, embed_dim=384, depth=12, num_heads=6),
    "vit_small_patch32_224": dict(patch_size=32, embed_dim=384, depth=12, num_heads=6),
    "vit_base_patch16_224": dict(patch_size=16, embed_dim=768, depth=12, num_heads=12),
    "vit_base_patch32_224": dict(patch_size=32, embed_dim=768, depth=12, num_heads=12),
    "vit_base_patch16_384": dict(
        img_size=384, patch_size=16, embed_dim=768, depth=12, num_heads=12
    ),
    "vit_large_patch16_224": dict(patch_size=16, embed_dim=1024, depth=24, num_heads=16),
    "vit_base_patch16_gap_224": dict(
        patch_size=16,
        embed_dim=768,
        depth=12,
        num_heads=16,
        class_token=False,
        global_pool="avg",
        fc_norm=False,
    ),
    "vit_base_patch16_clip_224": dict(
        patch_size=16, embed_dim=768, depth=12, num_heads=12, **_clip
    ),
    "vit_base_patch32_clip_224": dict(
        patch_size=32, embed_dim=768, depth=12, num_heads=12, **_clip
    ),
    "vit_base_patch32_clip_quickgelu_224": dict(
        patch_size=32, embed_dim=768, depth=12, num_heads=12, act="quick_gelu", **_clip
    ),
}.items():
    register_model(_name, "vit", **_args)

_swin_t = dict(embed_dim=96, depths=(2, 2, 6, 2), num_heads=(3, 6, 12, 24))
_swin_s = dict(embed_dim=96, depths=(2, 2, 18, 2), num_heads=(3, 6, 12, 24))
_swin_b = dict(embed_dim=128, depths=(2, 2, 18, 2), num_heads=(4, 8, 16, 32))
_swin_l = dict(embed_dim=192, depths=(2, 2, 18, 2), num_heads=(6, 12, 24, 48))
register_model("swin_tiny_patch4_window7_224", "swin", **_swin_t)
register_model("swin_small_patch4_window7_224", "swin", **_swin_s)
register_model("swin_base_patch4_window7_224", "swin", **_swin_b)
register_model("swin_base_patch4_window12_384", "swin", img_size=384, window_size=12, **_swin_b)
register_model("swin_large_patch4_window7_224", "swin", **_swin_l)

register_model("resnet18", "resnet", layers=(2, 2, 2, 2))
register_model("resnet34", "resnet", layers=(3, 4, 6, 3))
register_model("seresnet18", "resnet", layers=(2, 2, 2, 2), attn_layer="se")
register_model("seresnet34", "resnet", layers=(3, 4, 6, 3), attn_layer="se")
for _attn in ("se", "eca", "cbam", "coord"):
    register_model(f"resnet18_{_attn}", "resnet", timm_weights=False, attn_layer=_attn)
    register_model(
        f"resnet34_{_attn}", "resnet", timm_weights=False, layers=(3, 4, 6, 3), attn_layer=_attn
    )


# --- lookup ----------------------------------------------------------------------------
def _spec(arch: str) -> ModelSpec:
    if arch not in _MODELS:
        close = difflib.get_close_matches(arch, list(_MODELS), n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ValueError(f"unknown model {arch!r}{hint} (see attn_vision.list_models())")
    return _MODELS[arch]


def list_models(pattern: str = "*", pretrained: bool = False) -> list[str]:
    """Sorted preset names matching the glob ``pattern``.

    ``pretrained=True`` lists ``arch.tag`` for every pretrained tag timm knows instead.
    """
    names = sorted(n for n in _MODELS if fnmatch.fnmatch(n, pattern.partition(".")[0]))
    if not pretrained:
        return names
    import timm

    tagged = []
    for n in names:
        if _MODELS[n].timm_weights:
            tagged += [t for t in timm.list_pretrained(f"{n}.*") if fnmatch.fnmatch(t, pattern)]
    return sorted(tagged)


def _make_config(config_cls: type, args: dict[str, Any]) -> Any:
    valid = {f.name for f in dataclasses.fields(config_cls) if f.init}
    unknown = sorted(set(args) - valid)
    if unknown:
        raise ValueError(
            f"unknown option(s) {unknown} for {config_cls.__name__}; valid: {sorted(valid)}"
        )
    return config_cls(**args)


def _data_cfg(timm_cfg: dict[str, Any] | None, config: Any) -> dict[str, Any]:
    """The model's ``pretrained_cfg`` (timm's, with input size / classes of *this* model)."""
    cfg = dict(timm_cfg) if timm_cfg else dict(DEFAULT_DATA_CFG)
    h, w = cfg["input_size"][1:]
    if hasattr(config, "img_size"):
        img = config.img_size
        h, w = (img, img) if isinstance(img, int) else tuple(img)
    cfg["input_size"] = (config.in_chans, h, w)
    cfg["num_classes"] = config.num_classes
    return cfg


def get_model_config(name: str, **overrides: Any) -> Any:
    """The config dataclass ``create_model(name, **overrides)`` would build."""
    return _resolve(name, overrides)[1]


def _resolve(name: str, overrides: dict[str, Any]) -> tuple[ModelSpec, Any, dict | None]:
    arch, _, tag = name.partition(".")
    spec = _spec(arch)
    if tag and not spec.timm_weights:
        raise ValueError(f"{arch!r} is an attn_vision-only preset without pretrained tags")
    timm_cfg = get_pretrained_cfg(name) if spec.timm_weights else None
    config_cls = FAMILIES[spec.family][0]
    args = dict(spec.args)
    # timm: the pretrained cfg supplies num_classes / in_chans / fixed img_size defaults
    if timm_cfg:
        if timm_cfg.get("num_classes") is not None and timm_cfg["num_classes"] >= 0:
            args["num_classes"] = timm_cfg["num_classes"]
        if timm_cfg.get("input_size"):
            args["in_chans"] = timm_cfg["input_size"][0]
            if timm_cfg.get("fixed_input_size") and "img_size" in {
                f.name for f in dataclasses.fields(config_cls)
            }:
                args["img_size"] = tuple(timm_cfg["input_size"][1:])
    args.update(overrides)
    return spec, _make_config(config_cls, args), timm_cfg


def create_model(
    name: str,
    pretrained: bool | str | os.PathLike = False,
    *,
    cache_dir: str | os.PathLike | None = None,
    **overrides: Any,
) -> nn.Module:
    """Build preset ``name`` (``arch`` or ``arch.tag``) and optionally load weights.

    Args:
        name: a name from :func:`list_models`, optionally with a timm pretrained tag.
        pretrained: ``False``; ``True`` = timm's weights for the tag, fetched from the
            Hugging Face Hub (cached; raises :class:`WeightsUnavailableError` when
            offline / unreachable); or a path to a local timm-format ``.safetensors`` /
            ``.bin`` file.
        cache_dir: Hub cache directory (default: huggingface_hub's).
        **overrides: config fields, e.g. ``num_classes=10``, ``img_size=384``, ``depth=2``.

    Returns the model (in training mode, like timm); ``model.pretrained_cfg`` holds the
    preprocessing settings that :func:`attn_vision.create_transform` uses.
    """
    spec, config, timm_cfg = _resolve(name, overrides)
    _, model_cls, converter = FAMILIES[spec.family]
    loading = pretrained is not False and pretrained is not None
    model = model_cls(config, weight_init=not loading)
    model.pretrained_cfg = _data_cfg(timm_cfg, config)
    model.pretrained_cfg["architecture"] = name.partition(".")[0]
    if not loading:
        return model
    if pretrained is True:
        if not spec.timm_weights:
            raise ValueError(
                f"{name!r} has no published weights; pass pretrained=<path> to load your own"
            )
        path = download_pretrained(resolve_pretrained(name), cache_dir=cache_dir)
    else:
        path = pretrained
    model.load_state_dict(converter(load_state_dict_file(path), config))
    return model
