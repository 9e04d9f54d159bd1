"""Helpers shared by the CLIP apps (``zero_shot.py``, ``retrieval.py``): one-line errors,
robust image reading, and building the model a user names on the command line."""

from __future__ import annotations

__all__ = [  # the image names are attn_vision.images', InputError attn_core.errors'
    "IMAGE_EXTENSIONS",
    "ImageError",
    "InputError",
    "check_folder",
    "find_images",
    "iter_images",
    "load_image_file",
    "open_image",
    "to_rgb",
]

import argparse
import os
import signal
import sys
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from attn_core.errors import InputError
from attn_vision.images import (  # the one image decoder (re-exported for the apps)
    IMAGE_EXTENSIONS,
    ImageError,
    check_folder,
    find_images,
    iter_images,
    load_image_file,
    open_image,
    to_rgb,
)

DEFAULT_MODEL, DEFAULT_PRETRAINED = "ViT-B-32", "openai"
DEMO_MODEL = "demo-shapes"
PRECISIONS = ("fp32", "bf16", "fp16")


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """--help keeps the docstring's layout and shows each option's default (those that are
    not None / False and not already named in the help text)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if default in (None, False, [], argparse.SUPPRESS) or "default" in text:
            return text
        return f"{text} (default: %(default)s)"


def fail(message: str) -> int:
    print(f"error: {' '.join(str(message).split())}", file=sys.stderr)  # always one line
    return 2


def _interrupted_while_loading(signum: int, frame: object) -> None:
    print("interrupted", file=sys.stderr)
    raise SystemExit(130)


# An app run as a command (not imported by the tests): Ctrl-C while torch is still loading is
# one line and exit 130 too; run() puts Python's handler back. An ignored SIGINT stays so.
_main = getattr(sys.modules.get("__main__"), "__file__", None)
if _main is not None and Path(_main).resolve().parent == Path(__file__).resolve().parent:
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _interrupted_while_loading)


def run(main: Callable[[], int]) -> NoReturn:
    """``sys.exit(main())``, with Ctrl-C as one line on stderr and exit code 130."""
    if signal.getsignal(signal.SIGINT) is _interrupted_while_loading:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        code = main()
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        code = 130
    sys.exit(code)


def for_cli(message: str) -> str:
    """A library message in the words of the command line (``--pretrained PATH``)."""
    return (
        str(message)
        .replace("(pretrained=<path>)", "(--pretrained PATH)")
        .replace("pretrained=<path>", "--pretrained PATH")
        .replace("see attn_clip.list_models()", "see --list-models")
    )


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


def warn(message: str) -> None:
    print(f"warning: {' '.join(str(message).split())}", file=sys.stderr)


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
