"""Section ``startup``: wall time of fresh interpreters, the README's first command
(offline zero-shot with the bundled ``demo-shapes`` model) against ``import torch``."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from benchmarks.harness import Report, time_interleaved

ROOT = Path(__file__).resolve().parents[1]  # the repository

README_COMMAND = (  # the README's first command, after `uv run`
    "apps/zero_shot.py", "--model", "demo-shapes", "--image", "docs/assets/red_circle.png",
    "--labels", "red circle", "red square", "blue circle", "green star",
)  # fmt: skip


def bench_startup(args: argparse.Namespace, report: Report) -> None:
    """Interleaved runs of both commands; the goal is <= 1.0 s more than ``import torch``."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    commands = {
        "import torch": [sys.executable, "-c", "import torch"],
        "README first command": [sys.executable, *README_COMMAND],
    }

    def run(cmd: list[str]) -> None:
        subprocess.run(cmd, cwd=ROOT, env=env, check=True, capture_output=True, timeout=300)

    fns = {name: (lambda c=cmd: run(c)) for name, cmd in commands.items()}
    t = time_interleaved(fns, args.startup_repeats, warmup=args.startup_warmup)
    report.add_case(
        "start-up (fresh interpreter, wall time)", "offline zero-shot, demo-shapes", t, 1, "run",
        ours="README first command",
        note="python apps/zero_shot.py ... as `uv run` starts it, without uv's own check",
    )  # fmt: skip
    extra = t["README first command"].median - t["import torch"].median
    report.goal(
        "start-up: the README's first command",
        '<= 1.0 s more than python -c "import torch"',
        f"{extra:+.2f} s ({t['README first command'].median:.2f} s vs "
        f"{t['import torch'].median:.2f} s, medians of {args.startup_repeats})",
        extra <= 1.0,
    )
