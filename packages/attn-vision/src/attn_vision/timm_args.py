"""timm's keyword arguments -> our config fields: the one translation of timm's vocabulary.

A timm entrypoint builds its model with keyword arguments (``depth=12``,
``act_layer="gelu_tanh"``, ``use_rot_pos_emb=True``, ...), and
``timm.create_model(name, **kwargs)`` overrides them. Each function here translates such
arguments of one timm model class into the fields of our config dataclass, and names
what our config cannot express (``(args, unsupported)``); it translates exactly the keys
it is given, so it serves both the generator (:mod:`attn_vision.timm_table`, which adds
the class defaults of :data:`TIMM_CLASS_DEFAULTS` to what an entrypoint passes) and
:func:`attn_vision.registry.timm_model_config` (a preset's arguments overridden, as
``timm.create_model`` does). Imports no timm: a value that is not a plain Python value
(a layer class, a ``functools.partial``) is recognized by its name.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from .vit import GLOBAL_POOLS, ROPE_GRID_INDEXINGS

__all__ = [
    "TIMM_CLASS_DEFAULTS",
    "TIMM_TRANSLATORS",
    "convnext_args",
    "eva_args",
    "eva_layout",
    "relpos_args",
    "swin_args",
    "timm_kwargs",
    "vit_args",
    "vitamin_args",
]

# timm keyword arguments that are ViTConfig fields of the same name and meaning
SAME_ARGS = {
    "img_size",
    "patch_size",
    "embed_dim",
    "depth",
    "num_heads",
    "mlp_ratio",
    "qkv_bias",
    "proj_bias",
    "class_token",
    "no_embed_class",
    "reg_tokens",
    "pre_norm",
    "final_norm",
    "fc_norm",
    "init_values",
    "dynamic_img_size",
    "pool_include_prefix",
}
ACTIVATIONS = ("gelu", "gelu_tanh", "quick_gelu")  # timm act_layer names we have
EVA_ATTN_TYPES = ("eva", "rope")  # timm Eva's EvaAttention / AttentionRope: one math
# timm's ViTamin MLP (``mlp_layer``), by qualified name (a recorded kwargs table holds it so)
GEGLU_MLP = "timm.models.vitamin.GeGluMlp"
# the defaults of timm's model classes where they differ from our config's (the generator
# adds them to what an entrypoint passes: they hold unless the entrypoint says otherwise)
TIMM_CLASS_DEFAULTS: dict[str, dict[str, Any]] = {
    "vision_transformer": {},
    "deit": {},
    "eva": {"global_pool": "avg"},
    "vitamin": {"global_pool": "token", "class_token": True, "pos_embed": "learn"},
    "convnext": {},
    "swin_transformer": {},
    # VisionTransformerRelPos: no class token, GAP, LayerScale, a RelPosMlp per block
    "vision_transformer_relpos": {
        "global_pool": "avg",
        "class_token": False,
        "init_values": 1e-6,
        "fc_norm": False,
        "rel_pos_type": "mlp",
    },  # fmt: skip
}
# timm's vision_transformer_relpos block classes (by name): pre-norm, or res-post-norm
RELPOS_BLOCKS = {"RelPosBlock": False, "ResPostRelPosBlock": True}


def _describe(value: Any) -> str:
    if isinstance(value, functools.partial):
        kw = ", ".join(f"{k}={v!r}" for k, v in value.keywords.items())
        return f"{_describe(value.func)}({kw})"
    return getattr(value, "__name__", None) or repr(value)


def _layer_norm_eps(norm_layer: Any) -> float | None:
    """The eps of ``partial(LayerNorm, eps=...)`` (timm's or torch's), else None."""
    if not isinstance(norm_layer, functools.partial) or norm_layer.args:
        return None
    func = norm_layer.func
    is_layer_norm = getattr(func, "__name__", "") == "LayerNorm" and (
        func.__module__.startswith("timm.layers")
        or func.__module__ == "torch.nn.modules.normalization"
    )
    if is_layer_norm and set(norm_layer.keywords) == {"eps"}:
        return float(norm_layer.keywords["eps"])
    return None


def vit_args(kwargs: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """timm ``VisionTransformer`` kwargs -> ``(ViTConfig args, what we cannot express)``."""
    args: dict[str, Any] = {}
    unsupported: list[str] = []
    for key, value in kwargs.items():
        if key in SAME_ARGS:
            args[key] = value
        elif key == "global_pool" and value in GLOBAL_POOLS:
            args[key] = value
        elif key == "act_layer" and value in ACTIVATIONS:
            args["act"] = value
        elif key == "norm_layer" and _layer_norm_eps(value) is not None:
            args["norm_eps"] = _layer_norm_eps(value)
        elif key == "distilled":
            args["dist_token"] = bool(value)
        else:
            unsupported.append(f"{key}={_describe(value)}")
    return args, unsupported


def eva_args(kwargs: dict[str, Any], base: Any = None) -> tuple[dict[str, Any], list[str]]:
    """timm ``Eva`` kwargs (EVA-01 / EVA02) -> ``(ViTConfig args, what we cannot express)``.

    EVA02 is a ViT with a 2D RoPE, a SwiGLU MLP and optional inner norms. ``swiglu_mlp``
    and ``scale_mlp`` together choose the MLP (SwiGLU with separate ``fc1_g`` / ``fc1_x``
    when ``scale_mlp``, fused as ``[x, gate]``; without it timm's packed
    ``GluMlp(gate_last=False)``: ``[gate, x]``): given one, the other is ``base``'s (the
    ViTConfig being overridden; timm's default without one). ``qkv_fused`` only sets the
    checkpoint layout (the converter fuses separate q / k / v): see :func:`eva_layout`.
    ``use_post_norm`` (EVA02-E) is ``post_norm``; its blocks have no layer scale, so timm
    ignores ``init_values`` there, and so do we. PE-Core's ``attn_type="rope"`` (timm's
    ``AttentionRope``: a plain ``qkv`` with a key bias, which changes no attention) is a
    layout too; ``use_pre_transformer_norm`` is ``pre_norm``; an Eva's MAP head reads the
    prefix tokens too (``pool_include_prefix``, set with ``global_pool``)."""
    kw = dict(kwargs)
    args: dict[str, Any] = {}
    unsupported: list[str] = []
    scale_mlp = kw.get("scale_mlp", base is not None and base.mlp_inner_norm)
    swiglu = None  # (None: the MLP as it is)
    if "swiglu_mlp" in kw:
        swiglu = kw.pop("swiglu_mlp")
    elif "scale_mlp" in kw and base is not None:
        swiglu = base.act == "swiglu"  # (its gate order follows scale_mlp)
    if swiglu:
        args.update(act="swiglu", mlp_gate_last=bool(scale_mlp))
    elif swiglu is not None and base is not None and base.act == "swiglu":
        args.update(act="gelu", mlp_gate_last=True)
    for key, value in kw.items():
        if key == "qkv_fused" or (key == "use_abs_pos_emb" and value):
            continue
        if key == "attn_type" and value in EVA_ATTN_TYPES:
            continue  # (the layout: eva_layout)
        if key == "scale_mlp":
            args["mlp_inner_norm"] = bool(value)
        elif key == "scale_attn_inner":
            args["attn_inner_norm"] = bool(value)
        elif key == "use_rot_pos_emb":
            args["rope"] = bool(value)
        elif key == "use_post_norm":
            args["post_norm"] = bool(value)
        elif key == "ref_feat_shape" and value is not None:
            args["rope_ref_grid"] = tuple(value)
        elif key == "use_pre_transformer_norm":
            args["pre_norm"] = bool(value)
        elif key == "rope_grid_offset":
            args["rope_grid_offset"] = float(value)
        elif key == "rope_grid_indexing" and value in ROPE_GRID_INDEXINGS:
            args["rope_grid_indexing"] = value
        elif key in ("attn_pool_num_heads", "attn_pool_mlp_ratio"):
            args[key] = value
        elif key == "global_pool" and value in GLOBAL_POOLS:
            args.update(global_pool=value, pool_include_prefix=value == "map")
        elif key in SAME_ARGS - {"pool_include_prefix"} or key in ("act_layer", "norm_layer"):
            more, bad = vit_args({key: value})
            args.update(more)
            unsupported += bad
        else:
            unsupported.append(f"{key}={_describe(value)}")
    post_norm = args.get("post_norm", getattr(base, "post_norm", False))
    if post_norm and args.get("init_values", getattr(base, "init_values", None)) is not None:
        args["init_values"] = None  # (timm's post-norm blocks ignore it: no layer scale)
    return args, unsupported


def relpos_args(kwargs: dict[str, Any], base: Any = None) -> tuple[dict[str, Any], list[str]]:
    """timm ``VisionTransformerRelPos`` kwargs (``vit_relpos_*``) -> ``(ViTConfig args, what
    we cannot express)``: a ViT without absolute position embedding (``pos_embed="none"``,
    always) whose blocks add timm's ``RelPosMlp`` bias (``rel_pos_type="mlp"``: our
    ``rel_pos="mlp"``, ``rel_pos_dim`` its hidden width); ``block_fn=ResPostRelPosBlock`` is
    ``post_norm`` (its ``init_values`` only initializes the norms: ignored, as timm's
    LayerScale-free blocks have none)."""
    args: dict[str, Any] = {"pos_embed": "none"}
    unsupported: list[str] = []
    for key, value in kwargs.items():
        if key == "rel_pos_type" and value == "mlp":
            args["rel_pos"] = "mlp"
        elif key == "rel_pos_dim":
            if value:  # (None / 0: RelPosMlp's default)
                args["rel_pos_dim"] = int(value)
        elif key == "shared_rel_pos" and not value:
            continue
        elif key == "block_fn" and getattr(value, "__name__", value) in RELPOS_BLOCKS:
            args["post_norm"] = RELPOS_BLOCKS[getattr(value, "__name__", value)]
        elif key in SAME_ARGS - {"pool_include_prefix"} or key in (
            "global_pool", "act_layer", "norm_layer",
        ):  # fmt: skip
            more, bad = vit_args({key: value})
            args.update(more)
            unsupported += bad
        else:
            unsupported.append(f"{key}={_describe(value)}")
    if args.get("post_norm", getattr(base, "post_norm", False)):
        args["init_values"] = None
    return args, unsupported


def eva_layout(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The timm ``Eva`` kwargs that only choose its checkpoint's layout: ``qkv_fused``
    (one ``qkv`` with ``q_bias`` / ``v_bias``, timm's default, or ``q_proj`` / ``k_proj`` /
    ``v_proj``), and ``attn_type`` when it is ``"rope"`` (timm's ``AttentionRope``: biases
    in ``qkv`` itself, the key's too, or in all three projections)."""
    layout = {"qkv_fused": bool(kwargs.get("qkv_fused", True))}
    if kwargs.get("attn_type", "eva") != "eva":
        layout["attn_type"] = kwargs["attn_type"]
    return layout


