"""An index's manifest: ``INDEX.manifest.json``, the record of what the index holds.

The model that made it (:class:`~.fingerprint.ModelRecord`), the folder, each indexed
file's size, mtime and SHA-256 (which an update compares to find new, changed and removed
files), the files that could not be read (with the reason), and the generation of
embeddings it names (``INDEX.g<N>.*``, see :mod:`.store`).

An index of webdataset tar shards (:mod:`.tars`) has ids ``shard/key`` instead of paths:
``files`` maps each to ``{"shard", "caption"}`` (the caption when the sample has one),
``skipped`` to ``{"shard", "error"}``, and ``shards`` each shard's name (its file name without
``.tar``) to ``{"path", "size", "mtime_ns", "sha256", "samples"}`` (and ``"error"`` for a
truncated shard): what an update compares.

A folder index built with captions (``RetrievalIndex.create(..., caption=True)``, the app's
``index --caption``: a CoCa model's greedy caption of each image) has ``"captions": true``
and each file's ``"caption"`` beside its size, mtime and SHA-256; every later update
captions the new and changed files. A caption that is not a string is refused (either kind
of index).

Versions: 1 (no generation: the embeddings are ``INDEX.safetensors`` / ``.json``), 2
(``"generation": N``) and 3 (2 with ``"shards"``) are read; 2 is written for a folder, 3
for shards (so a reader that knows only folders refuses a shard index).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import IndexFormatError, IndexNotFoundError
from .fingerprint import ModelRecord

__all__ = ["FORMAT", "SHARDS_VERSION", "VERSION", "Manifest", "index_base", "manifest_path"]

FORMAT, VERSION, SHARDS_VERSION = "attn-zoo.retrieval-manifest", 2, 3
READABLE_VERSIONS = (1, 2, 3)
_KEYS = ("format", "version", "model", "root", "files", "skipped")


def index_base(path: str | os.PathLike) -> Path:
    """``photos.idx`` / ``photos.idx.manifest.json`` / ``.json`` / ``.safetensors`` ->
    ``photos.idx``, the path every file of the index is named after."""
    p = Path(path)
    for suffix in (".manifest.json", ".safetensors", ".json"):
        if p.name.endswith(suffix):
            return p.with_name(p.name[: -len(suffix)])
    return p


def manifest_path(base: Path) -> Path:
    return base.with_name(base.name + ".manifest.json")


@dataclass
class Manifest:
    """What an index holds. ``files`` maps each indexed path (relative to ``root``, in the
    order of the embedding rows) to ``{"size", "mtime_ns", "sha256"}``; ``skipped`` each
    unreadable one to ``{"size", "mtime_ns", "error"}``."""

    model: ModelRecord
    root: str  # absolute folder the paths are relative to
    files: dict[str, dict[str, Any]] = field(default_factory=dict)
    skipped: dict[str, dict[str, Any]] = field(default_factory=dict)
    generation: int | None = None  # None: a version-1 index (unversioned files)
    version: int = VERSION
    shards: dict[str, dict[str, Any]] | None = None  # a shard index's shards (see above)
    captions: bool = False  # a folder index that keeps each file's generated caption

    @classmethod
    def read(cls, base: str | os.PathLike) -> Manifest:
        """The manifest of the index at ``base``; :class:`IndexNotFoundError` when there is
        none, :class:`IndexFormatError` when it is unreadable or broken."""
        base = index_base(base)
        path = manifest_path(base)
        if not path.is_file():
            tensors = base.with_name(base.name + ".safetensors")
            what = "no index" if not tensors.exists() else "an index without its manifest"
            raise IndexNotFoundError(f"{what} at {base} (expected {path.name})")
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise IndexFormatError(f"unreadable index manifest {path}: {e}") from None
        return cls.from_json(data, str(path))

    @classmethod
    def from_json(cls, data: Any, where: str = "manifest") -> Manifest:
        """Validate a manifest's JSON (``where`` names it in errors)."""
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise IndexFormatError(f"{where} is not a manifest written by apps/retrieval.py")
        if data.get("version") not in READABLE_VERSIONS:
            raise IndexFormatError(f"{where}: unsupported manifest version {data.get('version')!r}")
        missing = [k for k in _KEYS if k not in data]
        if not missing and not isinstance(data["model"], dict):
            missing = ["model"]
        if not missing and not isinstance(data["files"], dict):
            missing = ["files"]
        if missing:
            raise IndexFormatError(
                f"{where}: a broken manifest (missing or malformed {', '.join(missing)})"
            )
        generation = data.get("generation")
        if generation is not None and (not isinstance(generation, int) or generation < 1):
            raise IndexFormatError(f"{where}: a broken manifest (generation {generation!r})")
        shards = data.get("shards")
        if (data["version"] == SHARDS_VERSION) != isinstance(shards, dict):
            raise IndexFormatError(f"{where}: a broken manifest (shards {type(shards).__name__})")
        if shards is not None and not _shards_ok(shards, data["files"], data["skipped"]):
            raise IndexFormatError(f"{where}: a broken manifest (a sample of no listed shard)")
        captions = data.get("captions", False)
        if not isinstance(captions, bool) or (captions and shards is not None):
            raise IndexFormatError(f"{where}: a broken manifest (captions {captions!r})")
        texts = (
            (id, f.get("caption", "")) for id, f in data["files"].items() if isinstance(f, dict)
        )
        bad = next((id for id, text in texts if not isinstance(text, str)), None)
        if bad is not None:
            raise IndexFormatError(f"{where}: a broken manifest (the caption of {bad!r} is "
                                   "not a string)")  # fmt: skip
        return cls(ModelRecord.from_json(data["model"], where), data["root"], data["files"],
                   data["skipped"], generation, data["version"], shards, captions)  # fmt: skip

    def caption(self, id: str) -> str | None:
        """The caption kept for ``id``: a shard sample's, or a captioned folder index's
        generated one (None: none)."""
        entry = self.files.get(id)
        return entry.get("caption") if isinstance(entry, dict) else None

    def shard_file(self, id: str) -> Path | None:
        """The tar file holding sample ``id`` of a shard index (None for a folder index):
        the image of an id is read from there, never from a file named after the id."""
        if self.shards is None or id not in self.files:
            return None
        return Path(self.shards[self.files[id]["shard"]]["path"])

    def to_json(self) -> dict[str, Any]:
        """The JSON written (always the current version)."""
        data = {
            "format": FORMAT,
            "version": VERSION if self.shards is None else SHARDS_VERSION,
            "model": self.model.to_json(),
            "root": self.root,
            "files": self.files,
            "skipped": self.skipped,
        }
        if self.generation is not None:
            data["generation"] = self.generation
        if self.shards is not None:
            data["shards"] = self.shards
        if self.captions:
            data["captions"] = True
        return data


def _shards_ok(shards: dict, files: dict, skipped: Any) -> bool:
    """Every shard has a path, every sample (and skipped one) names one of them."""
    ok = all(isinstance(s, dict) and isinstance(s.get("path"), str) for s in shards.values())
    entries = [*files.values(), *(skipped.values() if isinstance(skipped, dict) else [None])]
    return ok and all(isinstance(f, dict) and str(f.get("shard")) in shards for f in entries)
