"""Model names and pretrained tags: open_clip's registry, as a table shipped with attn_clip.

``list_models()`` is every open_clip architecture attn_clip can build (the ViT CLIPs:
``ViT-B-32``, ``ViT-B-16``, ``ViT-L-14``, ``ViT-H-14``, ``ViT-bigG-14``, the
``-quickgelu`` variants, ...; SigLIP / SigLIP2: ``ViT-B-16-SigLIP``,
``ViT-SO400M-14-SigLIP-384``, ...; ConvNeXt: ``convnext_base_w``, ``convnext_large_d``,
...; OpenAI's ResNets: ``RN50``, ``RN50x4``, ...; EVA-CLIP: ``EVA02-B-16``, ``EVA01-g-14``,
...; ViTamin: ``ViTamin-S``, ``ViTamin-L2-384``, ...; PE-Core: ``PE-Core-B-16``, ...;
``swin_base_patch4_window7_224``, ``vit_medium_patch16_gap_256``; the Hugging Face text towers:
``xlm-roberta-base-ViT-B-32``, ``nllb-clip-base``, ``mt5-xl-ViT-H-14``, ..., whose encoder
architecture attn_nlp ships) plus attn_clip's bundled models;
``list_pretrained()`` the open_clip ``(name, tag)`` pairs; ``get_pretrained_cfg(name, tag)``
says where open_clip would download the weights from and how images must be preprocessed
for them.

The names, model configs and pretrained locations are read from ``open_clip_registry.json``
next to this file, so none of this imports open_clip (which takes seconds). That file,
and ``imagenet_zero_shot.json`` (OpenAI's ImageNet class names and prompt templates, for
:mod:`attn_clip.zero_shot`), are generated from the installed open_clip::

    uv run python -m attn_clip.registry --write   # rebuild both files
    uv run python -m attn_clip.registry --check   # exit 1 if they differ from open_clip's
    uv run python -m attn_clip.registry --coverage  # what attn_clip builds (no open_clip)

(``tests/clip/test_registry.py`` runs the check, so an open_clip upgrade that changes
them, or a config feature attn_clip learns, fails until the files are rebuilt.) The
SigLIP, ConvNeXt, EVA, PE-Core, Swin and ViTamin image towers are timm models named in
open_clip's configs: attn_vision's presets of those names (:mod:`attn_clip.config_timm`).

attn_clip also has *bundled* models of its own, whose weights ship inside the package
(no network): ``demo-shapes``, a small CLIP trained by ``scripts/train_clip.py`` on the
generated shapes of ``attn_train.shapes``, and ``demo-shapes-coca``, a small CoCa (captions)
trained the same way (tag ``shapes``, the default for ``pretrained=True``).
"""

from __future__ import annotations

import argparse
import copy
import difflib
import fnmatch
import functools
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .config import OPENAI_DATASET_MEAN, OPENAI_DATASET_STD, CLIPConfig, PreprocessConfig

__all__ = [
    "BUNDLED_MODELS",
    "PretrainedSource",
    "build_tables",
    "clean_tag",
    "coverage",
    "default_pretrained_tag",
    "get_model_config",
    "get_pretrained_cfg",
    "list_models",
    "list_pretrained",
    "list_pretrained_tags",
]

HF_WEIGHTS_NAME = "open_clip_pytorch_model.bin"
HF_SAFE_WEIGHTS_NAME = "open_clip_model.safetensors"


@dataclass(frozen=True)
class PretrainedSource:
    """Where a ``(model, tag)`` checkpoint lives and what it expects."""

    model: str  # open_clip architecture name, e.g. "ViT-B-32"
    tag: str  # pretrained tag, e.g. "laion2b_s34b_b79k"
    hf_hub_id: str  # Hugging Face repo id, e.g. "laion/CLIP-ViT-B-32-laion2B-s34B-b79K"
    filenames: tuple[str, ...]  # files to try in order (safetensors first, as open_clip does)
    url: str = ""  # the original (non-hub) download URL, for reference
    quick_gelu: bool = False  # the weights were trained with QuickGELU
    preprocess: PreprocessConfig = field(default_factory=PreprocessConfig)
    file: str = ""  # a weights file shipped inside attn_clip (bundled models): no download


