"""What every recipe's command line shares: the run flags, ``--set KEY=VALUE`` overrides,
and the exits (NaN stop: 1, bad input: 2, Ctrl-C: 130)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .amp import PRECISIONS

__all__ = [
    "add_run_args",
    "add_schedule_args",
    "apply_overrides",
    "parse_overrides",
    "run_main",
]


def add_run_args(p: Any, *, log_every: int = 20, save_every: int = 500) -> None:
    """``--out --seed --device --threads --precision --log-every --save-every --no-resume
    --quiet`` on a parser or argument group (read by :func:`attn_train.start_run`)."""
    p.add_argument("--out", type=Path, required=True, help="run directory")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    p.add_argument("--threads", type=int, default=None, help="CPU threads per process")
    p.add_argument("--precision", default="auto", choices=PRECISIONS)
    p.add_argument("--log-every", type=int, default=log_every, help="updates between log lines")
    p.add_argument("--save-every", type=int, default=save_every, help="updates between checkpoints")
    p.add_argument("--no-resume", action="store_true", help="start over even if OUT/last exists")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--debug-nan-at-step", type=int, default=None, help=argparse.SUPPRESS)


def add_schedule_args(p: Any, *, epochs: int, batch_size: int, lr: float, warmup: int) -> None:
    """``--epochs --max-steps --batch-size --accum --lr --warmup``."""
    p.add_argument("--epochs", type=int, default=epochs)
    p.add_argument("--max-steps", type=int, default=None, help="total updates (sets the schedule)")
    p.add_argument("--batch-size", type=int, default=batch_size, help="per process and micro-step")
    p.add_argument("--accum", type=int, default=1, help="micro-steps per update")
    p.add_argument("--lr", type=float, default=lr)
    p.add_argument("--warmup", type=int, default=warmup, help="warm-up updates")


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """``["depth=6", "qkv_bias=false"]`` -> ``{"depth": 6, "qkv_bias": False}`` (JSON values,
    else the string)."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--set expects KEY=VALUE, got {item!r}")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def apply_overrides(config: dict[str, Any], items: list[str]) -> dict[str, Any]:
    """Set ``KEY=VALUE`` items in a (nested) config dict, in place: ``vision.layers=2``.
    An unknown key is a ``ValueError`` that names it."""
    for key, value in parse_overrides(items).items():
        *parents, leaf = key.split(".")
        target: Any = config
        for part in parents:
            target = target.get(part) if isinstance(target, dict) else None
        if not isinstance(target, dict) or leaf not in target:
            raise ValueError(f"--set: unknown config key {key!r}")
        target[leaf] = value
    return config


def run_main(main: Callable[[], Any]) -> None:
    """Run a recipe's ``main()`` as a command: one ``error:`` line on stderr and exit 1 for a
    NaN / inf loss, 2 for bad input (``ValueError``, ``OSError``, weights errors), 130 for
    Ctrl-C."""
    from attn_core.hub import WeightsError

    from .loop import NonFiniteLossError

    try:
        main()
    except NonFiniteLossError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(1) from None
    except (ValueError, OSError, WeightsError) as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        raise SystemExit(130) from None
