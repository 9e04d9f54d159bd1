"""open_clip's timm image towers (``vision_cfg.timm_model_name``) as attn_vision presets.

open_clip builds such a tower with ``timm.create_model(timm_model_name, ...)``; attn_clip
builds the same from attn_vision's config of that name
(:func:`attn_vision.registry.timm_model_config`, which also translates the tower's
``timm_model_args``), so there is one translation of timm's arguments: attn_vision's.
What open_clip adds is read here: the pooling (``timm_pool``), the projection
(``timm_proj``) and the image size the tower is fed. With ``timm_proj`` None or ``"none"``
open_clip's ``TimmModel`` builds ``timm.create_model(name, num_classes=embed_dim or 0,
global_pool=timm_pool)``: timm's classifier ``head`` is the projection (EVA:
``proj_type="head"``) or there is none (SigLIP's MAP head output); with ``"linear"`` /
``"mlp"`` it resets the classifier (to ``global_pool=timm_pool`` when set, else the
trunk's own pooling) and adds its own head. A preset field no CLIP tower has (register
tokens, a bias-free qkv, ...) is refused by name.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from attn_vision.patch_embed import to_2tuple
from attn_vision.pretrained import read_table
from attn_vision.registry import ModelSpec, get_model_spec, list_models, timm_model_config
from attn_vision.timm_args import timm_kwargs

from .config_mobileclip import MOBILECLIP_FAMILIES, mobileclip_timm_args, mobileclip_vision_config
from .tower_config import (
    CONVNEXT_FIELDS,
    EVA_FIELDS,
    EVA_LAYOUT,
    SWIN_FIELDS,
    VITAMIN_FIELDS,
    CLIPVisionConfig,
)

__all__ = ["timm_vision_cfg", "timm_vision_config"]

_POOLS = {"token": "tok", "avg": "avg", "map": "map"}  # timm's global_pool -> pool_type
# attn_vision ViTConfig fields a CLIP tower builds only at their default
_VIT_FIXED = ("in_chans", "proj_bias", "dist_token", "reg_tokens", "no_embed_class",
              "final_norm")  # fmt: skip
# the Eva fields (EVA_FIELDS): a timm VisionTransformer tower has them at their defaults
_EVA_ONLY = tuple(k for k in EVA_FIELDS if k not in (*EVA_LAYOUT, "mlp_gate_last"))
_EVA_FIXED = _VIT_FIXED
# ConvNeXtConfig fields an open_clip ConvNeXt tower builds only at their default (its head
# reads the dims[-1] pooled features: no pre-logits head_hidden_size)
_CONVNEXT_FIXED = ("in_chans", "mlp_ratio", "head_hidden_size")
_SWIN_FIXED = ("in_chans",)  # (its global_pool: the trunk's average, checked below)


@functools.cache
def _presets() -> frozenset[str]:
    return frozenset(list_models())


def _preset(name: str) -> ModelSpec:
    """attn_vision's preset of timm name ``name``; ``ValueError`` saying why there is none."""
    if name not in _presets():
        refused = read_table().get("unsupported", {}).get(name)
        if refused:
            raise ValueError(f"timm {name!r} with {', '.join(refused)}: not an attn_vision preset")
        raise ValueError("not an attn_vision ViT, Eva, ViTamin, ConvNeXt, Swin, FastViT or MCi "
                         "ViT preset")  # fmt: skip
    return get_model_spec(name)


def _changed(config: Any, names: tuple[str, ...]) -> list[str]:
    """``field=value`` for each of ``names`` that is not at its dataclass default."""
    defaults = {f.name: f.default for f in dataclasses.fields(config)}
    return [f"{k}={getattr(config, k)!r}" for k in names if getattr(config, k) != defaults[k]]


def _image_size(config: Any, image_size: Any) -> list[str]:
    if to_2tuple(config.img_size) == to_2tuple(image_size):
        return []
    return [f"img_size={to_2tuple(config.img_size)!r} (vision_cfg.image_size is {image_size!r})"]


