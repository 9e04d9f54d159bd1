"""Helpers shared by the CLIP apps (``zero_shot.py``, ``retrieval.py``, ``web.py``): building
the model a user names on the command line, and table printing. The command-line toolkit
(``attn_core.cli``) and the image decoder (``attn_vision.images``) are re-exported here."""

from __future__ import annotations

import os
import sys
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attn_core.cli import HelpFormatter, fail, one_line, run, warn  # before numpy: the hook
from attn_core.errors import InputError
from attn_vision.images import (
    IMAGE_EXTENSIONS,
    ImageError,
    check_folder,
    find_images,
    iter_images,
    load_image_file,
    open_image,
    to_rgb,
)

__all__ = [  # re-exported for the apps, from attn_core.cli / .errors and attn_vision.images
    "IMAGE_EXTENSIONS",
    "HelpFormatter",
    "ImageError",
    "InputError",
    "check_folder",
    "fail",
    "find_images",
    "iter_images",
    "load_image_file",
    "open_image",
    "run",
    "to_rgb",
    "warn",
]

DEFAULT_MODEL, DEFAULT_PRETRAINED = "ViT-B-32", "openai"
DEMO_MODEL = "demo-shapes"
PRECISIONS = ("fp32", "bf16", "fp16")


def for_cli(message: Any) -> str:
    """A CLIP library message in the words of the CLIP apps (``--pretrained PATH``,
    ``--list-models``)."""
    return one_line(message, list_option="--list-models")


def brings_weights(model: str) -> bool:
    """Whether ``--model`` names its own weights: an ``hf-hub:`` repo or a local folder (whose
    local copy is passed as ``--model FOLDER``, not ``--pretrained PATH``)."""
    return model.startswith("hf-hub:") or Path(model).is_dir()


def note(message: Any) -> None:
    """Print an informational line on stderr (as it is, one line), above any progress bar."""
    text = " ".join(str(message).split())
    if "tqdm" in sys.modules:  # a bar may be showing: tqdm.write keeps it intact
        from tqdm import tqdm

        tqdm.write(text, file=sys.stderr)
    else:
        print(text, file=sys.stderr)


def display_width(text: str) -> int:
    """Terminal columns of ``text``: East Asian wide / full-width characters take two."""
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


def pad(text: str, width: int) -> str:
    """``text`` left-aligned in ``width`` terminal columns."""
    return text + " " * max(0, width - display_width(text))


def list_models_and_exit() -> int:
    """--list-models: every model name and its pretrained tags, one per line."""
    import attn_clip

    tags: dict[str, list[str]] = {}
    for item in attn_clip.list_models(pretrained=True):
        name, _, tag = item.partition(":")
        tags.setdefault(name, []).append(tag)
    for name in attn_clip.list_models():
        print(f"{name}: {', '.join(tags.get(name, [])) or '(no pretrained tags)'}")
    return 0


# -- languages -----------------------------------------------------------------------------

LANGUAGE_HELP = (
    "language of the texts: an NLLB code (zho_Hans, deu_Latn, ...) or ISO 639-1 (zh, de, fr, "
    "es, ja, ar, hi, ru, en, ...); an NLLB tokenizer reads them as that source language"
)


def check_language(language: str | None) -> str | None:
    """--language as an NLLB code (None stays None); InputError naming the option."""
    if language is None:
        return None
    from attn_clip.languages import language_code

    try:
        return language_code(language)
    except InputError as e:
        raise InputError(f"--language: {e}") from None


def apply_language(loaded: Any, language: str | None) -> None:
    """--language: the tokenizer of ``loaded`` (a :class:`LoadedModel`, an index's
    ``IndexModel``) set to that source language (NLLB); for a tokenizer without languages a
    one-line note on stderr that its ids do not change. An image-only model (no tokenizer)
    has no texts to read: nothing to do."""
    if language is None or loaded.tokenizer is None:
        return
    from attn_clip.languages import tokenizer_for_language

    try:
        loaded.tokenizer, message = tokenizer_for_language(loaded.tokenizer, language)
    except InputError as e:
        raise InputError(f"--language: {e}") from None
    if message:
        note(message)


# -- models --------------------------------------------------------------------------------


@dataclass
class LoadedModel:
    model: Any  # attn_clip.CLIP
    preprocess: Any  # PIL image -> (3, H, W)
    tokenizer: Any  # list[str] -> (n, L)
    name: str  # what identifies the weights: the model name (or folder)
    pretrained: str | None  # tag or absolute path
    device: Any  # torch.device