@dataclass(frozen=True)
class BundledModel:
    """A model of attn_clip's own: an open_clip-style config and weights in the package."""

    config: dict  # open_clip model config (``embed_dim``, ``vision_cfg``, ``text_cfg``)
    weights: dict[str, str]  # pretrained tag -> file name under attn_clip/weights/
    preprocess: PreprocessConfig  # how images must be prepared for the weights


WEIGHTS_DIR = Path(__file__).parent / "weights"

BUNDLED_MODELS: dict[str, BundledModel] = {
    # 48 px images, 8 px patches (36 patches + class token); a 3-block, 128-wide ViT and a
    # 2-block, 32-wide causal text tower over OpenAI's BPE; ~2.2 M parameters (~4.5 MB fp16).
    "demo-shapes": BundledModel(
        config={
            "embed_dim": 64,
            "vision_cfg": {
                "image_size": 48,
                "patch_size": 8,
                "width": 128,
                "layers": 3,
                "head_width": 32,
                "mlp_ratio": 4.0,
            },
            "text_cfg": {
                "context_length": 24,
                "vocab_size": 49408,
                "width": 32,
                "heads": 2,
                "layers": 2,
                "mlp_ratio": 4.0,
            },
        },
        weights={"shapes": "demo-shapes.safetensors"},
        preprocess=PreprocessConfig(size=48),
    ),
    # a CoCa captioner on the same shapes: demo-shapes' ViT (its trained trunk was the start)
    # with an attentional pooler (16 queries: 1 contrastive, 15 image tokens for the decoder),
    # a 2-block text tower with an appended CLS and a 2-block multimodal decoder, all 32 wide
    # (the pooler's width = the decoder's = the text tower's); ~3.9 M parameters, 3.2 M of
    # them the two BPE tables (token embedding, vocabulary projection).
    "demo-shapes-coca": BundledModel(
        config={
            "embed_dim": 32,
            "vision_cfg": {
                "image_size": 48,
                "patch_size": 8,
                "width": 128,
                "layers": 3,
                "head_width": 32,
                "mlp_ratio": 4.0,
                "attentional_pool": True,
                "attn_pooler_queries": 16,
                "attn_pooler_heads": 2,
                "output_tokens": True,
            },
            "text_cfg": {
                "context_length": 16,
                "vocab_size": 49408,
                "width": 32,
                "heads": 2,
                "layers": 2,
                "mlp_ratio": 4.0,
                "embed_cls": True,
                "output_tokens": True,
            },
            "multimodal_cfg": {
                "context_length": 16,
                "vocab_size": 49408,
                "width": 32,
                "heads": 2,
                "layers": 2,
            },
            "custom_text": True,
        },
        weights={"shapes": "demo-shapes-coca.safetensors"},
        preprocess=PreprocessConfig(size=48),
    ),
}


def _safe_alternatives(filename: str) -> list[str]:
    """The ``.safetensors`` names open_clip tries before a ``.bin`` / ``.pth`` file."""
    if filename == HF_WEIGHTS_NAME:
        return [HF_SAFE_WEIGHTS_NAME]
    if filename.endswith((".bin", ".pth")):
        return [filename[:-4] + ".safetensors"]
    return []


TABLE_FILE = Path(__file__).with_name("open_clip_registry.json")
ZERO_SHOT_FILE = Path(__file__).with_name("imagenet_zero_shot.json")
# The pretrained-config fields attn_clip uses, with open_clip's defaults (its ``_pcfg``).
PRETRAINED_FIELDS: dict[str, Any] = {
    "hf_hub": "",
    "url": "",
    "quick_gelu": False,
    "mean": list(OPENAI_DATASET_MEAN),
    "std": list(OPENAI_DATASET_STD),
    "interpolation": "bicubic",
    "resize_mode": "shortest",
}


