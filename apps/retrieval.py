"""Image / text retrieval with CLIP: index a folder of images, search it, measure recall.

    uv run apps/retrieval.py index photos/ --out photos.idx             # embed every image
    uv run apps/retrieval.py index photos/ --out photos.idx --update    # only new / changed
    uv run apps/retrieval.py search photos.idx --text "a dog on a beach" --top-k 5
    uv run apps/retrieval.py search photos.idx --image query.jpg --grid hits.png
    uv run apps/retrieval.py eval --csv captions.csv                    # recall@1/5/10

An index is ``INDEX.manifest.json`` (the model that made it, the folder, and each file's
size, mtime and SHA-256, which --update compares to find new, changed and removed files)
and the generation of embeddings it names, ``INDEX.g<N>.safetensors`` + ``INDEX.g<N>.json``
(an attn_clip ``EmbeddingIndex``: normalized image embeddings, their paths, a SHA-256).
An update writes a new generation completely, then switches the manifest in one rename,
then removes the old generation: killed at any point, the index is the old one or the new
one, and the next ``--update`` completes the work. ``index`` holds ``INDEX.lock`` while it
writes; a second writer exits with code 2 naming the first one's PID. To copy an index,
copy ``INDEX.*``. ``search`` and ``eval --index`` use the index's own model; asking for
another one is an error, and so are weights that no longer give the embeddings the index
was built with.

Scores are cosine similarities; with a SigLIP / SigLIP2 model a text query's hits also get
``p(match)``, SigLIP's sigmoid probability that the text describes the image (JSON: "prob").

Bad input (unreadable index, missing query image, empty query, unknown model, weights not
available offline, a CSV without image / caption columns) prints one line on stderr and
exits with code 2. Unreadable files under the indexed folder are skipped and counted.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import glob
import hashlib
import importlib.util
import itertools
import json
import os
import re
from pathlib import Path
from typing import Any

from _common import (  # the image / model helpers shared with apps/zero_shot.py
    PRECISIONS,
    HelpFormatter,
    InputError,
    LoadedModel,
    check_folder,
    fail,
    find_images,
    iter_images,
    list_models_and_exit,
    load_image_file,
    load_model,
    resolve_model_args,
    run,
    warn,
)

MANIFEST_FORMAT, MANIFEST_VERSION = "attn-zoo.retrieval-manifest", 2
PROBE_TEXT = "a photo of a dog."  # its embedding is stored to recognise the same weights
PROBE_MIN_COSINE = 0.99  # bf16 / fp16 / another device stay far above this
IMAGE_COLUMNS = ("filepath", "image", "image_path", "path", "file", "filename")
CAPTION_COLUMNS = ("title", "caption", "text", "sentence")
ANN_THRESHOLD = 100_000  # --ann auto: an approximate index from this many images on


# -- index files ---------------------------------------------------------------------------


def index_base(path: str | os.PathLike) -> Path:
    """``photos.idx`` / ``photos.idx.json`` / ``photos.idx.safetensors`` -> ``photos.idx``."""
    p = Path(path)
    for suffix in (".manifest.json", ".safetensors", ".json"):
        if p.name.endswith(suffix):
            return p.with_name(p.name[: -len(suffix)])
    return p


def manifest_path(base: Path) -> Path:
    return base.with_name(base.name + ".manifest.json")


MANIFEST_KEYS = ("format", "version", "model", "root", "files", "skipped")


def read_manifest(base: Path) -> dict[str, Any]:
    path = manifest_path(base)
    if not path.is_file():
        tensors = base.with_name(base.name + ".safetensors")
        what = "no index" if not tensors.exists() else "an index without its manifest"
        raise InputError(f"{what} at {base} (expected {path.name}); build it with: index DIR --out")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InputError(f"unreadable index manifest {path}: {e}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
        raise InputError(f"{path} is not a manifest written by apps/retrieval.py")
    if manifest.get("version") not in (1, MANIFEST_VERSION):
        raise InputError(f"{path}: unsupported manifest version {manifest.get('version')!r}")
    missing = [k for k in MANIFEST_KEYS if k not in manifest]
    model = manifest.get("model")
    if not missing and not (isinstance(model, dict) and isinstance(manifest["files"], dict)):
        missing = ["model" if not isinstance(model, dict) else "files"]
    if not missing and not all(k in model for k in ("name", "pretrained", "embed_dim", "probe")):
        missing = ["model.name / pretrained / embed_dim / probe"]
    if missing:
        raise InputError(f"{path}: a broken manifest (missing or malformed {', '.join(missing)})")
    return manifest


def load_index(base: Path):
    """``(manifest, EmbeddingIndex)`` of the index at ``base``, checked against each other."""
    import attn_clip

    try:
        manifest, index = attn_clip.load_index_set(base, lambda: read_manifest(base))
    except (FileNotFoundError, ValueError) as e:
        raise InputError(f"unreadable index: {e}") from None
    if index.ids != list(manifest["files"]):
        raise InputError(f"{manifest_path(base)} does not match its embeddings: rebuild the index")
    if index.dim != manifest["model"]["embed_dim"]:
        raise InputError(
            f"{manifest_path(base)} says embed_dim {manifest['model']['embed_dim']} but its "
            f"embeddings have {index.dim}: rebuild the index"
        )
    return manifest, index


def shown(root: str, rel: str) -> str:
    """An indexed file's path, relative to the working directory when it is below it."""
    p = Path(root) / rel
    try:
        return str(p.relative_to(Path.cwd()))
    except ValueError:
        return str(p)


