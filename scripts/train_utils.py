"""Shared helpers for the training scripts (translation, char LM, classifier, CLIP, ViT ...).

Each piece is a plain function or a tiny class, usable on its own:

* :func:`start_run` -- what every script does first: process group, seeds, precision, log,
  and whether ``OUT/last`` is there to resume from.
* :func:`setup_distributed` -- one process, or ``torchrun`` DDP (gloo on CPU, nccl on GPU);
  :func:`wrap_ddp`, :func:`unwrap`, :func:`maybe_no_sync` (gradient accumulation).
* :func:`make_loader` -- a ``DataLoader`` over a :class:`ResumableSampler` (sharded per rank,
  reshuffled per epoch from the seed, able to skip the batches already seen).
* :func:`autocast` / :func:`make_scaler` -- bf16 / fp16 mixed precision (``"auto"``: bf16 on
  a GPU that has it, else fp32).
* :func:`save_checkpoint` / :func:`load_checkpoint` -- atomic checkpoint directories: model
  weights as ``model.safetensors``; optimizer, scheduler, scaler, step and every rank's RNG
  state in ``trainer_state.pt`` (read back with ``weights_only=True``). Resuming continues
  bit for bit where the run stopped.
* :class:`RunLogger` -- JSONL log plus console lines, main process only.
* :func:`check_finite` -- stop every rank with :class:`NonFiniteLossError` (a clear message
  naming the last good checkpoint) when the loss is NaN / inf, before anything is saved.
* :func:`inverse_sqrt_schedule`, :func:`cosine_schedule` -- LR multipliers for ``LambdaLR``.

Import from a script with ``sys.path.insert(0, str(Path(__file__).parent))``.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset, DistributedSampler

__all__ = [
    "Distributed",
    "NonFiniteLossError",
    "ResumableSampler",
    "Run",
    "RunLogger",
    "all_reduce_min",
    "all_reduce_sum",
    "autocast",
    "check_finite",
    "cleanup_distributed",
    "cosine_schedule",
    "inverse_sqrt_schedule",
    "load_checkpoint",
    "make_loader",
    "make_scaler",
    "maybe_no_sync",
    "resolve_precision",
    "save_checkpoint",
    "start_run",
    "seed_everything",
    "setup_distributed",
    "unwrap",
    "wrap_ddp",
]

# -- processes ---------------------------------------------------------------------------


@dataclass
class Distributed:
    """Where this process sits: ``rank`` of ``world_size``, and its device."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def setup_distributed(device: str | None = None, threads: int | None = None) -> Distributed:
    """Join the ``torchrun`` process group if launched by it, else run as one process.

    ``device`` ``None`` picks ``cuda:LOCAL_RANK`` when CUDA is available, else CPU.
    ``threads`` sets torch's intra-op CPU threads (1 is fastest for small models on a
    busy machine).
    """
    if threads:
        torch.set_num_threads(threads)
    want_cuda = torch.cuda.is_available() if device is None else device.startswith("cuda")
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        if want_cuda:
            torch.cuda.set_device(local_rank)
        if not dist.is_initialized():
            dist.init_process_group("nccl" if want_cuda else "gloo")
        dev = torch.device(f"cuda:{local_rank}" if want_cuda else "cpu")
        return Distributed(dist.get_rank(), dist.get_world_size(), local_rank, dev)
    return Distributed(device=torch.device(device or ("cuda" if want_cuda else "cpu")))


def cleanup_distributed() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def barrier(d: Distributed) -> None:
    if d.enabled:
        dist.barrier()


def all_reduce_mean(value: float, d: Distributed) -> float:
    """Mean of a Python number over all ranks (the number itself in one process)."""
    if not d.enabled:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=d.device)
    dist.all_reduce(t)
    return t.item() / d.world_size


def all_reduce_sum(value: float, d: Distributed) -> float:
    """Sum of a Python number over all ranks."""
    return all_reduce_mean(value, d) * d.world_size


