"""Where the time goes: a per-op profile of our CLIP image tower next to OpenVINO's per-layer
counters, on the same random weights, batch and threads (issue 19; docs/benchmarks.md).

    GOMP_SPINCOUNT=10000 uv run python -m benchmarks.investigations.op_profile  # ViT-B/32, batch 1
    OMP_WAIT_POLICY=PASSIVE uv run python -m benchmarks.investigations.op_profile --precision bf16
    uv run python -m benchmarks.investigations.op_profile --quick               # the tiny CLIP

Ours: ``torch.profiler`` over ``--repeats`` calls, self CPU time per op. OpenVINO: the graph
``attn_clip.export`` writes, compiled as the ``engines`` section compiles it plus
``PERF_COUNT``, summing each node's ``real_time`` over the same number of calls. Both are
grouped into the same kinds of work (the tables' first column), then the top ops / node types
of each are listed with OpenVINO's kernel names. OpenVINO fuses each block's attention into
one ``Subgraph`` node (its MHA kernel; no MatMul / Softmax node is left); ours computes the
patch embedding as one more ``_linear_pointwise`` (``attn_core.fast_inference.patchify``), so
it sits in our Linear row, where OpenVINO has a Convolution. The profilers add their own
overhead per op (more for ours: one record per aten call), so the shares matter more than
the sums; the ``wall`` line times both without a profiler, interleaved. Run it with the
OpenMP setting of the ``engines`` section (benchmarks/engines.py): it decides how long our
threads take to wake for each op, which is most of the difference at batch 1."""

from __future__ import annotations

import argparse
import os
from collections import defaultdict
from typing import Any

import torch

from benchmarks.clip_models import ours_and_openvino_image
from benchmarks.harness import time_interleaved

# the first matching pattern names an op's kind of work (ours: aten / mkldnn op names;
# OpenVINO: node types)
KINDS = [
    ("Linear (matrix products of the weights)", ("_linear_pointwise", "addmm", "FullyConnected")),
    ("attention (scores, softmax, weighted sum)", ("attention", "bmm", "softmax", "Softmax")),
    ("attention (scores, softmax, weighted sum)", ("ScaledDotProduct", "MatMul", "Subgraph")),
    ("layer norm", ("layer_norm", "MVN", "LayerNorm", "RMS")),
    ("patch embedding (conv)", ("conv", "Convolution")),
    ("element-wise (add, GELU, scale)", ("add", "gelu", "mul", "Eltwise", "Gelu")),
    ("element-wise (add, GELU, scale)", ("Multiply", "Add")),
    ("layout (copy, reshape, transpose, concat)", ("copy", "clone", "cat", "Reorder")),
    ("layout (copy, reshape, transpose, concat)", ("Transpose", "Reshape", "Concat", "Gather")),
    ("layout (copy, reshape, transpose, concat)", ("permute", "view", "reshape", "transpose")),
    ("layout (copy, reshape, transpose, concat)", ("contiguous", "select", "slice", "expand")),
    ("layout (copy, reshape, transpose, concat)", ("unbind", "empty", "as_strided", "Split")),
]


def kind_of(name: str) -> str:
    return next((k for k, pats in KINDS for p in pats if p in name), "other")


