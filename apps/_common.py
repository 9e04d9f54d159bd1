"""Helpers shared by the CLIP apps (``zero_shot.py``, ``retrieval.py``): one-line errors,
robust image reading, and building the model a user names on the command line."""

from __future__ import annotations

import argparse
import hashlib
import io
import math
import os
import signal
import sys
import unicodedata
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

DEFAULT_MODEL, DEFAULT_PRETRAINED = "ViT-B-32", "openai"
DEMO_MODEL = "demo-shapes"
IMAGE_EXTENSIONS = frozenset(
    ".jpg .jpeg .jpe .png .bmp .gif .webp .tif .tiff .ppm .pgm .pbm .pnm .jfif".split()
)
PRECISIONS = ("fp32", "bf16", "fp16")


class InputError(ValueError):
    """Bad user input: reported as one line on stderr with exit code 2."""


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


# -- images --------------------------------------------------------------------------------


def to_rgb(img: Image.Image) -> Image.Image:
    """Any Pillow mode -> 8-bit RGB: alpha is composited on white, 16-bit / 32-bit / float
    grey levels are rescaled (not clipped), CMYK / YCbCr / palette / 1-bit are converted."""
    mode = img.mode
    if mode.startswith("I;16") or mode in ("I", "F"):
        a = np.asarray(img, dtype=np.float32)
        if mode == "F" and a.size and a.max() <= 1.0:
            top = 1.0  # float image in [0, 1]
        else:
            top = 65535.0 if mode.startswith("I;16") or (a.size and a.max() > 255) else 255.0
        grey = np.clip(a / top * 255.0, 0, 255).round().astype(np.uint8)
        return Image.fromarray(grey, "L").convert("RGB")
    if mode in ("RGBA", "LA", "La", "RGBa", "PA") or (mode == "P" and "transparency" in img.info):
        rgba = img.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    if mode == "RGB":
        return img
    try:
        return img.convert("RGB")
    except (ValueError, OSError) as e:
        raise InputError(f"unsupported image mode {mode!r}: {e}") from None


MAX_FILE_BYTES = 1 << 30  # larger "images" are refused before reading them
MAX_SIDE = 1 << 15  # pixels per side; checked from the header, before decoding
MAX_ASPECT = 100  # longer side / shorter side
DRAFT_SIDE = 4096  # JPEGs larger than this square are decoded at 1/2, 1/4 or 1/8 scale


def load_image_file(path: str | os.PathLike, draft: int | None = None) -> tuple[Image.Image, str]:
    """Read and decode ``path``: ``(RGB image with EXIF rotation applied, SHA-256 of the
    file)``, or raise InputError saying what is wrong: missing, a folder, not an image,
    truncated / corrupt, so large it could be a decompression bomb (Pillow's warning is
    treated as an error too), or of extreme size or aspect ratio (checked from the header,
    before decoding). JPEGs above ``DRAFT_SIDE`` squared pixels are decoded at a reduced
    scale (Pillow's draft mode), their longer side still >= ``DRAFT_SIDE``; with ``draft``
    (the model's input side) at the smallest scale whose shorter side stays >= ``draft``."""
    p = Path(path)
    if not p.exists():
        raise InputError(f"image not found: {path}")
    if p.is_dir():
        raise InputError(f"{path} is a folder, not an image (use --images DIR for folders)")
    try:
        if p.stat().st_size > MAX_FILE_BYTES:
            raise InputError(f"{path}: file larger than {MAX_FILE_BYTES >> 20} MiB")
        data = p.read_bytes()
    except OSError as e:
        raise InputError(f"{path}: cannot read: {e.strerror or e}") from None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as img:
                _check_geometry(img.size)  # from the header: nothing decoded yet
                scale = 1.0
                if img.width * img.height > DRAFT_SIDE**2:  # longer side stays >= DRAFT_SIDE
                    scale = DRAFT_SIDE / max(img.size)
                if draft:  # shorter side stays >= the model's input (either way up)
                    scale = min(scale, draft / min(img.size))
                if img.format == "JPEG" and scale < 1:
                    img.draft("RGB", (math.ceil(img.width * scale), math.ceil(img.height * scale)))
                img.load()
                img = to_rgb(ImageOps.exif_transpose(img))
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        raise InputError(f"{path}: refusing a decompression-bomb sized image: {e}") from None
    except UnidentifiedImageError:
        raise InputError(f"{path}: not an image (or a format Pillow cannot read)") from None
    except InputError as e:
        raise InputError(f"{path}: {e}") from None
    except Exception as e:  # truncated data, broken chunks, bad EXIF: Pillow raises many types
        what = "truncated image" if "truncated" in str(e) else "corrupt image"
        raise InputError(f"{path}: {what} ({type(e).__name__}: {e})") from None
    return img, hashlib.sha256(data).hexdigest()


def _check_geometry(size: tuple[int, int]) -> None:
    w, h = size
    if max(w, h) > MAX_SIDE:
        raise InputError(f"refusing a {w}x{h} image: sides above {MAX_SIDE} pixels")
    if min(w, h) == 0 or max(w, h) / min(w, h) > MAX_ASPECT:
        raise InputError(f"refusing a {w}x{h} image: aspect ratio above {MAX_ASPECT}:1")


def open_image(path: str | os.PathLike) -> Image.Image:
    """:func:`load_image_file` without the hash."""
    return load_image_file(path)[0]


def iter_images(
    paths: list[Path],
    workers: int = 4,
    transform: Callable | None = None,
    draft: int | None = None,
):
    """``(path, image, sha256, error)`` for each path, in order, decoded by a thread pool
    (``error`` is the InputError message and ``image`` None for an unreadable file). With
    ``transform`` the workers apply it and ``image`` is its result (e.g. the model's input
    tensor): the decoded pictures are dropped at once, so memory stays that of the inputs.
    ``draft``: see :func:`load_image_file`."""
    from concurrent.futures import ThreadPoolExecutor

    def load(path: Path):
        try:
            image, digest = load_image_file(path, draft)
        except InputError as e:
            return path, None, None, str(e)
        return path, transform(image) if transform is not None else image, digest, None

    if workers <= 1:
        yield from map(load, paths)
        return
    with ThreadPoolExecutor(workers) as pool:
        window = workers * 4  # bounded read-ahead: memory stays flat on huge folders
        for start in range(0, len(paths), window):
            yield from pool.map(load, paths[start : start + window])


def check_folder(root: Path) -> None:
    """InputError unless ``root`` is a folder (a file there gets its own message)."""
    if root.is_file():
        raise InputError(f"{root} is a file, not a folder of images (use --image for one file)")
    if not root.is_dir():
        raise InputError(f"image folder not found: {root}")


def find_images(root: str | os.PathLike) -> list[Path]:
    """Every file with an image extension under ``root`` (recursive, sorted, no hidden dirs)."""
    root = Path(root)
    check_folder(root)
    found = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        found += [
            Path(dirpath) / f
            for f in filenames
            if Path(f).suffix.lower() in IMAGE_EXTENSIONS and not f.startswith(".")
        ]
    return sorted(found)


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
