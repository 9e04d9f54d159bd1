"""The training loop, once for every recipe.

A recipe builds the model, the data and the optimizer, then::

    run = start_run(args)                   # process group, seeds, precision, log, resume?
    ...
    result = fit(run, model, optimizer, scheduler, loader, LoopConfig(max_steps=...),
                 loss_fn=lambda model, batch: F.cross_entropy(model(batch[0]), batch[1]),
                 evaluate=..., write_files=...)
    run.close(result)

:func:`fit` does, per update: ``accum`` micro-batches under ``autocast`` (no DDP gradient
sync but on the last), a NaN / inf check of every loss *before* its backward (the run
stops on every rank with :class:`NonFiniteLossError`, naming the last good checkpoint,
which stays untouched), fp16 loss scaling, gradient clipping, the optimizer and scheduler
step (the schedule counts updates), an EMA update, a JSONL + console log line every
``log_every`` updates, ``OUT/last`` every ``save_every`` updates; after every epoch (or
every ``eval_every`` updates, and at the end) an evaluation -- which leaves the training
RNGs as they were -- ``OUT/best`` when its metric improved, and ``OUT/last``. It resumes
from ``OUT/last`` exactly: weights, optimizer, scheduler, scaler, EMA, every RNG and the
sampler position.

Batches from :func:`attn_train.data.collate_skip_unreadable` (a ``Collated``) have their
dropped items counted over ranks, and under DDP are trimmed to the smallest local batch.
A pass over the data in which more than ``warn_skipped_fraction`` of the items were
unreadable warns (:class:`SkippedImagesWarning`, once a run); one in which none was readable
stops the run (:class:`UnreadableDataError`). Ctrl-C raises :class:`TrainingInterrupted`,
whose message names the last checkpoint. The progress bar counts the updates this run will
make (one bar for the run). ``--fsdp`` shards the model with FSDP2 (:mod:`attn_train.fsdp`).
A recipe whose update is not "sum of micro-batch losses" (CLIP's exact contrastive
accumulation) passes ``step_fn`` instead of ``loss_fn``: it gets the update's micro-batches
and a :class:`StepContext`, and must call ``ctx.check(loss)`` before any backward.
"""

from __future__ import annotations

import contextlib
import math
import random
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader

from .amp import autocast, make_scaler, resolve_precision
from .checkpoint import (
    find_checkpoint,
    load_checkpoint,
    read_checkpoint_file,
    read_progress,
    save_checkpoint,
)
from .cli import check_run_args
from .data import Collated, UnreadableDataError
from .distributed import (
    Distributed,
    all_reduce_mean,
    all_reduce_min,
    all_reduce_sum,
    barrier,
    cleanup_distributed,
    maybe_no_sync,
    seed_everything,
    setup_distributed,
    wrap_ddp,
)
from .errors import NonFiniteLossError, TrainingInterrupted
from .log import RunLogger

__all__ = [
    "LoopConfig",
    "NonFiniteLossError",
    "Run",
    "SkippedImagesWarning",
    "StepContext",
    "TrainingInterrupted",
    "UnreadableDataError",
    "check_finite",
    "fit",
    "loss_step",
    "make_ema",
    "start_run",
]

# -- the start of a run --------------------------------------------------------------------


T = TypeVar("T")