def all_reduce_min(value: int, d: Distributed) -> int:
    """Smallest of an integer over all ranks (e.g. to trim batches to a common size)."""
    if not d.enabled:
        return value
    t = torch.tensor([value], dtype=torch.long, device=d.device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return int(t.item())


def wrap_ddp(model: nn.Module, d: Distributed) -> nn.Module:
    """``DistributedDataParallel`` under torchrun, the model itself otherwise."""
    if not d.enabled:
        return model
    ids = [d.local_rank] if d.device.type == "cuda" else None
    return nn.parallel.DistributedDataParallel(model, device_ids=ids)


def unwrap(model: nn.Module) -> nn.Module:
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model


def maybe_no_sync(model: nn.Module, sync: bool) -> contextlib.AbstractContextManager:
    """Skip the DDP gradient all-reduce on accumulation micro-steps (``sync=False``)."""
    if not sync and isinstance(model, nn.parallel.DistributedDataParallel):
        return model.no_sync()
    return contextlib.nullcontext()


def seed_everything(seed: int, rank: int = 0) -> None:
    """Seed Python and torch (CPU and CUDA); each rank gets ``seed + rank``."""
    random.seed(seed + rank)
    torch.manual_seed(seed + rank)


# -- data --------------------------------------------------------------------------------


class ResumableSampler(DistributedSampler):
    """A ``DistributedSampler`` (also for one process) that can skip a prefix.

    ``set_epoch(e)`` reshuffles from ``seed + e``; ``skip(n)`` drops this rank's first
    ``n`` indices of the current epoch, which is how a resumed run continues mid-epoch.
    """

    def __init__(self, dataset: Dataset, d: Distributed, *, shuffle: bool, seed: int) -> None:
        super().__init__(dataset, d.world_size, d.rank, shuffle=shuffle, seed=seed)
        self._skip = 0

    def skip(self, n: int) -> None:
        self._skip = n

    def set_epoch(self, epoch: int) -> None:
        super().set_epoch(epoch)
        self._skip = 0

    def __iter__(self) -> Iterator[int]:
        return iter(list(super().__iter__())[self._skip :])

    def __len__(self) -> int:
        return max(0, super().__len__() - self._skip)


def make_loader(
    dataset: Dataset,
    batch_size: int,
    d: Distributed,
    *,
    shuffle: bool = True,
    seed: int = 0,
    collate_fn: Callable | None = None,
    num_workers: int = 0,
) -> tuple[DataLoader, ResumableSampler]:
    """A loader whose order depends only on ``(seed, epoch)`` -- never on the global RNG."""
    sampler = ResumableSampler(dataset, d, shuffle=shuffle, seed=seed)
    loader = DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        collate_fn=collate_fn,
        num_workers=num_workers,
        generator=torch.Generator().manual_seed(seed),  # keeps the global RNG untouched
        pin_memory=d.device.type == "cuda",
    )
    return loader, sampler


# -- mixed precision ---------------------------------------------------------------------


def resolve_precision(precision: str, device: torch.device) -> str:
    """``"auto"`` -> ``"bf16"`` on a GPU that supports it, else ``"fp32"``."""
    if precision not in ("auto", "fp32", "bf16", "fp16"):
        raise ValueError(f"precision must be auto, fp32, bf16 or fp16, got {precision!r}")
    if precision == "auto":
        cuda_bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported()
        return "bf16" if cuda_bf16 else "fp32"
    return precision


def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    """``torch.autocast`` for bf16 / fp16; a no-op for fp32."""
    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device_type=device.type, dtype=dtype)


def make_scaler(device: torch.device, precision: str) -> torch.amp.GradScaler:
    """A loss scaler, enabled only for fp16."""
    return torch.amp.GradScaler(device.type, enabled=precision == "fp16")


# -- learning-rate schedules (multipliers for LambdaLR) ------------------------------------


def inverse_sqrt_schedule(warmup: int) -> Callable[[int], float]:
    """Linear warm-up to 1 over ``warmup`` steps, then ``sqrt(warmup / step)`` (Vaswani)."""
    warmup = max(1, warmup)
    return lambda step: min((step + 1) / warmup, math.sqrt(warmup / (step + 1)))


def cosine_schedule(warmup: int, total: int, floor: float = 0.0) -> Callable[[int], float]:
    """Linear warm-up, then cosine decay to ``floor`` at ``total`` steps."""

    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / max(1, warmup)
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))

    return f


# -- checkpoints -------------------------------------------------------------------------


def _rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(
    directory: str | Path,
    d: Distributed,
    *,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any = None,
    scaler: torch.amp.GradScaler | None = None,
    progress: dict[str, Any],
    write_files: Callable[[Path], None] | None = None,
) -> Path | None:
    """Write a checkpoint directory atomically (called on every rank; rank 0 writes).

    ``progress`` holds plain numbers (step, epoch, batches seen, best metric ...).
    ``write_files(tmp_dir)`` adds e.g. ``config.json`` and the tokenizer (or saves the model
    with its package's ``save_pretrained``), so the checkpoint is also a loadable model
    directory; ``model.safetensors`` is written here unless it did. The directory is
    assembled as ``NAME.tmp`` and then swapped in with ``os.replace``; a crash never leaves a
    half-written ``NAME``.
    """
    rngs = [None] * d.world_size
    if d.enabled:
        dist.all_gather_object(rngs, _rng_state())
    else:
        rngs = [_rng_state()]
    directory = Path(directory)
    if d.is_main:
        from safetensors.torch import save_model

        tmp, old = (
            directory.with_name(directory.name + ".tmp"),
            directory.with_name(directory.name + ".old"),
        )
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        if write_files is not None:  # config, tokenizer; may save the model itself
            write_files(tmp)
        if not (tmp / "model.safetensors").is_file():
            save_model(unwrap(model), str(tmp / "model.safetensors"))
        state = {
            "progress": dict(progress),
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict() if scheduler is not None else None,
            "scaler": scaler.state_dict() if scaler is not None else None,
            "rng": rngs,
        }
        torch.save(state, tmp / "trainer_state.pt")
        if directory.exists():
            shutil.rmtree(old, ignore_errors=True)
            os.replace(directory, old)
        os.replace(tmp, directory)
        shutil.rmtree(old, ignore_errors=True)
    barrier(d)
    return directory if d.is_main else None


