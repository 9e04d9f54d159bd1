"""The generator of ``timm_pretrained_cfgs.json`` and the coverage report: the only timm users.

The table holds, for every architecture we build that timm has, timm's pretrained cfgs
(``default_tag``, ``tags``); for the ViT family also the architecture itself
(``model_args``: :class:`~attn_vision.vit.ViTConfig` fields, and the timm module of its
entrypoint, ``timm_module``; an ``eva`` one's checkpoint layout, ``layout_args``), which is
where the ViT presets come from (:mod:`attn_vision.registry` registers one per entry), and
why the rest of timm's ViTs are not built (``unsupported``). The ViT entries are read off
timm's own model entrypoints (modules ``vision_transformer``, ``deit`` and ``eva``): each
is called with timm's builder replaced by a recorder of its keyword arguments, which
:mod:`attn_vision.timm_args` translates -- or names what our config cannot express yet.
timm's ``vitamin``, ``convnext`` and ``swin_transformer`` entrypoints are recorded the same
way (:func:`timm_vitamin_args`, :func:`timm_convnext_args`, :func:`timm_swin_args`): those
presets are written out in the registry and tests check them against these.

Regenerate after upgrading timm or adding a Swin / ResNet preset::

    python -m attn_vision.timm_table --write-table   # rewrite the table
    python -m attn_vision.timm_table --coverage      # what of timm's ViTs we build

Everything here imports timm lazily; building a model never calls it.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
from collections.abc import Iterator
from typing import Any

from attn_core import hub

from . import registry
from .pretrained import TABLE_FIELDS, TABLE_PATH
from .timm_args import TIMM_CLASS_DEFAULTS, TIMM_TRANSLATORS, eva_layout

__all__ = [
    "coverage_report",
    "format_table",
    "main",
    "timm_convnext_args",
    "timm_eva_args",
    "timm_fastvit_args",
    "timm_pretrained_table",
    "timm_relpos_args",
    "timm_swin_args",
    "timm_vit_args",
    "timm_vitamin_args",
]

# timm modules whose architectures are timm's plain ``VisionTransformer`` (+ DeiT's
# distilled subclass): the ones ViTConfig is meant to express
VIT_MODULES = ("vision_transformer", "deit")


class _Recorded(Exception):
    """Raised by :func:`_recorder` with the builder's keyword arguments."""


def _recorder(variant: str, pretrained: bool = False, **kwargs: Any) -> None:
    """A stand-in for a timm model builder: stops the entrypoint, with its kwargs."""
    raise _Recorded(kwargs)


@contextlib.contextmanager
def _replaced(module: Any, builder: str) -> Iterator[None]:
    """``module.builder`` is :func:`_recorder` inside the block (put back after it)."""
    original = getattr(module, builder)
    setattr(module, builder, _recorder)
    try:
        yield
    finally:
        setattr(module, builder, original)


def _record(archs: list[str], module: Any, builder: str) -> dict[str, dict[str, Any]]:
    """Call each entrypoint with ``module.builder`` replaced by a recorder of its kwargs;
    ``arch -> kwargs`` (by the entrypoint's name: timm's ``vitamin_xlarge_336`` passes its
    builder the variant name ``vitamin_xlarge_256``)."""
    import timm

    captured = {}
    with _replaced(module, builder):
        for arch in archs:
            try:
                timm.models.model_entrypoint(arch)()
            except _Recorded as recorded:
                captured[arch] = recorded.args[0]
    return captured


def _translated(module: str, kwargs: dict[str, dict[str, Any]]) -> dict[str, tuple[dict, list]]:
    """``arch -> (config args, unsupported)`` of recorded kwargs, timm's class defaults added."""
    translate, defaults = TIMM_TRANSLATORS[module], TIMM_CLASS_DEFAULTS[module]
    return {arch: translate({**defaults, **kw}) for arch, kw in sorted(kwargs.items())}


@functools.cache
def timm_vit_kwargs() -> dict[str, dict[str, Any]]:
    """``arch -> kwargs`` timm's entrypoint passes to its builder, for every architecture
    in :data:`VIT_MODULES` (the builder is replaced by a recorder: nothing is built)."""
    import timm
    from timm.models import deit, vision_transformer

    archs = timm.list_models(module=list(VIT_MODULES))
    with _replaced(deit, "_create_deit"):
        captured = _record(archs, vision_transformer, "_create_vision_transformer")
    missing = sorted(set(archs) - set(captured))
    if missing:
        raise RuntimeError(f"timm {timm.__version__}: entrypoints not recorded: {missing}")
    return captured