@dataclass
class Run:
    """A run's process, precision, log and checkpoint folder (from :func:`start_run`)."""

    d: Distributed
    precision: str  # "fp32" / "bf16" / "fp16" ("auto" resolved for the device)
    log: RunLogger  # OUT/log.jsonl
    out: Path  # the run directory
    resume: bool  # OUT/last holds a complete checkpoint and --no-resume was not given
    seed: int = 0
    fsdp: bool = False  # --fsdp: fit() shards the model (attn_train.fsdp) instead of DDP

    @property
    def last(self) -> Path:
        """``OUT/last``: the checkpoint resumed from and written to."""
        return self.out / "last"

    def read_last(self, name: str, read: Callable[[Path], T]) -> T:
        """``read(path)`` of the file ``name`` (a tokenizer, a config) in the checkpoint being
        resumed; any failure is a one-line :class:`~attn_train.ResumeError` naming the file."""
        found = find_checkpoint(self.last)
        if found is None:
            raise ValueError(f"{self.last}: no checkpoint to read {name} from")
        return read_checkpoint_file(found / name, read)

    def close(self, result: dict[str, Any]) -> None:
        """Log the ``done`` record, wait for every rank, leave the process group."""
        self.log.log({"event": "done", **result})
        barrier(self.d)
        cleanup_distributed()


def make_ema(model: nn.Module, decay: float | None) -> nn.Module | None:
    """timm's ``ModelEmaV3`` of ``model`` (with its warm-up; frozen) for :func:`fit`'s
    ``ema``, or None when ``decay`` is None (``--ema-decay``, checked by
    :func:`~attn_train.cli.check_run_args`)."""
    if decay is None:
        return None
    from timm.utils import ModelEmaV3

    return ModelEmaV3(model, decay=decay, use_warmup=True).requires_grad_(False)


def start_run(args: Any) -> Run:
    """Set up a run from the flags every recipe shares (``--device --threads --seed
    --precision --out --no-resume [--fsdp]``, see :func:`attn_train.cli.add_run_args`): check
    them (``ValueError``; ``--fsdp`` without torchrun is one), join the process group, seed
    every RNG, resolve the precision, look for ``OUT/last``. Nothing is written: ``OUT`` is
    made by the first log record."""
    check_run_args(args)
    d = setup_distributed(args.device, args.threads)
    fsdp = bool(getattr(args, "fsdp", False))
    if fsdp and not dist.is_initialized():
        raise ValueError(
            "--fsdp shards the model over the processes of torchrun: launch with "
            "'torchrun --nproc-per-node N SCRIPT ...' (in one process, leave out --fsdp)"
        )
    seed_everything(args.seed, d.rank)
    precision = resolve_precision(args.precision, d.device)
    out = Path(args.out)
    resume = not args.no_resume and find_checkpoint(out / "last") is not None
    return Run(d, precision, RunLogger(out / "log.jsonl", d), out, resume, args.seed, fsdp)


# -- NaN / inf -----------------------------------------------------------------------------


class SkippedImagesWarning(UserWarning):
    """More than ``LoopConfig.warn_skipped_fraction`` of a pass's items were unreadable."""


def check_finite(
    loss: torch.Tensor | float,
    d: Distributed,
    *,
    checkpoint: str | Path,
    step: int,
    epoch: int,
    log: RunLogger | None = None,
) -> None:
    """Raise :class:`NonFiniteLossError` on every rank if any rank's ``loss`` is not finite.

    Called before ``backward()``, so the weights and the checkpoint at ``checkpoint`` (the
    last good one) stay untouched. ``step`` is the update that failed.
    """
    value = float(loss.detach().float().item() if isinstance(loss, torch.Tensor) else loss)
    if all_reduce_mean(float(not math.isfinite(value)), d) == 0:
        return
    progress = read_progress(checkpoint)
    if progress is None:
        good = "no checkpoint had been written yet"
    else:
        good = (
            f"the last good checkpoint is {find_checkpoint(checkpoint)} (step {progress['step']})"
        )
    message = (
        f"loss is {value if not math.isfinite(value) else 'not finite on another rank'} at "
        f"update {step} (epoch {epoch}); stopped without saving: {good}. Lower --lr, add "
        "--grad-clip, use --precision fp32, or check the data."
    )
    if log is not None:
        log.log({"event": "nonfinite_loss", "step": step, "message": message}, echo=False)
    raise NonFiniteLossError(message)


# -- one update --------------------------------------------------------------------------