def _vit_fields(c: Any, image_size: Any) -> dict[str, Any]:
    """The CLIPVisionConfig fields of an attn_vision ViTConfig (or VitaminConfig)."""
    pool = _POOLS[c.global_pool]
    return dict(
        image_size=image_size,
        patch_size=c.patch_size,
        width=c.embed_dim,
        layers=c.depth,
        head_width=c.embed_dim // c.num_heads,
        mlp_ratio=c.mlp_ratio,
        ls_init_value=c.init_values,
        no_ln_pre=not c.pre_norm,
        pool_type=pool,
        final_ln_after_pool=(pool == "avg") if c.fc_norm is None else bool(c.fc_norm),
        act=c.act,
        norm_eps=c.norm_eps,
        class_token=c.class_token,
        qkv_bias=c.qkv_bias,
        rel_pos_dim=c.rel_pos_dim if getattr(c, "rel_pos", "") else None,
    )


def timm_vision_config(
    name: str,
    args: dict[str, Any],
    image_size: Any,
    timm_pool: str = "avg",
    timm_proj: str | None = "linear",
    timm_proj_bias: bool = False,
) -> CLIPVisionConfig:
    """The :class:`CLIPVisionConfig` of open_clip's timm tower ``name`` built with timm
    keyword arguments ``args`` (``timm_model_args``: overriding the preset's, as
    ``timm.create_model`` does), pooled by ``timm_pool``, projected by ``timm_proj``.

    Raises ``ValueError`` naming each argument and field attn_clip cannot build.
    """
    spec = _preset(name)
    build = {
        "vit": _vit_tower,
        "vitamin": _vitamin_tower,
        "convnext": _convnext_tower,
        "swin": _swin_tower,
        **dict.fromkeys(MOBILECLIP_FAMILIES, mobileclip_vision_config),  # MobileCLIP's
    }.get(spec.family)
    if build is None:
        raise ValueError(f"an attn_vision {spec.family} preset, not a ViT, Eva, ViTamin, "
                         "ConvNeXt, Swin, FastViT or MCi ViT")  # fmt: skip
    return build(name, spec, args, image_size, timm_pool, timm_proj, bool(timm_proj_bias))


def _vit_tower(
    name: str, spec: ModelSpec, args: dict, image_size: Any, pool: str, proj: Any, proj_bias: bool
) -> CLIPVisionConfig:
    """timm ``VisionTransformer`` (SigLIP, ``vit_medium_patch16_gap_256``) or ``Eva``
    (EVA-CLIP, PE-Core): timm's own classifier as the projection (``timm_proj`` None) or
    none (``"none"``), pooled by ``timm_pool``; or open_clip's bias-free Linear
    (``"linear"``) over the trunk's own pooling (``timm_pool=""``) or ``timm_pool``'s."""
    eva = spec.timm_module == "eva"
    linear = proj == "linear" and not proj_bias
    pools = list(_POOLS)
    bad = []
    if pool not in pools and not (linear and pool == ""):
        bad.append(f"timm_pool={pool!r} (expected one of {pools}, or '' with "
                   "timm_proj='linear')")  # fmt: skip
    if proj not in (None, "none") and not linear:
        bad.append(f"timm_proj={proj!r}, timm_proj_bias={proj_bias!r} (expected None: timm's "
                   "head, 'none', or 'linear' without bias)")  # fmt: skip
    # open_clip passes timm_pool to timm.create_model (to reset_classifier with "linear")
    pool_args = {"global_pool": pool} if pool in pools else {}
    c = timm_model_config(name, {**args, **pool_args})
    fixed = _changed(c, _EVA_FIXED if eva else (*_VIT_FIXED, *_EVA_ONLY))
    if (c.pos_embed == "none") != (c.rel_pos == "mlp"):  # (timm's ViTs: one or the other)
        fixed.append(f"pos_embed={c.pos_embed!r} with rel_pos={c.rel_pos!r}")
    bad = fixed + _image_size(c, image_size) + bad
    if bad:
        raise ValueError(f"timm {'EVA' if eva else 'ViT'} {name!r} with {', '.join(bad)}")
    eva_fields = None
    if eva:
        eva_fields = {k: getattr(c, k) for k in EVA_FIELDS if k not in EVA_LAYOUT}
        eva_fields["mlp_gate_last"] = c.mlp_gate_last if c.act == "swiglu" else True
        for key in EVA_LAYOUT:  # (timm_model_args may choose another layout)
            eva_fields[key] = args.get(key, spec.layout_args.get(key, EVA_FIELDS[key]))
    return CLIPVisionConfig(
        **_vit_fields(c, image_size),
        patch_bias=(not c.pre_norm) if c.patch_bias is None else c.patch_bias,
        proj_type={None: "head", "none": "none"}.get(proj, "linear"),
        timm_model_name=name,
        eva=eva_fields,
    )


