"""Image / text retrieval with CLIP: index a folder of images, search it, measure recall.

    uv run apps/retrieval.py index photos/ --out photos.idx             # embed every image
    uv run apps/retrieval.py index photos/ --out photos.idx --update    # only new / changed
    uv run apps/retrieval.py search photos.idx --text "a dog on a beach" --top-k 5
    uv run apps/retrieval.py search photos.idx --image query.jpg --grid hits.png
    uv run apps/retrieval.py eval --csv captions.csv                    # recall@1/5/10
    uv run apps/retrieval.py search photos.idx --text "海滩上的狗" --language zh
    uv run apps/retrieval.py index photos/ --out dino.idx --model hf-hub:facebook/dinov2-small
    uv run apps/retrieval.py index 'data/{00000..00009}.tar' --out data.idx   # webdataset

``--model`` is a CLIP (an open_clip name with ``--pretrained TAG``, ``hf-hub:ID``, a folder;
default ViT-B-32 / openai) or an image-only attn_vision backbone (DINOv2, ViT, Swin, ...:
a transformers or ``attn_vision.save_pretrained`` folder, ``hf-hub:ID``, a timm name, with
timm's weights for its tag unless ``--pretrained FILE``). A folder or ``hf-hub:`` repo is
what its config says (``open_clip_config.json`` or a transformers CLIP / SigLIP
``config.json``: CLIP; any other ``config.json``: attn_vision); a name is attn_clip's if it
knows it, else attn_vision's (timm's ``arch.tag`` picks the backbone where an open_clip
config has its timm tower's name, e.g. ``convnext_base``). A backbone embeds an image as its
pooled features (DINOv2: the [CLS] token after the final norm, transformers'
``pooler_output``), L2-normalized; its index is searched with ``--image`` only: ``--text``
and ``eval`` need a text tower and are refused.

The index is ``attn_clip.retrieval.RetrievalIndex``'s (docs/clip.md): ``INDEX.manifest.json``
(the model, the folder, each file's size, mtime and SHA-256) and the generation of
embeddings it names, ``INDEX.g<N>.*``, switched atomically under ``INDEX.lock`` (a second
writer exits with code 2). To copy an index, copy ``INDEX.*``. ``search`` and ``eval
--index`` use the index's own model: asking for another one is an error, and so are
weights that no longer give its embeddings.

Scores are cosine similarities; with a SigLIP / SigLIP2 model a text query's hits also get
``p(match)``, SigLIP's sigmoid probability that the text describes the image (JSON: "prob").
Texts may be in any language the model knows (the multilingual XLM-R / mT5 / NLLB CLIPs);
``search`` and ``eval`` take --language CODE (NLLB code or ISO 639-1: zho_Hans, zh, de, ...),
which an NLLB model's tokenizer reads the texts as (other tokenizers have no language token:
a line on stderr says so). The index itself holds image embeddings only: no language.

``index`` also reads webdataset tar shards (img2dataset's layout; a brace-expanded,
``::``-joined list of ``.tar`` files, quoted): each sample's id is ``shard/key``, its caption
(``txt``) is kept and shown beside its hits, ``--update`` embeds only new and changed shards
(size and mtime, or SHA-256), bad samples are skipped and counted in one line, and under
``torchrun`` the shards are dealt to the ranks.

``index --caption`` with a CoCa ``--model`` (e.g. the bundled ``demo-shapes-coca``) also
writes each image's greedy caption (the image tower runs once for both) into the manifest:
``search`` prints it beside the path (JSON: "caption"), ``--export-embeddings`` and
``serve`` return it. The index remembers it: ``--update`` captions new and changed files and
keeps the others'; ``--update --caption`` of an index built without captions is refused
(rebuild it). Captions are shown, exported and served, not searched: ``--text`` ranks the
image embeddings. Captioning needs a CoCa, a folder and one process (no torchrun, no shards).

Bad input (unreadable index, missing query image, empty query, unknown model, weights not
available offline, a CSV without image / caption columns) prints one line on stderr and
exits with code 2. Unreadable files under the indexed folder are skipped and counted.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from _common import (  # the CLI toolkit and model loading shared by the apps
    LANGUAGE_HELP,
    PRECISIONS,
    HelpFormatter,
    InputError,
    LoadedModel,
    apply_language,
    check_folder,
    check_language,
    fail,
    for_cli,
    list_models_and_exit,
    load_model,
    open_image,
    pick_device,
    resolve_model_args,
    run,
    warn,
)
from attn_clip.retrieval.errors import AnnError, IndexBusyError, IndexNotFoundError, RankError
from attn_clip.retrieval.fingerprint import ModelRecord, describe_model
from attn_clip.retrieval.manifest import Manifest, index_base, manifest_path
from attn_clip.retrieval.options import ANN_THRESHOLD, parse_size, rank_device, torchrun_rank

ANN_OPTIONS = {"ann": "--ann on ", "factory": "--ann-factory: ", "memory": "--ann-memory: "}

# -- the index and its model ---------------------------------------------------------------


def open_index(base: Path, args: argparse.Namespace, text_use: str | None = None):
    """The index at ``base`` with its recorded model (after --model / --pretrained, when
    given, are checked to name it). ``text_use``: what texts are needed for, when they are
    (an index of an image-only model is then refused, before its model is built)."""
    try:
        manifest = Manifest.read(base)  # (a missing or broken manifest: before torch loads)
        if text_use and not manifest.model.has_text:
            raise InputError(
                f"this index's model {manifest.model.describe()} has no text tower: {text_use}"
            )
        from attn_clip.retrieval import RetrievalIndex

        index = RetrievalIndex.open(base)
    except IndexNotFoundError as e:
        raise InputError(f"{e}; build it with: index DIR --out") from None
    check_requested_model(args, index.record, base)
    index.model = load_recorded(args, index.record)
    # search / eval --language: after the check (the record's probe text is tokenized as is)
    apply_language(index.model, args.language)
    return index


def check_requested_model(args: argparse.Namespace, recorded: ModelRecord, base: Path) -> None:
    """--model / --pretrained, when given, must name the model the index was built with."""
    if args.model is None and args.pretrained is None:
        return
    name, pretrained = resolve_model_args(args.model, args.pretrained)
    if args.model is None and args.pretrained is not None and not os.path.isdir(args.pretrained):
        name = recorded.name  # only --pretrained given: same architecture assumed
    if args.pretrained is None:
        pretrained = recorded.pretrained  # only --model given: its recorded weights
    if (name, pretrained) != (recorded.name, recorded.pretrained):
        only_model = args.pretrained is None  # then the recorded tag is not what was asked
        asked = name + (f" ({pretrained})" if pretrained and not only_model else "")
        raise InputError(
            f"{base} was built with {recorded.describe()}, not {asked}: its embeddings only "
            "make sense with that model; drop --model / --pretrained, or rebuild the index"
        )


def index_model(loaded: LoadedModel, precision: str):
    from attn_clip.retrieval import IndexModel

    return IndexModel(**vars(loaded), precision=precision)


def load_index_model(
    model: str | None, pretrained: str | None, device: str | None, precision: str,
    kind: str | None = None,
):  # fmt: skip
    """The ``IndexModel`` of --model / --pretrained: a CLIP (``_common.load_model``) or an
    image-only backbone (``kind``, default by the rule in the module docstring); every
    failure an InputError with one line."""
    from attn_clip.retrieval import IndexModel
    from attn_clip.retrieval.backbone import model_kind
    from attn_core.hub import WeightsError, WeightsUnavailableError

    name, pretrained = resolve_model_args(model, pretrained)
    if (kind or model_kind(name)) == "clip":
        return index_model(load_model(name, pretrained, device, precision), precision)
    dev = pick_device(device)
    try:
        return IndexModel.load(name, pretrained, device=dev, precision=precision, kind="vision")
    except WeightsUnavailableError as e:
        raise InputError(f"weights not available: {for_cli(e)}") from None
    except WeightsError as e:  # unreadable, unsafe or not fitting the model
        raise InputError(f"cannot load model {name!r}: {for_cli(e)}") from None
    except (ValueError, KeyError, TypeError, OSError, RuntimeError) as e:
        msg = for_cli(str(e).strip("'\""))
        raise InputError(msg if name in msg else f"{name}: {msg}") from None


def load_recorded(args: argparse.Namespace, record: ModelRecord):
    """The index's model (the library checks it gives the embeddings it was built with)."""
    return load_index_model(record.name, record.pretrained, args.device, args.precision,
                            record.kind)  # fmt: skip