@dataclass
class StepContext:
    """What a step function gets besides the micro-batches."""

    model: nn.Module  # the model itself
    ddp_model: nn.Module  # call this one in training forwards (DDP under torchrun)
    device: torch.device
    precision: str
    scaler: torch.amp.GradScaler
    check: Callable[[torch.Tensor], None]  # raises NonFiniteLossError; call before backward

    def autocast(self):
        return autocast(self.device, self.precision)

    def no_sync(self, sync: bool):
        """Wrap a micro-batch's forward: ``sync=False`` skips its DDP gradient all-reduce."""
        return maybe_no_sync(self.ddp_model, sync)

    def backward(self, loss: torch.Tensor) -> None:
        self.scaler.scale(loss).backward()


StepFn = Callable[[list[Any], StepContext], float]
LossFn = Callable[[nn.Module, Any], torch.Tensor]


def loss_step(loss_fn: LossFn) -> StepFn:
    """The usual update: ``loss_fn(model, batch)`` per micro-batch, checked, then its
    backward (scaled by 1 / micro-batches); returns the mean loss."""

    def step(micro: list[Any], ctx: StepContext) -> float:
        total = 0.0
        for j, batch in enumerate(micro):
            with ctx.no_sync(j == len(micro) - 1), ctx.autocast():
                loss = loss_fn(ctx.ddp_model, batch)
            ctx.check(loss)
            ctx.backward(loss / len(micro))
            total += loss.item() / len(micro)
        return total

    return step


# -- the loop ----------------------------------------------------------------------------


@dataclass
class LoopConfig:
    """How long and how often. Steps count optimizer updates."""

    max_steps: int  # stop after this many updates
    epochs: int = 1  # ... or after this many epochs
    accum: int = 1  # micro-batches per update
    grad_clip: float | None = None  # max gradient norm
    log_every: int = 20  # updates between log lines (and the first one)
    save_every: int | None = 500  # updates between OUT/last checkpoints (and after each epoch)
    eval_every: int | None = None  # updates between evaluations (and at the end)
    eval_each_epoch: bool = True  # also evaluate after every epoch
    eval_event: str = "eval"  # the "event" of evaluation records
    best_metric: str | None = None  # evaluate()'s key to keep OUT/best by (higher is better)
    warn_skipped_fraction: float = 0.1  # warn when more of a pass's items were unreadable
    quiet: bool = False  # no progress bar
    debug_nan_at_step: int | None = None  # tests: make this update's loss NaN
    start: dict[str, Any] = field(default_factory=dict)  # extra fields of the "start" record

    @classmethod
    def from_args(cls, args: Any, max_steps: int, epochs: int = 1, **fields: Any) -> LoopConfig:
        """From the shared flags (``--accum --grad-clip --log-every --save-every --quiet
        --warn-skipped-fraction``; those a recipe lacks keep their defaults); ``fields`` set
        the rest."""
        names = ("accum", "grad_clip", "log_every", "save_every", "quiet", "debug_nan_at_step")
        names += ("warn_skipped_fraction",)
        found = {k: getattr(args, k) for k in names if hasattr(args, k)}
        return cls(max_steps=max_steps, epochs=epochs, **{**found, **fields})


@contextlib.contextmanager
def _keep_rng(device: torch.device) -> Iterator[None]:
    """Restore Python's and torch's RNG states (CPU and ``device``) on exit."""
    state = random.getstate()
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        yield
    random.setstate(state)