def _qualname(value: Any) -> Any:
    return f"{value.__module__}.{value.__qualname__}" if isinstance(value, type) else value


def vitamin_args(kwargs: dict[str, Any], base: Any = None) -> tuple[dict[str, Any], list[str]]:
    """timm ViTamin kwargs (a ``VisionTransformer``'s plus ``embed_cfg``, a ``VitCfg`` or
    its dict) -> ``(VitaminConfig args, what we cannot express)``.

    The conv stem reads only ``embed_cfg.stem_width`` and the first two ``embed_dim`` /
    ``depths`` entries (the third ``embed_dim`` is the token width); timm's stem ignores
    ``conv_cfg`` and ``head_type``. ``out_indices`` only concerns feature extraction."""
    kw = dict(kwargs)
    args: dict[str, Any] = {}
    unsupported: list[str] = []
    if "embed_cfg" in kw:
        embed = kw.pop("embed_cfg")
        if embed is not None and not isinstance(embed, dict):
            embed = dataclasses.asdict(embed)
        width = kw.get("embed_dim", base.embed_dim if base is not None else 768)
        if embed is None or len(embed["embed_dim"]) < 3 or len(embed["depths"]) < 2:
            unsupported.append(f"embed_cfg={embed!r}")
        else:
            args.update(stem_width=embed["stem_width"], conv_dims=tuple(embed["embed_dim"][:2]),
                        conv_depths=tuple(embed["depths"][:2]))  # fmt: skip
            if embed["embed_dim"][2] != width:
                unsupported.append(f"embed_cfg.embed_dim={embed['embed_dim']} (the last must be "
                                   "the ViT's embed_dim)")  # fmt: skip
    if "mlp_layer" in kw and _qualname(kw.pop("mlp_layer")) != GEGLU_MLP:
        unsupported.append("mlp_layer (ViTamin's is GeGluMlp)")
    if "pos_embed" in kw:
        pos = kw.pop("pos_embed")
        args["pos_embed"] = "none" if pos in ("", "none", None) else pos
    kw.pop("out_indices", None)
    for key, value in kw.items():
        if key == "patch_size" and value != 16:
            unsupported.append(f"patch_size={value!r} (the conv stem's stride is 16)")
        elif key != "patch_size":
            more, bad = vit_args({key: value})
            args.update(more)
            unsupported += bad
    return args, unsupported


