"""Named presets, ``create_model`` / ``list_models`` / ``save_pretrained``: the zoo's contract.

Names are timm's (``vit_base_patch16_224``, ``swin_tiny_patch4_window7_224``,
``resnet18``, ...) and accept timm's pretrained tag after a dot
(``vit_base_patch16_224.augreg2_in21k_ft_in1k``); a bare name means timm's default tag.
As in timm, the tag's pretrained config supplies defaults for ``num_classes``,
``in_chans`` and (for fixed-size models) ``img_size``; keyword overrides win.
Presets that timm does not have (``resnet18_eca``, ...) have no pretrained weights.

The ViT presets are every architecture of timm's ``VisionTransformer`` family that
:class:`ViTConfig` can express (DeiT, DeiT-3, DINOv2 with and without registers, SigLIP,
CLIP-trained ViTs, ...). They, and timm's pretrained configs of all presets, come from a
generated table shipped with the package (``timm_pretrained_cfgs.json``, written from
timm's own entrypoints by :mod:`attn_vision.timm_table`, the only module that imports
timm). Regenerate it after adding a non-ViT preset or upgrading timm, and see what of
timm's ViTs we build::

    python -m attn_vision.timm_table --write-table
    python -m attn_vision.timm_table --coverage

:func:`timm_model_config` is the config ``timm.create_model(name, **kwargs)`` builds, as
ours: a preset with timm's keyword arguments (translated by :mod:`attn_vision.timm_args`),
which is how attn_clip builds open_clip's timm image towers.

A folder written by :func:`save_pretrained` holds ``config.json`` and
``model.safetensors`` (attn_vision's state dict); ``config.json`` is::

    {"architecture": "vit_tiny_patch16_224",  # the preset (null for a hand-built model)
     "family": "vit",                          # a key of FAMILIES: "vit", "swin", "fastvit", ...
     "model_args": {...},                      # every field of the config dataclass
     "pretrained_cfg": {...}}                  # model.pretrained_cfg (preprocessing)

and is read strictly: unknown keys are refused by name (``attn_core.hub.CheckpointError``).
A reparameterized FastViT / MCi model (``model.reparameterize()``) saves
``"inference_mode": true`` in its ``model_args`` and loads back folded.

A folder that transformers' ``save_pretrained`` wrote (``config.json`` with a
``model_type``) and ``"hf-hub:<repo id>"`` (either kind of folder, from the hub cache or
downloaded) load through :mod:`attn_vision.hf`: the model its config describes, the
converted weights, ``id2label`` as ``pretrained_cfg["label_names"]`` and
``preprocessor_config.json`` as the preprocessing; ``save_pretrained`` of such a model
writes our folder.
"""

from __future__ import annotations

import dataclasses
import difflib
import fnmatch
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attn_core import hub
from torch import nn

from .constants import DEFAULT_CROP_PCT, IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from .families import FAMILIES, make_config
from .fastvit import fastvit_args
from .hf import hf_module, is_hf_config
from .hf.processor import PREPROCESSOR_CONFIG, data_config, read_preprocessor_config
from .pretrained import (
    get_pretrained_cfg,
    pretrained_tags,
    read_table,
    resolve_pretrained,
)
from .timm_args import TIMM_TRANSLATORS

__all__ = [
    "ModelSpec",
    "create_model",
    "get_model_config",
    "get_model_spec",
    "list_models",
    "register_model",
    "save_pretrained",
    "timm_model_config",
]

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
CONFIG_KEYS = ("architecture", "family", "model_args", "pretrained_cfg")

# preprocessing of presets timm has no pretrained cfg for: timm's own defaults
DEFAULT_DATA_CFG = {
    "input_size": (3, 224, 224),
    "interpolation": "bicubic",
    "crop_pct": DEFAULT_CROP_PCT,
    "crop_mode": "center",
    "mean": IMAGENET_DEFAULT_MEAN,
    "std": IMAGENET_DEFAULT_STD,
}
HF_HUB_PREFIX = "hf-hub:"
HF_WEIGHTS = ("model.safetensors", "pytorch_model.bin")  # what transformers' folders hold


