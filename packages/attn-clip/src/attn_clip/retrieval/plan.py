"""The incremental update of an index: what to keep, what to embed, and the result.

:func:`plan_update` compares a folder's image files with the old manifest: a file with the
same size and mtime, or the same size and SHA-256 (copied or touched), keeps its row; an
unreadable file that did not change is not retried; everything else is embedded.
An index of webdataset shards is planned shard by shard (:func:`.tars.plan_tar_update`)
into the same :class:`UpdatePlan`, whose :meth:`UpdatePlan.take_shard` records a shard's
samples.
:meth:`UpdatePlan.take` records each embedded (or unreadable) file (with its generated
caption in an index that keeps them: an unchanged file keeps its old one), and
:meth:`UpdatePlan.assemble` builds the new embeddings and manifest, sorted by path.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .errors import RetrievalError
from .fingerprint import ModelRecord
from .index import EmbeddingIndex
from .manifest import Manifest

__all__ = ["COUNTS", "UpdatePlan", "file_stat", "plan_update"]

COUNTS = ("added", "updated", "unchanged", "removed", "skipped")


@dataclass
class UpdatePlan:
    """What an update does: the rows it keeps, the files it embeds, what it found."""

    root: Path
    record: ModelRecord  # the model
    found: list[Path]  # every image file under root
    old: Manifest | None = None
    old_index: EmbeddingIndex | None = None
    files: dict[str, dict[str, Any]] = field(default_factory=dict)  # rel -> size, mtime, sha
    skipped: dict[str, dict[str, Any]] = field(default_factory=dict)  # rel -> ..., error
    keep: dict[str, int] = field(default_factory=dict)  # rel -> row in the old index
    todo: list[Path] = field(default_factory=list)  # files to embed
    stats: dict[str, dict[str, int]] = field(default_factory=dict)  # rel -> size, mtime
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTS, 0))
    new: dict[str, torch.Tensor] = field(default_factory=dict)  # rel -> its new embedding
    shards: dict[str, dict[str, Any]] | None = None  # a shard index: name -> its record
    captions: bool = False  # a folder index that keeps each image's generated caption

    def take_shard(self, name: str, info: dict[str, Any], rows: list) -> list[str]:
        """Record one embedded shard (``info``: its manifest record) and its samples, ``rows``
        of ``(id, embedding or None, caption or None, error or None)``; returns the errors.
        A repeated key is skipped too (counted in ``info["duplicates"]``: its id is the
        first sample's)."""
        old_files, errors = self.old.files if self.old else {}, []
        self.shards[name] = info
        for id, emb, caption, error in rows:
            if id in self.files or id in self.skipped:
                error = f"{id}: a second sample with this key in {info['path']}"
                info["duplicates"] = info.get("duplicates", 0) + 1
            elif error is not None:
                self.skipped[id] = {"shard": name, "error": error}
            if error is not None:
                self.counts["skipped"] += 1
                errors.append(error)
                continue
            self.counts["updated" if id in old_files else "added"] += 1
            self.files[id] = {"shard": name} | ({"caption": caption} if caption else {})
            self.new[id] = emb
        return errors

    def take(
        self, rel: str, stat: dict, emb, digest: str | None, error: str | None,
        caption: str | None = None,
    ) -> None:  # fmt: skip
        """Record one embedded (or, with ``error``, unreadable) file (and its generated
        ``caption``, when the index keeps them)."""
        if error is not None:
            self.skipped[rel] = {**stat, "error": error}
            self.counts["skipped"] += 1
            return
        old_files = self.old.files if self.old else {}
        self.counts["updated" if rel in old_files else "added"] += 1
        self.files[rel] = {**stat, "sha256": digest}
        if caption is not None:
            self.files[rel]["caption"] = caption
        self.new[rel] = emb

    def assemble(self) -> tuple[EmbeddingIndex, Manifest]:
        """The new embeddings (kept rows + new ones, sorted by path) and their manifest."""
        if not self.files:
            what = "image files" if self.shards is None else "shards"
            raise RetrievalError(f"nothing in the {len(self.found)} {what} under {self.root} "
                                 "could be read")  # fmt: skip
        if self.shards is not None and self.old is not None:  # (a folder's plan counts them)
            gone = (id not in self.files and id not in self.skipped for id in self.old.files)
            self.counts["removed"] = sum(gone)
        dim = self.record.embed_dim
        order = sorted(self.files)
        emb = torch.empty(len(order), dim)
        kept = [i for i, rel in enumerate(order) if rel in self.keep]
        if kept:
            emb[kept] = self.old_index.embeddings[[self.keep[order[i]] for i in kept]]
        for i, rel in enumerate(order):
            if rel in self.new:
                emb[i] = self.new[rel]
        index = EmbeddingIndex(dim=dim)
        index.add(emb, ids=order)
        shards = None if self.shards is None else dict(sorted(self.shards.items()))
        manifest = Manifest(self.record, str(self.root), {rel: self.files[rel] for rel in order},
                            dict(sorted(self.skipped.items())), shards=shards,
                            captions=self.captions)  # fmt: skip
        return index, manifest


def plan_update(
    root: Path,
    found: list[Path],
    record: ModelRecord,
    old: Manifest | None = None,
    old_index: EmbeddingIndex | None = None,
) -> UpdatePlan:
    """Decide per file under ``root`` (absolute): keep its old row, or embed it."""
    plan = UpdatePlan(root, record, found, old, old_index)
    old_files = old.files if old else {}
    old_skipped = old.skipped if old else {}
    rows = {rel: i for i, rel in enumerate(old_files)}
    for path in found:
        rel = path.relative_to(root).as_posix()
        stat = file_stat(path)
        prev = old_files.get(rel) or old_skipped.get(rel)
        same_stat = prev is not None and all(prev[k] == stat[k] for k in stat)
        if rel in old_files and (same_stat or _same_content(path, prev, stat)):
            plan.files[rel] = {**stat, "sha256": prev["sha256"]}
            if "caption" in prev:  # (an index that keeps generated captions)
                plan.files[rel]["caption"] = prev["caption"]
            plan.keep[rel] = rows[rel]
            plan.counts["unchanged"] += 1
        elif rel in old_skipped and same_stat:
            plan.skipped[rel] = prev  # still the same unreadable file: not retried
            plan.counts["skipped"] += 1
        else:
            plan.todo.append(path)
            plan.stats[rel] = stat
    present = {path.relative_to(root).as_posix() for path in found}
    plan.counts["removed"] = sum(rel not in present for rel in old_files)
    return plan


def file_stat(path: Path) -> dict[str, int]:
    """Size and mtime (``-1`` for a file that vanished while indexing)."""
    try:
        st = path.stat()
    except OSError:
        return {"size": -1, "mtime_ns": -1}
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _same_content(path: Path, prev: dict[str, Any] | None, stat: dict[str, int]) -> bool:
    """Same size and SHA-256 (the mtime alone changed, e.g. after a copy)."""
    if prev is None or prev.get("size") != stat["size"] or "sha256" not in prev:
        return False
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    except OSError:
        return False
    return h.hexdigest() == prev["sha256"]