def resolve_model_args(model: str | None, pretrained: str | None) -> tuple[str, str | None]:
    """``--model`` / ``--pretrained`` -> ``(name, pretrained)`` with paths made absolute.

    A folder given as ``--pretrained`` with no ``--model`` brings its own architecture
    (``open_clip_config.json`` / ``config.json``) and becomes the model.
    """
    if pretrained is not None and os.path.exists(pretrained) and not _is_tag(model, pretrained):
        pretrained = str(Path(pretrained).resolve())
    if model is None:
        if pretrained is not None and os.path.isdir(pretrained):
            return pretrained, None
        model = DEFAULT_MODEL
        if pretrained is None:
            pretrained = DEFAULT_PRETRAINED
    elif os.path.exists(model):
        model = str(Path(model).resolve())
    return model, pretrained


def _is_tag(model: str | None, pretrained: str) -> bool:
    """A pretrained tag of ``model`` wins over a file or folder of the same name here, as in
    ``attn_clip.create_model``."""
    import attn_clip

    return pretrained.lower().replace("-", "_") in attn_clip.list_pretrained_tags(
        model or DEFAULT_MODEL
    )


def _default_pretrained(name: str) -> str | None:
    """The weights to load when only ``--model`` is given: ``openai`` or the only tag
    (``demo-shapes`` has one, bundled), else an error listing the choices."""
    import attn_clip

    if name.startswith(("hf-hub:", "local-dir:")) or os.path.exists(name):
        return None  # brings its own weights
    attn_clip.get_model_config(name)  # ValueError naming close matches if unknown
    tags = attn_clip.list_pretrained_tags(name)
    if DEFAULT_PRETRAINED in tags:
        return DEFAULT_PRETRAINED
    if len(tags) == 1:
        return tags[0]
    if not tags:
        raise InputError(
            f"no pretrained weights are known for {name!r}: pass --pretrained PATH "
            f"(a checkpoint file or folder), or use --model {DEMO_MODEL} offline"
        )
    raise InputError(f"{name!r} has several pretrained tags, pick one with --pretrained: {tags}")


def pick_device(requested: str | None):
    import torch

    if requested is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(requested)
    except RuntimeError as e:
        raise InputError(f"bad --device {requested!r}: {e}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise InputError(f"--device {requested}: CUDA is not available on this machine")
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        raise InputError(f"--device {requested}: only {torch.cuda.device_count()} GPU(s) here")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise InputError(f"--device {requested}: MPS is not available on this machine")
    return device


def load_model(
    model: str | None, pretrained: str | None, device: str | None, precision: str
) -> LoadedModel:
    """Build the CLIP of ``--model`` / ``--pretrained`` (see :func:`resolve_model_args`);
    every failure a user can cause becomes an InputError with one clear line."""
    import attn_clip
    from attn_core.hub import WeightsError, WeightsUnavailableError

    name, pretrained = resolve_model_args(model, pretrained)
    dev = pick_device(device)
    try:
        weights = pretrained if pretrained is not None else _default_pretrained(name)
        m, preprocess, tokenizer = attn_clip.create_model_and_transforms(
            name, weights, device=dev, precision=precision
        )
    except WeightsUnavailableError as e:
        if brings_weights(name):  # a hub repo's local copy is a folder, passed as --model
            msg = one_line(e, path_option="--model FOLDER", list_option="--list-models")
            raise InputError(f"weights not available: {msg}") from None
        raise InputError(
            f"weights not available: {for_cli(e)} Or run offline with the bundled model: "
            f"--model {DEMO_MODEL} (or --pretrained PATH to a downloaded checkpoint)."
        ) from None
    except WeightsError as e:  # unreadable, unsafe or not fitting the model
        raise InputError(f"cannot load model {name!r}: {for_cli(e)}") from None
    except (ValueError, KeyError, TypeError, OSError, RuntimeError) as e:
        msg = for_cli(str(e).strip("'\""))
        raise InputError(msg if name in msg or "unknown" in msg else f"{name}: {msg}") from None
    label = pretrained if isinstance(pretrained, str) else None
    if label is None and isinstance(weights, str):
        label = weights
    return LoadedModel(m, preprocess, tokenizer, name, label, dev)