def timm_vit_args() -> dict[str, tuple[dict[str, Any], list[str]]]:
    """``arch -> vit_args(kwargs)`` for every timm architecture in :data:`VIT_MODULES`."""
    return _translated("vision_transformer", timm_vit_kwargs())


# timm modules recorded whole (every architecture), with the builder their entrypoints call
BUILDERS = {"eva": "_create_eva", "vitamin": "_create_vitamin", "convnext": "_create_convnext",
            "swin_transformer": "_create_swin_transformer",
            "fastvit": "_create_fastvit",
            "vision_transformer_relpos": "_create_vision_transformer_relpos"}  # fmt: skip


@functools.cache
def timm_module_kwargs(module: str) -> dict[str, dict[str, Any]]:
    """``arch -> kwargs`` of every architecture of timm module ``module`` (a key of
    :data:`BUILDERS`), recorded, not built."""
    import importlib

    import timm

    archs = timm.list_models(module=module)
    return _record(archs, importlib.import_module(f"timm.models.{module}"), BUILDERS[module])


def timm_eva_args() -> dict[str, tuple[dict[str, Any], list[str]]]:
    """``arch -> eva_args(kwargs)`` for every timm architecture in the ``eva`` module."""
    return _translated("eva", timm_module_kwargs("eva"))


def timm_vitamin_args() -> dict[str, tuple[dict[str, Any], list[str]]]:
    """``arch -> vitamin_args(kwargs)`` for every timm architecture in ``vitamin``."""
    return _translated("vitamin", timm_module_kwargs("vitamin"))


def timm_convnext_args() -> dict[str, tuple[dict[str, Any], list[str]]]:
    """``arch -> convnext_args(kwargs)`` for every timm architecture in ``convnext``."""
    return _translated("convnext", timm_module_kwargs("convnext"))


def timm_relpos_args() -> dict[str, tuple[dict[str, Any], list[str]]]:
    """``arch -> relpos_args(kwargs)`` for every timm ``vision_transformer_relpos`` arch."""
    return _translated("vision_transformer_relpos", timm_module_kwargs("vision_transformer_relpos"))


def timm_swin_args() -> dict[str, tuple[dict[str, Any], list[str]]]:
    """``arch -> swin_args(kwargs)`` for every timm architecture in ``swin_transformer``."""
    return _translated("swin_transformer", timm_module_kwargs("swin_transformer"))


def timm_fastvit_args() -> dict[str, tuple[dict[str, Any], list[str]]]:
    """``arch -> fastvit_args(kwargs)`` for every timm architecture in ``fastvit`` (the
    translator lives in :mod:`attn_vision.fastvit`)."""
    from .fastvit import fastvit_args

    return {arch: fastvit_args(kw) for arch, kw in sorted(timm_module_kwargs("fastvit").items())}


def _pretrained_entry(arch: str) -> dict[str, Any]:
    from timm.models import get_arch_pretrained_cfgs
    from timm.models import get_pretrained_cfg as timm_pretrained_cfg

    tags = {}
    for cfg in get_arch_pretrained_cfgs(arch).values():
        values = {f: getattr(cfg, f) for f in TABLE_FIELDS}
        tags[cfg.tag] = {f: v for f, v in values.items() if v is not None}
    return {"default_tag": timm_pretrained_cfg(arch).tag, "tags": tags}