def shown(path: Path) -> str:
    """An indexed file's path, relative to the working directory when it is below it."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


# -- index ---------------------------------------------------------------------------------


def cmd_index(args: argparse.Namespace) -> int:
    from attn_clip.retrieval import AnnOptions, RetrievalIndex
    from attn_clip.retrieval.tars import is_shard_list, list_tars

    if is_shard_list(args.dir):
        list_tars(args.dir)  # (a missing shard: said before the model loads)
    else:
        check_folder(Path(args.dir))
    base = index_base(args.out)
    if not base.parent.is_dir():
        raise InputError(f"--out: folder {base.parent} does not exist")
    rank = torchrun_rank()
    if rank is not None and args.device in (None, "cuda"):
        args.device = rank_device() or args.device  # one GPU per process
    index = RetrievalIndex(base)
    if args.update and manifest_path(base).exists():
        index.manifest = Manifest.read(base)
        check_requested_model(args, index.record, base)
        if rank in (None, 0):  # (the other ranks build it from the plan rank 0 sends)
            index.model = load_recorded(args, index.record)
    else:
        if args.update:
            warn(f"no index at {base} yet: building it")
        if rank in (None, 0):
            index.model = load_index_model(args.model, args.pretrained, args.device,
                                           args.precision)  # fmt: skip
    ann = AnnOptions(args.ann, args.ann_threshold, args.ann_memory, args.ann_factory)
    try:
        result = index.update(
            args.dir, batch_size=args.batch_size, workers=args.workers, ann=ann,
            shard_size=args.shard_size, warn=lambda m: warn(m),
            load_model=lambda record: load_recorded(args, record), caption=args.caption,
        )  # fmt: skip
    except IndexBusyError as e:
        raise InputError(f"{e}; try again when it has finished") from None
    except AnnError as e:
        raise InputError(ANN_OPTIONS.get(e.option, "approximate index: ") + e.detail) from None
    if result is None:  # another torchrun rank: rank 0 reports
        return 0
    print(json.dumps(result.summary()) if args.json else "\n".join(result.describe()))
    return 0


# -- search and eval -----------------------------------------------------------------------


def cmd_search(args: argparse.Namespace) -> int:
    if not args.text and not args.image:
        raise InputError("nothing to search for: pass --text TEXT or --image PATH")
    check_language(args.language)
    if args.top_k < 1:
        raise InputError(f"--top-k must be >= 1, got {args.top_k}")
    for i, text in enumerate(args.text):
        if not text.strip():
            raise InputError(f"--text {i + 1} is empty")
    if args.grid and not Path(args.grid).resolve().parent.is_dir():
        raise InputError(f"--grid: folder {Path(args.grid).parent} does not exist")
    images = [open_image(p) for p in args.image]  # unreadable: an error before any work
    index = open_index(index_base(args.index), args, "search with --image" if args.text else None)
    found = index.search_many([*args.text, *images], k=args.top_k, exact=args.exact,
                              nprobe=args.nprobe, batch_size=args.batch_size)  # fmt: skip
    queries = [("text", t) for t in args.text] + [("image", p) for p in args.image]
    for (kind, query), hits in zip(queries, found, strict=True):
        listed = [listed_hit(h) | ({"prob": h.prob} if h.prob is not None else {})
                  for h in hits]  # fmt: skip
        if args.json:
            print(json.dumps({"query": query, "type": kind, "hits": listed}, ensure_ascii=False))
            continue
        print(f"{kind}: {query}")
        for rank, hit in enumerate(listed, 1):
            prob = f"  p(match) {100 * hit['prob']:6.2f}%" if "prob" in hit else ""
            where = f"{hit.get('path') or hit['id']}  {hit.get('caption', '')}".rstrip()
            print(f"  {rank:>3}  {hit['score']:.4f}{prob}  {where}")
        print()
    if args.grid:
        from attn_clip.retrieval import contact_sheet

        queries = [q if kind == "text" else Path(q) for kind, q in queries]
        contact_sheet(list(zip(queries, found, strict=True))).save(args.grid, format="PNG")
        if not args.json:
            print(f"contact sheet saved to {args.grid}")
    return 0


def listed_hit(hit) -> dict:
    """A hit as printed: a file's path (and its generated caption), or a shard sample's id,
    shard and caption."""
    caption = {"caption": hit.caption} if hit.caption is not None else {}
    if hit.key is None:
        return {"path": shown(hit.path), **caption, "score": hit.score}
    return {"id": hit.id, "shard": shown(hit.path), **caption, "score": hit.score}


def cmd_eval(args: argparse.Namespace) -> int:
    from attn_clip.retrieval import evaluate_captions
    from attn_vision.images import ImageError, read_captions_csv

    check_language(args.language)
    pairs = read_captions_csv(args.csv, sep=args.sep, root=args.root)
    known = {}
    no_text = "eval ranks captions, which need one"
    if args.index:
        index = open_index(index_base(args.index), args, no_text)
        model, known = index.model, index.unchanged_embeddings()  # reuse unchanged rows
    else:
        from attn_clip.retrieval.backbone import model_kind

        name, pretrained = resolve_model_args(args.model, args.pretrained)
        if model_kind(name) == "vision":
            raise InputError(f"{describe_model(name, pretrained)} has no text tower: {no_text}")
        model = load_index_model(name, pretrained, args.device, args.precision, "clip")
        apply_language(model, args.language)
    try:
        metrics = evaluate_captions(model, pairs, known, batch_size=args.batch_size,
                                    workers=args.workers)  # fmt: skip
    except ImageError as e:
        raise InputError(f"cannot evaluate: {e}") from None
    name = describe_model(model.name, model.pretrained)
    if args.json:
        print(json.dumps({"csv": args.csv, "model": name, **metrics}))
        return 0
    print(f"{name} on {args.csv}: {metrics['images']} images, {metrics['captions']} captions")
    print(f"  {'':<14}{'R@1':>8}{'R@5':>8}{'R@10':>8}")
    for label, key in (("image->text", "image_to_text"), ("text->image", "text_to_image")):
        cells = "".join(f"{100 * metrics[f'{key}_R@{k}']:>7.1f}%" for k in (1, 5, 10))
        print(f"  {label:<14}{cells}")
    return 0


# -- serve and export (attn_clip.retrieval.server / .export) -------------------------------


def cmd_serve(args: argparse.Namespace) -> int:
    """Serve the indexes over clip-retrieval's clip back API until Ctrl-C (exit 130)."""
    from attn_clip.retrieval.server import listen, serve

    if not 0 <= args.port <= 65535 or args.max_body_mb <= 0 or args.reload_interval < 0:
        raise InputError("--port must be 0-65535, --max-body-mb > 0, --reload-interval >= 0")
    if args.threads is not None and args.threads < 1 or args.nprobe is not None and args.nprobe < 1:
        raise InputError("--threads and --nprobe must be >= 1")
    indexes = {}
    for path in map(index_base, args.index):
        name = path.name.removesuffix(".idx")
        if name in indexes:
            raise InputError(f"two indexes named {name!r}: the names clients ask for must differ")
        try:
            indexes[name] = (path, Manifest.read(path))  # (before torch loads)
        except IndexNotFoundError as e:
            raise InputError(f"{e}; build it with: index DIR --out") from None
    path, manifest = next(iter(indexes.values()))
    check_requested_model(args, manifest.model, path)
    sock = listen(args.host, args.port, start=False)  # a busy port: said before the model loads
    try:
        model = load_recorded(args, manifest.model)  # (indexes of other models: their own)
    except BaseException:
        sock.close()
        raise
    serve({name: p for name, (p, _) in indexes.items()}, sock=sock, threads=args.threads,
          model=model, device=args.device, precision=args.precision, images=args.images,
          exact=args.exact, nprobe=args.nprobe, max_body_bytes=int(args.max_body_mb * (1 << 20)),
          reload_interval=args.reload_interval)  # fmt: skip
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    if args.rows_per_file < 1:
        raise InputError(f"--rows-per-file must be >= 1, got {args.rows_per_file}")
    return export(args, args.index, args.out, args.rows_per_file, args.dtype)