# -- the model an index was made with ------------------------------------------------------


def model_record(loaded: LoadedModel, precision: str) -> dict[str, Any]:
    import torch

    with torch.no_grad():
        tokens = loaded.tokenizer([PROBE_TEXT]).to(loaded.device)
        probe = loaded.model.encode_text(tokens, normalize=True)[0].float().cpu()
    return {
        "name": loaded.name,
        "pretrained": loaded.pretrained,
        "precision": precision,
        "embed_dim": int(probe.shape[0]),
        "probe": [round(v, 6) for v in probe.tolist()],
    }


def check_requested_model(args: argparse.Namespace, recorded: dict[str, Any], base: Path) -> None:
    """--model / --pretrained, when given, must name the model the index was built with."""
    if args.model is None and args.pretrained is None:
        return
    name, pretrained = resolve_model_args(args.model, args.pretrained)
    if args.model is None and args.pretrained is not None and not os.path.isdir(args.pretrained):
        name = recorded["name"]  # only --pretrained given: same architecture assumed
    if args.pretrained is None:
        pretrained = recorded["pretrained"]  # only --model given: its recorded weights
    if (name, pretrained) != (recorded["name"], recorded["pretrained"]):
        only_model = args.pretrained is None  # then the recorded tag is not what was asked
        asked = name + (f" ({pretrained})" if pretrained and not only_model else "")
        raise InputError(
            f"{base} was built with {describe(recorded)}, not {asked}: its embeddings only "
            "make sense with that model; drop --model / --pretrained, or rebuild the index"
        )


def describe(recorded: dict[str, Any]) -> str:
    tag = recorded.get("pretrained")
    return recorded["name"] + (f" ({tag})" if tag else "")


def load_recorded_model(args: argparse.Namespace, recorded: dict[str, Any]) -> LoadedModel:
    """The index's model, with a check that its weights still give the same embeddings."""
    import torch

    loaded = load_model(recorded["name"], recorded["pretrained"], args.device, args.precision)
    now = torch.tensor(model_record(loaded, args.precision)["probe"])
    then = torch.tensor(recorded["probe"])
    same = now.shape == then.shape and float(now @ then) >= PROBE_MIN_COSINE
    if not same:
        raise InputError(
            f"the weights of {describe(recorded)} are not the ones this index was built with "
            "(their embeddings differ); rebuild the index"
        )
    return loaded


# -- embedding -----------------------------------------------------------------------------


def embed_images(loaded: LoadedModel, paths: list[Path], args, desc: str, show: bool = True):
    """Yield ``(path, embedding or None, sha256, error)`` in batches, with a progress bar.

    ``--workers`` threads decode (JPEGs in Pillow's draft mode, at the smallest scale that
    still covers the model's input) and preprocess the images, up to two batches ahead of the
    model, so decoding goes on while the model runs and memory stays bounded."""
    import torch
    from tqdm import tqdm

    bar = tqdm(total=len(paths), unit="img", desc=desc, disable=None if show else True)
    side = max(getattr(loaded.preprocess, "size", None) or (0,))
    stream = iter_images(paths, args.workers, transform=loaded.preprocess, draft=side or None)
    if args.workers > 0:
        stream = read_ahead(stream, 2 * args.batch_size)
    try:
        while batch := list(itertools.islice(stream, args.batch_size)):
            good = [(p, x, h) for p, x, h, err in batch if err is None]
            embs = []
            if good:
                x = torch.stack([x for _, x, _ in good]).to(loaded.device)
                with torch.no_grad():
                    embs = loaded.model.encode_image(x, normalize=True).float().cpu()
            it = iter(embs)
            for p, _, h, err in batch:
                yield (p, None, None, err) if err is not None else (p, next(it), h, None)
            bar.update(len(batch))
    finally:
        bar.close()


def read_ahead(items, ahead: int):
    """``items``, produced by a background thread at most ``ahead`` items ahead of the
    consumer (whose exceptions, Ctrl-C included, stop the producer)."""
    import queue
    import threading

    box: queue.Queue = queue.Queue(maxsize=ahead)
    stop, end = threading.Event(), object()

    def put(item) -> bool:
        while not stop.is_set():
            try:
                box.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for item in items:
                if not put(item):
                    return
            put(end)
        except BaseException as e:  # handed to the consumer, raised there
            put((end, e))
        finally:
            items.close()

    thread = threading.Thread(target=produce, daemon=True, name="read-ahead")
    thread.start()
    try:
        while (item := box.get()) is not end:
            if isinstance(item, tuple) and len(item) == 2 and item[0] is end:
                raise item[1]
            yield item
    finally:
        stop.set()


