"""An update under ``torchrun``: one shard of the work per rank, merged by rank 0.

Rank 0 plans (holding the lock); the files to embed are cut into shards of whole batches,
dealt round-robin to the ranks; each rank writes every finished shard as
``INDEX.shard-<key>.safetensors`` (named by a hash of the model and of the files' paths,
sizes and mtimes); rank 0 merges them into the index one process writes. A killed run,
started again, keeps the finished shards. gloo carries only the plan and barriers.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import itertools
import json
import os
from collections.abc import Callable
from pathlib import Path

import torch
from attn_core import hub

from .embed import IndexModel, embed_images
from .errors import RankError, RetrievalError
from .fingerprint import ModelRecord
from .index import EmbeddingIndex
from .manifest import Manifest
from .options import AnnOptions
from .plan import UpdatePlan, file_stat, plan_update
from .store import index_lock
from .update import UpdateResult, find_folder_images, write_update

__all__ = [
    "merge_shards",
    "plan_shards",
    "read_shard",
    "shard_key",
    "shard_path",
    "update_distributed",
    "write_shard",
]

SHARD_FORMAT = "attn-zoo.retrieval-shard"


def shard_key(record: ModelRecord, root: str, items: list[list]) -> str:
    """What a shard's embeddings depend on: the model and each file's path, size, mtime."""
    what = {
        "model": [record.name, record.pretrained, record.precision, record.probe],
        "root": root,
        "files": items,
    }
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()


def shard_path(base: Path, key: str) -> Path:
    return base.with_name(f"{base.name}.shard-{key[:32]}.safetensors")


def plan_shards(
    items: list[list], shard_size: int, batch_size: int, record: ModelRecord, root: str
) -> tuple[list[list[list]], list[str]]:
    """``items`` (``[rel, size, mtime_ns]`` per file to embed) cut into shards of
    ``shard_size`` rounded up to whole batches, and each shard's key."""
    size = -(-shard_size // batch_size) * batch_size
    shards = [items[i : i + size] for i in range(0, len(items), size)]
    return shards, [shard_key(record, root, shard) for shard in shards]


def write_shard(path: Path, key: str, results: list[list], embs: list) -> None:
    """One finished shard, atomically: the embeddings of its readable files and, per file,
    ``[rel, size, mtime_ns, sha256 or None, error or None]`` in order."""
    emb = torch.stack(embs) if embs else torch.empty(0, 0)
    meta = {"format": SHARD_FORMAT, "key": key, "results": json.dumps(results)}
    hub.save_state_dict({"embeddings": emb.float().contiguous()}, path, metadata=meta)


def read_shard(path: Path, key: str, rels: list[str]):
    """``(results, embeddings)`` of a finished shard of this key and these files, or None
    when there is none (or it is unreadable or does not fit: then it is done again)."""
    if not path.is_file():
        return None
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            emb = f.get_tensor("embeddings")
        results = json.loads(meta["results"])
        good = sum(r[4] is None for r in results)
        ok = meta.get("format") == SHARD_FORMAT and meta.get("key") == key
        ok = ok and [r[0] for r in results] == rels and all(len(r) == 5 for r in results)
        ok = ok and emb.shape[0] == good and bool(torch.isfinite(emb).all())
    except Exception:  # a shard we cannot use is embedded again
        return None
    return (results, emb) if ok else None


def merge_shards(plan: UpdatePlan, base: Path, keys: list[str], rels: list[list[str]]) -> None:
    """Take every shard's results into the plan (rank 0, after all shards are written)."""
    for i, key in enumerate(keys):
        found = read_shard(shard_path(base, key), key, rels[i])
        if found is None:
            raise RetrievalError(
                f"shard {i} ({shard_path(base, key).name}) is missing or unreadable: is the "
                "index on a file system that every node shares?"
            )
        results, emb = found
        rows = iter(emb)
        for rel, size, mtime_ns, digest, err in results:
            stat = {"size": size, "mtime_ns": mtime_ns}
            plan.take(rel, stat, None if err else next(rows), digest, err)


def update_distributed(
    base: Path,
    root: Path,
    model: Callable[[], IndexModel],
    old: Callable[[], tuple[Manifest, EmbeddingIndex] | None],
    load_model: Callable[[ModelRecord], IndexModel],
    *,
    ann_options: AnnOptions,
    batch_size: int = 32,
    workers: int = 4,
    shard_size: int = 1024,
    warn: Callable[[str], None],
) -> UpdateResult | None:
    """The update under torchrun, run by every rank. Rank 0 takes the lock, reads ``old()``
    and builds ``model()``; the other ranks build the recorded model with ``load_model``
    and check its fingerprint (errors become :class:`RankError` naming the rank). Rank 0's
    errors are raised on every rank (as :class:`RetrievalError` on the others). Returns the
    result on rank 0, None on the others."""
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    ours = not dist.is_initialized()  # (a caller's process group is left to the caller)
    if ours:  # gloo: only small objects and barriers go through it
        dist.init_process_group("gloo", timeout=datetime.timedelta(days=7))

    def share(obj):
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    try:
        with contextlib.ExitStack() as stack:
            plan, loaded, error = None, None, None
            if rank == 0:
                try:
                    stack.enter_context(index_lock(base))
                    previous = old()
                    found = find_folder_images(root)
                    loaded = model()
                    record = previous[0].model if previous else loaded.record()
                    ann_options.check(record.embed_dim, len(found))
                    plan = plan_update(root, found, record, *(previous or (None, None)))
                except ValueError as e:
                    error = e
            work = None
            if plan is not None:
                items = [[rel, s["size"], s["mtime_ns"]] for rel, s in plan.stats.items()]
                work = {"record": plan.record, "items": items}
            shared_error, work = share((None if error is None else str(error), work))
            if error is not None:
                raise error
            if shared_error is not None:
                raise RetrievalError(shared_error)  # rank 0 says it; the others exit quietly
            record, items = work["record"], work["items"]
            if rank != 0:
                try:
                    loaded = load_model(record)
                    record.check(loaded)
                except ValueError as e:
                    raise RankError(f"rank {rank}: {e}") from None
            shards, keys = plan_shards(items, shard_size, batch_size, record, str(root))
            rels = [[rel for rel, _, _ in shard] for shard in shards]
            mine = list(range(rank, len(shards), world))
            todo = [
                i for i in mine if read_shard(shard_path(base, keys[i]), keys[i], rels[i]) is None
            ]
            resumed = sum(len(shards[i]) for i in mine if i not in todo)
            paths = [root / rel for i in todo for rel, _, _ in shards[i]]
            stream = embed_images(loaded, paths, batch_size=batch_size, workers=workers,
                                  desc=f"embedding (rank {rank})", progress=rank == 0)  # fmt: skip
            for i in todo:
                results, embs = [], []
                for path, emb, digest, err in itertools.islice(stream, len(shards[i])):
                    st = file_stat(path)
                    results.append([path.relative_to(root).as_posix(), st["size"],
                                    st["mtime_ns"], digest, err])  # fmt: skip
                    if err is None:
                        embs.append(emb)
                    else:
                        warn(f"skipped {err}")
                write_shard(shard_path(base, keys[i]), keys[i], results, embs)
            stream.close()
            total = torch.tensor([resumed], dtype=torch.long)
            dist.all_reduce(total)
            dist.barrier()  # every shard is on disk
            result, error = None, None
            if rank == 0:
                try:
                    merge_shards(plan, base, keys, rels)
                    extra = {"ranks": world, "resumed": int(total.item())}
                    result = write_update(base, plan, ann_options, warn, extra)
                except ValueError as e:
                    error = e
            shared_error = share(None if error is None else str(error))  # then the others leave
            if error is not None:
                raise error
            if shared_error is not None:
                raise RetrievalError(shared_error)
            return result
    finally:
        if ours:
            dist.destroy_process_group()
