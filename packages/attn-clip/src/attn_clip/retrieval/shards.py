"""An update under ``torchrun``: one shard of the work per rank, merged by rank 0.

Rank 0 plans (holding the lock); the files to embed are cut into shards of whole batches,
dealt round-robin to the ranks; each rank writes every finished shard as
``INDEX.shard-<key>.safetensors`` (named by a hash of the model and of the files' paths,
sizes and mtimes); rank 0 merges them into the index one process writes. A killed run,
started again, keeps the finished shards. gloo carries only the plan and barriers.
An index of webdataset tar shards (:mod:`.tars`) is split the same way, one tar per shard
file (whose results are its samples: ``[id, caption, error]``, and the tar's record).
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
from .tars import Bad, embed_tar, plan_tar_update, take_tar
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


def write_shard(
    path: Path, key: str, results: list[list], embs: list, info: dict | None = None
) -> None:
    """One finished shard, atomically: the embeddings of its readable files and, per file,
    ``[rel, size, mtime_ns, sha256 or None, error or None]`` in order (a tar's: per sample
    ``[id, caption or None, error or None]``, and ``info``, the tar's manifest record)."""
    emb = torch.stack(embs) if embs else torch.empty(0, 0)
    meta = {"format": SHARD_FORMAT, "key": key, "results": json.dumps(results),
            "info": json.dumps(info)}  # fmt: skip
    hub.save_state_dict({"embeddings": emb.float().contiguous()}, path, metadata=meta)


def read_shard(path: Path, key: str, rels: list[str] | None):
    """``(results, embeddings, info)`` of a finished shard of this key and these files
    (None: a tar's samples), or None when there is none (or it is unreadable or does not
    fit: then it is done again)."""
    if not path.is_file():
        return None
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            emb = f.get_tensor("embeddings")
        results, info = json.loads(meta["results"]), json.loads(meta.get("info", "null"))
        width = 5 if rels is not None else 3
        good = sum(r[-1] is None for r in results)
        ok = meta.get("format") == SHARD_FORMAT and meta.get("key") == key
        ok = ok and all(isinstance(r, list) and len(r) == width for r in results)
        ok = ok and (rels is None or [r[0] for r in results] == rels)
        ok = ok and (rels is not None or isinstance(info, dict) and "path" in info)
        ok = ok and emb.shape[0] == good and bool(torch.isfinite(emb).all())
    except Exception:  # a shard we cannot use is embedded again
        return None
    return (results, emb, info) if ok else None


def merge_shards(
    plan: UpdatePlan, base: Path, keys: list[str], rels: list[list[str]] | None
) -> Bad:
    """Take every shard's results into the plan (rank 0, after all shards are written);
    returns a tar index's bad samples and shards (``rels`` None: one shard per tar)."""
    bad = Bad()
    for i, key in enumerate(keys):
        found = read_shard(shard_path(base, key), key, rels and rels[i])
        if found is None:
            raise RetrievalError(
                f"shard {i} ({shard_path(base, key).name}) is missing or unreadable: is the "
                "index on a file system that every node shares?"
            )
        results, emb, info = found
        rows = iter(emb)
        if rels is None:
            samples = [(id, None if err else next(rows), caption, err)
                       for id, caption, err in results]  # fmt: skip
            take_tar(plan, info, samples, bad)
            continue
        for rel, size, mtime_ns, digest, err in results:
            stat = {"size": size, "mtime_ns": mtime_ns}
            plan.take(rel, stat, None if err else next(rows), digest, err)
    return bad


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
    tars: list[Path] | None = None,
) -> UpdateResult | None:
    """The update under torchrun, run by every rank. Rank 0 takes the lock, reads ``old()``
    and builds ``model()``; the other ranks build the recorded model with ``load_model``
    and check its fingerprint (errors become :class:`RankError` naming the rank). Rank 0's
    errors are raised on every rank (as :class:`RetrievalError` on the others). Returns the
    result on rank 0, None on the others. ``tars``: the webdataset shards to index (their
    folder is ``root``), one per shard file, instead of the images under ``root``."""
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
                    found = tars if tars is not None else find_folder_images(root)
                    loaded = model()
                    record = previous[0].model if previous else loaded.record()
                    count = len(previous[0].files) if previous else 0
                    ann_options.check(record.embed_dim, count if tars is not None else len(found))
                    planner = plan_update if tars is None else plan_tar_update
                    plan = planner(root, found, record, *(previous or (None, None)))
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
            one = (1, 1) if tars is not None else (shard_size, batch_size)  # a tar per shard
            shards, keys = plan_shards(items, *one, record, str(root))
            rels = None if tars is not None else [[rel for rel, _, _ in s] for s in shards]
            mine = list(range(rank, len(shards), world))
            todo = [
                i
                for i in mine
                if read_shard(shard_path(base, keys[i]), keys[i], rels and rels[i]) is None
            ]
            resumed = sum(len(shards[i]) for i in mine if i not in todo)
            if tars is not None:
                embed_tars(loaded, [(i, shards[i][0][0]) for i in todo], base, keys,
                           batch_size=batch_size, workers=workers, progress=rank == 0)  # fmt: skip
            else:
                embed_folder(loaded, root, [(i, shards[i]) for i in todo], base, keys,
                             batch_size=batch_size, workers=workers, progress=rank == 0,
                             desc=f"embedding (rank {rank})", warn=warn)  # fmt: skip
            total = torch.tensor([resumed], dtype=torch.long)
            dist.all_reduce(total)
            dist.barrier()  # every shard is on disk
            result, error = None, None
            if rank == 0:
                try:
                    if line := merge_shards(plan, base, keys, rels).line():
                        warn(line)
                    extra = {"ranks": world, "resumed": int(total.item())}
                    extra |= {"shards": len(tars)} if tars is not None else {}
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


def embed_tars(
    loaded: IndexModel, todo: list[tuple[int, str]], base: Path, keys: list[str], *,
    batch_size: int, workers: int, progress: bool,
) -> None:  # fmt: skip
    """Embed each ``(shard number, tar path)`` of ``todo`` into its shard file."""
    from tqdm import tqdm

    with tqdm(unit="img", desc="embedding", disable=None if progress else True) as bar:
        for i, path in todo:
            info, rows = embed_tar(loaded, Path(path), batch_size=batch_size, workers=workers,
                                   bar=bar)  # fmt: skip
            results = [[id, caption, err] for id, _, caption, err in rows]
            embs = [emb for _, emb, _, err in rows if err is None]
            write_shard(shard_path(base, keys[i]), keys[i], results, embs, info)


def embed_folder(
    loaded: IndexModel, root: Path, todo: list[tuple[int, list[list]]], base: Path,
    keys: list[str], *, batch_size: int, workers: int, desc: str, progress: bool,
    warn: Callable[[str], None],
) -> None:  # fmt: skip
    """Embed the files of each ``(shard number, [[rel, size, mtime_ns], ...])`` of ``todo``
    into its shard file (one stream of batches across them)."""
    paths = [root / rel for _, shard in todo for rel, _, _ in shard]
    stream = embed_images(loaded, paths, batch_size=batch_size, workers=workers, desc=desc,
                          progress=progress)  # fmt: skip
    for i, shard in todo:
        results, embs = [], []
        for path, emb, digest, err in itertools.islice(stream, len(shard)):
            st = file_stat(path)
            results.append([path.relative_to(root).as_posix(), st["size"], st["mtime_ns"],
                            digest, err])  # fmt: skip
            if err is None:
                embs.append(emb)
            else:
                warn(f"skipped {err}")
        write_shard(shard_path(base, keys[i]), keys[i], results, embs)
    stream.close()