def embed_texts(loaded: LoadedModel, texts: list[str], batch_size: int):
    import torch

    out = []
    with torch.no_grad():
        for start in range(0, len(texts), batch_size):
            tokens = loaded.tokenizer(texts[start : start + batch_size]).to(loaded.device)
            out.append(loaded.model.encode_text(tokens, normalize=True).float().cpu())
    return torch.cat(out)


# -- index ---------------------------------------------------------------------------------


def cmd_index(args: argparse.Namespace) -> int:
    root = Path(args.dir)
    check_folder(root)
    root = root.resolve()
    base = index_base(args.out)
    if not base.parent.is_dir():
        raise InputError(f"--out: folder {base.parent} does not exist")
    if torchrun_rank() is not None:
        return index_distributed(args, root, base)
    import attn_clip

    try:
        with attn_clip.index_lock(base):  # one writer at a time; the lock file goes with it
            return update_index(args, root, base)
    except attn_clip.IndexBusyError as e:
        raise InputError(f"{e}; try again when it has finished") from None


class Plan:
    """What an ``index`` run does: the rows it keeps, the files it embeds, what it found.
    (A plain class: the app is also loaded as a module that is not in ``sys.modules``.)"""

    def __init__(self, root: Path, base: Path, old, old_index, record, loaded, found) -> None:
        self.root, self.base = root, base
        self.old: dict[str, Any] | None = old  # the old manifest (--update)
        self.old_index = old_index  # its EmbeddingIndex
        self.record: dict[str, Any] = record  # the model
        self.loaded: LoadedModel = loaded
        self.found: list[Path] = found
        self.files: dict[str, dict[str, Any]] = {}
        self.skipped: dict[str, dict[str, Any]] = {}
        self.keep: dict[str, int] = {}  # rel -> row in the old index
        self.todo: list[Path] = []
        self.stats: dict[str, dict[str, int]] = {}  # rel -> size, mtime of each file in todo
        self.counts = dict.fromkeys(("added", "updated", "unchanged", "removed", "skipped"), 0)
        self.new: dict[str, Any] = {}  # rel -> its new embedding


def update_index(args: argparse.Namespace, root: Path, base: Path) -> int:
    """Build (or with --update, bring up to date) the index at ``base`` of ``root``."""
    plan = plan_index(args, root, base)
    for path, emb, digest, error in embed_images(plan.loaded, plan.todo, args, desc="embedding"):
        rel = path.relative_to(root).as_posix()
        take_result(plan, rel, file_stat(path), emb, digest, error)
        if error is not None:
            warn(f"skipped {error}")
    return finish_index(args, plan)


def plan_index(args: argparse.Namespace, root: Path, base: Path) -> Plan:
    """Load the old index (--update) and the model; decide per file: keep or embed."""
    old, old_index = None, None
    if args.update and manifest_path(base).exists():
        old, old_index = load_index(base)
        check_requested_model(args, old["model"], base)
    elif args.update:
        warn(f"no index at {base} yet: building it")

    found = find_images(root)
    if not found:
        raise InputError(f"no images under {root}")
    if old is not None:
        loaded = load_recorded_model(args, old["model"])
        record = old["model"]
    else:
        loaded = load_model(args.model, args.pretrained, args.device, args.precision)
        record = model_record(loaded, args.precision)
    plan = Plan(root, base, old, old_index, record, loaded, found)
    check_ann_args(args, record["embed_dim"], len(found))

    # Decide per file: keep the old row (same size + mtime, or same content), or embed.
    old_files = old["files"] if old else {}
    old_skipped = old["skipped"] if old else {}
    rows = {rel: i for i, rel in enumerate(old_files)}
    for path in found:
        rel = path.relative_to(root).as_posix()
        stat = file_stat(path)
        prev = old_files.get(rel) or old_skipped.get(rel)
        same_stat = prev is not None and all(prev[k] == stat[k] for k in stat)
        if rel in old_files and (same_stat or _same_content(path, prev, stat)):
            plan.files[rel] = {**stat, "sha256": prev["sha256"]}
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


def take_result(plan: Plan, rel: str, stat: dict, emb, digest: str | None, error: str | None):
    """Record one embedded (or unreadable) file in the plan."""
    if error is not None:
        plan.skipped[rel] = {**stat, "error": error}
        plan.counts["skipped"] += 1
        return
    old_files = plan.old["files"] if plan.old else {}
    plan.counts["updated" if rel in old_files else "added"] += 1
    plan.files[rel] = {**stat, "sha256": digest}
    plan.new[rel] = emb


