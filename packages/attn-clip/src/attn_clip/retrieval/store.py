"""An index on disk, replaced as a set: generations, the atomic manifest switch, the lock.

``INDEX.manifest.json`` names the generation of embeddings it goes with,
``INDEX.g<N>.safetensors`` / ``.json`` (/ ``.faiss``). A write puts a complete new
generation next to the old one, switches the manifest to it in one rename, then removes
the old one: killed at any point, the index on disk is the old one or the new one.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import re
from pathlib import Path

from attn_core import hub

from . import ann
from .errors import IndexBusyError, IndexFormatError
from .index import EmbeddingIndex, _paths
from .manifest import Manifest, index_base, manifest_path

__all__ = ["index_lock", "load_index_set", "save_index_set"]


def _generation_base(base: Path, generation: int | None) -> Path:
    """Where generation ``generation`` keeps its EmbeddingIndex files (None: ``base``)."""
    return base if generation is None else base.with_name(f"{base.name}.g{generation}")


def _generations_on_disk(base: Path) -> set[int]:
    pattern = re.compile(re.escape(base.name) + r"\.g(\d+)\.(?:safetensors|json|faiss)$")
    found = (pattern.match(p.name) for p in base.parent.iterdir())
    return {int(m[1]) for m in found if m}


@contextlib.contextmanager
def index_lock(base: str | os.PathLike):
    """Hold ``<base>.lock`` (an exclusive ``flock``) for the body; raise
    :class:`IndexBusyError` naming the holder's PID if another process has it. The lock file
    exists only while it is held."""
    import fcntl

    path = Path(f"{base}.lock")
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise IndexBusyError(f"index {base} is being updated by PID {holder}") from None
        try:  # the file we locked may have been removed by the previous holder: retry
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield
    finally:
        path.unlink(missing_ok=True)  # still ours: removed before the lock is released
        os.close(fd)


def save_index_set(base: str | os.PathLike, index: EmbeddingIndex, manifest: Manifest) -> int:
    """Write ``index`` and ``manifest`` as one new generation, switched in atomically.

    The embeddings go to ``<base>.g<N>.safetensors`` / ``.json`` (and an approximate index
    to ``.faiss``: a generation no manifest names yet); then ``manifest`` (with
    ``generation = N``) replaces ``<base>.manifest.json`` in one rename -- the switch; then
    older generations and temporary files of earlier crashed runs are removed. Call it
    holding :func:`index_lock`. Returns ``N`` (also set on ``manifest``).
    """
    base = index_base(base)
    generation = max(_generations_on_disk(base), default=0) + 1
    index.save(_generation_base(base, generation))
    manifest.generation = generation
    with hub.atomic_write(manifest_path(base), "w") as f:
        json.dump(manifest.to_json(), f, indent=1, ensure_ascii=False)
    stale = [_generation_base(base, g) for g in _generations_on_disk(base) - {generation}]
    for old in [base, *stale]:  # older generations, and the unversioned files of version 1
        tensor_path, meta_path = _paths(old)
        for path in (tensor_path, meta_path, ann.file_of(tensor_path)):
            path.unlink(missing_ok=True)
    for tmp in base.parent.glob(f".{glob.escape(base.name)}*.tmp"):  # left by a kill -9
        tmp.unlink(missing_ok=True)
    return generation


def load_index_set(base: str | os.PathLike) -> tuple[Manifest, EmbeddingIndex]:
    """``(manifest, embeddings)`` of the index at ``base``: the generation its manifest
    names (a version-1 manifest: ``<base>`` itself), checked against each other. Read again
    once if a concurrent update switched generations in between."""
    base = index_base(base)
    manifest = Manifest.read(base)
    for attempt in range(3):
        try:
            index = EmbeddingIndex.load(_generation_base(base, manifest.generation))
            break
        except FileNotFoundError as e:
            if attempt == 2:
                raise IndexFormatError(f"unreadable index: {e}") from None
            manifest = Manifest.read(base)  # switched (and the old files removed) meanwhile
        except IndexFormatError as e:
            raise IndexFormatError(f"unreadable index: {e}") from None
    where = manifest_path(base)
    if index.ids != list(manifest.files):
        raise IndexFormatError(f"{where} does not match its embeddings: rebuild the index")
    if index.dim != manifest.model.embed_dim:
        raise IndexFormatError(
            f"{where} says embed_dim {manifest.model.embed_dim} but its embeddings have "
            f"{index.dim}: rebuild the index"
        )
    return manifest, index