# family -> the timm module of its entrypoints (a ViT preset's is in the table: ``eva`` or
# ``vision_transformer`` / ``deit``)
TIMM_MODULES = {"swin": "swin_transformer", "resnet": "resnet", "convnext": "convnext",
                "vitamin": "vitamin", "fastvit": "fastvit",
                "vit_mci": "vision_transformer_hybrid"}  # fmt: skip
# timm module -> the translator of its keyword arguments (timm_args' and these)
_TRANSLATORS = {
    **TIMM_TRANSLATORS,
    "fastvit": fastvit_args,
    "vision_transformer_hybrid": TIMM_TRANSLATORS["vision_transformer"],  # (the ViT's kwargs)
}


@dataclass(frozen=True)
class ModelSpec:
    """A preset: its family, config fields and what timm calls it."""

    family: str  # key of FAMILIES
    args: dict[str, Any] = field(default_factory=dict)  # preset config fields
    timm_weights: bool = True  # timm has this architecture (pretrained cfgs and weights)
    timm_module: str | None = None  # the timm module of its entrypoint (None: the family's)
    # timm keyword arguments that only choose the layout of timm's checkpoint (Eva's
    # ``qkv_fused``: :func:`attn_vision.timm_args.eva_layout`)
    layout_args: dict[str, Any] = field(default_factory=dict)


_MODELS: dict[str, ModelSpec] = {}


def _tuples(d: dict[str, Any]) -> dict[str, Any]:
    """JSON lists back to the tuples the configs and pretrained cfgs hold."""
    return {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}


def register_model(name: str, family: str, timm_weights: bool = True, **args: Any) -> None:
    """Register preset ``name`` of ``family`` (a key of ``FAMILIES``) with config ``args``."""
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; expected one of {sorted(FAMILIES)}")
    _MODELS[name] = ModelSpec(family, args, timm_weights, TIMM_MODULES.get(family))


# --- presets ---------------------------------------------------------------------------
# ViT: one per generated table entry with "model_args" (timm's architecture, our field names)
for _name, _entry in read_table()["architectures"].items():
    if "model_args" in _entry:
        _MODELS[_name] = ModelSpec(
            "vit", _tuples(_entry["model_args"]), True, _entry["timm_module"],
            _entry.get("layout_args", {}),
        )  # fmt: skip

_swin_t = dict(embed_dim=96, depths=(2, 2, 6, 2), num_heads=(3, 6, 12, 24))
_swin_s = dict(embed_dim=96, depths=(2, 2, 18, 2), num_heads=(3, 6, 12, 24))
_swin_b = dict(embed_dim=128, depths=(2, 2, 18, 2), num_heads=(4, 8, 16, 32))
_swin_l = dict(embed_dim=192, depths=(2, 2, 18, 2), num_heads=(6, 12, 24, 48))
register_model("swin_tiny_patch4_window7_224", "swin", **_swin_t)
register_model("swin_small_patch4_window7_224", "swin", **_swin_s)
register_model("swin_base_patch4_window7_224", "swin", **_swin_b)
register_model("swin_base_patch4_window12_384", "swin", img_size=384, window_size=12, **_swin_b)
register_model("swin_large_patch4_window7_224", "swin", **_swin_l)
register_model("swin_large_patch4_window12_384", "swin", img_size=384, window_size=12, **_swin_l)

