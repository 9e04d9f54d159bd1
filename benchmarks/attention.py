"""Section ``attention``: causal attention kernels (B=1, H=8, D=64) at each length: our
sliding window and linear attention against ``attention()`` on SDPA and on the math
backend; at one length also against a dense-masked SDPA and compiled FlexAttention as
sliding-window references."""

from __future__ import annotations

import argparse
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from benchmarks.harness import Report, max_diff, peak_memory_mb, time_interleaved

SECTION = "Attention kernels (causal, B=1, H=8, D=64)"


def _attention_case(
    args: argparse.Namespace, report: Report, L: int, peaks: dict[int, float | None]
) -> None:
    """The kernels at length ``L`` (their peak memory goes to ``peaks``), and the
    sliding-window references when ``L`` is ``args.flex_length``."""
    from attn_core import attention, sliding_window_attention, sliding_window_mask
    from attn_core.linear_attention import elu_feature_map, linear_attention

    B, H, D, w = 1, 8, 64, args.window
    torch.manual_seed(0)
    q, k, v = (torch.randn(B, H, L, D) for _ in range(3))
    ours = f"sliding window w={w} (ours)"
    fns: dict[str, Callable[[], Any]] = {
        ours: lambda: sliding_window_attention(q, k, v, w),
        "linear (elu+1, ours)": lambda: linear_attention(
            elu_feature_map(q), elu_feature_map(k), v, causal=True
        ),
        "sdpa (attention())": lambda: attention(q, k, v, is_causal=True),
    }
    score_gb = B * H * L * L * 4 / 2**30
    note = ""
    if score_gb <= args.math_max_gb:
        fns["math (attention(backend='math'))"] = lambda: attention(
            q, k, v, is_causal=True, backend="math"
        )
    else:
        note = f"math skipped: {score_gb:.0f} GiB of scores"
    t = time_interleaved(fns, args.attn_repeats)
    mem = {name: peak_memory_mb(f) for name, f in fns.items()} if args.memory else {}
    peaks[L] = mem.get(ours)
    report.add_case(SECTION, f"L={L}", t, L, "tok", ours=ours, memory=mem, note=note)
    if L != args.flex_length:
        return

    # the references for the sliding window: a dense mask, and compiled FlexAttention
    dense_mask = sliding_window_mask(L, w)
    refs = {
        ours: fns[ours],
        "sdpa + dense window mask": lambda: F.scaled_dot_product_attention(
            q, k, v, attn_mask=dense_mask
        ),
    }
    ref_out = refs["sdpa + dense window mask"]()
    checks = {ours: f"max diff {max_diff(refs[ours](), ref_out):.1e} to dense"}
    flex_name, compile_s = "FlexAttention, compiled", None
    try:
        if not args.flex:
            raise LookupError
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        def rule(b, h, qi, ki):
            return (ki <= qi) & (ki > qi - w)

        block_mask = create_block_mask(rule, None, None, L, L, device="cpu")
        flex = torch.compile(flex_attention)
        start = time.perf_counter()
        flex_out = flex(q, k, v, block_mask=block_mask)
        compile_s = time.perf_counter() - start
        refs[flex_name] = lambda: flex(q, k, v, block_mask=block_mask)
        diff = max_diff(flex_out, ref_out)
        checks[flex_name] = f"compile {compile_s:.1f} s; max diff {diff:.1e}"
    except LookupError:
        pass  # --no-flex
    except Exception as err:  # no C++ compiler, ...
        warnings.warn(f"compiled FlexAttention unavailable: {err}", stacklevel=2)
    t = time_interleaved(refs, args.attn_repeats)
    mem = {name: peak_memory_mb(f) for name, f in refs.items()} if args.memory else {}
    rows = report.add_case(
        SECTION, f"sliding window refs L={L} w={w}", t, L, "tok", ours=ours, memory=mem,
        checks=checks,
    )  # fmt: skip
    if flex_name in rows:
        ratio = rows[flex_name].ref_over_ours
        report.goal(
            f"sliding window L={L} w={w}",
            "<= compiled FlexAttention time, no compile step",
            f"{ratio:.2f}x flex's speed (flex compiles {compile_s:.1f} s first)",
            ratio >= 1.0,
        )


def bench_attention(args: argparse.Namespace, report: Report) -> None:
    """Every length of ``args.lengths``; the goal is sliding-window memory linear in L."""
    B, H, w = 1, 8, args.window
    peaks: dict[int, float | None] = {}
    for L in args.lengths:
        _attention_case(args, report, L, peaks)
    lens = [L for L in args.lengths if peaks.get(L)]
    if len(lens) >= 2:
        lo, hi = lens[0], lens[-1]
        growth = peaks[hi] / peaks[lo]
        report.goal(
            "sliding window extra memory O(L*w)",
            f"peak grows ~linearly: x{hi // lo} length -> ~x{hi // lo} memory",
            f"{peaks[lo]:.1f} MB at L={lo} -> {peaks[hi]:.1f} MB at L={hi} (x{growth:.1f}); "
            f"L*w*H fp32 scores would be {B * H * hi * w * 4 / 2**20:.0f} MB",
            growth <= 1.25 * hi / lo,
        )