# timm ``ConvNeXt`` keyword arguments that are ConvNeXtConfig fields of the same name
CONVNEXT_SAME_ARGS = {
    "depths", "dims", "in_chans", "patch_size", "mlp_ratio", "ls_init_value", "conv_mlp",
    "conv_bias", "head_norm_first", "head_hidden_size", "drop_rate", "drop_path_rate",
}  # fmt: skip
# timm ``ConvNeXt`` keyword arguments our ConvNeXt has only at timm's default
CONVNEXT_FIXED = {
    "stem_type": "patch", "use_grn": False, "act_layer": "gelu", "norm_layer": None,
    "output_stride": 32, "global_pool": "avg", "head_init_scale": 1.0,
}  # fmt: skip


def convnext_args(kwargs: dict[str, Any], base: Any = None) -> tuple[dict[str, Any], list[str]]:
    """timm ``ConvNeXt`` kwargs -> ``(ConvNeXtConfig args, what we cannot express)``:
    ``kernel_sizes`` (one size for every stage) is our ``kernel_size``, ``norm_eps=None``
    timm's LayerNorm default (1e-6); ``head_init_scale`` only scales the head's init."""
    args: dict[str, Any] = {}
    unsupported: list[str] = []
    for key, value in kwargs.items():
        if key in CONVNEXT_SAME_ARGS:
            args[key] = tuple(value) if isinstance(value, list) else value
        elif key == "kernel_sizes":
            sizes = value if isinstance(value, (list, tuple)) else [value]
            if len(set(sizes)) == 1:
                args["kernel_size"] = sizes[0]
            else:
                unsupported.append(f"kernel_sizes={value!r} (one size for every stage)")
        elif key == "norm_eps":
            args["norm_eps"] = 1e-6 if value is None else float(value)
        elif key == "head_init_scale" or CONVNEXT_FIXED.get(key, ...) == value:
            continue
        else:
            unsupported.append(f"{key}={_describe(value)}")
    return args, unsupported