def finish_index(args: argparse.Namespace, plan: Plan, extra: dict | None = None) -> int:
    """Assemble the index (kept rows + new ones, sorted by path), add the approximate index
    when asked for, and write it all as one new generation."""
    root, base, record = plan.root, plan.base, plan.record
    if not plan.files:
        raise InputError(f"none of the {len(plan.found)} image files under {root} could be read")
    import attn_clip
    import torch

    index = attn_clip.EmbeddingIndex(dim=record["embed_dim"])
    files, keep = plan.files, plan.keep
    order = sorted(files)
    rows_old = [keep[rel] for rel in order if rel in keep]
    emb = torch.empty(len(order), record["embed_dim"])
    if rows_old:
        emb[[i for i, rel in enumerate(order) if rel in keep]] = plan.old_index.embeddings[rows_old]
    for i, rel in enumerate(order):
        if rel in plan.new:
            emb[i] = plan.new[rel]
    index.add(emb, ids=order)
    del emb
    ann = build_ann(args, index, plan.old_index)
    manifest = {
        "format": MANIFEST_FORMAT,
        "version": MANIFEST_VERSION,
        "model": record,
        "root": str(root),
        "files": {rel: files[rel] for rel in order},
        "skipped": dict(sorted(plan.skipped.items())),
    }
    generation = attn_clip.save_index_set(base, index, manifest, manifest_path(base))
    for shard in base.parent.glob(f"{glob.escape(base.name)}.shard-*.safetensors"):
        shard.unlink(missing_ok=True)  # finished (or abandoned) shards of torchrun runs
    counts = plan.counts
    summary = {"index": str(base), "model": describe(record), "images": len(order), **counts}
    summary.update(extra or {})
    if ann is not None:
        summary["ann"] = {k: ann[k] for k in ANN_SUMMARY_KEYS if k in ann}
    if args.json:
        print(json.dumps(summary))
    else:
        parts = ", ".join(f"{v} {k}" for k, v in counts.items() if v or k in ("added",))
        more = "".join(f", {v} {k}" for k, v in (extra or {}).items() if k != "ranks")
        ranks = f" on {extra['ranks']} ranks" if extra and "ranks" in extra else ""
        print(f"indexed {len(order)} images under {root} with {describe(record)}{ranks} "
              f"({parts}{more})")  # fmt: skip
        if ann is not None:
            print(describe_ann(ann, index))
        print(f"wrote {manifest_path(base)} (embeddings: {base.name}.g{generation}.*)")
    return 0


# -- the approximate index ---------------------------------------------------------------------

ANN_SUMMARY_KEYS = ("factory", "bytes", "nprobe", "param", "recall_at_10", "check_queries",
                    "build_s", "retrained")  # fmt: skip


def parse_bytes(text: str) -> int:
    """``"256MB"`` / ``"1.5GiB"`` / ``"300000000"`` -> bytes."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kmgt]?i?b?)\s*", text.lower())
    if not m:
        raise InputError(f"--ann-memory: not a size: {text!r} (e.g. 256MB, 2GiB)")
    unit = m[2].rstrip("b").rstrip("i")
    scale = 1024 ** "_kmgt".index(unit) if unit else 1
    return int(float(m[1]) * scale)


def check_ann_args(args: argparse.Namespace, dim: int, count: int) -> None:
    """--ann on needs faiss, a factory string must parse, the budget must fit an index."""
    if args.ann == "off":
        return
    if importlib.util.find_spec("faiss") is None:
        if args.ann == "on":
            raise InputError("--ann on needs faiss: pip install 'attn-clip[faiss]'")
        return
    import attn_clip.retrieval as r

    if args.ann_factory:
        try:
            r.check_ann_factory(dim, args.ann_factory)
        except ValueError as e:
            raise InputError(f"--ann-factory: {e}") from None
    elif args.ann == "on" or count >= args.ann_threshold:
        budget = args.ann_memory if args.ann_memory is not None else count * dim * 4 // 8
        try:
            r.choose_ann_factory(count, dim, budget)
        except ValueError as e:
            raise InputError(f"--ann-memory: {e}") from None


def build_ann(args: argparse.Namespace, index, old_index) -> dict | None:
    """The approximate index, when --ann asks for one (auto: from --ann-threshold images).
    An --update whose old index has one of the same kind keeps its training."""
    wanted = args.ann == "on" or (args.ann == "auto" and len(index) >= args.ann_threshold)
    if not wanted:
        return None
    if importlib.util.find_spec("faiss") is None:
        warn(f"{len(index)} images: an approximate index needs faiss (pip install "
             "'attn-clip[faiss]'); search stays exact")  # fmt: skip
        return None
    import attn_clip.retrieval as r

    n, dim = len(index), index.dim
    budget = args.ann_memory if args.ann_memory is not None else n * dim * 4 // 8
    try:
        factory = args.ann_factory or r.choose_ann_factory(n, dim, budget)
    except ValueError as e:
        raise InputError(f"--ann-memory: {e}") from None
    old_info = getattr(old_index, "ann_info", None) or {}
    trained = old_index.ann if old_info.get("factory") == factory else None
    try:
        return index.build_ann(factory, memory_budget=budget, trained=trained)
    except ValueError as e:
        raise InputError(f"approximate index: {e}") from None


def describe_ann(ann: dict, index) -> str:
    exact, size = len(index) * index.dim * 4, max(ann["bytes"], 1)
    part = f"1/{exact / size:.0f} of" if size <= exact else f"{size / exact:.1f}x"
    return (
        f"approximate index {ann['factory']}: {size / 2**20:.2f} MiB ({part} the float32 "
        f"embeddings), built in "
        f"{ann['build_s']:.1f} s; recall@10 {ann['recall_at_10']:.3f} against exact search "
        f"({ann['check_queries']} indexed images as queries) at {ann['param']} {ann['nprobe']}"
    )


# -- index under torchrun: one shard of the work per rank --------------------------------------


class RankError(InputError):
    """Bad input that only this rank saw (each rank reports its own)."""


def torchrun_rank() -> int | None:
    """This process's rank when ``torchrun`` started it, else None."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return int(os.environ["RANK"])
    return None


