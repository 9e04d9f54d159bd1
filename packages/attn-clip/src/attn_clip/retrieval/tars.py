"""An index of webdataset tar shards (img2dataset's layout) instead of a folder.

    apps/retrieval.py index 'data/{00000..00009}.tar' --out data.idx          # every sample
    apps/retrieval.py index 'data/{00000..00019}.tar' --out data.idx --update # new shards

A shard list (:func:`is_shard_list`: brace-expanded, ``::``-joined ``.tar`` files, read
with :mod:`attn_vision.wds`) is indexed as a folder is, into the same index files: each
sample's id is ``shard/key`` (the shard's file name without ``.tar``, then the sample's
key), its caption (``txt``, when it has one) is kept in the manifest, and the manifest
records each shard's path, size, mtime and SHA-256 (:mod:`.manifest`). An update keeps the
rows of a shard with the same size and mtime, or size and SHA-256 (copied or touched), and
embeds every other shard whole; rows of shards no longer listed are dropped. A sample
without an image, or whose image does not decode or cannot be read (a truncated shard), is
skipped and counted; under ``torchrun`` (:mod:`.shards`) the shards are dealt to the ranks.
An id is never a file name: a hit's image is read from its shard (:func:`sample_image_at`).
"""

from __future__ import annotations

import itertools
import os
from collections import defaultdict
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attn_vision import wds

from .embed import IndexModel, draft_size, embed_stream
from .errors import RetrievalError
from .export import MAX_CAPTION_BYTES
from .fingerprint import ModelRecord
from .index import EmbeddingIndex, _sha256
from .manifest import Manifest
from .options import AnnOptions
from .plan import UpdatePlan, _same_content, file_stat
from .update import UpdateResult, write_update

__all__ = [
    "Bad",
    "embed_tar",
    "is_shard_list",
    "list_tars",
    "plan_tar_update",
    "sample_image_at",
    "sample_image_bytes",
    "take_tar",
    "tar_name",
    "update_tars",
]


def is_shard_list(source: str | os.PathLike) -> bool:
    """Whether ``source`` names tar shards (every name of its brace-expanded, ``::``-joined
    list ends in ``.tar``) rather than a folder."""
    text = os.fspath(source)
    if os.path.isdir(text):
        return False
    try:
        names = wds.expand_urls(text)
    except ValueError:  # unbalanced braces: not a shard list (then not a folder either)
        return False
    return bool(names) and all(name.lower().endswith(".tar") for name in names)


def tar_name(path: Path) -> str:
    """A shard's name in ids: its file name without ``.tar``."""
    return path.name[:-4] if path.name.lower().endswith(".tar") else path.name


def list_tars(spec: str | os.PathLike) -> tuple[Path, list[Path]]:
    """``(root, shards)``: the shard files (resolved) and the folder holding them all.
    :class:`RetrievalError` for a URL, a missing shard, or two shards of the same name."""
    try:
        paths = [p.resolve() for p in wds.list_shards(spec)]
    except ValueError as e:
        raise RetrievalError(str(e)) from None
    seen: dict[str, Path] = {}
    for path in paths:
        if (name := tar_name(path)) in seen:
            raise RetrievalError(
                f"two shards named {name!r} ({seen[name]}, {path}): ids are shard/key, so "
                "the shards' file names must differ"
            )
        seen[name] = path
    return Path(os.path.commonpath([p.parent for p in paths])), paths


def plan_tar_update(
    root: Path,
    shards: list[Path],
    record: ModelRecord,
    old: Manifest | None = None,
    old_index: EmbeddingIndex | None = None,
) -> UpdatePlan:
    """An unchanged shard keeps its samples' rows (its bad samples stay skipped); every
    other one is to be embedded (``plan.todo``, ``plan.stats`` keyed by its path)."""
    plan = UpdatePlan(root, record, shards, old, old_index, shards={})
    old_shards = (old.shards or {}) if old else {}
    rows = {id: i for i, id in enumerate(old.files)} if old else {}
    ids = defaultdict(list)  # shard name -> its samples' ids in the old index
    for id, entry in [*old.files.items(), *old.skipped.items()] if old_shards else []:
        ids[entry.get("shard")].append(id)
    for path in shards:
        name, stat = tar_name(path), file_stat(path)
        prev = old_shards.get(name)
        same = prev is not None and all(prev.get(k) == v for k, v in stat.items())
        if prev is None or not (same or _same_content(path, prev, stat)):
            plan.todo.append(path)
            plan.stats[str(path)] = stat
            continue
        plan.shards[name] = {**prev, "path": str(path), **stat}
        plan.counts["skipped"] += prev.get("duplicates", 0)
        for id in ids[name]:
            if id in old.files:
                plan.files[id], plan.keep[id] = old.files[id], rows[id]
                plan.counts["unchanged"] += 1
            else:
                plan.skipped[id] = old.skipped[id]
                plan.counts["skipped"] += 1
    return plan


def _caption(sample: dict[str, Any]) -> str | None:
    try:
        return wds.sample_caption(sample)[:MAX_CAPTION_BYTES]
    except wds.BadSample:  # no caption: the image is indexed without one
        return None


