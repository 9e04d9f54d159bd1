"""The generator of ``timm_pretrained_cfgs.json`` and the coverage report: the only timm users.

The table holds, for every architecture we build that timm has, timm's pretrained cfgs
(``default_tag``, ``tags``); for the ViT family also the architecture itself
(``model_args``: :class:`~attn_vision.vit.ViTConfig` fields), which is where the ViT presets
come from (:mod:`attn_vision.registry` registers one per entry). The ViT entries are read
off timm's own model entrypoints (modules ``vision_transformer`` and ``deit``): each is
called with timm's builder replaced by a recorder of its keyword arguments, which
:func:`vit_args` translates -- or names what our config cannot express yet. timm's
``eva`` and ``vitamin`` entrypoints are recorded the same way (:func:`eva_args`,
:func:`vitamin_args`; the ``vitamin_*`` presets are written out in the registry and a test
checks them against these; attn_clip translates open_clip's timm towers with both).

Regenerate after upgrading timm or adding a Swin / ResNet preset::

    python -m attn_vision.registry --write-table   # rewrite the table
    python -m attn_vision.registry --coverage      # what of timm's ViTs we build

Everything here imports timm lazily; building a model never calls it.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from typing import Any
from unittest import mock

from torch import nn

from .pretrained import TABLE_FIELDS
from .vit import GLOBAL_POOLS

__all__ = [
    "coverage_report",
    "eva_args",
    "format_table",
    "timm_eva_args",
    "timm_pretrained_table",
    "timm_vit_args",
    "timm_vitamin_args",
    "vit_args",
    "vitamin_args",
]

# timm modules whose architectures are timm's plain ``VisionTransformer`` (+ DeiT's
# distilled subclass): the ones ViTConfig is meant to express
VIT_MODULES = ("vision_transformer", "deit")
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
}
ACTIVATIONS = ("gelu", "gelu_tanh", "quick_gelu")  # timm act_layer names we have


def _describe(value: Any) -> str:
    if isinstance(value, functools.partial):
        kw = ", ".join(f"{k}={v!r}" for k, v in value.keywords.items())
        return f"{_describe(value.func)}({kw})"
    return getattr(value, "__name__", None) or repr(value)


def _layer_norm_eps(norm_layer: Any) -> float | None:
    """The eps of ``partial(LayerNorm, eps=...)`` (timm's or torch's), else None."""
    from timm.layers import LayerNorm

    if isinstance(norm_layer, functools.partial) and set(norm_layer.keywords) == {"eps"}:
        if norm_layer.func in (LayerNorm, nn.LayerNorm) and not norm_layer.args:
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


def eva_args(kwargs: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """timm ``Eva`` kwargs (EVA-01 / EVA02) -> ``(ViTConfig args, what we cannot express)``.

    EVA02 is a ViT with a 2D RoPE, a SwiGLU MLP and optional inner norms; timm's ``Eva``
    defaults differ from ``VisionTransformer``'s in the pooling (``avg``). ``qkv_fused``
    only changes the checkpoint layout (the converter fuses separate q / k / v)."""
    kw = {"global_pool": "avg", **kwargs}
    args: dict[str, Any] = {}
    unsupported: list[str] = []
    if kw.pop("swiglu_mlp", False):
        # SwiGLU with separate fc1_g / fc1_x when scale_mlp (fused as [x, gate]); without
        # it timm's packed GluMlp(gate_last=False): [gate, x]
        args.update(act="swiglu", mlp_gate_last=bool(kw.get("scale_mlp", False)))
    for key, value in kw.items():
        if key == "qkv_fused" or (key == "use_abs_pos_emb" and value):
            continue
        if key == "scale_mlp":
            args["mlp_inner_norm"] = bool(value)
        elif key == "scale_attn_inner":
            args["attn_inner_norm"] = bool(value)
        elif key == "use_rot_pos_emb":
            args["rope"] = bool(value)
        elif key == "ref_feat_shape" and value is not None:
            args["rope_ref_grid"] = tuple(value)
        elif key in SAME_ARGS or key in ("global_pool", "act_layer", "norm_layer"):
            more, bad = vit_args({key: value})
            args.update(more)
            unsupported += bad
        else:
            unsupported.append(f"{key}={_describe(value)}")
    return args, unsupported


@functools.cache
def timm_eva_kwargs() -> dict[str, dict[str, Any]]:
    """``arch -> kwargs`` of every timm ``eva`` module architecture (recorded, not built)."""
    import timm
    from timm.models import eva

    return _record(timm.list_models(module="eva"), eva, "_create_eva")


def timm_eva_args() -> dict[str, tuple[dict[str, Any], list[str]]]:
    """``arch -> eva_args(kwargs)`` for every timm architecture in the ``eva`` module."""
    return {arch: eva_args(kw) for arch, kw in sorted(timm_eva_kwargs().items())}


# timm's ViTamin MLP (``mlp_layer``), by qualified name (a recorded kwargs table holds it so)
GEGLU_MLP = "timm.models.vitamin.GeGluMlp"


def _qualname(value: Any) -> Any:
    return f"{value.__module__}.{value.__qualname__}" if isinstance(value, type) else value


def vitamin_args(kwargs: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """timm ViTamin kwargs (a ``VisionTransformer``'s plus ``embed_cfg``, a ``VitCfg`` or
    its dict) -> ``(VitaminConfig args, what we cannot express)``.

    The conv stem reads only ``embed_cfg.stem_width`` and the first two ``embed_dim`` /
    ``depths`` entries (the third ``embed_dim`` is the token width); timm's stem ignores
    ``conv_cfg`` and ``head_type``. ``out_indices`` only concerns feature extraction."""
    kw = {"global_pool": "token", "class_token": True, "pos_embed": "learn", **kwargs}
    args: dict[str, Any] = {}
    unsupported: list[str] = []
    embed = kw.pop("embed_cfg", None)
    if embed is not None and not isinstance(embed, dict):
        embed = dataclasses.asdict(embed)
    if embed is None or len(embed["embed_dim"]) < 3 or len(embed["depths"]) < 2:
        unsupported.append(f"embed_cfg={embed!r}")
    else:
        args.update(stem_width=embed["stem_width"], conv_dims=tuple(embed["embed_dim"][:2]),
                    conv_depths=tuple(embed["depths"][:2]))  # fmt: skip
        if embed["embed_dim"][2] != kw.get("embed_dim", 768):
            unsupported.append(f"embed_cfg.embed_dim={embed['embed_dim']} (the last must be "
                               "the ViT's embed_dim)")  # fmt: skip
    if _qualname(kw.pop("mlp_layer", None)) != GEGLU_MLP:
        unsupported.append("mlp_layer (ViTamin's is GeGluMlp)")
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


@functools.cache
def timm_vitamin_kwargs() -> dict[str, dict[str, Any]]:
    """``arch -> kwargs`` of every timm ``vitamin`` module architecture (not built)."""
    import timm
    from timm.models import vitamin

    return _record(timm.list_models(module="vitamin"), vitamin, "_create_vitamin")


def timm_vitamin_args() -> dict[str, tuple[dict[str, Any], list[str]]]:
    """``arch -> vitamin_args(kwargs)`` for every timm architecture in ``vitamin``."""
    return {arch: vitamin_args(kw) for arch, kw in sorted(timm_vitamin_kwargs().items())}


class _Recorded(Exception):
    """Raised by :func:`_recorder` with the builder's keyword arguments."""