SHARD_FORMAT = "attn-zoo.retrieval-shard"


def shard_key(plan_record: dict, root: str, items: list[list]) -> str:
    """What a shard's embeddings depend on: the model and each file's path, size, mtime."""
    what = {
        "model": [plan_record[k] for k in ("name", "pretrained", "precision", "probe")],
        "root": root,
        "files": items,
    }
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()


def shard_path(base: Path, key: str) -> Path:
    return base.with_name(f"{base.name}.shard-{key[:32]}.safetensors")


def write_shard(path: Path, key: str, results: list[list], embs: list) -> None:
    """One finished shard, atomically: the embeddings of its readable files and, per file,
    ``[rel, size, mtime_ns, sha256 or None, error or None]`` in order."""
    import torch
    from attn_core import hub

    emb = torch.stack(embs) if embs else torch.empty(0, 0)
    meta = {"format": SHARD_FORMAT, "key": key, "results": json.dumps(results)}
    hub.save_state_dict({"embeddings": emb.float().contiguous()}, path, metadata=meta)


def read_shard(path: Path, key: str, rels: list[str]):
    """``(results, embeddings)`` of a finished shard of this key and these files, or None
    when there is none (or it is unreadable or does not fit: then it is done again)."""
    if not path.is_file():
        return None
    import torch
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