register_model("resnet18", "resnet", layers=(2, 2, 2, 2))
register_model("resnet34", "resnet", layers=(3, 4, 6, 3))
register_model("seresnet18", "resnet", layers=(2, 2, 2, 2), attn_layer="se")
register_model("seresnet34", "resnet", layers=(3, 4, 6, 3), attn_layer="se")
# timm's ResNet family: name -> (layers, variant, attention); variants: "" plain 7x7 stem,
# "c" deep stem, "d" deep stem + average-pool shortcut, "s" wide deep stem, "l" (light)
# average-pool shortcut only; "32x4d" & co. are ResNeXt groups, "_2" wide bottlenecks
_R50, _R101, _R152, _R200 = (3, 4, 6, 3), (3, 4, 23, 3), (3, 8, 36, 3), (3, 24, 36, 3)
_VARIANTS = {
    "": {},
    "c": dict(stem_type="deep"),
    "d": dict(stem_type="deep", avg_down=True),
    "s": dict(stem_type="deep", stem_width=64),
    "l": dict(avg_down=True),
}
_RESNETS = {
    "resnet18d": ((2, 2, 2, 2), "d", None, "basic"),
    "resnet34d": ((3, 4, 6, 3), "d", None, "basic"),
    "resnet26": ((2, 2, 2, 2), "", None),
    "resnet26d": ((2, 2, 2, 2), "d", None),
    "resnet200": (_R200, "", None),
    "resnet200d": (_R200, "d", None),
    "seresnet50": (_R50, "", "se"),
    "seresnet101": (_R101, "", "se"),
    "seresnet152": (_R152, "", "se"),
    "seresnet152d": (_R152, "d", "se"),
    "seresnet200d": (_R200, "d", "se"),
    "seresnet269d": ((3, 30, 48, 8), "d", "se"),
    "ecaresnetlight": ((1, 1, 11, 3), "l", "eca"),
    "ecaresnet50d": (_R50, "d", "eca"),
    "ecaresnet101d": (_R101, "d", "eca"),
    "ecaresnet200d": (_R200, "d", "eca"),
    "ecaresnet269d": ((3, 30, 48, 8), "d", "eca"),
}
for _depth, _layers in (("50", _R50), ("101", _R101), ("152", _R152)):
    for _v in ("", "c", "d", "s"):
        _RESNETS[f"resnet{_depth}{_v}"] = (_layers, _v, None)
for _name, (_layers, _v, _attn, *_block) in _RESNETS.items():
    _kind = _block[0] if _block else "bottleneck"
    register_model(_name, "resnet", block=_kind, layers=_layers, attn_layer=_attn, **_VARIANTS[_v])
_RESNEXTS = {  # name -> (layers, variant, attention, cardinality, base width)
    "resnext50_32x4d": (_R50, "", None, 32, 4),
    "resnext50d_32x4d": (_R50, "d", None, 32, 4),
    "resnext101_32x4d": (_R101, "", None, 32, 4),
    "resnext101_32x8d": (_R101, "", None, 32, 8),
    "resnext101_32x16d": (_R101, "", None, 32, 16),
    "resnext101_32x32d": (_R101, "", None, 32, 32),
    "resnext101_64x4d": (_R101, "", None, 64, 4),
    "seresnext26d_32x4d": ((2, 2, 2, 2), "d", "se", 32, 4),
    "seresnext50_32x4d": (_R50, "", "se", 32, 4),
    "seresnext101_32x4d": (_R101, "", "se", 32, 4),
    "seresnext101_32x8d": (_R101, "", "se", 32, 8),
    "seresnext101_64x4d": (_R101, "", "se", 64, 4),
    "seresnext101d_32x8d": (_R101, "d", "se", 32, 8),
    "wide_resnet50_2": (_R50, "", None, 1, 128),
    "wide_resnet101_2": (_R101, "", None, 1, 128),
}
for _name, (_layers, _v, _attn, _card, _bw) in _RESNEXTS.items():
    _args = dict(layers=_layers, attn_layer=_attn, cardinality=_card, base_width=_bw)
    register_model(_name, "resnet", block="bottleneck", **_args, **_VARIANTS[_v])

# timm's ConvNeXt (V1, patch stem, LayerNorm)
_CONVNEXT_SMALL = (2, 2, 6, 2)
_CONVNEXTS = {
    "convnext_atto": dict(depths=_CONVNEXT_SMALL, dims=(40, 80, 160, 320), conv_mlp=True),
    "convnext_femto": dict(depths=_CONVNEXT_SMALL, dims=(48, 96, 192, 384), conv_mlp=True),
    "convnext_pico": dict(depths=_CONVNEXT_SMALL, dims=(64, 128, 256, 512), conv_mlp=True),
    "convnext_nano": dict(depths=(2, 2, 8, 2), dims=(80, 160, 320, 640), conv_mlp=True),
    "convnext_tiny": dict(depths=(3, 3, 9, 3), dims=(96, 192, 384, 768)),
    "convnext_tiny_hnf": dict(
        depths=(3, 3, 9, 3), dims=(96, 192, 384, 768), head_norm_first=True, conv_mlp=True
    ),
    "convnext_small": dict(depths=(3, 3, 27, 3), dims=(96, 192, 384, 768)),
    "convnext_base": dict(depths=(3, 3, 27, 3), dims=(128, 256, 512, 1024)),
    "convnext_large": dict(depths=(3, 3, 27, 3), dims=(192, 384, 768, 1536)),
    "convnext_large_mlp": dict(
        depths=(3, 3, 27, 3), dims=(192, 384, 768, 1536), head_hidden_size=1536
    ),
    "convnext_xlarge": dict(depths=(3, 3, 27, 3), dims=(256, 512, 1024, 2048)),
    "convnext_xxlarge": dict(depths=(3, 4, 30, 3), dims=(384, 768, 1536, 3072), norm_eps=1e-5),
}
for _name, _args in _CONVNEXTS.items():
    register_model(_name, "convnext", **_args)