def timm_pretrained_table() -> dict[str, Any]:
    """The table from the installed timm: every ViT architecture :mod:`attn_vision.timm_args`
    can express (with its ``model_args``, ``timm_module`` and, from ``eva``,
    ``layout_args``), the registered Swin / ResNet / ConvNeXt / ViTamin presets timm has,
    and why the other ViT architectures are not built (``unsupported``).

    ``{"timm_version": ..., "architectures": {arch: {["model_args": {...}, "timm_module":
    ..., "layout_args": {...},] "default_tag": tag, "tags": {tag: {field: value}}}},
    "unsupported": {arch: [reason, ...]}}`` with the :data:`TABLE_FIELDS` timm sets (not
    None); JSON types (tuples as lists).
    """
    import timm
    from timm.models import get_arch_pretrained_cfgs

    other_archs = []
    for name in registry.list_models():
        spec = registry.get_model_spec(name)
        if spec.family != "vit" and spec.timm_weights:
            other_archs.append(name)
    archs: dict[str, Any] = {}
    unsupported: dict[str, list[str]] = {}
    translated = {
        "vision_transformer": timm_vit_args(),
        "eva": timm_eva_args(),
        "vision_transformer_relpos": timm_relpos_args(),
    }
    for module, table in translated.items():
        for arch, (args, refused) in table.items():
            if refused:
                unsupported[arch] = refused
                continue
            timm_module = timm.models.model_entrypoint(arch).__module__.rpartition(".")[2]
            entry = {"model_args": args, "timm_module": timm_module}
            if module == "eva":
                entry["layout_args"] = eva_layout(timm_module_kwargs("eva")[arch])
            archs[arch] = {**entry, **_pretrained_entry(arch)}
    for arch in other_archs:
        if not get_arch_pretrained_cfgs(arch):
            raise RuntimeError(
                f"timm {timm.__version__} has no pretrained cfgs for {arch!r}; "
                "register it with timm_weights=False"
            )
        archs[arch] = _pretrained_entry(arch)
    table = {
        "timm_version": timm.__version__,
        "architectures": dict(sorted(archs.items())),
        "unsupported": dict(sorted(unsupported.items())),
    }
    return json.loads(json.dumps(table))  # JSON types: tuples -> lists


def format_table(table: dict[str, Any]) -> str:
    """The table as JSON text with one line per tag / model_args (small, diff-friendly)."""
    lines = ["{", f'  "timm_version": {json.dumps(table["timm_version"])},', '  "architectures": {']
    archs = list(table["architectures"].items())
    for i, (arch, entry) in enumerate(archs):
        lines.append(f"    {json.dumps(arch)}: {{")
        for key in ("model_args", "timm_module", "layout_args"):
            if key in entry:
                lines.append(f'      "{key}": {json.dumps(entry[key])},')
        lines += [f'      "default_tag": {json.dumps(entry["default_tag"])},', '      "tags": {']
        tags = list(entry["tags"].items())
        for j, (tag, cfg) in enumerate(tags):
            comma = "," if j < len(tags) - 1 else ""
            lines.append(f"        {json.dumps(tag)}: {json.dumps(cfg)}{comma}")
        lines += ["      }", "    }" + ("," if i < len(archs) - 1 else "")]
    lines += ["  },", '  "unsupported": {']
    refused = list(table["unsupported"].items())
    for i, (arch, reasons) in enumerate(refused):
        lines.append(
            f"    {json.dumps(arch)}: {json.dumps(reasons)}" + ("," if i < len(refused) - 1 else "")
        )
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
    others = {m: len(set(a) - built) for m, a in others.items() if m not in VIT_MODULES}
    others = {m: n for m, n in others.items() if n}
    listed = ", ".join(f"{m} ({n})" for m, n in sorted(others.items()))
    lines.append(f"not built, other timm model classes ({sum(others.values())}): {listed}")
    others = ("swin_transformer", "resnet", "convnext", "eva", "vitamin", "fastvit",
              "vision_transformer_hybrid")  # fmt: skip
    for module in others:
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


def main(argv: list[str] | None = None) -> None:
    """``python -m attn_vision.timm_table --write-table | --coverage`` (both import timm)."""
    parser = argparse.ArgumentParser(
        prog="python -m attn_vision.timm_table", description=main.__doc__
    )
    parser.add_argument(
        "--write-table",
        action="store_true",
        help=f"write {TABLE_PATH.name} (ViT presets + pretrained cfgs) from the installed timm",
    )
    parser.add_argument(
        "--coverage",
        action="store_true",
        help="print how many of timm's ViT architectures and pretrained tags we build",
    )
    args = parser.parse_args(argv)
    if not (args.write_table or args.coverage):
        parser.error("nothing to do (pass --write-table or --coverage)")
    if args.write_table:
        table = timm_pretrained_table()
        with hub.atomic_write(TABLE_PATH, "w") as f:
            f.write(format_table(table))
        n = sum(len(e["tags"]) for e in table["architectures"].values())
        print(f"wrote {TABLE_PATH} ({len(table['architectures'])} architectures, {n} tags)")
    if args.coverage:
        built = set(registry.list_models())
        print(coverage_report(built, set(registry.list_models(pretrained=True))))


if __name__ == "__main__":
    main()