def export(args: argparse.Namespace, index: str, out: str, rows: int, dtype: str) -> int:
    from attn_clip.retrieval.export import export_embeddings

    try:
        result = export_embeddings(index_base(index), out, rows_per_file=rows, dtype=dtype)
    except IndexNotFoundError as e:
        raise InputError(f"{e}; build it with: index DIR --out") from None
    print(json.dumps({"export": str(result.folder), "rows": result.rows, "files": result.files})
          if args.json else result.describe())  # fmt: skip
    return 0


def cmd_index_and_export(args: argparse.Namespace) -> int:
    """``index``, then ``--export-embeddings DIR`` (checked before any work)."""
    if args.export_embeddings is None:
        return cmd_index(args)
    from attn_clip.retrieval.export import check_export_folder

    check_export_folder(args.export_embeddings)
    code = cmd_index(args)
    if code == 0 and torchrun_rank() in (None, 0):
        return export(args, args.out, args.export_embeddings, 1_000_000, "float32")
    return code


def add_serve_commands(sub, ix: argparse.ArgumentParser, model: argparse.ArgumentParser) -> None:
    fmt = {"formatter_class": HelpFormatter}
    # fmt: off
    ix.add_argument("--export-embeddings", metavar="DIR",
                    help="then write clip-retrieval's img_emb/ + metadata/ layout to DIR")
    sv = sub.add_parser("serve", help="serve indexes over clip-retrieval's HTTP API "
                        "(/knn-service)", **fmt)
    sv.add_argument("--model", help="the index's model (checked; default: the recorded one)")
    sv.add_argument("--pretrained", help="its weights (checked, as --model)")
    sv.add_argument("--device", help="cpu, cuda, ... (default: cuda if available)")
    sv.add_argument("--precision", choices=PRECISIONS, default="fp32", help="weight precision")
    sv.add_argument("index", nargs="+", metavar="INDEX",
                    help="the index(es); clients name one by its file name without .idx")
    sv.add_argument("--host", default="127.0.0.1", help="address to listen on")
    sv.add_argument("--port", type=int, default=1234, help="port (0: a free one, printed)")
    sv.add_argument("--images", action="store_true",
                    help="add each result's image file, base64, as clip back does")
    sv.add_argument("--exact", action="store_true", help="exact search with an approximate index")
    sv.add_argument("--nprobe", type=int, metavar="N", help="approximate index: lists to scan")
    sv.add_argument("--max-body-mb", type=float, default=32, metavar="MB",
                    help="larger request bodies get a 413")
    sv.add_argument("--reload-interval", type=float, default=1.0, metavar="S",
                    help="how often to check for a new generation of the index (index --update)")
    sv.add_argument("--threads", type=int, help="torch threads per query (default: torch's)")
    ex = sub.add_parser("export", help="write an index's embeddings in clip-retrieval's layout",
                        **fmt)
    ex.add_argument("index", metavar="INDEX", help="the index (its --out path)")
    ex.add_argument("--out", required=True, metavar="DIR", help="folder to write (replaced)")
    ex.add_argument("--dtype", choices=("float32", "float16"), default="float32",
                    help="float16: as clip-retrieval's inference writes")
    ex.add_argument("--rows-per-file", type=int, default=1_000_000, metavar="N",
                    help="embeddings per img_emb_N.npy / metadata_N.parquet")
    ex.add_argument("--json", action="store_true", help="machine-readable output")
    for command in (sv, ex):
        command.set_defaults(batch_size=1, workers=0)  # (main checks them for every command)
    # fmt: on