# timm's ViTamin: a ViT on a conv stem, GeGLU MLPs, average pooling, no class token;
# size -> stem width, conv stage widths, ViT width, depth, heads (large2: large's
# architecture, other weights; xlarge: no position embedding)
_VITAMINS = {
    "small": (64, (64, 128), 384, 14, 6),
    "base": (128, (128, 256), 768, 14, 12),
    "large": (160, (160, 320), 1024, 31, 16),
    "large2": (160, (160, 320), 1024, 31, 16),
    "xlarge": (192, (192, 384), 1152, 32, 16),
}
_VITAMIN_SIZES = {"small": (224,), "base": (224,), "xlarge": (256, 336, 384)}
for _size, (_stem, _dims, _width, _depth, _heads) in _VITAMINS.items():
    for _img in _VITAMIN_SIZES.get(_size, (224, 256, 336, 384)):
        _args = dict(stem_width=_stem, conv_dims=_dims, embed_dim=_width, depth=_depth)
        _pos = "none" if _size == "xlarge" else "learn"
        register_model(
            f"vitamin_{_size}_{_img}", "vitamin", img_size=_img, num_heads=_heads,
            pos_embed=_pos, **_args,
        )  # fmt: skip


# timm's FastViT (RepMixer stages, then attention stages with a conditional position
# encoding: "sa" / "ma") and MobileCLIP's MCi image encoders (Squeeze-Excite downsampling,
# a GELU after the large-kernel conv; MCi3 / MCi4: 5 stages, LayerNorm2d attention, no
# scale branches in the stem)
def _fastvit(
    layers: tuple[int, ...],
    dims: tuple[int, ...],
    mlp_ratio: float,
    attention_stages: int = 0,
    **args: Any,
) -> dict[str, Any]:
    """FastVitConfig fields: RepMixer stages, then ``attention_stages`` (each with a 7x7
    conditional position encoding)."""
    n = len(layers)
    mixers = ("repmixer",) * (n - attention_stages) + ("attention",) * attention_stages
    pos_embs = (None,) * (n - attention_stages) + (7,) * attention_stages
    return dict(layers=layers, embed_dims=dims, mlp_ratios=(float(mlp_ratio),) * n,
                token_mixers=mixers, pos_embs=pos_embs, **args)  # fmt: skip


_FV_DIMS = (64, 128, 256, 512)
_MCI = dict(se_downsamples=(False, False, True, True), lkc_use_act=True)
_MCI_L = dict(downsamples=(False, True, True, True, True), se_downsamples=(False,) * 5,
              lkc_use_act=True, norm_layer="layernorm2d", stem_use_scale_branch=False)  # fmt: skip
