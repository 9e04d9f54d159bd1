"""Side-by-side speed benchmarks: attn-zoo against open_clip, timm and transformers.

From the repository root (``uv run benchmarks/run.py ...`` works as well):

    uv run python -m benchmarks.run                      # every section (~20 min on 2 cores)
    uv run python -m benchmarks.run --quick              # tiny configs, seconds (a smoke test)
    uv run python -m benchmarks.run --only image,text --json bench.json

Sections (``--only``): ``image`` (CLIP ViT-B/32 image tower, batch 1/8/32, fp32 and bf16
weights), ``text`` (CLIP text tower on OpenAI's 80 ImageNet prompts for one class),
``zeroshot`` (the 1,000-class x 80-prompt ImageNet zero-shot head, timed on a subset of
classes and extrapolated), ``families`` (the RN50 and convnext_base CLIP image towers
against open_clip, batch 8, fp32 and bf16), ``vit`` (timm ``vit_base_patch16_224``, batch
8), ``attention``
(math / sdpa / sliding-window / linear kernels at L = 1k..16k, plus compiled FlexAttention
and a dense-masked SDPA as sliding-window references), ``dispatch`` (``attention()`` vs a
raw ``F.scaled_dot_product_attention`` call), ``compile`` (``CLIP.compile_encoders``),
``startup`` (the README's first command, offline zero-shot with the bundled model, against
``python -c "import torch"``, each a fresh interpreter), ``ann`` (approximate search over
1M clustered 512-d vectors against exact search) and ``embed`` (indexing 1,000 JPEGs end to
end against the model alone; both in retrieval_scale.py); ``engines`` (the image tower
against ONNX Runtime and OpenVINO on the graph attn_clip.export writes, fp32 / bf16 / int8;
run it with ``GOMP_SPINCOUNT=10000``, see engines.py) and ``engines-alone`` (ours against
OpenVINO with each runtime alone in its own process, as a deployment runs one of them;
``--alone-model``, ``--precisions``, ``--rounds``; see engines_alone.py); ``caption`` (CoCa
ViT-B/32 captions, greedy at batch 1 and 8 against the plain loop over open_clip's forward,
and 6-beam search with its image tower's share; 3 repeats, ``--repeats`` sets them; see
caption.py); ``mobileclip`` (MobileCLIP-S2's image tower at 256 px, batch 1 and 8, ours
folded against open_clip as shipped and after timm's ``reparameterize_model``, and its text
tower; see mobileclip.py); ``server`` (the search server's p50 / p99 latency for text, image
and embedding queries over HTTP against the same search in process, and 4 concurrent
clients; ``--server-queries``; see retrieval_server.py).

Method. Every section builds ours and the references in this one process with identical
random weights (transformers' random ``CLIPModel`` -> ours through our converter -> open_clip
through ``to_open_clip`` -> timm through timm's own open_clip converter) and checks that they
agree (the ``check`` column). Each implementation is warmed up, then the implementations are
timed *interleaved* (A, B, C, A, B, C, ...) so that load from other processes hits all of
them alike; the table shows the median (and min) of the repeats, run under
``torch.inference_mode()`` with PyTorch's default thread count. ``ref / ours`` is the
reference's median time divided by ours (> 1: ours is faster). Peak memory is the peak of
live tensor memory allocated during one call (inputs and weights excluded), from the
allocation events of ``torch.profiler`` (``profile_memory=True``); ``-`` where that is
unavailable. Rows marked *extrapolated* time a subset and scale it linearly.

Layout: the package ``benchmarks`` (``harness.py``: timing, memory, checks, report;
``clip_models.py``: the CLIP built four ways; one module per section, imported when its
section runs). ``benchmarks/investigations/`` holds the scripts that explain one gap.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import sys
import time
import warnings
from pathlib import Path

# section -> "module.function" in benchmarks/; CLIP_SECTIONS also get the shared CLIP models
SECTIONS = {
    "image": "clip_image.bench_image",
    "text": "clip_text.bench_text",
    "zeroshot": "clip_zero_shot.bench_zero_shot",
    "families": "clip_families.bench_families",
    "vit": "vit.bench_vit",
    "attention": "attention.bench_attention",
    "dispatch": "dispatch.bench_dispatch",
    "compile": "torch_compile.bench_compile",
    "startup": "startup.bench_startup",
    "ann": "retrieval_scale.bench_ann",
    "embed": "retrieval_scale.bench_embed",
    "engines": "engines.bench_engines",
    "engines-alone": "engines_alone.bench_engines_alone",
    "caption": "caption.bench_caption",
    "mobileclip": "mobileclip.bench_mobileclip",
    "server": "retrieval_server.bench_server",
}
CLIP_SECTIONS = ("image", "text", "zeroshot", "compile")
# compiling takes ~20 s; start-up runs fresh interpreters; the families section builds
# full-size open_clip models (--only families --quick runs it at 64 px); engines exports
# ONNX and calibrates int8 (~20 s even tiny); engines-alone starts a process per runtime;
# caption builds open_clip's CoCa and ours and decodes ~10 s even tiny (--only caption --quick);
# mobileclip builds open_clip's MobileCLIP-S2 and ours (--only mobileclip --quick: one block
# per stage, 64 px); server starts a server and indexes shapes (--only server --quick)
QUICK_SKIP = ("compile", "startup", "families", "engines", "engines-alone", "caption",
              "mobileclip", "server")  # fmt: skip


def section_function(name: str):
    """The function that runs section ``name`` (its module is imported here)."""
    module, function = SECTIONS[name].rsplit(".", 1)
    return getattr(importlib.import_module(f"benchmarks.{module}"), function)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, with every default filled in (smaller ones with ``--quick``)."""
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.run",
        description=__doc__,
        formatter_class=argparse.RawTextHelpFormatter,
    )
    names = ", ".join(SECTIONS)
    p.add_argument("--quick", action="store_true", help="tiny configs (a smoke test)")
    p.add_argument("--only", default=None, help=f"comma-separated sections of: {names}")
    p.add_argument("--skip", default="", help="comma-separated sections to leave out")
    p.add_argument("--json", default=None, help="also write the rows and goals here")
    p.add_argument("--markdown", default=None, help="also write the tables here")
    p.add_argument("--repeats", type=int, default=None, help="timed repeats per row")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--batches", default=None, help="image batch sizes, e.g. 1,8,32")
    p.add_argument("--zero-shot-classes", type=int, default=None, help="classes timed for ours")
    p.add_argument(
        "--zero-shot-ref-classes", type=int, default=None, help="classes timed for open_clip"
    )
    p.add_argument(
        "--zero-shot-batch", type=int, default=10, help="classes per text batch (default 10)"
    )
    p.add_argument("--lengths", default=None, help="attention lengths, e.g. 1024,4096")
    p.add_argument("--window", type=int, default=None, help="sliding window")
    p.add_argument("--no-memory", dest="memory", action="store_false", help="skip peak memory")
    p.add_argument("--ann-size", type=int, default=None, help="ann: vectors (1M; --quick 10k)")
    p.add_argument("--embed-images", type=int, default=None, help="embed: JPEGs (1000; quick 16)")
    p.add_argument("--server-queries", type=int, default=None, help="server: per kind (200; 20)")
    p.add_argument(
        "--flex", action=argparse.BooleanOptionalAction, default=None,
        help="time compiled FlexAttention (compiles ~10 s; default: on, off with --quick)",
    )  # fmt: skip
    p.add_argument(
        "--alone-model", default="ViT-B-32", help="engines-alone: the CLIP (default ViT-B-32)"
    )
    p.add_argument(
        "--precisions", default="fp32,bf16", help="engines-alone: of fp32,bf16 (default both)"
    )
    p.add_argument(
        "--rounds", type=int, default=None, help="engines-alone: processes per runtime (3)"
    )
    args = p.parse_args(argv)
    for name in ("repeats", "threads", "rounds"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            p.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    q = args.quick
    args.sections = [s for s in (args.only.split(",") if args.only else SECTIONS) if s]
    if q and not args.only:
        args.sections = [s for s in SECTIONS if s not in QUICK_SKIP]
    skip = set(filter(None, args.skip.split(",")))
    unknown = (set(args.sections) | skip) - set(SECTIONS)
    if unknown:
        p.error(f"unknown sections {sorted(unknown)}; expected some of: {names}")
    args.sections = [s for s in args.sections if s not in skip]
    args.precisions = [s for s in args.precisions.split(",") if s]
    if not args.precisions or set(args.precisions) - {"fp32", "bf16"}:
        p.error(f"--precisions expects fp32, bf16 or fp32,bf16, got {','.join(args.precisions)!r}")
    # caption: open_clip's loop takes seconds per call (tens at batch 8): 3 repeats
    args.caption_repeats = args.repeats or (1 if q else 3)
    args.repeats = args.repeats or (2 if q else 7)
    args.inner = 1 if q else 3
    args.attn_repeats = 2 if q else 5
    args.dispatch_repeats = 3 if q else 15
    args.startup_repeats = 1 if q else 7
    args.startup_warmup = 0 if q else 1  # --quick: one fresh interpreter per command
    args.rounds = args.rounds or (1 if q else 3)
    default_batches = "1,8" if q else "1,8,32"
    args.batches = [int(b) for b in (args.batches or default_batches).split(",")]
    args.zero_shot_classes = args.zero_shot_classes or (3 if q else 50)
    args.zero_shot_ref_classes = args.zero_shot_ref_classes or (1 if q else 3)
    default_lengths = "128,256" if q else "1024,4096,8192,16384"
    args.lengths = [int(n) for n in (args.lengths or default_lengths).split(",")]
    args.window = args.window or (32 if q else 256)
    args.flex_length = 256 if q else 8192
    args.flex = (not q) if args.flex is None else args.flex
    args.math_max_gb = 0.6
    args.dispatch_length = 64 if q else 256
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the chosen sections, print the tables and goals, write --json / --markdown."""
    args = parse_args(argv)
    import torch  # after the arguments: --help and bad input answer without loading torch

    from benchmarks.clip_models import build_clip_models
    from benchmarks.harness import Report

    if args.threads:
        torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", message=".*No pretrained weights loaded.*")
    report = Report()
    report.meta = {
        "command": "uv run python -m benchmarks.run "
        + " ".join(sys.argv[1:] if argv is None else argv),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpu": platform.processor() or platform.machine(),
        "loadavg_start": os.getloadavg(),
        "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "(default)"),
        "GOMP_SPINCOUNT": os.environ.get("GOMP_SPINCOUNT", "(default)"),
        "quick": args.quick,
    }
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, load average "
        f"{os.getloadavg()[0]:.2f}, OMP_WAIT_POLICY {report.meta['OMP_WAIT_POLICY']}, "
        f"GOMP_SPINCOUNT {report.meta['GOMP_SPINCOUNT']}; sections: {', '.join(args.sections)}",
        file=sys.stderr,
    )
    started = time.perf_counter()
    with_clip = set(CLIP_SECTIONS) & set(args.sections)
    models = build_clip_models(args.quick, "image" in args.sections) if with_clip else None
    # compiled graphs are made outside inference_mode: compile runs last, under no_grad
    order = [s for s in args.sections if s != "compile"] + ["compile"] * (
        "compile" in args.sections
    )
    for section in order:
        print(f"[{section}]", file=sys.stderr, flush=True)
        run_section = section_function(section)
        with torch.no_grad() if section == "compile" else torch.inference_mode():
            if section in CLIP_SECTIONS:
                run_section(args, report, models)
            else:
                run_section(args, report)
    report.meta["loadavg_end"] = os.getloadavg()
    report.meta["wall_s"] = time.perf_counter() - started
    text = report.markdown()
    print(text)
    print(
        f"{report.meta['command']}: torch {torch.__version__}, {report.meta['threads']} "
        f"threads, OMP_WAIT_POLICY {report.meta['OMP_WAIT_POLICY']}, GOMP_SPINCOUNT "
        f"{report.meta['GOMP_SPINCOUNT']}; load average at start "
        f"{report.meta['loadavg_start'][0]:.2f}, at end {report.meta['loadavg_end'][0]:.2f}; "
        f"{report.meta['wall_s']:.0f} s",
    )
    if args.markdown:
        with open(args.markdown, "w", encoding="utf-8") as f:
            f.write(text)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(report.to_json(), f, indent=2)
    return 0


if __name__ == "__main__":
    if not __package__:  # run as a file (`uv run benchmarks/run.py`): import the package
        sys.path[0] = str(Path(__file__).resolve().parents[1])
    sys.exit(main())
