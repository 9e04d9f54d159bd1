"""Webdataset tar shards in img2dataset's layout: shard lists, samples, decoding, a writer.

A shard is a tar of files named ``{key}.{ext}`` (``00000123.jpg``, ``00000123.txt``,
``00000123.json``; img2dataset's ``{shard:05d}.tar``, a ``{shard:05d}.parquet`` beside it)::

    from attn_vision import wds
    paths = wds.list_shards("data/{00000..00009}.tar::more/{000..004}.tar")
    with wds.ShardReader(paths[0]) as shard:           # the samples' names, from the headers
        sample = shard.sample(0)                       # {"__key__", "__url__", "jpg": bytes, ...}
        image, text = wds.sample_image(sample), wds.sample_caption(sample)
    with wds.ShardWriter("out", shard_size=1000) as w:  # 00000.tar + 00000.parquet, ...
        w.write(image, "a red circle", {"class": "red_circle"})

Samples are grouped exactly as the ``webdataset`` package groups them (its
``tariterators.group_by_keys``; the tests compare the two): consecutive regular files whose
key -- the name up to the first dot of its basename, the folder part kept -- is the same
form one sample, its extensions (the rest of the name, lower-cased) are its fields;
``__*__`` metadata files and names without a dot are skipped, a repeated extension is
ignored, and a key never spans two shards (a key split across a shard boundary is two
samples). Shard lists are brace-expanded as ``braceexpand`` does (``{00000..00099}``,
``{a,b}``, ``{0..10..2}``), several sources joined with ``::``.

The reader is a small one over the standard ``tarfile`` module rather than the
``webdataset`` package (a test dependency only), because:

* exact resume needs a sample *by position*: a shard's samples are listed from the tar
  headers (seeking over the data) and read in any order, so a restarted run goes straight
  to where it stopped; webdataset streams a tar front to back and shuffles through a buffer
  whose state is not restorable;
* a bad sample (corrupt image, missing caption, truncated shard) is one error with a reason
  the training data set counts and names; webdataset's handlers either raise or drop
  silently;
* loading never runs code: only local files are opened (webdataset's ``gopen`` runs
  ``pipe:`` URLs through a shell and fetches ``http(s)://``), and attn-vision stays free of
  its dependencies.

Splitting shards over processes and DataLoader workers, shuffling, resampling and epochs of
``--train-num-samples`` samples are the training side's (``attn_train.data.ShardDataset``).
Writing parquet tables needs ``pyarrow`` (``attn-vision[wds]``), imported when writing.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from PIL import Image

from .images import MAX_FILE_BYTES, ImageError, decode_image

__all__ = [
    "CAPTION_EXTENSIONS",
    "IMAGE_EXTENSIONS",
    "BadSample",
    "ShardReader",
    "ShardWriter",
    "braceexpand",
    "expand_urls",
    "list_shards",
    "sample_caption",
    "sample_image",
    "sample_label",
    "split_name",
]

IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "webp")  # the first a sample has is its image
CAPTION_EXTENSIONS = ("txt",)


class BadSample(ValueError):
    """A sample that cannot be used: no image, an undecodable one, no caption, no label."""


# -- shard lists ------------------------------------------------------------------------------

_INT_RANGE = re.compile(r"^(-?\d+)\.\.(-?\d+)(?:\.\.-?(\d+))?$")


def _int_range(first: str, last: str, step: str | None) -> list[str]:
    """braceexpand's integer range: zero-padded to the longer end when either end is."""
    padded = any(s.startswith(("0", "-0")) for s in (first, last) if s not in ("0", "-0"))
    width = max(len(first), len(last)) if padded else 0
    a, b, k = int(first), int(last), (int(step) or 1) if step else 1
    values = range(a, b + 1, k) if a < b else range(a, b - 1, -k)
    return [f"{v:0{width}d}" for v in values]


def _alternatives(body: str) -> list[str] | None:
    """The expansions of a brace's contents: a range, a comma list, or None (literal)."""
    if m := _INT_RANGE.match(body):
        return _int_range(*m.groups())
    parts, depth, start = [], 0, 0
    for i, c in enumerate(body):
        depth += (c == "{") - (c == "}")
        if c == "," and depth == 0:
            parts.append(body[start:i])
            start = i + 1
    if not parts:
        return None
    return [s for part in [*parts, body[start:]] for s in braceexpand(part)]