@functools.cache
def _table() -> dict[str, Any]:
    """The shipped copy of open_clip's registry (``models``, ``unsupported``, ``pretrained``,
    ``unsupported_pretrained``)."""
    with open(TABLE_FILE, encoding="utf-8") as f:
        return json.load(f)


def clean_tag(tag: str) -> str:
    """open_clip's tag normalization: ``"LAION2B-s34b"`` -> ``"laion2b_s34b"``."""
    return tag.lower().replace("-", "_")


def _matches(pattern: str | None, *names: str) -> bool:
    return pattern is None or any(fnmatch.fnmatchcase(n, pattern) for n in names)


def list_models(pattern: str | None = None, pretrained: bool = False) -> list[str]:
    """Names attn_clip can build: open_clip's ViT CLIPs, then the bundled models.

    ``pattern`` is a glob on the names (``"ViT-B-*"``). ``pretrained=True`` lists
    ``"name:tag"`` for every pretrained checkpoint instead (bundled ones included); there
    the pattern may match the name (``"ViT-B-32"``) or the whole string (``"*:openai"``).
    """
    if not pretrained:
        return [n for n in [*_table()["models"], *BUNDLED_MODELS] if _matches(pattern, n)]
    bundled = [(n, t) for n, b in BUNDLED_MODELS.items() for t in b.weights]
    pairs = [*list_pretrained(), *bundled]
    return [f"{n}:{t}" for n, t in pairs if _matches(pattern, n, f"{n}:{t}")]


def get_model_config(name: str) -> CLIPConfig:
    """The :class:`CLIPConfig` of an open_clip architecture name; clear error if unknown."""
    if name in BUNDLED_MODELS:
        return CLIPConfig.from_open_clip(BUNDLED_MODELS[name].config)
    table = _table()
    if name in table["models"]:
        return CLIPConfig.from_open_clip(copy.deepcopy(table["models"][name]))
    if name in table["unsupported"]:
        raise ValueError(
            f"model {name!r} cannot be built by attn_clip: {table['unsupported'][name]}"
        )
    names = list_models()
    lower = {n.lower(): n for n in names}  # "vit-b-32" means ViT-B-32 before ViT-S-32
    close = [lower[m] for m in difflib.get_close_matches(name.lower(), list(lower), n=5)]
    hint = f"; did you mean {close}?" if close else "; see attn_clip.list_models()"
    raise ValueError(f"unknown model {name!r}{hint}")


def list_pretrained(as_str: bool = False) -> list[tuple[str, str]] | list[str]:
    """``(name, tag)`` pairs (or ``"name:tag"`` strings) of every buildable open_clip model."""
    pairs = [(m, t) for m, tags in _table()["pretrained"].items() for t in tags]
    return [f"{m}:{t}" for m, t in pairs] if as_str else pairs


def list_pretrained_tags(name: str) -> list[str]:
    """The pretrained tags of one architecture (empty if it has none)."""
    if name in BUNDLED_MODELS:
        return list(BUNDLED_MODELS[name].weights)
    return list(_table()["pretrained"].get(name, {}))


def default_pretrained_tag(name: str) -> str | None:
    """The tag ``pretrained=True`` means: a bundled model's own weights (else None)."""
    bundled = BUNDLED_MODELS.get(name)
    return next(iter(bundled.weights)) if bundled else None