def _recorder(variant: str, pretrained: bool = False, **kwargs: Any) -> None:
    """A stand-in for a timm model builder: stops the entrypoint, with its kwargs."""
    raise _Recorded(kwargs)


def _record(
    archs: list[str], module: Any, builder: str, captured: dict | None = None
) -> dict[str, dict[str, Any]]:
    """Call each entrypoint with ``module.builder`` replaced by a recorder of its kwargs;
    ``arch -> kwargs`` (by the entrypoint's name: timm's ``vitamin_xlarge_336`` passes its
    builder the variant name ``vitamin_xlarge_256``)."""
    import timm

    captured = {} if captured is None else captured
    with mock.patch.object(module, builder, _recorder):
        for arch in archs:
            try:
                timm.models.model_entrypoint(arch)()
            except _Recorded as recorded:
                captured[arch] = recorded.args[0]
    return captured


@functools.cache
def timm_vit_kwargs() -> dict[str, dict[str, Any]]:
    """``arch -> kwargs`` timm's entrypoint passes to its builder, for every architecture
    in :data:`VIT_MODULES` (the builder is replaced by a recorder: nothing is built)."""
    import timm
    from timm.models import deit, vision_transformer

    archs = timm.list_models(module=list(VIT_MODULES))
    with mock.patch.object(deit, "_create_deit", _recorder):
        captured = _record(archs, vision_transformer, "_create_vision_transformer")
    missing = sorted(set(archs) - set(captured))
    if missing:
        raise RuntimeError(f"timm {timm.__version__}: entrypoints not recorded: {missing}")
    return captured


def timm_vit_args() -> dict[str, tuple[dict[str, Any], list[str]]]:
    """``arch -> vit_args(kwargs)`` for every timm architecture in :data:`VIT_MODULES`."""
    return {arch: vit_args(kw) for arch, kw in sorted(timm_vit_kwargs().items())}


def _pretrained_entry(arch: str) -> dict[str, Any]:
    from timm.models import get_arch_pretrained_cfgs
    from timm.models import get_pretrained_cfg as timm_pretrained_cfg

    tags = {}
    for cfg in get_arch_pretrained_cfgs(arch).values():
        values = {f: getattr(cfg, f) for f in TABLE_FIELDS}
        tags[cfg.tag] = {f: v for f, v in values.items() if v is not None}
    return {"default_tag": timm_pretrained_cfg(arch).tag, "tags": tags}