_FASTVITS = {
    "fastvit_t8": _fastvit((2, 2, 4, 2), (48, 96, 192, 384), 3),
    "fastvit_t12": _fastvit((2, 2, 6, 2), _FV_DIMS, 3),
    "fastvit_s12": _fastvit((2, 2, 6, 2), _FV_DIMS, 4),
    "fastvit_sa12": _fastvit((2, 2, 6, 2), _FV_DIMS, 4, 1),
    "fastvit_sa24": _fastvit((4, 4, 12, 4), _FV_DIMS, 4, 1),
    "fastvit_sa36": _fastvit((6, 6, 18, 6), _FV_DIMS, 4, 1),
    "fastvit_ma36": _fastvit((6, 6, 18, 6), (76, 152, 304, 608), 4, 1),
    "fastvit_mci0": _fastvit((2, 6, 10, 2), _FV_DIMS, 3, 1, **_MCI),
    "fastvit_mci1": _fastvit((4, 12, 20, 4), _FV_DIMS, 3, 1, **_MCI),
    "fastvit_mci2": _fastvit((4, 12, 24, 4), (80, 160, 320, 640), 3, 1, **_MCI),
    "fastvit_mci3": _fastvit((2, 12, 24, 4, 2), (96, 192, 384, 768, 1536), 4, 2, **_MCI_L),
    "fastvit_mci4": _fastvit((2, 12, 24, 4, 4), (128, 256, 512, 1024, 2048), 4, 2, **_MCI_L),
}
for _name, _args in _FASTVITS.items():
    register_model(_name, "fastvit", **_args)
# MobileCLIP-B's image encoder: a ViT-B/16 on the MCi conv stem (the config's defaults)
register_model("vit_base_mci_224", "vit_mci")

for _attn in ("se", "eca", "cbam", "coord"):
    register_model(f"resnet18_{_attn}", "resnet", timm_weights=False, attn_layer=_attn)
    register_model(
        f"resnet34_{_attn}", "resnet", timm_weights=False, layers=(3, 4, 6, 3), attn_layer=_attn
    )