def _vitamin_tower(
    name: str, spec: ModelSpec, args: dict, image_size: Any, pool: str, proj: Any, proj_bias: bool
) -> CLIPVisionConfig:
    """timm ViTamin: the trunk's pooling (or ``timm_pool``), open_clip's bias-free Linear.

    A tower without position embedding (``vitamin_xlarge_*``) computes the same at any
    image size: built at ``image_size`` (open_clip's ``ViTamin-XL-384`` feeds its 384 px
    trunk 256 px images)."""
    bad = [] if pool in ("", "token", "avg") else [f"timm_pool={pool!r} (expected '', "
                                                    "'token' or 'avg')"]  # fmt: skip
    if proj not in ("linear", "none") or proj_bias:
        bad.append(f"timm_proj={proj!r}, timm_proj_bias={proj_bias!r} (expected 'linear' "
                   "without bias, or 'none')")  # fmt: skip
    c = timm_model_config(name, args, **({"global_pool": pool} if pool in ("token", "avg") else {}))
    bad = _changed(c, _VIT_FIXED) + bad
    if c.global_pool not in ("token", "avg"):
        bad.append(f"global_pool={c.global_pool!r} (expected 'token' or 'avg')")
    if c.pos_embed != "none":
        bad = _image_size(c, image_size) + bad
    if bad:
        raise ValueError(f"timm ViTamin {name!r} with {', '.join(bad)}")
    return CLIPVisionConfig(
        **_vit_fields(c, image_size),
        proj_type=proj,
        timm_model_name=name,
        vitamin={k: getattr(c, k) for k in VITAMIN_FIELDS},
    )


def _convnext_tower(
    name: str, spec: ModelSpec, args: dict, image_size: Any, pool: str, proj: Any, proj_bias: bool
) -> CLIPVisionConfig:
    """timm ConvNeXt: its own average pool + LayerNorm, then open_clip's Linear or MLP."""
    bad = [] if pool in ("", "avg") else [f"timm_pool={pool!r} (expected '' or 'avg')"]
    if proj not in ("linear", "mlp"):
        bad.append(f"timm_proj={proj!r} (expected 'linear' or 'mlp')")
    c = timm_model_config(name, args)
    bad = _changed(c, _CONVNEXT_FIXED) + bad
    if bad:
        raise ValueError(f"timm ConvNeXt {name!r} with {', '.join(bad)}")
    return CLIPVisionConfig(
        image_size=image_size,
        width=c.dims[-1],  # what the pooled, normalized features feed the projection
        pool_type="avg",
        proj_type=proj,
        proj_bias=proj_bias,
        timm_model_name=name,
        convnext={k: getattr(c, k) for k in CONVNEXT_FIELDS},
    )


def _swin_tower(
    name: str, spec: ModelSpec, args: dict, image_size: Any, pool: str, proj: Any, proj_bias: bool
) -> CLIPVisionConfig:
    """timm Swin: its final LayerNorm and average pool, then open_clip's Linear or MLP (as a
    ConvNeXt's). open_clip builds the trunk at the preset's image size (its shift masks are
    fixed): ``image_size`` must be that."""
    bad = [] if pool in ("", "avg") else [f"timm_pool={pool!r} (expected '' or 'avg')"]
    if proj not in ("linear", "mlp"):
        bad.append(f"timm_proj={proj!r} (expected 'linear' or 'mlp')")
    c = timm_model_config(name, args)
    bad = _changed(c, _SWIN_FIXED) + _image_size(c, image_size) + bad
    if c.global_pool != "avg":
        bad.append(f"global_pool={c.global_pool!r} (expected 'avg')")
    if bad:
        raise ValueError(f"timm Swin {name!r} with {', '.join(bad)}")
    return CLIPVisionConfig(
        image_size=image_size,
        pool_type="avg",
        proj_type=proj,
        proj_bias=proj_bias,
        timm_model_name=name,
        swin={k: getattr(c, k) for k in SWIN_FIELDS},
    )