def timm_pretrained_table() -> dict[str, Any]:
    """The table from the installed timm: every ViT architecture :func:`vit_args` can
    express (with its ``model_args``) and the registered Swin / ResNet presets timm has.

    ``{"timm_version": ..., "architectures": {arch: {["model_args": {...},]
    "default_tag": tag, "tags": {tag: {field: value}}}}}`` with the :data:`TABLE_FIELDS`
    timm sets (not None); JSON types (tuples as lists).
    """
    import timm
    from timm.models import get_arch_pretrained_cfgs

    from .registry import _MODELS

    other_archs = [n for n, spec in _MODELS.items() if spec.family != "vit" and spec.timm_weights]
    archs: dict[str, Any] = {}
    for arch, (args, unsupported) in {**timm_vit_args(), **timm_eva_args()}.items():
        if not unsupported:
            archs[arch] = {"model_args": args, **_pretrained_entry(arch)}
    for arch in other_archs:
        if not get_arch_pretrained_cfgs(arch):
            raise RuntimeError(
                f"timm {timm.__version__} has no pretrained cfgs for {arch!r}; "
                "register it with timm_weights=False"
            )
        archs[arch] = _pretrained_entry(arch)
    table = {"timm_version": timm.__version__, "architectures": dict(sorted(archs.items()))}
    return json.loads(json.dumps(table))  # JSON types: tuples -> lists


def format_table(table: dict[str, Any]) -> str:
    """The table as JSON text with one line per tag / model_args (small, diff-friendly)."""
    lines = ["{", f'  "timm_version": {json.dumps(table["timm_version"])},', '  "architectures": {']
    archs = list(table["architectures"].items())
    for i, (arch, entry) in enumerate(archs):
        lines.append(f"    {json.dumps(arch)}: {{")
        if "model_args" in entry:
            lines.append(f'      "model_args": {json.dumps(entry["model_args"])},')
        lines += [f'      "default_tag": {json.dumps(entry["default_tag"])},', '      "tags": {']
        tags = list(entry["tags"].items())
        for j, (tag, cfg) in enumerate(tags):
            comma = "," if j < len(tags) - 1 else ""
            lines.append(f"        {json.dumps(tag)}: {json.dumps(cfg)}{comma}")
        lines += ["      }", "    }" + ("," if i < len(archs) - 1 else "")]
    lines += ["  }", "}"]
    return "\n".join(lines) + "\n"


def coverage_report(built: set[str], built_tags: set[str]) -> str:
    """What of timm's ViTs we build: ``built`` preset names, ``built_tags`` ``arch.tag``."""
    import timm
    from timm.models import get_arch_pretrained_cfgs

    def hub_tags(archs: list[str]) -> set[str]:
        return {
            f"{a}.{c.tag}"
            for a in archs
            for c in get_arch_pretrained_cfgs(a).values()
            if c.hf_hub_id
        }

    vit_archs = sorted(timm_vit_kwargs())
    all_archs = timm.list_models(["vit_*", "deit*"])
    lines = [f"timm {timm.__version__}"]
    for label, archs in (
        (f"VisionTransformer architectures (timm modules {', '.join(VIT_MODULES)})", vit_archs),
        ("all timm vit_* / deit* architectures (any module)", all_archs),
    ):
        tags = hub_tags(archs)
        lines += [
            f"{label}:",
            f"  architectures built: {len(built & set(archs))} of {len(archs)}",
            f"  pretrained tags (Hub weights) built: {len(built_tags & tags)} of {len(tags)}",
        ]
    not_built = {a: u for a, (_, u) in timm_vit_args().items() if a not in built}
    lines.append(f"not built, in {', '.join(VIT_MODULES)} ({len(not_built)}):")
    lines += [f"  {a}: {'; '.join(u) or 'not registered'}" for a, u in not_built.items()]
    others = {m: timm.list_models(["vit_*", "deit*"], module=m) for m in timm.list_modules()}
    others = {m: len(a) for m, a in others.items() if a and m not in VIT_MODULES}
    listed = ", ".join(f"{m} ({n})" for m, n in sorted(others.items()))
    lines.append(f"not built, other timm model classes ({sum(others.values())}): {listed}")
    for module in ("swin_transformer", "resnet", "convnext", "eva", "vitamin"):  # the others
        archs = [a for a in timm.list_models(module=module) if not a.startswith("test_")]
        tags = hub_tags(archs)
        missing = sorted(set(archs) - built)
        lines += [
            f"timm module {module}:",
            f"  architectures built: {len(built & set(archs))} of {len(archs)}",
            f"  pretrained tags (Hub weights) built: {len(built_tags & tags)} of {len(tags)}",
            f"  not built ({len(missing)}): {', '.join(missing) or 'none'}",
        ]
    return "\n".join(lines)