# timm ``SwinTransformer`` keyword arguments that are SwinConfig fields of the same name
SWIN_SAME_ARGS = {
    "img_size", "patch_size", "in_chans", "embed_dim", "depths", "num_heads", "window_size",
    "mlp_ratio", "qkv_bias", "drop_rate", "proj_drop_rate", "attn_drop_rate", "drop_path_rate",
}  # fmt: skip
# timm ``SwinTransformer`` keyword arguments our Swin has only at timm's default
SWIN_FIXED = {"head_dim": None, "always_partition": False, "strict_img_size": True}


def swin_args(kwargs: dict[str, Any], base: Any = None) -> tuple[dict[str, Any], list[str]]:
    """timm ``SwinTransformer`` kwargs -> ``(SwinConfig args, what we cannot express)``:
    ``norm_layer`` a LayerNorm (its eps: ``norm_eps``), ``global_pool`` ``"avg"`` or ``""``."""
    args: dict[str, Any] = {}
    unsupported: list[str] = []
    for key, value in kwargs.items():
        if key in SWIN_SAME_ARGS:
            args[key] = tuple(value) if isinstance(value, list) else value
        elif key == "global_pool" and value in ("avg", ""):
            args[key] = value
        elif key == "norm_layer" and (value is None or _is_layer_norm(value)):
            args["norm_eps"] = 1e-5 if _layer_norm_eps(value) is None else _layer_norm_eps(value)
        elif key in SWIN_FIXED and SWIN_FIXED[key] == value:
            continue
        else:
            unsupported.append(f"{key}={_describe(value)}")
    return args, unsupported


def _is_layer_norm(value: Any) -> bool:
    """torch's or timm's LayerNorm class, or a ``partial`` of it with only ``eps``."""
    if _layer_norm_eps(value) is not None:
        return True
    return getattr(value, "__name__", "") == "LayerNorm" and getattr(
        value, "__module__", ""
    ).startswith(("timm.layers", "torch.nn.modules.normalization"))


def _vit_translator(kwargs: dict[str, Any], base: Any = None) -> tuple[dict[str, Any], list[str]]:
    return vit_args(kwargs)