def _to_device(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if isinstance(batch, dict):
        return {k: _to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, list | tuple):
        return type(batch)(_to_device(v, device) for v in batch)
    return batch


def _readable(collated: Collated, d: Distributed) -> tuple[Any, int]:
    """The readable items of a batch (None if none; under DDP trimmed to the smallest local
    batch, as all-gathers and every rank's backward need) and the unreadable count over
    all ranks."""
    skipped = round(all_reduce_sum(collated.skipped, d))
    n = 0 if collated.batch is None else _batch_size(collated.batch)
    if d.enabled:
        n = all_reduce_min(n, d)
    return (_trim(collated.batch, n) if n > 0 else None), skipped


def _trim(batch: Any, n: int) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch[:n]
    if isinstance(batch, dict):
        return {k: _trim(v, n) for k, v in batch.items()}
    return type(batch)(_trim(v, n) for v in batch)


def _batch_size(batch: Any) -> int:
    if isinstance(batch, torch.Tensor):
        return len(batch)
    return _batch_size(next(iter(batch.values())) if isinstance(batch, dict) else batch[0])


def _updates_left(loader: DataLoader, cfg: LoopConfig, progress: dict[str, Any]) -> int:
    """The updates :func:`fit` will make from ``progress`` on: the rest of this epoch, then
    whole epochs, at most up to ``max_steps`` (the progress bar's length)."""
    if progress["epoch"] >= cfg.epochs:
        return 0
    samples: int = getattr(loader.sampler, "num_samples", 0)  # this rank's items an epoch
    size = loader.batch_size or 1
    batches = samples // size if loader.drop_last else math.ceil(samples / size)
    per_epoch = batches // cfg.accum
    this_epoch = per_epoch - progress["batches"] // cfg.accum
    later = (cfg.epochs - progress["epoch"] - 1) * per_epoch
    return max(0, min(cfg.max_steps - progress["step"], this_epoch + later))


def _check_skipped(used: int, skipped: int, epoch: int, cfg: LoopConfig, warned: bool) -> bool:
    """After a pass over the data: stop if no item was readable, warn (once a run) when more
    than ``cfg.warn_skipped_fraction`` were not. Returns whether it has warned."""
    if skipped and not used:
        raise UnreadableDataError(
            f"none of the {skipped} training items read in epoch {epoch} could be loaded "
            "(every image was unreadable; the warnings name them): nothing to train on. "
            "Check the image paths and files."
        )
    seen = used + skipped
    if not warned and skipped > cfg.warn_skipped_fraction * seen:
        warnings.warn(
            f"{skipped} of {seen} training items ({skipped / seen:.0%}) were unreadable images "
            f"in epoch {epoch}, more than --warn-skipped-fraction {cfg.warn_skipped_fraction:g}; "
            "they were skipped (check the data)",
            SkippedImagesWarning,
            stacklevel=3,
        )
        return True
    return warned


def _resume_hint(run: Run) -> str:
    """Where a stopped run would resume from, for the Ctrl-C message."""
    found = find_checkpoint(run.last)
    if found is None:
        return "no checkpoint had been written yet; the same command starts the run over"
    try:
        step = f" (update {read_progress(found)['step']})"  # type: ignore[index]
    except Exception:  # a checkpoint being swapped in at that instant
        step = ""
    return f"the last checkpoint is {found}{step}; run the same command again to resume from it"


def fit(
    run: Run,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    loader: DataLoader,
    config: LoopConfig,
    *,
    loss_fn: LossFn | None = None,
    step_fn: StepFn | None = None,
    evaluate: Callable[[], dict[str, Any]] | None = None,
    write_files: Callable[[Path], None] | None = None,
    ema: nn.Module | None = None,
    train_mode: Callable[[nn.Module], None] | None = None,
    after_update: Callable[[], dict[str, Any] | None] | None = None,
) -> dict[str, Any]:
    """Train ``model`` (on ``run.d.device``, not yet DDP-wrapped) until ``config.max_steps``
    updates or ``config.epochs`` epochs; see the module docstring.

    ``loader``: from :func:`attn_train.data.make_loader` (its ``ResumableSampler``).
    ``evaluate()`` runs on rank 0 and returns metrics to log. ``write_files(dir)`` makes a
    checkpoint a model folder (config, tokenizer). ``ema``: timm's ``ModelEmaV3`` (updated
    after every update with the update count, saved and restored). ``train_mode(model)``
    replaces ``model.train()`` (e.g. to keep a frozen tower in eval mode).
    ``after_update()`` runs after every update and may return extra log fields.
    With ``run.fsdp`` (``--fsdp``) the model is sharded in place with FSDP2 instead of DDP
    (:mod:`attn_train.fsdp`; no ``ema``): ``evaluate()`` and ``write_files`` still run on rank
    0 only, on gathered weights, and after ``fit`` ``model.state_dict()`` returns the whole
    trained weights (on rank 0, CPU), so a recipe saves them as usual.

    Returns ``step``, ``skipped_images``, the mean loss of the first and last few updates
    (``first_loss``, ``last_loss``), ``eval`` (the last evaluation's metrics, on rank 0) and
    ``out``. Raises :class:`NonFiniteLossError`, :class:`UnreadableDataError`,
    :class:`TrainingInterrupted` (Ctrl-C) and, when ``OUT/last`` cannot be resumed from,
    :class:`attn_train.checkpoint.ResumeError`.
    """
    if (loss_fn is None) == (step_fn is None):
        raise TypeError("give fit() exactly one of loss_fn or step_fn")
    step_fn = step_fn or loss_step(loss_fn)  # type: ignore[arg-type]
    d, log, last, cfg = run.d, run.log, run.last, config
    if run.fsdp:  # FSDP2: the model is sharded in place (attn_train.fsdp)
        from . import fsdp

        if ema is not None:
            raise ValueError("an EMA of the weights is not supported with --fsdp")
        ddp_model = fsdp.shard(model, optimizer, d, run.precision)
    else:
        ddp_model = wrap_ddp(model, d)
    scaler = make_scaler(d.device, run.precision)
    sampler = loader.sampler
    set_train = train_mode or (lambda m: m.train())
    progress = {"step": 0, "epoch": 0, "batches": 0, "skipped_images": 0, "best": None}
    progress["seed"] = run.seed
    if run.resume:
        resumed = load_checkpoint(
            last, d, model=model, optimizer=optimizer, scheduler=scheduler, scaler=scaler, ema=ema
        )
        progress.update(resumed)
        log.log({"event": "resume", "from": str(last), **progress})
    else:
        log.log(
            {
                "event": "start",
                **cfg.start,
                "params": sum(p.numel() for p in model.parameters()),
                "trainable": sum(p.numel() for p in model.parameters() if p.requires_grad),
                "samples": len(loader.dataset),  # type: ignore[arg-type]
                "global_batch": (loader.batch_size or 1) * cfg.accum * d.world_size,
                "steps": cfg.max_steps,
                "precision": run.precision,
                "world_size": d.world_size,
            }
        )

    def save(name: str) -> None:
        save_checkpoint(
            run.out / name,
            d,
            model=model,
            optimizer=optimizer,
            scheduler=scheduler,
            scaler=scaler,
            ema=ema,
            progress=progress,
            write_files=write_files,
        )

    def check(loss: torch.Tensor) -> None:
        step = progress["step"] + 1
        if cfg.debug_nan_at_step == step:
            loss = loss * float("nan")
        check_finite(loss, d, checkpoint=last, step=step, epoch=progress["epoch"], log=log)

    ctx = StepContext(model, ddp_model, d.device, run.precision, scaler, check)
    result: dict[str, Any] = {}

    def run_eval() -> None:
        better = False
        gather = run.fsdp and evaluate is not None  # every rank gathers, rank 0 evaluates
        with fsdp.gathered(model) if gather else contextlib.nullcontext():
            if evaluate is not None and d.is_main:
                with _keep_rng(d.device):  # evaluating never shifts the training randomness
                    metrics = evaluate()
                set_train(ddp_model)
                record = {"step": progress["step"], "epoch": progress["epoch"], **metrics}
                log.log({"event": cfg.eval_event, **record})
                result["eval"] = metrics
                if cfg.best_metric is not None:
                    value, best = metrics[cfg.best_metric], progress["best"]
                    better = best is None or value > best
                    progress["best"] = value if better else best
        if all_reduce_mean(float(better), d) > 0:  # rank 0 decides for everyone
            save("best")

    losses: list[float] = []
    bar = None
    if d.is_main and not cfg.quiet:
        from tqdm import tqdm

        total = progress["step"] + _updates_left(loader, cfg, progress)
        desc = f"epoch {progress['epoch']}"
        bar = tqdm(total=total, initial=progress["step"], desc=desc, unit="update", leave=False)
    warned = False
    try:
        while progress["step"] < cfg.max_steps and progress["epoch"] < cfg.epochs:
            epoch = progress["epoch"]
            sampler.set_epoch(epoch)  # type: ignore[union-attr]
            if hasattr(loader.dataset, "set_epoch"):  # seeded augmentation
                loader.dataset.set_epoch(epoch)
            sampler.skip(progress["batches"] * (loader.batch_size or 1))  # type: ignore[union-attr]
            set_train(ddp_model)
            if bar is not None:
                bar.set_description(f"epoch {epoch}")
            micro: list[Any] = []
            stopped = evaluated = False
            used = skipped = 0  # items of this pass trained on / unreadable (all ranks)
            for batch in loader:
                if progress["step"] >= cfg.max_steps:
                    stopped = True
                    break
                progress["batches"] += 1
                if isinstance(batch, Collated):  # unreadable images dropped
                    batch, dropped = _readable(batch, d)
                    progress["skipped_images"] += dropped
                    skipped += dropped
                if batch is not None:
                    used += _batch_size(batch) * d.world_size
                    micro.append(_to_device(batch, d.device))
                if progress["batches"] % cfg.accum or not micro:
                    continue
                loss = step_fn(micro, ctx)  # forward + check + backward
                micro = []
                if run.fsdp:
                    fsdp.sync_replicated_grads(model)
                scaler.unscale_(optimizer)
                if cfg.grad_clip:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad(set_to_none=True)
                scheduler.step()
                extra = after_update() if after_update is not None else None
                progress["step"] += 1
                step = progress["step"]
                if ema is not None:
                    ema.update(model, step=step)
                losses.append(all_reduce_mean(float(loss), d))
                if bar is not None:
                    bar.update(1)
                if step % cfg.log_every == 0 or step == 1:
                    lr = max(scheduler.get_last_lr())
                    record = {"step": step, "epoch": epoch, "loss": losses[-1], "lr": lr}
                    log.log({**record, **(extra or {})}, echo=bar is None)
                    if bar is not None:
                        bar.set_postfix(loss=f"{losses[-1]:.3f}")
                evaluated = bool(cfg.eval_every) and step % cfg.eval_every == 0
                if evaluated:
                    run_eval()
                if cfg.save_every and step % cfg.save_every == 0:
                    save("last")
            warned = _check_skipped(used, skipped, epoch, cfg, warned)
            if not stopped:  # a full epoch: the next one starts from its first batch
                progress["epoch"] += 1
                progress["batches"] = 0
            done = progress["step"] >= cfg.max_steps or progress["epoch"] >= cfg.epochs
            if not evaluated and (cfg.eval_each_epoch or done):
                run_eval()
            save("last")
    except (NonFiniteLossError, UnreadableDataError):
        cleanup_distributed()
        raise
    except KeyboardInterrupt:
        raise TrainingInterrupted(_resume_hint(run)) from None
    finally:
        if bar is not None:
            bar.close()
    if run.fsdp:  # the recipe's rank-0 code after fit() reads whole weights
        fsdp.pin_full_weights(model)
    if losses:
        k = max(1, min(5, len(losses) // 4))
        result.update(first_loss=sum(losses[:k]) / k, last_loss=sum(losses[-k:]) / k)
    result.update(step=progress["step"], skipped_images=progress["skipped_images"])
    result["out"] = str(run.out)
    return result