def braceexpand(pattern: str) -> list[str]:
    """Bash-style brace expansion as the ``braceexpand`` package does it (integer ranges with
    its zero padding and step, nested comma lists; ``{x}`` and ``{}`` stay literal; no
    backslash escapes or letter ranges). Unbalanced braces: ``ValueError``."""
    depth, start = 0, 0
    for i, c in enumerate(pattern):
        if c == "{":
            start = i if depth == 0 else start
            depth += 1
        elif c == "}":
            depth -= 1
            if depth < 0:
                break
            if depth == 0:
                head, body, tail = pattern[:start], pattern[start + 1 : i], pattern[i + 1 :]
                options = _alternatives(body)
                if options is None:
                    options = [f"{{{b}}}" for b in braceexpand(body)]
                return [head + o + t for o in options for t in braceexpand(tail)]
    if depth != 0:
        raise ValueError(f"unbalanced braces in {pattern!r}")
    return [pattern]


def expand_urls(spec: str) -> list[str]:
    """``"a/{000..002}.tar::b/x.tar"`` -> every shard name, in order (webdataset's
    ``expand_urls``, without its environment-variable substitution)."""
    return [url for part in spec.split("::") if part for url in braceexpand(part)]


def list_shards(spec: str | os.PathLike) -> list[Path]:
    """The shard files of a brace-expanded, ``::``-joined list, in order. ``ValueError``
    (naming it) for a URL or ``pipe:`` (only local files are read), a missing file, or an
    empty list."""
    text = os.fspath(spec)
    names = expand_urls(text)
    if not names:
        raise ValueError(f"no shard in {text!r}")
    remote = [n for n in names if "://" in n or n.startswith("pipe:")]
    if remote:
        raise ValueError(
            f"{remote[0]}: only local shard files are read (no URLs or pipe: commands); "
            "download the shards first"
        )
    missing = [n for n in names if not os.path.isfile(n)]
    if missing:
        raise ValueError(
            f"{len(missing)} of the {len(names)} shards of {text!r} are not files "
            f"(the first: {missing[0]})"
        )
    return [Path(n) for n in names]


# -- reading --------------------------------------------------------------------------------

_NAME = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")  # webdataset's base_plus_ext
_META = re.compile(r"__[^/]*__($|/)")  # webdataset's skip_meta


def split_name(name: str) -> tuple[str, str] | None:
    """``"dir/00012.seg.png"`` -> ``("dir/00012", "seg.png")``; None for a name without an
    extension (webdataset's ``base_plus_ext``; the extension is not lower-cased here)."""
    m = _NAME.match(name)
    return (m.group(1), m.group(2)) if m else None