def index_distributed(args: argparse.Namespace, root: Path, base: Path) -> int:
    """``index`` under ``torchrun``: rank 0 plans (holding the lock), every rank embeds its
    shards (fixed-size slices of the files to embed, dealt round-robin) and writes each as
    ``INDEX.shard-<key>.safetensors`` once finished, rank 0 merges them into the same index
    a single process writes. A killed run, started again, keeps the finished shards."""
    import datetime

    import attn_clip
    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", 0))
    if args.device in (None, "cuda") and torch.cuda.is_available():
        args.device = f"cuda:{local}"  # one GPU per process
    if not dist.is_initialized():  # gloo: only small objects and barriers go through it
        dist.init_process_group("gloo", timeout=datetime.timedelta(days=7))

    def share(obj):
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    try:
        with contextlib.ExitStack() as stack:
            plan, error = None, None
            if rank == 0:
                try:
                    stack.enter_context(attn_clip.index_lock(base))
                    plan = plan_index(args, root, base)
                except attn_clip.IndexBusyError as e:
                    error = f"{e}; try again when it has finished"
                except InputError as e:
                    error = str(e)
            work = None
            if plan is not None:
                items = [[rel, s["size"], s["mtime_ns"]] for rel, s in plan.stats.items()]
                work = {"record": plan.record, "items": items}
            error, work = share((error, work))
            if error is not None:
                raise InputError(error)  # rank 0 says it; the others exit quietly
            record, items = work["record"], work["items"]
            if rank == 0:
                loaded = plan.loaded
            else:
                try:
                    loaded = load_recorded_model(args, record)
                except InputError as e:
                    raise RankError(f"rank {rank}: {e}") from None
            size = -(-args.shard_size // args.batch_size) * args.batch_size  # whole batches
            shards = [items[i : i + size] for i in range(0, len(items), size)]
            keys = [shard_key(record, str(root), shard) for shard in shards]
            mine = list(range(rank, len(shards), world))
            rels = [[rel for rel, _, _ in shard] for shard in shards]
            todo = [
                i for i in mine if read_shard(shard_path(base, keys[i]), keys[i], rels[i]) is None
            ]
            resumed = sum(len(shards[i]) for i in mine if i not in todo)
            paths = [root / rel for i in todo for rel, _, _ in shards[i]]
            stream = embed_images(loaded, paths, args, desc=f"embedding (rank {rank})",
                                  show=rank == 0)  # fmt: skip
            for i in todo:
                results, embs = [], []
                for path, emb, digest, err in itertools.islice(stream, len(shards[i])):
                    st = file_stat(path)
                    rel = path.relative_to(root).as_posix()
                    results.append([rel, st["size"], st["mtime_ns"], digest, err])
                    if err is None:
                        embs.append(emb)
                    else:
                        warn(f"skipped {err}")
                write_shard(shard_path(base, keys[i]), keys[i], results, embs)
            stream.close()
            resumed = share_sum(torch, dist, resumed)
            dist.barrier()  # every shard is on disk
            code, error = 0, None
            if rank == 0:
                try:
                    merge_shards(plan, base, keys, rels)
                    code = finish_index(args, plan, {"ranks": world, "resumed": resumed})
                except InputError as e:
                    error = str(e)
            error = share(error)  # the others leave once the index is written (or not)
            if error is not None:
                raise InputError(error)
            return code
    finally:
        dist.destroy_process_group()


def merge_shards(plan: Plan, base: Path, keys: list[str], rels: list[list[str]]) -> None:
    """Take every shard's results into the plan (rank 0, after all shards are written)."""
    for i, key in enumerate(keys):
        found = read_shard(shard_path(base, key), key, rels[i])
        if found is None:
            raise InputError(
                f"shard {i} ({shard_path(base, key).name}) is missing or unreadable: is --out "
                "on a file system that every node shares?"
            )
        results, emb = found
        rows = iter(emb)
        for rel, size, mtime_ns, digest, err in results:
            stat = {"size": size, "mtime_ns": mtime_ns}
            take_result(plan, rel, stat, None if err else next(rows), digest, err)


def share_sum(torch, dist, value: int) -> int:
    t = torch.tensor([value], dtype=torch.long)
    dist.all_reduce(t)
    return int(t.item())


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


# -- search --------------------------------------------------------------------------------


def cmd_search(args: argparse.Namespace) -> int:
    if not args.text and not args.image:
        raise InputError("nothing to search for: pass --text TEXT or --image PATH")
    if args.top_k < 1:
        raise InputError(f"--top-k must be >= 1, got {args.top_k}")
    for i, text in enumerate(args.text):
        if not text.strip():
            raise InputError(f"--text {i + 1} is empty")
    if args.grid and not Path(args.grid).resolve().parent.is_dir():
        raise InputError(f"--grid: folder {Path(args.grid).parent} does not exist")
    queries = [("text", t, None) for t in args.text]
    queries += [("image", p, load_image_file(p)[0]) for p in args.image]
    base = index_base(args.index)
    manifest, index = load_index(base)
    check_requested_model(args, manifest["model"], base)
    loaded = load_recorded_model(args, manifest["model"])

    import attn_clip
    import torch

    q = []
    if args.text:
        q.append(embed_texts(loaded, list(args.text), args.batch_size))
    if args.image:
        x = torch.stack([loaded.preprocess(im) for _, _, im in queries if im is not None])
        with torch.no_grad():
            q.append(loaded.model.encode_image(x.to(loaded.device), normalize=True).float().cpu())
    hits = index.search(torch.cat(q), k=args.top_k, exact=args.exact, nprobe=args.nprobe)
    # SigLIP: a text query's sigmoid probability of matching each hit, next to the cosine
    probs = attn_clip.match_probability(loaded.model, hits.scores)
    root = manifest["root"]
    results = []
    for i, ((kind, query, _), ids) in enumerate(zip(queries, hits.ids, strict=True)):
        with_prob = probs is not None and kind == "text"
        found = [
            {"path": shown(root, rel), "score": float(hits.scores[i, j])}
            | ({"prob": float(probs[i, j])} if with_prob else {})
            for j, rel in enumerate(ids)
        ]
        results.append({"query": query, "type": kind, "hits": found})
    for r in results:
        if args.json:
            print(json.dumps(r, ensure_ascii=False))
            continue
        print(f"{r['type']}: {r['query']}")
        for rank, hit in enumerate(r["hits"], 1):
            prob = f"  p(match) {100 * hit['prob']:6.2f}%" if "prob" in hit else ""
            print(f"  {rank:>3}  {hit['score']:.4f}{prob}  {hit['path']}")
        print()
    if args.grid:
        contact_sheet(results, root, hits.ids).save(args.grid, format="PNG")
        if not args.json:
            print(f"contact sheet saved to {args.grid}")
    return 0


def contact_sheet(results: list[dict], root: str, ids: list[list[str]], thumb: int = 160):
    """One row per query: its text (or image) then the hits, each with rank and score."""
    from PIL import Image, ImageDraw, ImageFont, ImageOps

    try:
        font = ImageFont.load_default(size=14)
    except (TypeError, OSError):  # Pillow without FreeType: the small bitmap font
        font = ImageFont.load_default()
    pad, label_h = 8, 20
    cols = max(len(r["hits"]) for r in results) + 1
    cell_w, cell_h = thumb + pad, thumb + label_h + pad
    sheet = Image.new("RGB", (pad + cols * cell_w, pad + len(results) * cell_h), "white")
    draw = ImageDraw.Draw(sheet)

    def paste(path: Path, x: int, y: int) -> None:
        try:
            im = load_image_file(path)[0]
        except InputError:  # moved or deleted since indexing: a grey box
            draw.rectangle([x, y, x + thumb - 1, y + thumb - 1], fill=(200, 200, 200))
            return
        im = ImageOps.contain(im, (thumb, thumb))
        sheet.paste(im, (x + (thumb - im.width) // 2, y + (thumb - im.height) // 2))

    for row, r in enumerate(results):
        y = pad + row * cell_h
        if r["type"] == "image":
            paste(Path(r["query"]), pad, y)
        else:
            words, lines = r["query"].split(), [""]
            for w in words:  # wrap the query text into the first cell
                if draw.textlength(f"{lines[-1]} {w}", font=font) > thumb and lines[-1]:
                    lines.append(w)
                else:
                    lines[-1] = f"{lines[-1]} {w}".strip()
            draw.multiline_text((pad, y), "\n".join(lines[:8]), fill="black", font=font)
        draw.text((pad, y + thumb + 2), "query", fill=(90, 90, 90), font=font)
        for col, (rel, hit) in enumerate(zip(ids[row], r["hits"], strict=True), 1):
            x = pad + col * cell_w
            paste(Path(root) / rel, x, y)
            draw.text((x, y + thumb + 2), f"#{col}  {hit['score']:.3f}", fill="black", font=font)
    return sheet


# -- eval ----------------------------------------------------------------------------------


def read_captions(csv_path: Path, root: Path | None, sep: str | None):
    """``[(image path, [captions...]), ...]`` in first-seen order from a captions CSV."""
    if not csv_path.is_file():
        raise InputError(f"captions CSV not found: {csv_path}")
    try:
        text = csv_path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"cannot read {csv_path}: {e}") from None
    header = text.split("\n", 1)[0]
    sep = sep or ("\t" if "\t" in header and "," not in header else ",")
    reader = csv.DictReader(text.splitlines(), delimiter=sep)
    fields = [f.strip().lower() for f in reader.fieldnames or []]
    img_col = next((c for c in IMAGE_COLUMNS if c in fields), None)
    cap_col = next((c for c in CAPTION_COLUMNS if c in fields), None)
    if img_col is None or cap_col is None:
        raise InputError(
            f"{csv_path}: needs a header with an image column ({'/'.join(IMAGE_COLUMNS)}) and "
            f"a caption column ({'/'.join(CAPTION_COLUMNS)}); found {fields or 'none'}"
        )
    names = {f.strip().lower(): f for f in reader.fieldnames}
    root = root or csv_path.parent
    groups: dict[Path, list[str]] = {}
    for line, row in enumerate(reader, 2):
        image, caption = row.get(names[img_col]), row.get(names[cap_col])
        if not image or not caption or not caption.strip():
            raise InputError(f"{csv_path} line {line}: empty image path or caption")
        groups.setdefault((root / image.strip()).resolve(), []).append(caption.strip())
    if not groups:
        raise InputError(f"{csv_path} has no rows")
    return list(groups.items())


def cmd_eval(args: argparse.Namespace) -> int:
    groups = read_captions(Path(args.csv), Path(args.root) if args.root else None, args.sep)
    index, manifest, stored = None, None, {}
    if args.index:
        base = index_base(args.index)
        manifest, index = load_index(base)
        check_requested_model(args, manifest["model"], base)
        root = Path(manifest["root"])
        for row, rel in enumerate(index.ids):  # reuse rows whose file is unchanged
            p, info = root / rel, manifest["files"][rel]
            st = p.stat() if p.is_file() else None
            if st and (st.st_size, st.st_mtime_ns) == (info["size"], info["mtime_ns"]):
                stored[p.resolve()] = row
        loaded = load_recorded_model(args, manifest["model"])
    else:
        loaded = load_model(args.model, args.pretrained, args.device, args.precision)

    import attn_clip
    import torch

    paths = [p for p, _ in groups]
    todo = [p for p in paths if p not in stored]
    fresh = {}
    for path, emb, _, error in embed_images(loaded, todo, args, desc="images"):
        if error is not None:
            raise InputError(f"cannot evaluate: {error}")
        fresh[path] = emb
    image_emb = torch.stack(
        [index.embeddings[stored[p]] if p in stored else fresh[p] for p in paths]
    )
    captions = [c for _, caps in groups for c in caps]
    text_emb = embed_texts(loaded, captions, args.batch_size)
    counts = [len(caps) for _, caps in groups]
    metrics = attn_clip.retrieval_metrics(image_emb, text_emb, texts_per_image=counts)
    result = {
        "csv": args.csv,
        "model": describe(manifest["model"]) if manifest else describe(_record_name(loaded)),
        "images": len(paths),
        "captions": len(captions),
        **metrics,
    }
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"{result['model']} on {args.csv}: {len(paths)} images, {len(captions)} captions")
    print(f"  {'':<14}{'R@1':>8}{'R@5':>8}{'R@10':>8}")
    for name, key in (("image->text", "image_to_text"), ("text->image", "text_to_image")):
        cells = "".join(f"{100 * metrics[f'{key}_R@{k}']:>7.1f}%" for k in (1, 5, 10))
        print(f"  {name:<14}{cells}")
    return 0


def _record_name(loaded: LoadedModel) -> dict[str, Any]:
    return {"name": loaded.name, "pretrained": loaded.pretrained}


# -- command line --------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    model = argparse.ArgumentParser(add_help=False)
    g = model.add_argument_group("model")
    g.add_argument(
        "--model", help="architecture, hf-hub:ID, folder or demo-shapes (default: ViT-B-32)"
    )
    g.add_argument("--pretrained", help="tag, or checkpoint file / folder (default: openai)")
    g.add_argument("--device", help="cpu, cuda, ... (default: cuda if available)")
    g.add_argument("--precision", choices=PRECISIONS, default="fp32", help="weight precision")
    g.add_argument("--batch-size", type=int, default=32, help="images per forward pass")
    g.add_argument("--workers", type=int, default=4, help="image decoding threads")
    g.add_argument("--json", action="store_true", help="machine-readable output")

    p = argparse.ArgumentParser(
        description=__doc__.split("\n")[0],
        formatter_class=HelpFormatter,
        epilog="examples:\n" + "\n".join(__doc__.split("\n")[2:8]),
    )
    p.add_argument(
        "--list-models", action="store_true", help="list every model name and its tags, then exit"
    )
    sub = p.add_subparsers(dest="command")
    fmt = {"formatter_class": HelpFormatter}
    ix = sub.add_parser("index", parents=[model], help="embed every image under a folder", **fmt)
    ix.add_argument("dir", help="folder of images (searched recursively)")
    ix.add_argument("--out", required=True, metavar="INDEX", help="index path (no extension)")
    ix.add_argument("--update", action="store_true", help="embed only new or changed files")
    an = ix.add_argument_group("approximate search (faiss)")
    an.add_argument(
        "--ann", choices=("auto", "on", "off"), default="auto",
        help="build an approximate index: auto = from --ann-threshold images",
    )  # fmt: skip
    an.add_argument(
        "--ann-threshold", type=int, default=ANN_THRESHOLD, metavar="N",
        help="--ann auto builds one for indexes of at least N images",
    )  # fmt: skip
    an.add_argument(
        "--ann-memory", metavar="SIZE",
        help="its memory budget, e.g. 256MB (default: 1/8 of the float32 embeddings)",
    )  # fmt: skip
    an.add_argument(
        "--ann-factory", metavar="SPEC",
        help="a faiss index_factory string instead of the choice by size and budget",
    )  # fmt: skip
    ix.add_argument(
        "--shard-size", type=int, default=1024, metavar="N",
        help="under torchrun: images per shard file (rounded up to whole batches)",
    )  # fmt: skip
    se = sub.add_parser("search", parents=[model], help="find images for a text or an image", **fmt)
    se.add_argument("index", metavar="INDEX", help="the index (its --out path)")
    se.add_argument("--text", action="append", default=[], help="a text query, repeatable")
    se.add_argument(
        "--image", action="append", default=[], metavar="PATH", help="an image query, repeatable"
    )
    se.add_argument("--top-k", type=int, default=10, help="hits per query")
    se.add_argument("--grid", metavar="OUT.png", help="save a contact sheet of the hits")
    se.add_argument(
        "--nprobe", type=int, metavar="N",
        help="approximate index: IVF lists to scan (HNSW: efSearch); default: tuned at build",
    )  # fmt: skip
    se.add_argument(
        "--exact", action="store_true", help="exact search even with an approximate index"
    )
    ev = sub.add_parser("eval", parents=[model], help="recall@1/5/10 on a captions CSV", **fmt)
    ev.add_argument("--csv", required=True, help="columns filepath,title (or image,caption)")
    ev.add_argument("--root", help="folder the CSV's image paths are relative to")
    ev.add_argument("--sep", help="CSV separator (default: tab if the header has one, else ,)")
    ev.add_argument("--index", help="reuse this index's embeddings and model")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.list_models:
        return list_models_and_exit()
    if args.command is None:
        return fail("a command is needed: index, search or eval (see --help)")
    if args.batch_size < 1 or args.workers < 0:
        return fail("--batch-size must be >= 1 and --workers >= 0")
    commands = {"index": cmd_index, "search": cmd_search, "eval": cmd_eval}
    try:
        check_args(args)
        return commands[args.command](args)
    except InputError as e:  # under torchrun rank 0 says it (a rank's own trouble: that rank)
        if torchrun_rank() not in (None, 0) and not isinstance(e, RankError):
            # rank 0 has the same error, prints it and exits 2; a failing exit here could
            # make torchrun stop rank 0 before its line is out (seen once in CI)
            return 0
        return fail(str(e))


def check_args(args: argparse.Namespace) -> None:
    if args.command == "index":
        if args.ann_threshold < 1 or args.shard_size < 1:
            raise InputError("--ann-threshold and --shard-size must be >= 1")
        if args.ann_memory is not None:
            args.ann_memory = parse_bytes(args.ann_memory)
            if args.ann_memory < 1:
                raise InputError("--ann-memory must be positive")
    if args.command == "search" and args.nprobe is not None and args.nprobe < 1:
        raise InputError(f"--nprobe must be >= 1, got {args.nprobe}")


if __name__ == "__main__":
    run(main)