def get_pretrained_cfg(name: str, tag: str) -> PretrainedSource:
    """Resolve ``(name, tag)`` to the hub repo/file open_clip downloads and its preprocessing.

    For a bundled model the source is the file inside the package (``file``).
    """
    bundled = BUNDLED_MODELS.get(name)
    if bundled is not None:
        if tag not in bundled.weights:
            raise ValueError(
                f"unknown pretrained tag {tag!r} for {name!r}; known tags: {list(bundled.weights)}"
            )
        filename = bundled.weights[tag]
        return PretrainedSource(
            model=name,
            tag=tag,
            hf_hub_id="",
            filenames=(filename,),
            preprocess=bundled.preprocess,
            file=str(WEIGHTS_DIR / filename),
        )
    cfg = _table()["pretrained"].get(name, {}).get(clean_tag(tag))
    if cfg is None:
        tags = list_pretrained_tags(name)
        raise ValueError(
            f"unknown pretrained tag {tag!r} for {name!r}; known tags: {tags or 'none'} "
            "(or pass pretrained=<path to a checkpoint file>)"
        )
    if not cfg["hf_hub"]:
        raise ValueError(f"{name}:{tag} has no Hugging Face hub location (url: {cfg['url']})")
    repo_id, filename = os.path.split(cfg["hf_hub"])  # "org/repo/" -> ("org/repo", "")
    filename = filename or HF_WEIGHTS_NAME
    return PretrainedSource(
        model=name,
        tag=tag,
        hf_hub_id=repo_id,
        filenames=(*_safe_alternatives(filename), filename),
        url=cfg["url"],
        quick_gelu=cfg["quick_gelu"],
        preprocess=PreprocessConfig(
            size=get_model_config(name).vision.image_size,
            mean=cfg["mean"],
            std=cfg["std"],
            interpolation=cfg["interpolation"],
            resize_mode=cfg["resize_mode"],
        ),
    )


# -- generating the shipped tables from the installed open_clip ---------------------------


def build_tables() -> dict[str, dict[str, Any]]:
    """The shipped tables, computed from the installed open_clip: ``{file name: content}``.

    Imports open_clip. A model goes into ``models`` when :meth:`CLIPConfig.from_open_clip`
    accepts its config, else into ``unsupported`` with the reason; ``pretrained`` keeps
    the tags of the buildable models only, with the fields in ``PRETRAINED_FIELDS``.
    """
    import open_clip
    import open_clip.pretrained as oc_pretrained
    from open_clip.zero_shot_metadata import IMAGENET_CLASSNAMES, OPENAI_IMAGENET_TEMPLATES

    configs = {name: open_clip.get_model_config(name) for name in open_clip.list_models()}
    models: dict[str, Any] = {}
    unsupported: dict[str, str] = {}
    for name, cfg in configs.items():
        try:
            CLIPConfig.from_open_clip(copy.deepcopy(cfg))
        except (ValueError, TypeError, KeyError) as e:
            unsupported[name] = str(e)
        else:
            models[name] = cfg
    pretrained: dict[str, dict[str, Any]] = {}
    unsupported_pretrained: dict[str, list[str]] = {}
    for name, tag in oc_pretrained.list_pretrained():
        if name in models:
            cfg = oc_pretrained.get_pretrained_cfg(name, tag)
            entry = {k: cfg.get(k, default) for k, default in PRETRAINED_FIELDS.items()}
            pretrained.setdefault(name, {})[tag] = entry
        else:
            unsupported_pretrained.setdefault(name, []).append(tag)

    # the templates are lambdas there; as format strings they give the same prompts
    templates = [t("{}") for t in OPENAI_IMAGENET_TEMPLATES]
    for t, fmt in zip(OPENAI_IMAGENET_TEMPLATES, templates, strict=True):
        if any(t(c) != fmt.format(c) for c in IMAGENET_CLASSNAMES):
            raise ValueError(f"template {fmt!r} is not a plain format string")
    tables = {
        TABLE_FILE.name: {
            "open_clip_version": open_clip.__version__,
            "models": models,
            "unsupported": unsupported,
            "pretrained": pretrained,
            "unsupported_pretrained": unsupported_pretrained,
        },
        ZERO_SHOT_FILE.name: {
            "open_clip_version": open_clip.__version__,
            "imagenet_classnames": list(IMAGENET_CLASSNAMES),
            "openai_imagenet_templates": templates,
        },
    }
    return json.loads(json.dumps(tables))  # tuples -> lists: exactly what a reload gives


