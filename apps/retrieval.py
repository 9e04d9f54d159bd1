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
import csv
import hashlib
import itertools
import json
import os
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


def embed_images(loaded: LoadedModel, paths: list[Path], args, desc: str):
    """Yield ``(path, embedding or None, sha256, error)`` in batches, with a progress bar."""
    import torch
    from tqdm import tqdm

    bar = tqdm(total=len(paths), unit="img", desc=desc, disable=None)
    stream = iter_images(paths, workers=args.workers, transform=loaded.preprocess)
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
    import attn_clip

    try:
        with attn_clip.index_lock(base):  # one writer at a time; the lock file goes with it
            return update_index(args, root, base)
    except attn_clip.IndexBusyError as e:
        raise InputError(f"{e}; try again when it has finished") from None


def update_index(args: argparse.Namespace, root: Path, base: Path) -> int:
    """Build (or with --update, bring up to date) the index at ``base`` of ``root``."""
    old = None
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

    # Decide per file: keep the old row (same size + mtime, or same content), or embed.
    old_files = old["files"] if old else {}
    old_skipped = old["skipped"] if old else {}
    files: dict[str, dict[str, Any]] = {}
    skipped: dict[str, dict[str, Any]] = {}
    keep: dict[str, int] = {}  # rel -> row in the old index
    todo: list[Path] = []
    counts = dict.fromkeys(("added", "updated", "unchanged", "removed", "skipped"), 0)
    rows = {rel: i for i, rel in enumerate(old_files)}
    for path in found:
        rel = path.relative_to(root).as_posix()
        stat = file_stat(path)
        prev = old_files.get(rel) or old_skipped.get(rel)
        same_stat = prev is not None and all(prev[k] == stat[k] for k in stat)
        if rel in old_files and (same_stat or _same_content(path, prev, stat)):
            files[rel] = {**stat, "sha256": prev["sha256"]}
            keep[rel] = rows[rel]
            counts["unchanged"] += 1
        elif rel in old_skipped and same_stat:
            skipped[rel] = prev  # still the same unreadable file: not retried
            counts["skipped"] += 1
        else:
            todo.append(path)
    present = {path.relative_to(root).as_posix() for path in found}
    counts["removed"] = sum(rel not in present for rel in old_files)

    new_ids, new_embs = [], []
    for path, emb, digest, error in embed_images(loaded, todo, args, desc="embedding"):
        rel = path.relative_to(root).as_posix()
        stat = file_stat(path)
        if error is not None:
            skipped[rel] = {**stat, "error": error}
            counts["skipped"] += 1
            warn(f"skipped {error}")
            continue
        counts["updated" if rel in old_files else "added"] += 1
        files[rel] = {**stat, "sha256": digest}
        new_ids.append(rel)
        new_embs.append(emb)
    if not files:
        raise InputError(f"none of the {len(found)} image files under {root} could be read")

    import attn_clip
    import torch

    index = attn_clip.EmbeddingIndex(dim=record["embed_dim"])
    by_rel = dict(zip(new_ids, new_embs, strict=True))
    order = sorted(files)
    rows_old = [keep[rel] for rel in order if rel in keep]
    emb = torch.empty(len(order), record["embed_dim"])
    if rows_old:
        emb[[i for i, rel in enumerate(order) if rel in keep]] = old_index.embeddings[rows_old]
    for i, rel in enumerate(order):
        if rel in by_rel:
            emb[i] = by_rel[rel]
    index.add(emb, ids=order)
    manifest = {
        "format": MANIFEST_FORMAT,
        "version": MANIFEST_VERSION,
        "model": record,
        "root": str(root),
        "files": {rel: files[rel] for rel in order},
        "skipped": dict(sorted(skipped.items())),
    }
    generation = attn_clip.save_index_set(base, index, manifest, manifest_path(base))
    summary = {"index": str(base), "model": describe(record), "images": len(order), **counts}
    if args.json:
        print(json.dumps(summary))
    else:
        parts = ", ".join(f"{v} {k}" for k, v in counts.items() if v or k in ("added",))
        print(f"indexed {len(order)} images under {root} with {describe(record)} ({parts})")
        print(f"wrote {manifest_path(base)} (embeddings: {base.name}.g{generation}.*)")
    return 0


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
    hits = index.search(torch.cat(q), k=args.top_k)
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
    se = sub.add_parser("search", parents=[model], help="find images for a text or an image", **fmt)
    se.add_argument("index", metavar="INDEX", help="the index (its --out path)")
    se.add_argument("--text", action="append", default=[], help="a text query, repeatable")
    se.add_argument(
        "--image", action="append", default=[], metavar="PATH", help="an image query, repeatable"
    )
    se.add_argument("--top-k", type=int, default=10, help="hits per query")
    se.add_argument("--grid", metavar="OUT.png", help="save a contact sheet of the hits")
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
        return commands[args.command](args)
    except InputError as e:
        return fail(str(e))


if __name__ == "__main__":
    run(main)