def profile_ours(fn, repeats: int) -> dict[str, tuple[float, int]]:
    """op name -> (self CPU ms per call, op calls per call), over ``repeats`` calls."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(repeats):
            fn()
    return {
        e.key: (e.self_cpu_time_total / 1e3 / repeats, e.count // repeats)
        for e in prof.key_averages()
        if e.self_cpu_time_total > 0
    }


def profile_openvino(compiled, x: torch.Tensor, repeats: int) -> dict[str, tuple[float, int]]:
    """``node type [kernel]`` -> (ms per call, nodes), summed over the executed nodes."""
    request = compiled.create_infer_request()
    inputs = {0: x.contiguous().numpy()}
    totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for i in range(repeats):
        request.infer(inputs, share_inputs=True)
        for p in request.profiling_info:
            if p.real_time.total_seconds() <= 0:
                continue  # optimized out / not run
            t = totals[f"{p.node_type} [{p.exec_type}]"]
            t[0] += p.real_time.total_seconds() * 1e3 / repeats
            t[1] += 1 if i == 0 else 0
    return {k: (ms, int(n)) for k, (ms, n) in totals.items()}


def by_kind(ops: dict[str, tuple[float, int]]) -> dict[str, float]:
    kinds: dict[str, float] = defaultdict(float)
    for name, (ms, _) in ops.items():
        kinds[kind_of(name)] += ms
    return kinds


def tables(ours: dict, ov: dict, wall: dict[str, float], top: int) -> str:
    ko, kv = by_kind(ours), by_kind(ov)
    so, sv = sum(ko.values()), sum(kv.values())
    lines = [
        f"wall, no profiler (median): ours {wall['ours']:.2f} ms, OpenVINO "
        f"{wall['OpenVINO']:.2f} ms per call",
        "",
        "| kind of work | ours ms (share) | OpenVINO ms (share) | ours - OpenVINO ms |",
        "|---|---:|---:|---:|",
    ]
    for kind in sorted(set(ko) | set(kv), key=lambda k: -(ko.get(k, 0) + kv.get(k, 0))):
        o, v = ko.get(kind, 0.0), kv.get(kind, 0.0)
        lines.append(f"| {kind} | {o:.2f} ({o / so:.0%}) | {v:.2f} ({v / sv:.0%}) | {o - v:+.2f} |")
    lines.append(f"| **sum of the ops** | **{so:.2f}** | **{sv:.2f}** | {so - sv:+.2f} |")
    uo, uv = wall["ours"] - so, wall["OpenVINO"] - sv
    lines.append(
        f"| outside the ops (wall - sum: Python, dispatch, threads waking) | {uo:.2f} | "
        f"{uv:.2f} | {uo - uv:+.2f} |"
    )
    for title, ops in (("ours: op", ours), ("OpenVINO: node type [kernel]", ov)):
        lines += ["", f"| {title} | calls | ms | share |", "|---|---:|---:|---:|"]
        total = sum(ms for ms, _ in ops.values())
        for name, (ms, n) in sorted(ops.items(), key=lambda kv: -kv[1][0])[:top]:
            lines.append(f"| `{name}` | {n} | {ms:.2f} | {ms / total:.0%} |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line; counts below 1 are refused (exit 2)."""
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.investigations.op_profile",
        description=__doc__.split("\n\n")[0],
    )
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--repeats", type=int, default=50, help="profiled calls of each")
    p.add_argument("--threads", type=int, default=None, help="default: torch's thread count")
    p.add_argument("--top", type=int, default=12, help="ops listed per side")
    p.add_argument("--quick", action="store_true", help="the tiny CLIP")
    args = p.parse_args(argv)
    for name in ("batch", "repeats", "threads", "top"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            p.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    return args


def profile_tables(args: argparse.Namespace, ours: Any, ov_model: Any) -> str:
    """Profile ``ours`` and OpenVINO's model of its image tower (from
    ``ours_and_openvino_image``, not changed: bf16 runs a bf16 copy of ours); the tables."""
    import openvino as ov
    from attn_clip import create_model
    from attn_clip import export as ex

    threads = torch.get_num_threads()
    config = ours.config
    precision = {"fp32": "f32", "bf16": "bf16"}[args.precision]
    compiled = ex.compile_openvino(ov_model, threads, precision)
    with ex.signal_stack_kept():  # (OpenVINO swaps the thread's signal stack: docs/clip.md)
        perf = ov.Core().compile_model(
            ov_model,
            "CPU",
            {
                "INFERENCE_NUM_THREADS": threads,
                "PERFORMANCE_HINT": "LATENCY",
                "INFERENCE_PRECISION_HINT": precision,
                "PERF_COUNT": True,
            },
        )
    if args.precision == "bf16":
        ours16 = create_model(config, precision="bf16").eval()
        ours16.load_state_dict(ours.state_dict())
        ours = ours16
    size = config.vision.image_size
    x = torch.randn(args.batch, 3, size, size)
    xo = x.to(torch.bfloat16) if args.precision == "bf16" else x
    tower = ex.OpenVINOTower(compiled)
    with torch.inference_mode():
        fns = {"ours": lambda: ours.encode_image(xo), "OpenVINO": lambda: tower(x)}
        t = time_interleaved(fns, 7, inner=10 if args.batch == 1 else 1)
        wall = {k: v.median * 1e3 for k, v in t.items()}
        ours_ops = profile_ours(fns["ours"], args.repeats)
    ov_ops = profile_openvino(perf, x, args.repeats)
    policy = os.environ.get("OMP_WAIT_POLICY", "unset")
    name = "tiny CLIP" if args.quick else "ViT-B/32"
    return (
        f"{name} image tower, {args.precision}, batch {args.batch}, {threads} threads, "
        f"{args.repeats} profiled calls each, OMP_WAIT_POLICY {policy}\n\n"
        + tables(ours_ops, ov_ops, wall, args.top)
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    print(profile_tables(args, *ours_and_openvino_image(args.quick)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
