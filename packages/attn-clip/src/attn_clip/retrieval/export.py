"""An index's embeddings in clip-retrieval's layout, for the tools that read it.

    from attn_clip.retrieval.export import export_embeddings
    export_embeddings("photos.idx", "photos_emb/")

writes what ``clip-retrieval inference`` writes (and ``clip-retrieval index`` / autofaiss
read)::

    photos_emb/img_emb/img_emb_0.npy          (N, D) L2-normalized image embeddings
    photos_emb/metadata/metadata_0.parquet    one row per embedding, in the same order:
                                              image_path, caption, key

``image_path`` is the image file's absolute path, ``caption`` the text of the ``.txt`` file
beside it (clip-retrieval's folder layout; null when there is none), ``key`` the index's id
of the row (the path relative to the indexed folder). Files are numbered as clip-retrieval
numbers its partitions (``img_emb_0`` .. ``img_emb_9``; from 11 files on, zero-padded to the
same width), ``rows_per_file`` rows each. The embeddings are float32 (the index's own
values) or float16 (what clip-retrieval's inference writes). An index of tar shards
(:mod:`.tars`) has no image files: ``image_path`` and ``key`` are then the sample's id
(``shard/key``), ``caption`` the one kept in its manifest. A folder index built with
captions (``index --caption``) exports the generated caption kept in its manifest instead of
a ``.txt`` file's.

The folder is written next to ``out`` and renamed into place when complete; an existing
export there is replaced, any other non-empty folder is refused. Captions are read only
from files below the indexed folder (a ``.txt`` that is a symlink out of it is not read).
pyarrow is imported when used (``pip install 'attn-vision[wds]'`` brings it).
"""

from __future__ import annotations

import math
import os
import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import RetrievalError

__all__ = [
    "MAX_CAPTION_BYTES",
    "ExportResult",
    "check_export_folder",
    "export_embeddings",
    "file_below",
    "read_caption",
]

MAX_CAPTION_BYTES = 64 << 10  # a caption file is read up to this size
EXPORT_PARTS = ("img_emb", "metadata")
DTYPES = {"float32": np.float32, "float16": np.float16}


def file_below(root: Path, path: Path) -> Path | None:
    """``path`` resolved, when it is a file below the (resolved) folder ``root``; else None
    (outside it through ``..`` or a symlink, missing, a folder, a symlink loop)."""
    try:
        resolved = path.resolve()
    except (OSError, RuntimeError):
        return None
    return resolved if resolved.is_relative_to(root) and resolved.is_file() else None


def read_caption(root: Path, image: Path) -> str | None:
    """The text of the ``.txt`` file beside ``image`` (stripped, invalid UTF-8 replaced), or
    None when there is none below the resolved folder ``root``."""
    path = file_below(root, image.with_suffix(".txt"))
    if path is None:
        return None
    try:
        with open(path, "rb") as f:
            return f.read(MAX_CAPTION_BYTES).decode("utf-8", errors="replace").strip()
    except OSError:
        return None


@dataclass
class ExportResult:
    """What :func:`export_embeddings` wrote."""

    folder: Path
    rows: int
    files: int
    dim: int
    generation: int | None

    def describe(self) -> str:
        return (f"exported {self.rows} embeddings ({self.dim} wide, generation "
                f"{self.generation}) to {self.folder} in {self.files} file(s)")  # fmt: skip


def _check_out(out: Path) -> None:
    if not out.parent.is_dir():
        raise RetrievalError(f"export folder: {out.parent} does not exist")
    if out.exists() and not out.is_dir():
        raise RetrievalError(f"export folder: {out} is a file")
    if out.is_dir():
        other = sorted(p.name for p in out.iterdir() if p.name not in EXPORT_PARTS)
        if other:
            raise RetrievalError(
                f"export folder {out} holds other files ({', '.join(other[:3])}): "
                "give an empty or new folder, or an earlier export to replace"
            )


def check_export_folder(out: str | os.PathLike) -> Path:
    """``out`` as a path, checked to be usable by :func:`export_embeddings` (before any
    work: a missing parent, a file, a folder holding other things are refused)."""
    out = Path(out).absolute()
    _check_out(out)
    return out


def export_embeddings(
    index: str | os.PathLike,
    out: str | os.PathLike,
    *,
    rows_per_file: int = 1_000_000,
    dtype: str = "float32",
) -> ExportResult:
    """Write the embeddings of the index at ``index`` to folder ``out`` in clip-retrieval's
    layout (see the module docstring). Errors: the index's (``IndexNotFoundError``, ...),
    and a :class:`RetrievalError` for an unusable ``out``, ``rows_per_file`` or ``dtype``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from .store import load_index_set

    if rows_per_file < 1:
        raise RetrievalError(f"rows_per_file must be >= 1, got {rows_per_file}")
    if dtype not in DTYPES:
        raise RetrievalError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    out = check_export_folder(out)
    manifest, embeddings = load_index_set(index)
    if not len(embeddings):
        raise RetrievalError(f"{index}: the index is empty: nothing to export")
    folder = Path(manifest.root)
    root = folder.resolve()
    matrix = embeddings.embeddings.numpy()
    files = math.ceil(len(embeddings) / rows_per_file)
    width = int(math.log10(files)) + 1  # clip-retrieval's zfill of the partition number
    tmp = _new_folder(out, ".tmp")
    try:
        for part in EXPORT_PARTS:
            (tmp / part).mkdir()
        for n in range(files):
            rows = slice(n * rows_per_file, (n + 1) * rows_per_file)
            ids = embeddings.ids[rows]
            np.save(tmp / "img_emb" / f"img_emb_{n:0{width}d}.npy",
                    matrix[rows].astype(DTYPES[dtype]))  # fmt: skip
            if manifest.shards is None:
                paths = [str(folder / i) for i in ids]
                captions = [manifest.caption(i) if manifest.captions
                            else read_caption(root, folder / i) for i in ids]  # fmt: skip
            else:  # a shard index: ids are samples, not files
                paths, captions = list(ids), [manifest.caption(i) for i in ids]
            table = pa.table(
                {"image_path": paths, "caption": pa.array(captions, pa.string()), "key": ids}
            )
            pq.write_table(table, tmp / "metadata" / f"metadata_{n:0{width}d}.parquet")
        _swap_in(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return ExportResult(out, len(embeddings), files, embeddings.dim, manifest.generation)


def _new_folder(out: Path, suffix: str) -> Path:
    """A new empty folder next to ``out`` (``os.mkdir``: the umask's usual permissions)."""
    path = out.parent / f".{out.name}.{secrets.token_hex(4)}{suffix}"
    path.mkdir()
    return path


def _swap_in(tmp: Path, out: Path) -> None:
    """Rename the complete folder ``tmp`` to ``out``; an earlier export there is moved aside
    first and removed after."""
    _check_out(out)  # (again: something may have been put there meanwhile)
    if not out.exists() or not any(out.iterdir()):
        if out.exists():
            out.rmdir()
        os.replace(tmp, out)
        return
    old = _new_folder(out, ".old")
    os.replace(out, old / out.name)
    os.replace(tmp, out)
    shutil.rmtree(old, ignore_errors=True)
