"""The measuring and reporting half of the benchmarks: interleaved timing, peak memory,
agreement checks, and the report (rows, goals) as markdown tables and JSON."""

from __future__ import annotations

import contextlib
import json
import math
import os
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

# ----------------------------------------------------------------------------------------
# Measuring
# ----------------------------------------------------------------------------------------


@dataclass
class Timing:
    times: list[float]  # seconds per call

    @property
    def median(self) -> float:
        return statistics.median(self.times)

    @property
    def min(self) -> float:
        return min(self.times)


def time_interleaved(
    fns: dict[str, Callable[[], Any]], repeats: int, warmup: int = 1, inner: int = 1
) -> dict[str, Timing]:
    """Warm each function up, then time them round-robin ``repeats`` times (``inner``
    calls per sample); interleaving spreads load from other processes over all of them."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            for _ in range(inner):
                fn()
            times[name].append((time.perf_counter() - start) / inner)
    return {name: Timing(t) for name, t in times.items()}


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """Silence file descriptor 2 (the profiler's C++ start / stop lines)."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def peak_memory_mb(fn: Callable[[], Any]) -> float | None:
    """Peak live tensor memory (MB) allocated while ``fn()`` runs; None when the profiler
    cannot tell.

    ``torch.profiler.profile(profile_memory=True)`` records every allocation and free as a
    ``[memory]`` event with its signed size in bytes; the public ``export_chrome_trace``
    writes them out in order, and the running sum of those sizes peaks at the answer.
    Memory that existed before the call (inputs, weights) is not counted."""
    try:
        from torch.profiler import ProfilerActivity, profile

        with _quiet_stderr(), tempfile.TemporaryDirectory() as tmp:
            with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
                fn()  # (already warmed up: nothing worth seeing goes to stderr)
            trace = Path(tmp) / "trace.json"
            prof.export_chrome_trace(str(trace))
            events = json.loads(trace.read_text(encoding="utf-8"))["traceEvents"]
        memory = sorted((e for e in events if e.get("name") == "[memory]"), key=lambda e: e["ts"])
        live = peak = 0
        for event in memory:
            live += event["args"]["Bytes"]
            peak = max(peak, live)
        return peak / 2**20
    except Exception as err:  # report "-" rather than fail the benchmark
        warnings.warn(f"peak memory unavailable: {err}", stacklevel=2)
        return None


# ----------------------------------------------------------------------------------------
# Identical weights, checked
# ----------------------------------------------------------------------------------------


@torch.no_grad()
def random_fill_(model: torch.nn.Module, std: float = 0.02) -> torch.nn.Module:
    """Norm scales ~ 1 + noise, every other parameter ~ N(0, std^2); returns it in eval mode."""
    for name, p in model.named_parameters():
        if p.ndim == 1 and "norm" in name and name.endswith("weight"):
            p.normal_(1.0, 0.1)
        elif name.endswith("logit_scale"):
            p.fill_(math.log(1 / 0.07))
        else:
            p.normal_(0.0, std)
    return model.eval()


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest absolute difference."""
    return (a.float() - b.float()).abs().max().item()


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    """Smallest row-wise cosine similarity."""
    return F.cosine_similarity(a.float(), b.float(), dim=-1).min().item()


# ----------------------------------------------------------------------------------------
# Report
# ----------------------------------------------------------------------------------------


@dataclass
class Row:
    section: str
    case: str  # what is computed, e.g. "image fp32 batch 8"
    impl: str  # "ours", "open_clip", ...
    median_ms: float
    min_ms: float
    throughput: float | None  # items per second (median)
    unit: str  # what an item is
    peak_mb: float | None = None
    ref_over_ours: float | None = None  # reference median / ours median (> 1: ours faster)
    check: str = ""
    note: str = ""


@dataclass
class Goal:
    name: str
    target: str
    measured: str
    met: bool


@dataclass
class Report:
    rows: list[Row] = field(default_factory=list)
    goals: list[Goal] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)

    def add_case(
        self,
        section: str,
        case: str,
        timings: dict[str, Timing],
        items: int,
        unit: str,
        *,
        ours: str = "ours",
        memory: dict[str, float | None] | None = None,
        checks: dict[str, str] | None = None,
        note: str = "",
        scale: float = 1.0,
    ) -> dict[str, Row]:
        """One row per implementation; ``scale`` multiplies times (extrapolation)."""
        memory, checks = memory or {}, checks or {}
        base = timings[ours].median * scale if ours in timings else None
        rows = {}
        for impl, t in timings.items():
            med, mn = t.median * scale, t.min * scale
            row = Row(
                section,
                case,
                impl,
                med * 1e3,
                mn * 1e3,
                items / med if med > 0 else None,
                unit,
                memory.get(impl),
                med / base if base and impl != ours else None,
                checks.get(impl, ""),
                note,
            )
            self.rows.append(row)
            rows[impl] = row
            print(
                f"  {case:<34} {impl:<24} {med * 1e3:10.1f} ms"
                + (f"  ref/ours {row.ref_over_ours:.2f}x" if row.ref_over_ours else ""),
                file=sys.stderr,
                flush=True,
            )
        return rows

    def goal(self, name: str, target: str, measured: str, met: bool) -> None:
        self.goals.append(Goal(name, target, measured, bool(met)))
        print(f"  GOAL {name}: {measured} ({'met' if met else 'NOT met'})", file=sys.stderr)

    def markdown(self) -> str:
        """One table per section, then the goals."""
        out = []
        section = None
        for r in self.rows:
            if r.section != section:
                section = r.section
                out += [
                    "",
                    f"### {section}",
                    "",
                    "| case | impl | median ms | min ms | throughput | peak MB | ref / ours "
                    "| check |",
                    "|---|---|---:|---:|---:|---:|---:|---|",
                ]
            thr = f"{r.throughput:,.1f} {r.unit}/s" if r.throughput else "-"
            mem = f"{r.peak_mb:,.1f}" if r.peak_mb is not None else "-"
            ratio = f"{r.ref_over_ours:.2f}x" if r.ref_over_ours else ""
            case = r.case + (f" ({r.note})" if r.note else "")
            out.append(
                f"| {case} | {r.impl} | {r.median_ms:,.1f} | {r.min_ms:,.1f} | {thr} | {mem} "
                f"| {ratio} | {r.check} |"
            )
        if self.goals:
            out += ["", "### Goals", "", "| goal | target | measured | met |", "|---|---|---|---|"]
            for g in self.goals:
                out.append(f"| {g.name} | {g.target} | {g.measured} | {'yes' if g.met else 'NO'} |")
        return "\n".join(out).strip() + "\n"

    def to_json(self) -> dict[str, Any]:
        """``{"meta": ..., "rows": [...], "goals": [...]}``."""
        return {
            "meta": self.meta,
            "rows": [asdict(r) for r in self.rows],
            "goals": [asdict(g) for g in self.goals],
        }
