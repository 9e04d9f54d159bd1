"""Side-by-side speed benchmarks: attn-zoo against open_clip, timm and transformers.

    uv run benchmarks/run.py                      # every section (~15 min on 2 cores)
    uv run benchmarks/run.py --quick              # tiny configs, seconds (a smoke test)
    uv run benchmarks/run.py --only image,text --json bench.json

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
run it with ``GOMP_SPINCOUNT=10000``, see engines.py).

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

Layout: ``harness.py`` (timing, memory, checks, report), ``clip_models.py`` (the CLIP
built four ways), one file per section; Python puts this folder on ``sys.path`` when it
runs this file, so the siblings import by their plain names.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import warnings

import torch
from attention import bench_attention
from clip_families import bench_families
from clip_image import bench_image
from clip_models import build_clip_models
from clip_text import bench_text
from dispatch import bench_dispatch
from engines import bench_engines
from harness import Report
from retrieval_scale import bench_ann, bench_embed
from startup import bench_startup
from torch_compile import bench_compile
from vit import bench_vit
from zero_shot import bench_zero_shot

SECTIONS = (
    "image", "text", "zeroshot", "families", "vit", "attention", "dispatch", "compile", "startup",
    "ann", "embed", "engines",
)  # fmt: skip
CLIP_SECTIONS = {"image": bench_image, "text": bench_text, "zeroshot": bench_zero_shot}
OTHER_SECTIONS = {
    "families": bench_families,
    "vit": bench_vit,
    "attention": bench_attention,
    "dispatch": bench_dispatch,
    "startup": bench_startup,
    "ann": bench_ann,
    "embed": bench_embed,
    "engines": bench_engines,
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, with every default filled in (smaller ones with ``--quick``)."""
    p = argparse.ArgumentParser(
        prog="benchmarks/run.py", description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="tiny configs (a smoke test)")
    p.add_argument("--only", default=None, help=f"comma-separated sections of {SECTIONS}")
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
    p.add_argument(
        "--flex", action=argparse.BooleanOptionalAction, default=None,
        help="time compiled FlexAttention (compiles ~10 s; default: on, off with --quick)",
    )  # fmt: skip
    args = p.parse_args(argv)
    q = args.quick
    args.sections = [s for s in (args.only.split(",") if args.only else SECTIONS) if s]
    if q and not args.only:
        # compiling takes ~20 s; start-up runs fresh interpreters; the families section
        # builds full-size open_clip models (--only families --quick runs it at 64 px)
        # engines exports ONNX and calibrates int8 (~20 s even tiny: --only engines --quick)
        quick_skip = ("compile", "startup", "families", "engines")
        args.sections = [s for s in SECTIONS if s not in quick_skip]
    skip = set(filter(None, args.skip.split(",")))
    unknown = (set(args.sections) | skip) - set(SECTIONS)
    if unknown:
        p.error(f"unknown sections {sorted(unknown)}; expected some of {SECTIONS}")
    args.sections = [s for s in args.sections if s not in skip]
    args.repeats = args.repeats or (2 if q else 7)
    args.inner = 1 if q else 3
    args.attn_repeats = 2 if q else 5
    args.dispatch_repeats = 3 if q else 15
    args.startup_repeats = 2 if q else 7
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
    if args.threads:
        torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", message=".*No pretrained weights loaded.*")
    report = Report()
    report.meta = {
        "command": "uv run benchmarks/run.py " + " ".join(sys.argv[1:] if argv is None else argv),
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
    clip_sections = {"image", "text", "zeroshot", "compile"} & set(args.sections)
    models = build_clip_models(args.quick, "image" in args.sections) if clip_sections else None
    with torch.inference_mode():
        for section in args.sections:
            if section == "compile":
                continue  # below
            print(f"[{section}]", file=sys.stderr, flush=True)
            if section in CLIP_SECTIONS:
                CLIP_SECTIONS[section](args, report, models)
            else:
                OTHER_SECTIONS[section](args, report)
    if "compile" in args.sections:  # compiled graphs are made outside inference_mode
        with torch.no_grad():
            print("[compile]", file=sys.stderr, flush=True)
            bench_compile(args, report, models)
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
    sys.exit(main())