# -- back to open_clip's vision_cfg ---------------------------------------------------------


def _trunk_changes(v: CLIPVisionConfig, base: Any) -> dict[str, Any]:
    """The attn_vision config fields of tower ``v``'s trunk that differ from ``base`` (its
    timm name's preset, pooled as ``v``)."""
    if v.convnext is not None:
        want = dict(v.convnext)
    elif v.swin is not None:
        want = dict(v.swin, img_size=to_2tuple(v.image_size))
    else:
        want = dict(
            img_size=to_2tuple(v.image_size),
            patch_size=v.patch_size,
            embed_dim=v.width,
            depth=v.layers,
            num_heads=v.heads,
            mlp_ratio=v.mlp_ratio,
            init_values=v.ls_init_value,
            pre_norm=not v.no_ln_pre,
            fc_norm=v.final_ln_after_pool,
            act=v.act,
            norm_eps=v.norm_eps,
            class_token=v.class_token,
            qkv_bias=v.qkv_bias,
            **{k: x for k, x in (v.eva or {}).items() if k not in EVA_LAYOUT},
            **(v.vitamin or {}),
        )
        if v.vitamin is None:
            want["patch_bias"] = v.patch_bias
            relpos = v.rel_pos_dim is not None  # (timm vit_relpos_*)
            want.update(rel_pos="mlp" if relpos else "", pos_embed="none" if relpos else "learn")
            if relpos:
                want["rel_pos_dim"] = v.rel_pos_dim
        if v.vitamin is not None and v.vitamin["pos_embed"] == "none":
            del want["img_size"]  # (no position embedding: any size)
        if v.act != "swiglu":
            want.pop("mlp_gate_last", None)
    have = _vit_fields(base, v.image_size) if v.tower == "vit" else {}
    out = {}
    for key, value in want.items():
        current = getattr(base, key)
        if key == "img_size":
            current = to_2tuple(current)
        elif key == "fc_norm":
            current = have["final_ln_after_pool"]
        elif key == "patch_bias" and current is None:
            current = not base.pre_norm
        if value != current:
            out[key] = value
    return out


def timm_vision_cfg(v: CLIPVisionConfig) -> dict[str, Any]:
    """open_clip's ``vision_cfg`` of a timm tower (inverse of :func:`timm_vision_config`),
    with ``timm_model_args`` when the tower is not exactly its timm name's architecture:
    the timm keyword arguments that differ (``ValueError`` if timm's arguments cannot say
    it)."""
    name = v.timm_model_name
    spec = _preset(name)
    if v.tower in ("convnext", "swin"):
        pool = ""  # (the trunk's own average pool)
    else:
        pool = {"tok": "token", "avg": "avg", "map": "map"}[v.pool_type]
    proj = None if v.proj_type == "head" else v.proj_type  # None: timm's own head
    out = {
        "image_size": list(v.image_size) if isinstance(v.image_size, tuple) else v.image_size,
        "timm_model_name": name,
        "timm_model_pretrained": False,
        "timm_pool": pool,
        "timm_proj": proj,
        "timm_proj_bias": v.proj_bias,
    }
    try:
        same = timm_vision_config(name, {}, v.image_size, pool, proj, v.proj_bias) == v
    except ValueError:
        same = False
    if same:
        return out
    if v.fastvit is not None or v.mci is not None:  # MobileCLIP's (attn_clip.config_mobileclip)
        return {**out, "timm_model_args": mobileclip_timm_args(v)}
    base = timm_model_config(name, {"global_pool": pool} if pool else None)
    changes = _trunk_changes(v, base)
    args = timm_kwargs(spec.timm_module, dataclasses.replace(base, **changes), base)
    for key in EVA_LAYOUT if v.eva is not None else ():
        if v.eva[key] != spec.layout_args.get(key, EVA_FIELDS[key]):
            args[key] = v.eva[key]
    if timm_vision_config(name, args, v.image_size, pool, proj, v.proj_bias) != v:
        raise ValueError(f"vision tower {name!r} is not timm's {name} with any timm keyword "
                         f"arguments (tried {args})")  # fmt: skip
    out["timm_model_args"] = args
    return out
