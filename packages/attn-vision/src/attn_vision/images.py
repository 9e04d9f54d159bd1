"""The one image decoder of attn-zoo: apps, training data sets and the web page all read
images here, so an image is the same input everywhere.

:func:`load_image_file` -> an 8-bit RGB image with EXIF rotation applied, alpha composited
on white, 16-bit / 32-bit / float grey levels rescaled (see :func:`to_rgb`), and the file's
SHA-256. Anything a user can get wrong -- missing, a folder, empty, not an image, truncated,
a decompression bomb, extreme size or aspect ratio -- is an :class:`ImageError` (a
``ValueError``; an ``attn_core.errors.InputError``, which the apps report as one line).

:func:`find_images` lists a folder's images, :func:`read_captions_csv` the image-caption
pairs of a CSV (what training data sets and the retrieval app's ``eval`` read).

Imports Pillow and numpy only (no torch).
"""

from __future__ import annotations

import csv
import hashlib
import io
import math
import os
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
from attn_core.errors import InputError
from PIL import Image, ImageOps, UnidentifiedImageError

__all__ = [
    "CAPTION_COLUMNS",
    "DRAFT_SIDE",
    "IMAGE_COLUMNS",
    "IMAGE_EXTENSIONS",
    "MAX_ASPECT",
    "MAX_FILE_BYTES",
    "MAX_SIDE",
    "ImageError",
    "decode_image",
    "check_folder",
    "find_images",
    "iter_images",
    "load_image_file",
    "open_image",
    "read_captions_csv",
    "to_rgb",
]

IMAGE_EXTENSIONS = frozenset(
    ".jpg .jpeg .jpe .png .bmp .gif .webp .tif .tiff .ppm .pgm .pbm .pnm .jfif".split()
)
MAX_FILE_BYTES = 1 << 30  # larger "images" are refused before reading them
MAX_SIDE = 1 << 15  # pixels per side; checked from the header, before decoding
MAX_ASPECT = 100  # longer side / shorter side
DRAFT_SIDE = 4096  # JPEGs larger than this square are decoded at 1/2, 1/4 or 1/8 scale


class ImageError(InputError):
    """An image file that cannot be used (the message names the file and what is wrong)."""


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
        raise ImageError(f"unsupported image mode {mode!r}: {e}") from None


def load_image_file(path: str | os.PathLike, draft: int | None = None) -> tuple[Image.Image, str]:
    """Read and decode ``path``: ``(RGB image with EXIF rotation applied, SHA-256 of the
    file)``, or raise :class:`ImageError` saying what is wrong: missing, a folder, empty, not
    an image, truncated / corrupt, so large it could be a decompression bomb (Pillow's
    warning is treated as an error too), or of extreme size or aspect ratio (checked from
    the header, before decoding). JPEGs above ``DRAFT_SIDE`` squared pixels are decoded at a
    reduced scale (Pillow's draft mode), their longer side still >= ``DRAFT_SIDE``; with
    ``draft`` (the model's input side) at the smallest scale whose shorter side stays
    >= ``draft``."""
    data = _read(path)
    return decode_image(data, path, draft), hashlib.sha256(data).hexdigest()


def open_image(path: str | os.PathLike, draft: int | None = None) -> Image.Image:
    """:func:`load_image_file` without the hash (what training data sets read)."""
    return decode_image(_read(path), path, draft)


def _read(path: str | os.PathLike) -> bytes:
    p = Path(path)
    if not p.exists():
        raise ImageError(f"image not found: {path}")
    if p.is_dir():
        raise ImageError(f"{path} is a folder, not an image (use --images DIR for folders)")
    try:
        if p.stat().st_size > MAX_FILE_BYTES:
            raise ImageError(f"{path}: file larger than {MAX_FILE_BYTES >> 20} MiB")
        data = p.read_bytes()
    except OSError as e:
        raise ImageError(f"{path}: cannot read: {e.strerror or e}") from None
    if not data:
        raise ImageError(f"{path}: empty file (0 bytes), not an image")
    return data


def decode_image(data: bytes, path: str | os.PathLike, draft: int | None = None) -> Image.Image:
    """Decode image file bytes (``path`` names them in errors) with the checks and draft
    scaling of :func:`load_image_file`: the one decoder for files, shard members and
    uploaded bytes."""
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
                return to_rgb(ImageOps.exif_transpose(img))
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        raise ImageError(f"{path}: refusing a decompression-bomb sized image: {e}") from None
    except UnidentifiedImageError:
        raise ImageError(f"{path}: not an image (or a format Pillow cannot read)") from None
    except ImageError as e:
        raise ImageError(f"{path}: {e}") from None
    except Exception as e:  # truncated data, broken chunks, bad EXIF: Pillow raises many types
        what = "truncated image" if "truncated" in str(e) else "corrupt image"
        raise ImageError(f"{path}: {what} ({type(e).__name__}: {e})") from None