def find_checkpoint(directory: str | Path) -> Path | None:
    """``directory`` if it holds a complete checkpoint (or the ``.old`` copy of a swap)."""
    directory = Path(directory)
    for candidate in (directory, directory.with_name(directory.name + ".old")):
        if (candidate / "trainer_state.pt").is_file() and (
            candidate / "model.safetensors"
        ).is_file():
            return candidate
    return None


def load_checkpoint(
    directory: str | Path,
    d: Distributed,
    *,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any = None,
    scaler: torch.amp.GradScaler | None = None,
) -> dict[str, Any]:
    """Restore everything :func:`save_checkpoint` wrote; returns ``progress``."""
    from safetensors.torch import load_model

    found = find_checkpoint(directory)
    if found is None:
        raise FileNotFoundError(f"no checkpoint in {directory}")
    load_model(unwrap(model), str(found / "model.safetensors"), device=str(d.device))
    state = torch.load(found / "trainer_state.pt", map_location="cpu", weights_only=True)
    if optimizer is not None:
        optimizer.load_state_dict(state["optimizer"])
    if scheduler is not None and state["scheduler"] is not None:
        scheduler.load_state_dict(state["scheduler"])
    if scaler is not None and state["scaler"] is not None:
        scaler.load_state_dict(state["scaler"])
    rngs = state["rng"]
    if len(rngs) == d.world_size:
        _set_rng_state(rngs[d.rank])
    else:  # a different number of processes: continue, but not bit-exactly
        seed_everything(int(state["progress"].get("seed", 0)) + len(rngs), d.rank)
    return state["progress"]


class NonFiniteLossError(RuntimeError):
    """The loss became NaN / inf; the run stopped without saving anything."""


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

    Call it before ``backward()`` / ``optimizer.step()``, so the weights and the checkpoint
    at ``checkpoint`` (the last good one) stay untouched. ``step`` is the update that failed.
    """
    value = float(loss.detach().float().item() if isinstance(loss, torch.Tensor) else loss)
    if all_reduce_mean(float(not math.isfinite(value)), d) == 0:
        return
    found = find_checkpoint(checkpoint)
    if found is None:
        good = "no checkpoint had been written yet"
    else:
        state = torch.load(found / "trainer_state.pt", map_location="cpu", weights_only=True)
        good = f"the last good checkpoint is {found} (step {state['progress']['step']})"
    message = (
        f"loss is {value if not math.isfinite(value) else 'not finite on another rank'} at "
        f"update {step} (epoch {epoch}); stopped without saving: {good}. Lower --lr, add "
        "--grad-clip, use --precision fp32, or check the data."
    )
    if log is not None:
        log.log({"event": "nonfinite_loss", "step": step, "message": message}, echo=False)
    raise NonFiniteLossError(message)


# -- logging -----------------------------------------------------------------------------


class RunLogger:
    """Append JSON records to ``path`` and print a short line; silent on ranks > 0."""

    def __init__(self, path: str | Path | None, d: Distributed, *, echo: bool = True) -> None:
        self.enabled = d.is_main
        self.echo = echo
        self.path = Path(path) if path is not None else None
        self.start = time.time()
        if self.enabled and self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)

    def log(self, record: dict[str, Any], echo: bool | None = None) -> None:
        if not self.enabled:
            return
        record = {"time": round(time.time() - self.start, 3), **record}
        if self.path is not None:
            with self.path.open("a", encoding="utf-8") as f:
                f.write(json.dumps(record, ensure_ascii=False) + "\n")
        if self.echo if echo is None else echo:
            text = " ".join(f"{k}={_fmt(v)}" for k, v in record.items())
            try:
                from tqdm import tqdm

                tqdm.write(text, file=sys.stdout)
            except ImportError:
                print(text, flush=True)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


# -- the start of a run --------------------------------------------------------------------


class Run(NamedTuple):
    d: Distributed
    precision: str  # "fp32" / "bf16" / "fp16" ("auto" resolved for the device)
    log: RunLogger  # OUT/log.jsonl
    last: Path  # OUT/last: the checkpoint directory resumed from and written to
    resume: bool  # OUT/last holds a complete checkpoint and --no-resume was not given


def start_run(args: Any) -> Run:
    """Set up a run from the flags every script shares (``--device --threads --seed
    --precision --out --no-resume``): join the process group, seed every RNG, resolve the
    precision, open the JSONL log, and look for a checkpoint to resume."""
    d = setup_distributed(args.device, args.threads)
    seed_everything(args.seed, d.rank)
    precision = resolve_precision(args.precision, d.device)
    log = RunLogger(args.out / "log.jsonl", d)
    last = args.out / "last"
    resume = not args.no_resume and find_checkpoint(last) is not None
    return Run(d, precision, log, last, resume)
