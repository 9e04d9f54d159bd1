"""One process, or ``torchrun`` DDP (gloo on CPU, nccl on GPU), and the few collectives the
loop needs.

* :func:`setup_distributed` joins the process group when ``torchrun`` started us and
  returns a :class:`Distributed` (rank, world size, device); :func:`cleanup_distributed`
  leaves it.
* :func:`wrap_ddp` / :func:`unwrap` / :func:`maybe_no_sync` (no gradient all-reduce on
  accumulation micro-steps).
* :func:`all_reduce_mean` / :func:`all_reduce_sum` / :func:`all_reduce_min` on Python
  numbers; :func:`barrier`; :func:`seed_everything` (``seed + rank``).
"""

from __future__ import annotations

import contextlib
import os
import random
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

__all__ = [
    "Distributed",
    "all_reduce_mean",
    "all_reduce_min",
    "all_reduce_sum",
    "barrier",
    "check_device",
    "cleanup_distributed",
    "maybe_no_sync",
    "seed_everything",
    "setup_distributed",
    "unwrap",
    "wrap_ddp",
]


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

    ``device`` None picks ``cuda:LOCAL_RANK`` when CUDA is available, else CPU; a device
    this machine lacks is a ``ValueError``. ``threads`` sets torch's intra-op CPU threads
    (1 is fastest for small models on a busy machine).
    """
    if device is not None:
        check_device(device)
    if threads:
        torch.set_num_threads(threads)
    want_cuda = torch.cuda.is_available() if device is None else device.startswith("cuda")
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        if want_cuda:
            check_device(f"cuda:{local_rank}")  # one GPU per process
            torch.cuda.set_device(local_rank)
        if not dist.is_initialized():
            dist.init_process_group("nccl" if want_cuda else "gloo")
        dev = torch.device(f"cuda:{local_rank}" if want_cuda else "cpu")
        return Distributed(dist.get_rank(), dist.get_world_size(), local_rank, dev)
    return Distributed(device=torch.device(device or ("cuda" if want_cuda else "cpu")))


def check_device(name: str) -> torch.device:
    """``torch.device(name)``, or a ``ValueError`` (in ``--device`` words) when it is not a
    device name or this machine does not have it."""
    try:
        device = torch.device(name)
    except RuntimeError as e:
        raise ValueError(f"--device {name!r} is not a device name ({e})") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"--device {name}: CUDA is not available on this machine")
        if (device.index or 0) >= torch.cuda.device_count():
            raise ValueError(f"--device {name}: only {torch.cuda.device_count()} GPU(s) here")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"--device {name}: MPS is not available on this machine")
    return device


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
    """Skip the DDP gradient all-reduce of the backward of a forward run in this context
    (``sync=False``: an accumulation micro-step). DDP decides at forward time."""
    if not sync and isinstance(model, nn.parallel.DistributedDataParallel):
        return model.no_sync()
    return contextlib.nullcontext()


def seed_everything(seed: int, rank: int = 0) -> None:
    """Seed Python and torch (CPU and CUDA); each rank gets ``seed + rank``."""
    random.seed(seed + rank)
    torch.manual_seed(seed + rank)
