"""open_clip's MobileCLIP / MobileCLIP2 image towers (``vision_cfg.timm_model_name``
``fastvit_mci0`` ... ``fastvit_mci4``, ``vit_base_mci_224``) <-> :class:`CLIPVisionConfig`
fields (the towers themselves: :mod:`attn_clip.mobileclip`).

:func:`attn_clip.config_timm.timm_vision_config` hands these timm names here. The tower is
attn_vision's preset of that name with the config's ``timm_model_args`` (timm's keyword
arguments, translated by attn_vision: ``layers``, ``embed_dims``, ``depth``, ...;
attn_clip's extension, as for every timm tower), pooled by ``timm_pool`` and projected by
timm's own classifier (``timm_proj`` None) or not at all (``"none"``). One key there is
attn_clip's alone: ``inference_mode`` (true: the tower is saved folded, see
:func:`attn_clip.mobileclip.reparameterize`; it is timm's FastVit keyword of that name,
whose layout attn_clip's folded one extends, and the MCi ViT's stem folding).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from attn_vision.patch_embed import to_2tuple
from attn_vision.registry import ModelSpec, get_model_spec, timm_model_config
from attn_vision.timm_args import timm_kwargs

from .mobileclip import FASTVIT_FIELDS, MCI_FIELDS
from .tower_config import CLIPVisionConfig

__all__ = ["MOBILECLIP_FAMILIES", "mobileclip_timm_args", "mobileclip_vision_config"]

MOBILECLIP_FAMILIES = ("fastvit", "vit_mci")  # attn_vision families of these timm towers
# timm's training-only keyword arguments (dropout, stochastic depth): no effect on inference
_TRAINING_ARGS = ("drop_rate", "proj_drop_rate", "drop_path_rate", "pos_drop_rate",
                  "attn_drop_rate")  # fmt: skip
# keyword arguments open_clip passes to timm itself: a timm_model_args entry would clash
_OPEN_CLIP_ARGS = ("num_classes", "global_pool", "pretrained")
# FastVitConfig fields timm takes under the same name (and mlp_ratios)
_FASTVIT_TIMM = ("layers", "embed_dims", "mlp_ratios", "token_mixers", "downsamples",
                 "se_downsamples", "repmixer_kernel_size", "down_patch_size", "down_stride",
                 "layer_scale_init_value", "lkc_use_act", "stem_use_scale_branch", "cls_ratio",
                 "inference_mode")  # fmt: skip
# MciViTConfig fields a CLIP tower holds (the ViT fields, image size, head, stem), or that
# do not change inference; all its others must be the preset's
_MCI_HELD = ("img_size", "patch_size", "num_classes", "global_pool", "embed_dim", "depth",
             "num_heads", "mlp_ratio", "qkv_bias", "class_token", "pre_norm", "fc_norm",
             "norm_eps", "act", "init_values", "dynamic_img_size", *_TRAINING_ARGS,
             *MCI_FIELDS)  # fmt: skip
_MCI_POOLS = {"token": "tok", "avg": "avg"}


def _proj_type(proj: Any, proj_bias: bool, bad: list[str]) -> str:
    """open_clip's ``timm_proj`` of these towers: None (timm's classifier) or ``"none"``."""
    if proj not in (None, "none") or proj_bias:
        bad.append(f"timm_proj={proj!r}, timm_proj_bias={proj_bias!r} (expected None: timm's "
                   "head, or 'none')")  # fmt: skip
    return "none" if proj == "none" else "head"


def _args(args: dict[str, Any], bad: list[str]) -> dict[str, Any]:
    """``timm_model_args`` less the training-only ones; those open_clip sets itself refused."""
    bad += [f"timm_model_args.{k} (open_clip passes it to timm itself)" for k in args
            if k in _OPEN_CLIP_ARGS]  # fmt: skip
    return {k: v for k, v in args.items() if k not in (*_TRAINING_ARGS, *_OPEN_CLIP_ARGS)}


def mobileclip_vision_config(
    name: str, spec: ModelSpec, args: dict, image_size: Any, pool: str, proj: Any, proj_bias: bool
) -> CLIPVisionConfig:
    """The :class:`CLIPVisionConfig` of open_clip's timm tower ``name`` (a FastViT / MCi or
    the MCi ViT preset ``spec``) built with timm keyword arguments ``args``, pooled by
    ``timm_pool`` ``pool``, projected per ``timm_proj`` ``proj``; ``ValueError`` naming each
    argument that cannot be built."""
    bad: list[str] = []
    proj_type = _proj_type(proj, proj_bias, bad)
    args = _args(args, bad)
    if spec.family == "fastvit":
        if pool != "avg":
            bad.append(f"timm_pool={pool!r} (expected 'avg')")
        c = timm_model_config(name, args)  # ValueError naming the arguments it cannot build
        if c.in_chans != 3:
            bad.append(f"in_chans={c.in_chans!r}")
        if bad:
            raise ValueError(f"timm FastViT {name!r} with {', '.join(bad)}")
        return CLIPVisionConfig(
            image_size=image_size,  # (no position embedding: any size)
            pool_type="avg",
            proj_type=proj_type,
            timm_model_name=name,
            fastvit={k: getattr(c, k) for k in FASTVIT_FIELDS},
        )
    if spec.family != "vit_mci":
        raise ValueError(f"an attn_vision {spec.family} preset, not a FastViT or MCi ViT")
    if pool not in _MCI_POOLS:
        bad.append(f"timm_pool={pool!r} (expected one of {list(_MCI_POOLS)})")
    folded = bool(args.pop("inference_mode", False))  # (attn_clip's key: timm's ViT has none)
    c = timm_model_config(name, {**args, "global_pool": pool if pool in _MCI_POOLS else "token"})
    preset = timm_model_config(name, {"global_pool": c.global_pool})
    fixed = [f.name for f in dataclasses.fields(c) if f.name not in _MCI_HELD]
    bad += [f"{k}={getattr(c, k)!r}" for k in fixed if getattr(c, k) != getattr(preset, k)]
    if to_2tuple(c.img_size) != to_2tuple(image_size):
        bad.append(f"img_size={to_2tuple(c.img_size)!r} (vision_cfg.image_size is "
                   f"{image_size!r})")  # fmt: skip
    if bad:
        raise ValueError(f"timm MCi ViT {name!r} with {', '.join(bad)}")
    pool_type = _MCI_POOLS[c.global_pool]
    return CLIPVisionConfig(
        image_size=image_size,
        patch_size=c.patch_size,
        width=c.embed_dim,
        layers=c.depth,
        head_width=c.embed_dim // c.num_heads,
        mlp_ratio=c.mlp_ratio,
        ls_init_value=c.init_values,
        no_ln_pre=not c.pre_norm,
        pool_type=pool_type,
        final_ln_after_pool=(pool_type == "avg") if c.fc_norm is None else bool(c.fc_norm),
        act=c.act,
        norm_eps=c.norm_eps,
        class_token=c.class_token,
        qkv_bias=c.qkv_bias,
        proj_type=proj_type,
        timm_model_name=name,
        mci={"stem_width": c.stem_width, "inference_mode": folded},
    )


def _json(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def mobileclip_timm_args(v: CLIPVisionConfig) -> dict[str, Any]:
    """The ``timm_model_args`` that make open_clip's timm tower ``v.timm_model_name`` tower
    ``v`` (inverse of :func:`mobileclip_vision_config`; empty when it is the preset), JSON
    values; ``ValueError`` naming what timm's keyword arguments cannot say."""
    name = v.timm_model_name
    pool = "avg" if v.fastvit is not None else {"tok": "token", "avg": "avg"}[v.pool_type]
    proj = None if v.proj_type == "head" else v.proj_type
    if v.fastvit is not None:
        base = timm_model_config(name)
        diff = {k: x for k, x in v.fastvit.items() if x != getattr(base, k)}
        bad = [k for k in diff if k not in _FASTVIT_TIMM]
        if bad:
            raise ValueError(f"FastViT tower {name!r}: no timm keyword argument sets "
                             f"{', '.join(bad)}")  # fmt: skip
        args = {k: _json(x) for k, x in diff.items()}
    else:
        base = timm_model_config(name, {"global_pool": pool})
        trunk = dict(
            embed_dim=v.width, depth=v.layers, num_heads=v.heads, mlp_ratio=v.mlp_ratio,
            init_values=v.ls_init_value, pre_norm=not v.no_ln_pre, act=v.act,
            norm_eps=v.norm_eps, class_token=v.class_token, qkv_bias=v.qkv_bias,
            img_size=to_2tuple(v.image_size),
        )  # fmt: skip
        if v.final_ln_after_pool != (v.pool_type == "avg"):
            trunk["fc_norm"] = v.final_ln_after_pool
        if v.mci["stem_width"] != base.stem_width:
            raise ValueError(f"MCi ViT tower {name!r}: no timm keyword argument sets stem_width")
        changed = {k: x for k, x in trunk.items() if x != getattr(base, k)}
        if to_2tuple(base.img_size) == to_2tuple(v.image_size):
            changed.pop("img_size", None)
        args = timm_kwargs("vision_transformer", dataclasses.replace(base, **changed), base)
        if v.mci["inference_mode"]:
            args["inference_mode"] = True
    back = mobileclip_vision_config(
        name, get_model_spec(name), dict(args), v.image_size, pool, proj, v.proj_bias
    )
    if back != v:
        raise ValueError(f"vision tower {name!r} is not timm's {name} with any timm keyword "
                         f"arguments (tried {args})")  # fmt: skip
    return args