# --- lookup ----------------------------------------------------------------------------
def _spec(arch: str) -> ModelSpec:
    if arch not in _MODELS:
        refused = read_table().get("unsupported", {}).get(arch)
        if refused:
            raise ValueError(f"timm's {arch!r} is not built by attn_vision: it has "
                             f"{', '.join(refused)}")  # fmt: skip
        close = difflib.get_close_matches(arch, list(_MODELS), n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ValueError(
            f"unknown model {arch!r}{hint} (see attn_vision.list_models(); or pass a folder "
            "written by save_pretrained)"
        )
    return _MODELS[arch]


def list_models(pattern: str | None = None, pretrained: bool = False) -> list[str]:
    """Sorted preset names matching the glob ``pattern`` (None: all).

    ``pretrained=True`` lists ``arch.tag`` for every tag timm has Hub weights for instead.
    """
    pattern = pattern or "*"
    names = sorted(n for n in _MODELS if fnmatch.fnmatch(n, pattern.partition(".")[0]))
    if not pretrained:
        return names
    tagged = (f"{n}.{t}" for n in names if _MODELS[n].timm_weights for t in pretrained_tags(n))
    return sorted(t for t in tagged if fnmatch.fnmatch(t, pattern))


def _data_cfg(timm_cfg: dict[str, Any] | None, config: Any) -> dict[str, Any]:
    """The model's ``pretrained_cfg`` (timm's, with input size / classes of *this* model)."""
    cfg = dict(timm_cfg or {})
    for key, value in DEFAULT_DATA_CFG.items():
        cfg.setdefault(key, value)
    h, w = cfg["input_size"][1:]
    # (a transformers processor's size is its own: DINOv2 crops 224 px for a 518 px grid)
    if hasattr(config, "img_size") and not cfg.get("processor_size"):
        img = config.img_size
        h, w = (img, img) if isinstance(img, int) else tuple(img)
    cfg["input_size"] = (config.in_chans, h, w)
    cfg["num_classes"] = config.num_classes
    return cfg


def get_model_config(name: str, **overrides: Any) -> Any:
    """The config dataclass ``create_model(name, **overrides)`` would build."""
    return _resolve(name, overrides)[1]


def get_model_spec(name: str) -> ModelSpec:
    """The preset behind ``name`` (``arch`` or ``arch.tag``); ValueError if there is none."""
    return _spec(name.partition(".")[0])


def timm_model_config(
    name: str, timm_kwargs: dict[str, Any] | None = None, **overrides: Any
) -> Any:
    """The config ``timm.create_model(name, **timm_kwargs)`` builds, as ours, then
    ``overrides`` (our field names): the preset's, with timm's keyword arguments
    (``depth``, ``act_layer``, ``use_rot_pos_emb``, ``kernel_sizes``, ...) translated by
    :mod:`attn_vision.timm_args`. Raises ``ValueError`` naming each argument we cannot
    build (and for Swin / ResNet presets, whose timm arguments are not translated)."""
    spec = get_model_spec(name)
    args: dict[str, Any] = {}
    if timm_kwargs:
        translate = _TRANSLATORS.get(spec.timm_module)
        if translate is None:
            raise ValueError(
                f"timm keyword arguments of {name!r} ({spec.family}) are not translated; only "
                f"those of the {sorted(_TRANSLATORS)} presets"
            )
        args, unsupported = translate(timm_kwargs, get_model_config(name))
        if unsupported:
            raise ValueError(f"timm {name!r} with {', '.join(unsupported)}")
    return get_model_config(name, **{**args, **overrides})


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
    return spec, make_config(config_cls, args), timm_cfg


# --- create / save / load ----------------------------------------------------------------
def create_model(
    name_or_path: str | os.PathLike,
    pretrained: bool | str | os.PathLike | None = None,
    *,
    cache_dir: str | os.PathLike | None = None,
    local_files_only: bool = False,
    **overrides: Any,
) -> nn.Module:
    """Build a preset or a saved folder, optionally with weights; returned in eval mode.

    Args:
        name_or_path: a name from :func:`list_models` (``arch`` or ``arch.tag``), a
            folder written by :func:`save_pretrained` or by transformers' ``save_pretrained``
            (:mod:`attn_vision.hf`: ViT, DeiT, DINOv2, ...), or ``"hf-hub:<repo id>"`` of
            either (downloaded once into the hub cache).
        pretrained: ``None`` / ``False``: random init. ``True``: timm's weights for the
            name's tag (timm's default tag for a bare ``arch``), from the Hugging Face Hub
            cache or downloaded. A pretrained tag of the arch (``"augreg_in21k"``): that
            tag's weights. A path to a timm-format ``.safetensors`` / ``.bin`` file (or a
            folder holding ``model.safetensors`` / ``pytorch_model.bin``, sharded or not):
            those weights. A saved folder as ``name_or_path`` brings its own weights,
            loaded unless ``pretrained=False``.
        cache_dir: Hub cache directory (default: huggingface_hub's).
        local_files_only: never use the network (the file must be in the cache).
        **overrides: config fields, e.g. ``num_classes=10``, ``img_size=384``, ``depth=2``;
            unknown ones raise ``ValueError`` naming them.

    ``model.pretrained_cfg`` holds the preprocessing settings that
    :func:`attn_vision.create_transform` uses. Call ``.train()`` to train.
    """
    if isinstance(name_or_path, str) and name_or_path.startswith(HF_HUB_PREFIX):
        folder = _hub_folder(name_or_path[len(HF_HUB_PREFIX) :], cache_dir, local_files_only)
        return _load_folder(folder, pretrained, overrides).eval()
    folder = _saved_folder(name_or_path)
    if folder is not None:
        return _load_folder(folder, pretrained, overrides).eval()
    name = str(name_or_path)
    arch, _, tag = name.partition(".")
    if isinstance(pretrained, str) and pretrained in pretrained_tags(arch, with_weights=False):
        if tag and tag != pretrained:
            raise ValueError(f"{name!r} names tag {tag!r} but pretrained={pretrained!r}")
        name, pretrained = f"{arch}.{pretrained}", True
    spec, config, timm_cfg = _resolve(name, overrides)
    _, model_cls, converter = FAMILIES[spec.family]
    loading = pretrained is not False and pretrained is not None
    model = model_cls(config, weight_init=not loading)
    model.pretrained_cfg = _data_cfg(timm_cfg, config)
    model.pretrained_cfg["architecture"] = arch
    if loading:
        if pretrained is True:
            if not spec.timm_weights:
                raise ValueError(
                    f"{name!r} has no published weights; pass pretrained=<path> to load your own"
                )
            loc = resolve_pretrained(name)
            path = hub.download(
                loc.repo_id,
                loc.filenames,
                revision=loc.revision,
                cache_dir=cache_dir,
                local_files_only=local_files_only,
            )
        else:
            path = _weights_file(pretrained, arch)
        state_dict = converter(hub.read_state_dict(path), config)
        hub.load_state_dict(model, state_dict, source=str(path))
    return model.eval()


def _hub_folder(repo_id: str, cache_dir: str | os.PathLike | None, local_files_only: bool) -> Path:
    """The hub snapshot folder of ``repo_id`` holding its ``config.json``, weights (one
    file, or an ``*.index.json`` and its shards) and (if the repo has one)
    ``preprocessor_config.json``: cached, else downloaded."""
    kwargs: dict[str, Any] = dict(cache_dir=cache_dir, local_files_only=local_files_only)
    config = hub.download(repo_id, CONFIG_NAME, **kwargs)
    index_names = tuple(f"{name}.index.json" for name in HF_WEIGHTS)
    weights = hub.download(repo_id, HF_WEIGHTS + index_names, **kwargs)
    if weights.name in index_names:  # sharded: each shard (read_sharded checks the names)
        try:
            shards = set(json.loads(weights.read_text(encoding="utf-8"))["weight_map"].values())
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise hub.CheckpointError(f"cannot read the shard index {weights}: {e}") from None
        for shard in sorted(shards):
            if not isinstance(shard, str) or ".." in Path(shard).parts or Path(shard).is_absolute():
                raise hub.UnsafeCheckpointError(f"refusing shard {shard!r} named by {weights}")
            hub.download(repo_id, shard, **kwargs)
    try:
        hub.download(repo_id, PREPROCESSOR_CONFIG, **kwargs)
    except hub.WeightsUnavailableError:
        pass  # optional: without it, the default preprocessing
    return config.parent


def _weights_file(pretrained: str | os.PathLike, arch: str) -> Path:
    """``pretrained`` as a file or folder of weights; else WeightsUnavailableError (with tags)."""
    path = Path(pretrained)
    if not path.exists():
        tags = pretrained_tags(arch)
        hint = f"a pretrained tag of {arch!r} ({', '.join(tags)}) nor " if tags else ""
        raise hub.WeightsUnavailableError(
            f"pretrained={str(pretrained)!r} is neither {hint}a checkpoint file or folder"
        )
    return path


def _saved_folder(name_or_path: str | os.PathLike) -> Path | None:
    """``name_or_path`` as a save_pretrained folder, or None for a preset name."""
    if isinstance(name_or_path, str) and name_or_path.partition(".")[0] in _MODELS:
        return None
    path = Path(name_or_path)
    if path.is_dir():
        if not (path / CONFIG_NAME).is_file():
            raise hub.WeightsUnavailableError(
                f"{path} has no {CONFIG_NAME}: not a folder written by save_pretrained"
            )
        return path
    if isinstance(name_or_path, os.PathLike):
        raise hub.WeightsUnavailableError(f"no such folder: {path}")
    return None  # an unknown name: _spec says so


def _family(model: nn.Module) -> str:
    classes = {model_cls: family for family, (_, model_cls, _) in FAMILIES.items()}
    for cls in type(model).__mro__:  # the most specific: a Vitamin is a VisionTransformer too
        if cls in classes:
            return classes[cls]
    raise TypeError(f"save_pretrained takes an attn_vision model, got {type(model).__name__}")


def save_pretrained(model: nn.Module, directory: str | os.PathLike) -> Path:
    """Write ``config.json`` + ``model.safetensors`` to ``directory``; returns the folder.

    Each file is replaced atomically. ``create_model(directory)`` loads it back exactly.
    """
    family = _family(model)
    pretrained_cfg = dict(getattr(model, "pretrained_cfg", None) or _data_cfg(None, model.config))
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    hub.save_state_dict(model.state_dict(), directory / WEIGHTS_NAME, metadata={"format": "pt"})
    config = {
        "architecture": pretrained_cfg.get("architecture"),
        "family": family,
        "model_args": dataclasses.asdict(model.config),
        "pretrained_cfg": pretrained_cfg,
    }
    hub.write_json(directory / CONFIG_NAME, config)
    return directory


def read_config(path: str | os.PathLike) -> dict[str, Any]:
    """A save_pretrained ``config.json``, checked strictly (a ``CheckpointError`` names any
    unknown or missing key, an unknown family or config field); a transformers
    ``config.json`` (a ``model_type``, no ``family``) as it is, for :mod:`attn_vision.hf`."""
    path = Path(path)
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise hub.CheckpointError(f"cannot read {path}: {e}") from None
    if not isinstance(cfg, dict):
        raise hub.CheckpointError(f"{path} must hold a JSON object, got {type(cfg).__name__}")
    if is_hf_config(cfg) and "family" not in cfg:
        return cfg  # transformers' (read by attn_vision.hf)
    unknown = sorted(set(cfg) - set(CONFIG_KEYS))
    missing = [k for k in CONFIG_KEYS if k not in cfg]
    if unknown or missing:
        raise hub.CheckpointError(
            f"{path}: unknown key(s) {unknown}, missing key(s) {missing}; "
            f"expected exactly {list(CONFIG_KEYS)}"
        )
    if cfg["family"] not in FAMILIES:
        raise hub.CheckpointError(
            f"{path}: unknown family {cfg['family']!r}; expected one of {sorted(FAMILIES)}"
        )
    if cfg["architecture"] is not None and not isinstance(cfg["architecture"], str):
        raise hub.CheckpointError(f"{path}: architecture must be a string or null")
    for key in ("model_args", "pretrained_cfg"):
        if not isinstance(cfg[key], dict):
            raise hub.CheckpointError(f"{path}: {key} must be a JSON object")
    try:
        make_config(FAMILIES[cfg["family"]][0], _tuples(cfg["model_args"]))
    except (TypeError, ValueError) as e:
        raise hub.CheckpointError(f"{path}: model_args: {e}") from None
    return cfg


def _load_folder(
    folder: Path, pretrained: bool | str | os.PathLike | None, overrides: dict[str, Any]
) -> nn.Module:
    if pretrained not in (None, True, False):
        raise ValueError(
            f"{folder} brings its own weights: pass pretrained=None (load them) or False "
            f"(random init), not {pretrained!r}"
        )
    cfg = read_config(folder / CONFIG_NAME)
    if is_hf_config(cfg):
        return _load_hf_folder(folder, cfg, pretrained is not False, overrides)
    config_cls, model_cls, converter = FAMILIES[cfg["family"]]
    config = make_config(config_cls, {**_tuples(cfg["model_args"]), **overrides})
    loading = pretrained is not False
    model = model_cls(config, weight_init=not loading)
    model.pretrained_cfg = _data_cfg(_tuples(cfg["pretrained_cfg"]), config)
    if loading:
        state_dict = converter(hub.read_folder(folder, (WEIGHTS_NAME,)), config)
        hub.load_state_dict(model, state_dict, source=str(folder / WEIGHTS_NAME))
    return model


def _load_hf_folder(
    folder: Path, hf_cfg: dict[str, Any], loading: bool, overrides: dict[str, Any]
) -> nn.Module:
    """A transformers ``save_pretrained`` folder: the model its ``config.json`` describes
    (:mod:`attn_vision.hf`), its weights converted, ``id2label`` as the class names and
    ``preprocessor_config.json`` as the preprocessing (``pretrained_cfg``)."""
    module = hf_module(hf_cfg)
    state_dict = hub.read_folder(folder, HF_WEIGHTS)
    family, config = module.config_from_hf(hf_cfg, state_dict.keys())
    config_cls, model_cls, converter = FAMILIES[family]
    if overrides:
        config = make_config(config_cls, {**dataclasses.asdict(config), **overrides})
    model = model_cls(config, weight_init=not loading)
    preprocessor = read_preprocessor_config(folder)
    model.pretrained_cfg = _data_cfg(data_config(preprocessor, config), config)
    model.pretrained_cfg["architecture"] = None
    labels = hf_cfg.get("id2label") or {}
    if config.num_classes and len(labels) == config.num_classes:
        model.pretrained_cfg["label_names"] = tuple(str(labels[k]) for k in sorted(labels, key=int))
    if loading:
        converted = module.convert_hf(state_dict, hf_cfg)  # for the folder's own config
        if "img_size" in overrides:  # another size: the family's fix (pos_embed resampled)
            converted = converter(converted, config)
        hub.load_state_dict(model, converted, source=str(folder))
    return model
