"""Section ``dispatch``: the overhead of ``attn_core.attention()`` over a raw
``F.scaled_dot_product_attention`` call, interleaved at one shape and per call on tiny
tensors (``timeit``)."""

from __future__ import annotations

import argparse
import timeit

import torch
import torch.nn.functional as F

from benchmarks.harness import Report, time_interleaved


def bench_dispatch(args: argparse.Namespace, report: Report) -> None:
    """One row each; the goal is <= 5% of the kernel's time."""
    from attn_core import attention

    L = args.dispatch_length
    q, k, v = (torch.randn(1, 8, L, 64) for _ in range(3))
    fns = {
        "attention()": lambda: attention(q, k, v),
        "F.scaled_dot_product_attention": lambda: F.scaled_dot_product_attention(q, k, v),
    }
    t = time_interleaved(fns, args.dispatch_repeats, warmup=3, inner=20)
    rows = report.add_case(
        "attention() dispatch overhead", f"B=1 H=8 L={L} D=64", t, 1, "call",
        ours="attention()",
    )  # fmt: skip
    tiny = [torch.randn(1, 1, 1, 8) for _ in range(3)]
    per_call = {
        name: min(timeit.repeat(lambda f=f: f(*tiny), number=2000, repeat=5)) / 2000
        for name, f in (("attention", attention), ("sdpa", F.scaled_dot_product_attention))
    }
    overhead_us = (per_call["attention"] - per_call["sdpa"]) * 1e6
    kernel = t["F.scaled_dot_product_attention"].median
    pct = overhead_us * 1e-6 / kernel * 100
    ratio = rows["F.scaled_dot_product_attention"].ref_over_ours
    report.goal(
        f"attention() dispatch overhead at L={L}",
        "<= 5% over raw F.scaled_dot_product_attention",
        f"{overhead_us:.1f} us per call = {pct:.2f}% of the {kernel * 1e3:.2f} ms kernel "
        f"(interleaved medians: sdpa/attention() = {ratio:.3f})",
        pct <= 5,
    )