# families counted on their own by ``coverage()``: label, test on the open_clip name
COVERAGE_FAMILIES = (
    ("SigLIP / SigLIP2", lambda n: "siglip" in n.lower()),
    ("ConvNeXt", lambda n: n.startswith("convnext_")),
    ("OpenAI ResNet (RN*)", lambda n: n.startswith("RN")),
    ("EVA-CLIP (EVA01 / EVA02)", lambda n: n.startswith("EVA")),
    ("ViTamin", lambda n: n.startswith("ViTamin")),
    ("PE-Core (Perception Encoder)", lambda n: n.startswith("PE-Core")),
    ("MobileCLIP / MobileCLIP2 (FastViT / MCi)", lambda n: n.startswith("MobileCLIP")),
    (
        "Hugging Face text towers (XLM-R, RoBERTa, NLLB, mT5)",
        lambda n: n.startswith(("xlm-roberta-", "roberta-", "nllb-clip-", "mt5-", "coca_roberta-")),
    ),
)


def coverage() -> str:
    """How many of open_clip's model configs and pretrained tags attn_clip builds, from
    the shipped table (imports nothing): overall, per family (SigLIP / SigLIP2, ConvNeXt,
    ResNet, EVA, ViTamin, PE-Core, Hugging Face text towers), and why the rest is refused."""
    table = _table()
    models, unsupported = table["models"], table["unsupported"]
    pretrained, refused_tags = table["pretrained"], table["unsupported_pretrained"]
    n_tags = sum(len(t) for t in pretrained.values())
    n_all_tags = n_tags + sum(len(t) for t in refused_tags.values())
    lines = [
        f"open_clip {table['open_clip_version']}: attn_clip builds {len(models)} of "
        f"{len(models) + len(unsupported)} model configs and {n_tags} of {n_all_tags} "
        "pretrained tags",
    ]
    for label, is_member in COVERAGE_FAMILIES:
        names = [n for n in [*models, *unsupported] if is_member(n)]
        built = [n for n in names if n in models]
        tags = sum(len(pretrained.get(n, {})) for n in built)
        all_tags = tags + sum(len(refused_tags.get(n, [])) for n in names)
        lines.append(f"  {label}: {len(built)} of {len(names)} configs, {tags} of {all_tags} tags")
    if not unsupported:
        lines.append("not built: none")
        return "\n".join(lines)
    lines.append(f"not built ({len(unsupported)} configs), by the first feature refused:")
    reasons: dict[str, list[str]] = {}
    for name, why in unsupported.items():
        first = why.split(": ", 1)[-1].split(", ")[0].split(" (")[0].split("=")[0]
        reasons.setdefault(first, []).append(name)
    for reason, names in sorted(reasons.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        shown = ", ".join(names[:4]) + (", ..." if len(names) > 4 else "")
        lines.append(f"  {len(names):>3}  {reason}: {shown}")
    return "\n".join(lines)


def _dumps(content: dict[str, Any]) -> str:
    return json.dumps(content, indent=1, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    """``python -m attn_clip.registry --write | --check | --coverage``."""
    parser = argparse.ArgumentParser(
        prog="python -m attn_clip.registry",
        description="Rebuild (--write) or verify (--check) attn_clip's copies of open_clip's "
        "registry and zero-shot tables from the installed open_clip, or print "
        "how much of open_clip's registry attn_clip builds (--coverage).",
    )
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--write", action="store_true", help="rewrite the shipped JSON files")
    action.add_argument("--check", action="store_true", help="exit 1 if they are out of date")
    action.add_argument(
        "--coverage", action="store_true", help="count the configs and tags attn_clip builds"
    )
    args = parser.parse_args(argv)
    if args.coverage:
        print(coverage())
        return 0
    folder = TABLE_FILE.parent
    stale = []
    for name, content in build_tables().items():
        path = folder / name
        text = _dumps(content)
        if path.is_file() and path.read_text(encoding="utf-8") == text:
            continue
        stale.append(name)
        if args.write:
            from attn_core.hub import atomic_write

            with atomic_write(path, "w") as f:
                f.write(text)
            print(f"wrote {path}")
    if args.check and stale:
        print(f"out of date: {', '.join(stale)} (run: python -m attn_clip.registry --write)")
        return 1
    if not stale:
        print("up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
