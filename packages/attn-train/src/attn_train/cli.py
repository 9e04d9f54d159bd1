"""What every recipe's command line shares: the run flags, input checks, ``--set KEY=VALUE``
overrides, and the exits. The help layout, one-line messages, exit handling and Ctrl-C are
the toolkit's (:mod:`attn_core.cli`, re-exported here: ``HelpFormatter``, ``make_parser``,
``add_subcommand``, ``one_line``).

Exit codes of :func:`run_main`: 0 done, 1 a NaN / inf loss stopped the run, 2 bad input
(one ``error:`` line on stderr, nothing written), 130 Ctrl-C (one line saying where the
last checkpoint is; the same command resumes from it).
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, NoReturn

from attn_core.cli import HelpFormatter, add_subcommand, make_parser, one_line, run

from .amp import PRECISIONS
from .errors import NonFiniteLossError

__all__ = [
    "EXIT_CODES",
    "HelpFormatter",
    "add_augment_args",
    "add_image_loader_args",
    "add_optimizer_args",
    "add_run_args",
    "add_schedule_args",
    "add_subcommand",
    "add_zero_shot_args",
    "apply_overrides",
    "augment_kwargs",
    "check_run_args",
    "make_parser",
    "one_line",
    "parse_overrides",
    "read_text_file",
    "require_dir",
    "require_file",
    "require_multiple",
    "require_positive",
    "run_main",
    "zero_shot_sets",
]


# -- the shared flags ----------------------------------------------------------------------


def add_run_args(p: Any, *, log_every: int = 20, save_every: int = 500, fsdp: bool = False) -> None:
    """``--out --seed --device --threads --precision --log-every --save-every --no-resume
    --quiet`` (and ``--fsdp`` with ``fsdp=True``) on a parser or argument group (read by
    :func:`attn_train.start_run`)."""
    p.add_argument(
        "--out", type=Path, required=True, help="run folder (rerun the same command to resume)"
    )
    p.add_argument("--seed", type=int, default=0, help="seed of init, data order, augmentation")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: cuda if any)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads per process")
    p.add_argument(
        "--precision",
        default="auto",
        choices=PRECISIONS,
        help="autocast dtype; auto = bf16 on a GPU that has it, else fp32",
    )
    p.add_argument("--log-every", type=int, default=log_every, help="updates between log lines")
    p.add_argument("--save-every", type=int, default=save_every, help="updates between checkpoints")
    p.add_argument("--no-resume", action="store_true", help="start over even if OUT/last exists")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--debug-nan-at-step", type=int, default=None, help=argparse.SUPPRESS)
    if fsdp:
        p.add_argument(
            "--fsdp",
            action="store_true",
            help="under torchrun: shard weights, gradients and optimizer state over the "
            "processes (PyTorch FSDP2, per block; activation checkpointing on)",
        )


def add_schedule_args(p: Any, *, epochs: int, batch_size: int, lr: float, warmup: int) -> None:
    """``--epochs --max-steps --batch-size --accum --lr --warmup``."""
    p.add_argument("--epochs", type=int, default=epochs, help="passes over the training data")
    p.add_argument("--max-steps", type=int, default=None, help="total updates (sets the schedule)")
    p.add_argument("--batch-size", type=int, default=batch_size, help="per process and micro-step")
    p.add_argument("--accum", type=int, default=1, help="micro-steps per update")
    p.add_argument("--lr", type=float, default=lr, help="peak learning rate")
    p.add_argument("--warmup", type=int, default=warmup, help="warm-up updates")


def add_optimizer_args(
    p: Any,
    *,
    wd: float,
    min_lr_ratio: float,
    betas: tuple[float, float] | None = None,
    eps: float | None = None,
) -> None:
    """AdamW's ``--wd`` (``--beta1 --beta2`` with ``betas``, ``--eps`` with ``eps``), the
    cosine floor ``--min-lr-ratio`` and ``--grad-clip``."""
    p.add_argument("--wd", type=float, default=wd, help="AdamW weight decay")
    if betas is not None:
        p.add_argument("--beta1", type=float, default=betas[0], help="AdamW beta1")
        p.add_argument("--beta2", type=float, default=betas[1], help="AdamW beta2")
    if eps is not None:
        p.add_argument("--eps", type=float, default=eps, help="AdamW epsilon")
    p.add_argument("--min-lr-ratio", type=float, default=min_lr_ratio, help="cosine floor, x --lr")
    p.add_argument("--grad-clip", type=float, default=None, help="max gradient norm")


def add_image_loader_args(p: Any) -> None:
    """``--workers --warn-skipped-fraction --eval-batch-size`` of the image recipes."""
    p.add_argument("--workers", type=int, default=0, help="DataLoader worker processes")
    p.add_argument(
        "--warn-skipped-fraction",
        type=float,
        default=0.1,
        help="warn when more than this fraction of an epoch's images is unreadable (a run "
        "where none is readable stops with exit code 2)",
    )
    p.add_argument("--eval-batch-size", type=int, default=256, help="images per eval forward")


def add_zero_shot_args(p: Any) -> None:
    """``--zeroshot-dir`` (repeatable) ``--zeroshot-classnames --zeroshot-templates`` of the
    CLIP recipes: ImageFolder sets scored zero-shot (read them with :func:`zero_shot_sets`)."""
    p.add_argument(
        "--zeroshot-dir",
        type=Path,
        action="append",
        default=[],
        help="ImageFolder scored zero-shot after every epoch (repeatable)",
    )
    p.add_argument("--zeroshot-classnames", type=Path, default=None, help="one class per line")
    p.add_argument("--zeroshot-templates", nargs="+", default=["a photo of a {}."], help="prompts")


def zero_shot_sets(args: Any, transform: Callable[..., Any]) -> dict[str, Any]:
    """The ``--zeroshot-dir`` folders of :func:`add_zero_shot_args` -> ``{folder name:
    ImageFolderDataset}``, labelled by the ``--zeroshot-classnames`` list when given (so a
    folder of some classes is scored against all); a missing file or folder is a
    ``ValueError`` naming the flag (call it before anything is written)."""
    from .data import ImageFolderDataset

    names = None
    if args.zeroshot_classnames is not None:
        text = read_text_file(args.zeroshot_classnames, "--zeroshot-classnames")
        names = [c.strip() for c in text.splitlines() if c.strip()]
    for folder in args.zeroshot_dir:
        require_dir(folder, "--zeroshot-dir")
    return {p.name: ImageFolderDataset(p, transform, names) for p in args.zeroshot_dir}


def add_augment_args(p: Any) -> None:
    """timm's training augmentation flags: ``--no-augment --crop-pct --scale --hflip --aa
    --color-jitter --reprob`` (see :func:`augment_kwargs`)."""
    p.add_argument("--no-augment", action="store_true", help="train with the eval transform")
    p.add_argument(
        "--crop-pct",
        type=float,
        default=None,
        help="eval center-crop fraction (default: the weights' own)",
    )
    p.add_argument("--scale", type=float, nargs=2, default=(0.08, 1.0), help="RRC area range")
    p.add_argument("--hflip", type=float, default=0.5, help="horizontal flip probability")
    p.add_argument(
        "--aa",
        choices=["rand", "trivial", "none"],
        default="rand",
        help="auto-augment: RandAugment, TrivialAugment or none",
    )
    p.add_argument("--color-jitter", type=float, default=0.4, help="used when --aa none")
    p.add_argument("--reprob", type=float, default=0.25, help="random erasing probability")


def augment_kwargs(args: Any) -> dict[str, Any]:
    """The flags of :func:`add_augment_args` as keyword arguments of timm's training
    transform (``attn_vision.create_transform(model, True, **augment_kwargs(args))``)."""
    return dict(
        scale=args.scale,
        hflip=args.hflip,
        auto_augment=args.aa,
        color_jitter=args.color_jitter,
        re_prob=args.reprob,
    )


# -- input checks --------------------------------------------------------------------------

_AT_LEAST_ONE = (
    "threads",
    "log_every",
    "save_every",
    "epochs",
    "max_steps",
    "steps",
    "batch_size",
    "accum",
    "eval_every",
    "eval_batch_size",
)


def require_positive(args: Any, *names: str) -> None:
    """``ValueError`` naming the flag for the first of ``names`` (attributes of ``args``,
    ``"embed_dim"`` for ``--embed-dim``) below 1; missing or None ones are skipped."""
    for name in names:
        value = getattr(args, name, None)
        if value is not None and value < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {value}")


def require_multiple(args: Any, name: str, of: str) -> None:
    """``ValueError`` unless ``args.<name>`` is a multiple of ``args.<of>`` (e.g. the model
    width of the number of heads)."""
    value, divisor = getattr(args, name), getattr(args, of)
    if value % divisor:
        flag, other = f"--{name.replace('_', '-')}", f"--{of.replace('_', '-')}"
        raise ValueError(f"{flag} {value} is not a multiple of {other} {divisor}")


def check_run_args(args: Any) -> None:
    """``ValueError`` naming the flag for a shared flag out of range, or an ``--out`` that is
    a file (only the flags ``args`` has are checked)."""
    require_positive(args, *_AT_LEAST_ONE)
    out = getattr(args, "out", None)
    if out is not None and Path(out).exists() and not Path(out).is_dir():
        raise ValueError(f"--out {out} is a file, not a folder")
    ema_decay = getattr(args, "ema_decay", None)
    if ema_decay is not None and not 0.0 < ema_decay < 1.0:
        raise ValueError(f"--ema-decay must be in (0, 1), got {ema_decay}")
    if getattr(args, "fsdp", False):
        for flag in ("--ema-decay", "--wise-ft-alpha"):  # each keeps a whole copy of the model
            if getattr(args, flag[2:].replace("-", "_"), None) is not None:
                raise ValueError(f"{flag} is not supported with --fsdp (it needs whole weights)")
        if getattr(args, "precision", None) == "fp16":  # the loss scaler sees one shard's grads
            raise ValueError("--precision fp16 is not supported with --fsdp: use bf16 or fp32")


def require_file(path: str | os.PathLike | None, flag: str) -> None:
    """``ValueError`` unless ``path`` (if given) is an existing file."""
    if path is None:
        return
    if Path(path).is_dir():
        raise ValueError(f"{flag} {path} is a folder, not a file")
    if not Path(path).is_file():
        raise ValueError(f"{flag} {path}: no such file")


def require_dir(path: str | os.PathLike | None, flag: str) -> None:
    """``ValueError`` unless ``path`` (if given) is an existing folder."""
    if path is None:
        return
    if Path(path).is_file():
        raise ValueError(f"{flag} {path} is a file, not a folder")
    if not Path(path).is_dir():
        raise ValueError(f"{flag} {path}: no such folder")


def read_text_file(path: str | os.PathLike, flag: str) -> str:
    """The UTF-8 text of the file a flag names, or a ``ValueError`` that names both."""
    require_file(path, flag)
    try:
        return Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{flag} {path} is not UTF-8 text ({e})") from None


# -- --set ---------------------------------------------------------------------------------


def parse_overrides(items: list[str], known: Iterable[str] | None = None) -> dict[str, Any]:
    """``["depth=6", "qkv_bias=false"]`` -> ``{"depth": 6, "qkv_bias": False}`` (JSON values,
    else the string). With ``known``, a key not in it is a ``ValueError`` that names it."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--set expects KEY=VALUE, got {item!r}")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    if known is not None:
        names = sorted(known)
        unknown = sorted(out.keys() - set(names))
        if unknown:
            raise ValueError(f"--set: unknown config key(s) {unknown}; known: {names}")
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


# -- exits ---------------------------------------------------------------------------------

EXIT_CODES = {NonFiniteLossError: 1}  # what the recipes add to attn_core.cli.run's codes


def run_main(main: Callable[[], Any]) -> NoReturn:
    """A recipe's :func:`attn_core.cli.run`: exit 1 with one ``error:`` line for a NaN / inf
    loss, 2 for bad input, 130 with one ``interrupted`` line (naming the checkpoint to resume
    from) for Ctrl-C; under ``torchrun`` rank 0 says it."""
    run(main, exit_codes=EXIT_CODES)
