"""Hugging Face transformers vision checkpoints: a folder's ``config.json`` -> our model.

A folder that transformers' ``save_pretrained`` wrote (``config.json`` with a
``model_type``, ``model.safetensors`` or ``pytorch_model.bin``, sharded or not) is read by
the module of :mod:`attn_vision.hf` that converts its ``model_type``; the modules are
listed in :data:`MODULES` and imported lazily (one not built yet is skipped, and the
coverage listing says so). Each module exposes::

    MODEL_TYPES: tuple[str, ...]            # transformers model_type values it reads
    ARCHITECTURES: dict[str, tuple[str, ...]]  # model_type -> the classes that load
    REFUSED_ARCHITECTURES: dict[str, str]   # class -> why it is refused
    config_from_hf(hf: Mapping, state_dict_keys) -> tuple[str, Any]  # (family, our config)
    convert_hf(state_dict, hf) -> dict      # strict: every key used; missing keys named

``family`` is a key of :data:`attn_vision.families.FAMILIES`; ``create_model(folder)``
(:mod:`attn_vision.registry`) builds that model and loads the converted weights. See what
loads and what is refused, and why::

    python -m attn_vision.hf --coverage
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from types import ModuleType
from typing import Any

__all__ = ["MODULES", "coverage_report", "hf_module", "is_hf_config", "model_types"]

# the converter modules, in the order the coverage listing shows them
MODULES = ("vit", "swin", "beit", "convnext", "resnet")


def _load(name: str) -> ModuleType | None:
    """``attn_vision.hf.<name>``, or None if that module is not built yet."""
    try:
        return importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as e:
        if e.name != f"{__name__}.{name}":  # the module exists but an import inside failed
            raise
        return None


def model_types() -> dict[str, str]:
    """transformers ``model_type`` -> the name of the module in :data:`MODULES` reading it."""
    found: dict[str, str] = {}
    for name in MODULES:
        module = _load(name)
        for model_type in getattr(module, "MODEL_TYPES", ()):
            found[model_type] = name
    return found


def is_hf_config(config: Mapping[str, Any]) -> bool:
    """Whether a parsed ``config.json`` is transformers' (it has a ``model_type``)."""
    return isinstance(config, Mapping) and "model_type" in config


def hf_module(hf: Mapping[str, Any]) -> ModuleType:
    """The converter module for a transformers ``config.json``; ``ValueError`` naming the
    ``model_type`` and those that load when no module reads it."""
    model_type = hf.get("model_type")
    types = model_types()
    if model_type not in types:
        raise ValueError(
            f"transformers model_type={model_type!r} is not supported by attn_vision; "
            f"supported: {', '.join(sorted(types))} (python -m attn_vision.hf --coverage)"
        )
    module = _load(types[model_type])
    assert module is not None
    return module


def coverage_report() -> str:
    """Which transformers vision architectures load, which are refused and why, and the
    converter modules not built yet: one line each."""
    lines, missing = [], []
    for name in MODULES:
        module = _load(name)
        if module is None:
            missing.append(name)
            continue
        for model_type in module.MODEL_TYPES:
            archs = module.ARCHITECTURES.get(model_type, ())
            if archs:  # (a model_type whose every class is refused has only refused lines)
                lines.append(f"loads   {model_type}: {', '.join(archs)}")
        for arch, why in module.REFUSED_ARCHITECTURES.items():
            lines.append(f"refused {arch}: {why}")
    lines.append(f"not built yet: {', '.join(f'attn_vision.hf.{m}' for m in missing) or 'none'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``python -m attn_vision.hf --coverage``: print :func:`coverage_report`."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m attn_vision.hf",
        description="Hugging Face vision checkpoints in attn_vision",
    )
    parser.add_argument("--coverage", action="store_true", help="what loads, what is refused")
    args = parser.parse_args(argv)
    if not args.coverage:
        parser.error("nothing to do (pass --coverage)")
    print(coverage_report())
    return 0