def _decoded(shard: wds.ShardReader, name: str, transform, draft, workers: int) -> Iterator:
    """``(id, model input or None, caption, error)`` per sample, in order: files read in
    this thread (one tar file), images decoded by ``workers`` threads."""
    keys = shard.keys

    def read(i: int) -> tuple[int, dict | None, str | None]:
        try:
            return i, shard.sample(i), None
        except wds.BadSample as e:
            return i, None, str(e)

    def decode(item: tuple[int, dict | None, str | None]) -> tuple:
        i, sample, error = item
        if sample is not None:
            try:
                x = transform(wds.sample_image(sample, draft))
                return f"{name}/{keys[i]}", x, _caption(sample), None
            except wds.BadSample as e:
                error = str(e)
        return f"{name}/{keys[i]}", None, None, error

    items = map(read, range(len(keys)))
    if workers <= 1:
        yield from map(decode, items)
        return
    with ThreadPoolExecutor(workers) as pool:
        while chunk := list(itertools.islice(items, workers * 4)):  # bounded read-ahead
            yield from pool.map(decode, chunk)


def embed_tar(
    model: IndexModel, path: Path, *, batch_size: int, workers: int, bar: Any
) -> tuple[dict[str, Any], list[tuple]]:
    """One shard's manifest record (path, size, mtime, SHA-256, samples [, error]) and its
    rows ``(id, embedding or None, caption or None, error or None)``."""
    info = {"path": str(path), **file_stat(path), "sha256": _sha256(path)}
    with wds.ShardReader(path) as shard:
        info["samples"] = len(shard)
        if shard.truncated:
            info["error"] = shard.truncated
        stream = _decoded(shard, tar_name(path), model.preprocess, draft_size(model), workers)
        rows = list(embed_stream(model, stream, batch_size=batch_size, workers=workers, bar=bar))
    return info, rows


def take_tar(plan: UpdatePlan, info: dict[str, Any], rows: list[tuple], bad: Bad) -> None:
    """Record an embedded shard in ``plan``, and what was wrong with it in ``bad``."""
    bad.samples += plan.take_shard(tar_name(Path(info["path"])), info, rows)
    if "error" in info:
        bad.shards.append(f"{info['path']}: {info['error']}")


@dataclass
class Bad:
    """The bad samples (their errors) and truncated shards an update met."""

    samples: list[str] = field(default_factory=list)
    shards: list[str] = field(default_factory=list)

    def line(self) -> str | None:
        """The one line an update says about them (None: there were none)."""
        parts = [f"{len(found)} {what}{'s' * (len(found) != 1)} (the first: {found[0]})"
                 for what, found in (("bad sample", self.samples),
                                     ("truncated shard", self.shards)) if found]  # fmt: skip
        return "skipped " + "; ".join(parts) if parts else None


def update_tars(
    base: Path,
    spec: str,
    model: IndexModel,
    old: tuple[Manifest, EmbeddingIndex] | None,
    *,
    ann_options: AnnOptions,
    batch_size: int = 32,
    workers: int = 4,
    progress: bool = True,
    warn: Callable[[str], None],
) -> UpdateResult:
    """One process: plan the shards against ``old`` (None: a new index), embed the new and
    changed ones, write. Call it holding the index's lock."""
    from tqdm import tqdm

    root, paths = list_tars(spec)
    record = old[0].model if old else model.record()
    ann_options.check(record.embed_dim, len(old[0].files) if old else 0)
    plan = plan_tar_update(root, paths, record, *(old or (None, None)))
    bad = Bad()
    with tqdm(unit="img", desc="embedding", disable=None if progress else True) as bar:
        for path in plan.todo:
            info, rows = embed_tar(model, path, batch_size=batch_size, workers=workers, bar=bar)
            take_tar(plan, info, rows, bad)
    if line := bad.line():
        warn(line)
    return write_update(base, plan, ann_options, warn, {"shards": len(paths)})


def _sample_at(tar: str | os.PathLike, key: str) -> dict[str, Any]:
    try:
        with wds.ShardReader(tar) as shard:
            return shard.sample(shard.keys.index(key))
    except ValueError as e:  # (BadSample too) a key no longer in the shard
        raise wds.BadSample(f"{tar}: {key}: {e}") from None


def sample_image_at(tar: str | os.PathLike, key: str, draft: int | None = None):
    """The image of sample ``key`` of the shard ``tar`` (e.g. a :class:`~.api.Hit`'s ``path``
    and ``key``), decoded (a PIL image); :class:`~attn_vision.wds.BadSample` when it is gone
    or does not decode."""
    return wds.sample_image(_sample_at(tar, key), draft)


def sample_image_bytes(tar: str | os.PathLike, key: str) -> bytes:
    """The image file of sample ``key`` of the shard ``tar`` as stored (what a server sends
    base64-encoded); :class:`~attn_vision.wds.BadSample` when it is gone or has none."""
    sample = _sample_at(tar, key)
    ext = next((e for e in wds.IMAGE_EXTENSIONS if e in sample), None)
    if ext is None:
        raise wds.BadSample(f"{tar}: {key}: no image")
    return sample[ext]