def _check_geometry(size: tuple[int, int]) -> None:
    w, h = size
    if max(w, h) > MAX_SIDE:
        raise ImageError(f"refusing a {w}x{h} image: sides above {MAX_SIDE} pixels")
    if min(w, h) == 0 or max(w, h) / min(w, h) > MAX_ASPECT:
        raise ImageError(f"refusing a {w}x{h} image: aspect ratio above {MAX_ASPECT}:1")


def iter_images(
    paths: list[Path],
    workers: int = 4,
    transform: Callable[[Image.Image], Any] | None = None,
    draft: int | None = None,
) -> Iterator[tuple[Path, Any, str | None, str | None]]:
    """``(path, image, sha256, error)`` for each path, in order, decoded by a thread pool
    (``error`` is the :class:`ImageError` message and ``image`` None for an unreadable
    file). With ``transform`` the workers apply it and ``image`` is its result (e.g. the
    model's input tensor): the decoded pictures are dropped at once, so memory stays that of
    the inputs. ``draft``: see :func:`load_image_file`."""
    from concurrent.futures import ThreadPoolExecutor

    def load(path: Path) -> tuple[Path, Any, str | None, str | None]:
        try:
            image, digest = load_image_file(path, draft)
        except ImageError as e:
            return path, None, None, str(e)
        return path, transform(image) if transform is not None else image, digest, None

    if workers <= 1:
        yield from map(load, paths)
        return
    with ThreadPoolExecutor(workers) as pool:
        window = workers * 4  # bounded read-ahead: memory stays flat on huge folders
        for start in range(0, len(paths), window):
            yield from pool.map(load, paths[start : start + window])


def check_folder(root: str | os.PathLike) -> None:
    """:class:`ImageError` unless ``root`` is a folder (a file there gets its own message)."""
    root = Path(root)
    if root.is_file():
        raise ImageError(f"{root} is a file, not a folder of images (use --image for one file)")
    if not root.is_dir():
        raise ImageError(f"image folder not found: {root}")


def find_images(root: str | os.PathLike) -> list[Path]:
    """Every file with an image extension under ``root`` (recursive, sorted, no hidden
    files or folders, symlinked folders followed)."""
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


# -- captions CSVs -------------------------------------------------------------------------

IMAGE_COLUMNS = ("filepath", "image", "image_path", "path", "file", "filename")
CAPTION_COLUMNS = ("title", "caption", "text", "sentence")


def read_captions_csv(
    path: str | os.PathLike,
    *,
    img_key: str | None = None,
    caption_key: str | None = None,
    sep: str | None = None,
    root: str | os.PathLike | None = None,
) -> list[tuple[Path, str]]:
    """``[(image path, caption), ...]`` in file order from an image-caption CSV (open_clip's
    convention: a header, one row per caption, ``filepath`` / ``title`` columns).

    ``img_key`` / ``caption_key``: the column names (case-insensitive); None takes the first
    of :data:`IMAGE_COLUMNS` / :data:`CAPTION_COLUMNS` the header has. ``sep``: None detects
    tab (a header with tabs and no comma) or comma. Relative image paths are read from
    ``root`` (default: the CSV's folder). Captions are stripped; an empty image path or
    caption, a missing column, no rows or a file that is not UTF-8 text is an
    :class:`~attn_core.errors.InputError` naming the file (and line)."""
    csv_path = Path(path)
    if not csv_path.is_file():
        raise InputError(f"captions CSV not found: {csv_path}")
    try:
        text = csv_path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"cannot read {csv_path}: {e}") from None
    header = text.split("\n", 1)[0]
    sep = sep or ("\t" if "\t" in header and "," not in header else ",")
    reader = csv.DictReader(text.splitlines(), delimiter=sep)
    fields = {f.strip().lower(): f for f in reader.fieldnames or []}
    img_col = _column(fields, img_key, IMAGE_COLUMNS)
    cap_col = _column(fields, caption_key, CAPTION_COLUMNS)
    if img_col is None or cap_col is None:
        missing = [
            key or f"an {what} column ({'/'.join(names)})"
            for col, key, what, names in [
                (img_col, img_key, "image", IMAGE_COLUMNS),
                (cap_col, caption_key, "caption", CAPTION_COLUMNS),
            ]
            if col is None
        ]
        raise InputError(
            f"{csv_path}: no column(s) {missing}; the header has {list(fields.values())} "
            "(choose with img_key= / caption_key=, i.e. --csv-img-key / --csv-caption-key)"
        )
    base = Path(root) if root is not None else csv_path.parent
    rows = []
    for line, row in enumerate(reader, start=2):
        image, caption = (row.get(img_col) or "").strip(), (row.get(cap_col) or "").strip()
        if not image or not caption:
            raise InputError(f"{csv_path} line {line}: empty image path or caption")
        rows.append((base / image, caption))
    if not rows:
        raise InputError(f"{csv_path} has no rows")
    return rows


def _column(fields: dict[str, str], key: str | None, names: tuple[str, ...]) -> str | None:
    """The header's spelling of column ``key`` (or of the first of ``names``), or None."""
    wanted = [key.strip().lower()] if key is not None else names
    return next((fields[k] for k in wanted if k in fields), None)