# timm module (where a preset's entrypoint lives) -> its translator ``(kwargs, base)``
TIMM_TRANSLATORS = {
    "vision_transformer": _vit_translator,
    "deit": _vit_translator,
    "eva": eva_args,
    "vitamin": vitamin_args,
    "convnext": convnext_args,
    "swin_transformer": swin_args,
    "vision_transformer_relpos": relpos_args,
}


# our config field -> timm's keyword argument, where the names differ (the translators'
# inverse); the other fields have timm's name (SAME_ARGS, CONVNEXT_SAME_ARGS)
TIMM_NAMES: dict[str, dict[str, str]] = {
    "vision_transformer": {"act": "act_layer", "dist_token": "distilled"},
    "deit": {"act": "act_layer", "dist_token": "distilled"},
    "eva": {
        "act": "act_layer",
        "rope": "use_rot_pos_emb",
        "rope_ref_grid": "ref_feat_shape",
        "attn_inner_norm": "scale_attn_inner",
        "post_norm": "use_post_norm",
        "pre_norm": "use_pre_transformer_norm",
        "rope_grid_offset": "rope_grid_offset",
        "rope_grid_indexing": "rope_grid_indexing",
        "attn_pool_num_heads": "attn_pool_num_heads",
        "attn_pool_mlp_ratio": "attn_pool_mlp_ratio",
    },  # fmt: skip
    "vitamin": {"act": "act_layer", "pos_embed": "pos_embed"},
    "convnext": {"kernel_size": "kernel_sizes", "norm_eps": "norm_eps"},
    "swin_transformer": {},
    "vision_transformer_relpos": {
        "act": "act_layer",
        "rel_pos": "rel_pos_type",
        "rel_pos_dim": "rel_pos_dim",
    },  # fmt: skip
}
_EVA_MLP = ("act", "mlp_gate_last", "mlp_inner_norm")  # timm: swiglu_mlp + scale_mlp
_VITAMIN_STEM = ("stem_width", "conv_dims", "conv_depths")  # timm: embed_cfg


def timm_kwargs(module: str, config: Any, base: Any) -> dict[str, Any]:
    """The timm keyword arguments that make timm's model of preset config ``base``
    ``config`` (``module``: where the preset's entrypoint lives): the inverse of its
    translator, ``TIMM_TRANSLATORS[module](timm_kwargs(module, config, base), base)``
    gives ``config``'s fields that differ. JSON values (tuples as lists); ``ValueError``
    naming each field timm has no keyword argument for (``norm_eps`` of a ViT: timm takes
    a ``norm_layer``; None: ``timm.create_model`` drops None arguments)."""
    diff = {
        f.name: getattr(config, f.name)
        for f in dataclasses.fields(config)
        if getattr(config, f.name) != getattr(base, f.name)
    }
    out: dict[str, Any] = {}
    if module == "eva" and diff.keys() & set(_EVA_MLP):
        out.update(swiglu_mlp=config.act == "swiglu", scale_mlp=config.mlp_inner_norm)
        if config.act not in ("swiglu", "gelu"):
            out["act_layer"] = config.act
        diff = {k: v for k, v in diff.items() if k not in _EVA_MLP}
    if module == "vitamin" and diff.keys() & {*_VITAMIN_STEM, "embed_dim"}:
        out["embed_cfg"] = {
            "embed_dim": [*config.conv_dims, config.embed_dim],
            "depths": [*config.conv_depths, 1],
            "stem_width": config.stem_width,
        }
        diff = {k: v for k, v in diff.items() if k not in _VITAMIN_STEM}
    if module == "eva" and diff.get("pool_include_prefix", ...) == (config.global_pool == "map"):
        del diff["pool_include_prefix"]  # (an Eva's: its global_pool's)
    same = {"convnext": CONVNEXT_SAME_ARGS, "swin_transformer": SWIN_SAME_ARGS | {"global_pool"}}
    same = same.get(module, SAME_ARGS | {"global_pool"})
    names = TIMM_NAMES.get(module, {})
    bad = [k for k in diff if k not in names and k not in same]
    if bad:
        raise ValueError(f"{', '.join(bad)}: no timm keyword argument of {module!r} sets it")
    dropped = [k for k, v in diff.items() if v is None]
    if dropped:  # (timm.create_model drops the arguments that are None)
        raise ValueError(f"{', '.join(dropped)}: timm.create_model cannot set None")
    for key, value in diff.items():
        out[names.get(key, key)] = list(value) if isinstance(value, tuple) else value
    return out