# -- command line --------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    model = argparse.ArgumentParser(add_help=False)
    g = model.add_argument_group("model")
    g.add_argument(
        "--model",
        help="CLIP architecture, hf-hub:ID, folder or demo-shapes (default: ViT-B-32), or an "
        "image-only attn_vision model (folder, hf-hub:ID, timm name): see above",
    )
    g.add_argument(
        "--pretrained",
        help="tag, or checkpoint file / folder (default: openai; a timm name: its tag's weights)",
    )
    g.add_argument("--device", help="cpu, cuda, ... (default: cuda if available)")
    g.add_argument("--precision", choices=PRECISIONS, default="fp32", help="weight precision")
    g.add_argument("--batch-size", type=int, default=32, help="images per forward pass")
    g.add_argument("--workers", type=int, default=4, help="image decoding threads")
    g.add_argument("--json", action="store_true", help="machine-readable output")

    p = argparse.ArgumentParser(
        description=__doc__.split("\n")[0],
        formatter_class=HelpFormatter,
        epilog="examples:\n" + "\n".join(__doc__.split("\n")[2:10]),
    )
    p.add_argument(
        "--list-models", action="store_true", help="list every model name and its tags, then exit"
    )
    sub = p.add_subparsers(dest="command")
    fmt = {"formatter_class": HelpFormatter}
    ix = sub.add_parser("index", parents=[model], help="embed every image under a folder", **fmt)
    ix.add_argument("dir", help="folder of images (searched recursively), or webdataset "
                    "shards: 'DIR/{00000..00009}.tar'")  # fmt: skip
    ix.add_argument("--out", required=True, metavar="INDEX", help="index path (no extension)")
    ix.add_argument("--update", action="store_true",
                    help="embed only new or changed files (shards)")  # fmt: skip
    ix.add_argument("--caption", action="store_true",
                    help="a CoCa --model also captions each image (a folder; kept, shown by "
                    "search, exported, served); an index built so keeps captioning on "
                    "--update")  # fmt: skip
    an = ix.add_argument_group("approximate search (faiss)")
    # fmt: off
    an.add_argument("--ann", choices=("auto", "on", "off"), default="auto",
                    help="build an approximate index: auto = from --ann-threshold images")
    an.add_argument("--ann-threshold", type=int, default=ANN_THRESHOLD, metavar="N",
                    help="--ann auto builds one for indexes of at least N images")
    an.add_argument("--ann-memory", metavar="SIZE",
                    help="its memory budget, e.g. 256MB (default: 1/8 of the float32 embeddings)")
    an.add_argument("--ann-factory", metavar="SPEC",
                    help="a faiss index_factory string instead of the choice by size and budget")
    ix.add_argument("--shard-size", type=int, default=1024, metavar="N",
                    help="under torchrun: images per shard file (rounded up to whole batches; "
                    "webdataset shards: one tar per shard file)")
    # fmt: on
    se = sub.add_parser("search", parents=[model], help="find images for a text or an image", **fmt)
    se.add_argument("index", metavar="INDEX", help="the index (its --out path)")
    se.add_argument("--text", action="append", default=[], help="a text query, repeatable")
    se.add_argument(
        "--image", action="append", default=[], metavar="PATH", help="an image query, repeatable"
    )
    se.add_argument("--top-k", type=int, default=10, help="hits per query")
    se.add_argument("--grid", metavar="OUT.png", help="save a contact sheet of the hits")
    se.add_argument("--nprobe", type=int, metavar="N", help="approximate index: IVF lists to "
                    "scan (HNSW: efSearch); default: tuned at build")  # fmt: skip
    se.add_argument(
        "--exact", action="store_true", help="exact search even with an approximate index"
    )
    se.add_argument("--language", metavar="CODE", help=LANGUAGE_HELP)
    ev = sub.add_parser("eval", parents=[model], help="recall@1/5/10 on a captions CSV", **fmt)
    ev.add_argument("--csv", required=True, help="columns filepath,title (or image,caption)")
    ev.add_argument("--root", help="folder the CSV's image paths are relative to")
    ev.add_argument("--sep", help="CSV separator (default: tab if the header has one, else ,)")
    ev.add_argument("--index", help="reuse this index's embeddings and model")
    ev.add_argument("--language", metavar="CODE", help=LANGUAGE_HELP + " (the captions)")
    add_serve_commands(sub, ix, model)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.list_models:
        return list_models_and_exit()
    if args.command is None:
        return fail("a command is needed: index, search, eval, serve or export (see --help)")
    if args.batch_size < 1 or args.workers < 0:
        return fail("--batch-size must be >= 1 and --workers >= 0")
    commands = {"index": cmd_index_and_export, "search": cmd_search, "eval": cmd_eval,
                "serve": cmd_serve, "export": cmd_export}  # fmt: skip
    try:
        check_args(args)
        return commands[args.command](args)
    except InputError as e:  # (library errors too) under torchrun rank 0 says it
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
            try:
                args.ann_memory = parse_size(args.ann_memory)
            except ValueError as e:
                raise InputError(f"--ann-memory: {e}") from None
            if args.ann_memory < 1:
                raise InputError("--ann-memory must be positive")
    if args.command == "search" and args.nprobe is not None and args.nprobe < 1:
        raise InputError(f"--nprobe must be >= 1, got {args.nprobe}")


if __name__ == "__main__":
    run(main)