class ShardReader:
    """One shard: its samples listed from the tar headers (``keys``, ``len``), each read by
    position (``sample(i)``). A damaged shard keeps the samples listed before the damage and
    a file that is not a tar has none; ``truncated`` then says why (a sample whose data is
    cut off is a :class:`BadSample` when read). A context manager (or ``close()``)."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self.truncated: str | None = None
        self._samples: list[tuple[str, dict[str, tarfile.TarInfo]]] = []
        try:
            self._tar: tarfile.TarFile | None = tarfile.open(self.path, "r:*")
        except (tarfile.TarError, OSError) as e:
            self._tar, self.truncated = None, f"not a readable tar file ({e})"
            return
        try:
            for info in self._tar:
                self._add(info)
        except (tarfile.TarError, OSError, EOFError) as e:
            self.truncated = f"truncated or corrupt after {len(self._samples)} samples ({e})"

    def _add(self, info: tarfile.TarInfo) -> None:
        """group_by_keys: a new key (or the first file) starts a sample."""
        if not info.isreg() or _META.match(info.name):
            return
        if "/" not in info.name and info.name.startswith("__") and info.name.endswith("__"):
            return
        parts = split_name(info.name)
        if parts is None:
            return
        key, ext = parts[0], parts[1].lower()
        if not self._samples or self._samples[-1][0] != key:
            self._samples.append((key, {}))
        self._samples[-1][1].setdefault(ext, info)  # a repeated extension is ignored

    def __len__(self) -> int:
        return len(self._samples)

    @property
    def keys(self) -> list[str]:
        return [key for key, _ in self._samples]

    def extensions(self, index: int) -> list[str]:
        """The fields of sample ``index`` (without reading them)."""
        return list(self._samples[index][1])

    def sample(self, index: int) -> dict[str, Any]:
        """Sample ``index`` as webdataset yields it: ``__key__``, ``__url__`` (the shard's
        path) and one ``bytes`` value per extension. :class:`BadSample` if a file of it
        cannot be read (a truncated shard) or is larger than ``images.MAX_FILE_BYTES``."""
        key, members = self._samples[index]
        out: dict[str, Any] = {"__key__": key, "__url__": str(self.path)}
        assert self._tar is not None  # (a shard that is not a tar has no samples)
        for ext, info in members.items():
            if info.size > MAX_FILE_BYTES:
                raise BadSample(f"{info.name}: larger than {MAX_FILE_BYTES >> 20} MiB")
            try:
                f = self._tar.extractfile(info)
                out[ext] = f.read() if f is not None else b""
                if len(out[ext]) != info.size:
                    raise EOFError("unexpected end of data")
            except (tarfile.TarError, OSError, EOFError) as e:
                raise BadSample(f"{info.name}: cannot be read ({e})") from None
        return out

    def __iter__(self) -> Iterator[dict[str, Any]]:
        """Every sample in order; those that cannot be read are skipped."""
        for i in range(len(self)):
            try:
                yield self.sample(i)
            except BadSample:
                continue

    def close(self) -> None:
        if self._tar is not None:
            self._tar.close()

    def __enter__(self) -> ShardReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- decoding -------------------------------------------------------------------------------


def _where(sample: dict[str, Any]) -> str:
    return f"{sample.get('__url__', '?')}: {sample.get('__key__', '?')}"


def sample_image(sample: dict[str, Any], draft: int | None = None) -> Image.Image:
    """The sample's image (the first of ``jpg`` / ``jpeg`` / ``png`` / ``webp`` it has),
    decoded by the one decoder of :mod:`attn_vision.images`; :class:`BadSample` when it has
    none or it does not decode."""
    ext = next((e for e in IMAGE_EXTENSIONS if e in sample), None)
    if ext is None:
        fields = ", ".join(k for k in sample if not k.startswith("__")) or "none"
        raise BadSample(f"{_where(sample)}: no image ({'/'.join(IMAGE_EXTENSIONS)}; has {fields})")
    try:
        return decode_image(sample[ext], f"{sample['__key__']}.{ext}", draft)
    except ImageError as e:
        raise BadSample(f"{sample.get('__url__', '?')}: {e}") from None


def sample_caption(sample: dict[str, Any]) -> str:
    """The ``txt`` caption (UTF-8, surrounding whitespace removed); :class:`BadSample` when
    missing, empty or not UTF-8."""
    data = sample.get("txt")
    try:
        text = data.decode("utf-8").strip() if data is not None else ""
    except UnicodeDecodeError:
        raise BadSample(f"{_where(sample)}: the caption is not UTF-8") from None
    if not text:
        raise BadSample(f"{_where(sample)}: no caption ({'missing' if data is None else 'empty'})")
    return text


def sample_label(sample: dict[str, Any], key: str = "cls") -> int | str:
    """The class label: the integer in ``{key}.cls`` for ``key="cls"``, else the field
    ``key`` of ``{key}.json`` (an int or a class name); :class:`BadSample` when missing."""
    try:
        if key == "cls":
            return int(sample["cls"].decode("utf-8").strip())
        value = json.loads(sample["json"])[key]
    except (KeyError, TypeError, ValueError, UnicodeDecodeError):
        source = "cls" if key == "cls" else f"json field {key!r}"
        raise BadSample(f"{_where(sample)}: no usable label ({source})") from None
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise BadSample(f"{_where(sample)}: label {value!r} is not an int or a class name")
    return value


# -- writing --------------------------------------------------------------------------------


class ShardWriter:
    """Write samples as img2dataset does: ``{shard:05d}.tar`` of ``shard_size`` samples
    (``{key}.jpg`` / ``.txt`` / ``.json`` [/ ``.cls``], key ``{shard:05d}{index:04d}``), a
    ``{shard:05d}.parquet`` of the same rows (key, caption, status, error_message, width,
    height, sha256 and the json fields) and ``{shard:05d}_stats.json`` beside it.

    Each shard is written as ``NAME.tmp`` and renamed when complete. ``image_format``:
    ``"jpg"`` (JPEG, ``quality``) or ``"png"``. Files are reproducible: the same samples give
    the same bytes (fixed tar times and owners).
    """

    def __init__(
        self,
        folder: str | os.PathLike,
        shard_size: int = 10_000,
        image_format: str = "jpg",
        quality: int = 95,
    ) -> None:
        if shard_size < 1:
            raise ValueError(f"shard_size must be >= 1, got {shard_size}")
        if image_format not in ("jpg", "png"):
            raise ValueError(f"image_format must be 'jpg' or 'png', got {image_format!r}")
        try:
            import pyarrow  # noqa: F401  (checked now: nothing is written without it)
        except ImportError:
            raise ValueError(
                "writing shards' parquet tables needs pyarrow: pip install 'attn-vision[wds]'"
            ) from None
        self.folder, self.shard_size = Path(folder), shard_size
        self.image_format, self.quality = image_format, quality
        self.digits = max(4, len(str(shard_size - 1)))
        self.shards: list[Path] = []
        self._rows: list[dict[str, Any]] = []
        self._tar: tarfile.TarFile | None = None
        self._tmp = self.folder / "00000.tar.tmp"
        self.count = 0

    def _member(self, name: str, data: bytes) -> None:
        info = tarfile.TarInfo(name)
        info.size, info.mode, info.mtime = len(data), 0o644, 0
        self._tar.addfile(info, io.BytesIO(data))  # type: ignore[union-attr]

    def write(
        self,
        image: Image.Image,
        caption: str,
        meta: dict[str, Any] | None = None,
        cls: int | None = None,
    ) -> str:
        """Add one sample; returns its key. ``meta``: extra json fields (e.g. ``class``);
        ``cls``: a class index, also written as ``{key}.cls`` (webdataset's convention)."""
        shard, index = divmod(self.count, self.shard_size)
        if index == 0:
            self._finish()
            self.folder.mkdir(parents=True, exist_ok=True)
            self._tmp = self._path(shard, ".tar.tmp")
            self._tar = tarfile.open(self._tmp, "w", format=tarfile.USTAR_FORMAT)
        key = f"{shard:05d}{index:0{self.digits}d}"
        buf = io.BytesIO()
        if self.image_format == "jpg":
            image.convert("RGB").save(buf, "JPEG", quality=self.quality)
        else:
            image.save(buf, "PNG")
        data = buf.getvalue()
        row = {"key": key, "caption": caption, "status": "success", "error_message": None}
        row |= {"width": image.width, "height": image.height}
        row |= {"sha256": hashlib.sha256(data).hexdigest(), **(meta or {})}
        self._member(f"{key}.{self.image_format}", data)
        self._member(f"{key}.txt", caption.encode("utf-8"))
        self._member(f"{key}.json", json.dumps(row, sort_keys=True).encode("utf-8"))
        if cls is not None:
            self._member(f"{key}.cls", str(cls).encode())
        self._rows.append(row)
        self.count += 1
        return key

    def _path(self, shard: int, suffix: str) -> Path:
        return self.folder / f"{shard:05d}{suffix}"

    def _finish(self) -> None:
        """Close the open shard: rename its tar, write its parquet table and stats."""
        if self._tar is None:
            return
        import pyarrow as pa
        import pyarrow.parquet as pq

        self._tar.close()
        self._tar = None
        shard = (self.count - 1) // self.shard_size
        os.replace(self._tmp, self._path(shard, ".tar"))
        pq.write_table(pa.Table.from_pylist(self._rows), self._path(shard, ".parquet"))
        stats = {"count": len(self._rows), "successes": len(self._rows), "failed_to_download": 0}
        self._path(shard, "_stats.json").write_text(json.dumps(stats, indent=2) + "\n")
        self.shards.append(self._path(shard, ".tar"))
        self._rows = []

    @property
    def spec(self) -> str:
        """The brace pattern of the shards written so far (``DIR/{00000..00007}.tar``)."""
        last = max(len(self.shards) - 1, 0)
        return str(self.folder / (f"{{00000..{last:05d}}}.tar" if last else "00000.tar"))

    def close(self) -> None:
        self._finish()

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None:
            self.close()
        elif self._tar is not None:  # an interrupted shard is not left half written
            self._tar.close()
            self._tmp.unlink(missing_ok=True)
