"""Atomic checkpoint directories and exact resume.

A checkpoint is a directory (``OUT/last``, ``OUT/best``)::

    model.safetensors    the weights (or whatever ``write_files`` saved: config.json, tokenizer...)
    ema.safetensors      the EMA weights, when training keeps an EMA
    trainer_state.pt     progress (step, epoch, batches seen ...), optimizer, scheduler,
                         scaler and every rank's RNG state (read with ``weights_only=True``)
    dcp/                 under --fsdp: the weights and optimizer state, one file per rank
                         (torch.distributed.checkpoint), resumed from; model.safetensors
                         still holds the whole weights (gathered to rank 0)

It is assembled as ``NAME.tmp`` and swapped in with ``os.replace`` (the previous one is
parked as ``NAME.old`` for the instant of the swap), so a crash -- even ``kill -9`` while
writing -- never leaves a half-written ``NAME``. Loading restores every piece, so a resumed
run continues bit for bit: the sampler position comes from ``progress["batches"]``.
A checkpoint that cannot be resumed from (a truncated or corrupt file, or one that does not
fit the model) raises :class:`ResumeError`: one line naming the file and how to start over.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import nn

from .distributed import Distributed, barrier, seed_everything, unwrap

__all__ = [
    "ResumeError",
    "find_checkpoint",
    "load_checkpoint",
    "read_checkpoint_file",
    "read_progress",
    "save_checkpoint",
]

MODEL, EMA, STATE = "model.safetensors", "ema.safetensors", "trainer_state.pt"
SHARDS = "dcp"  # --fsdp
T = TypeVar("T")


class ResumeError(ValueError):
    """A checkpoint cannot be resumed from: a truncated / corrupt file, or another model's."""


def _resume_error(path: Path, e: Exception, *, fits: bool = False) -> ResumeError:
    detail = " ".join(str(e).split())
    detail = f"{type(e).__name__}: {detail[:300]}" if detail else type(e).__name__
    if fits:
        why = f"does not fit this run ({detail}); were the model options changed?"
    else:
        why = f"is truncated or corrupt ({detail})."
    return ResumeError(
        f"cannot resume: {path} {why} Start fresh with --no-resume, or remove {path.parent}"
    )


def read_checkpoint_file(path: str | Path, read: Callable[[Path], T]) -> T:
    """``read(path)`` for a file of a checkpoint being resumed (a tokenizer, a config): any
    failure becomes a one-line :class:`ResumeError` that names the file."""
    path = Path(path)
    try:
        return read(path)
    except Exception as e:
        raise _resume_error(path, e) from None


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


def _fsdp(model: nn.Module) -> Any:
    """:mod:`attn_train.fsdp` if ``model`` was sharded by it, else None (never imports it)."""
    fsdp = sys.modules.get(f"{__package__}.fsdp")
    return fsdp if fsdp is not None and isinstance(model, fsdp.FSDPModule) else None


def _ema_generator(ema: nn.Module | None) -> torch.Generator | None:
    """timm's ``ModelEmaV3`` rounds bf16 EMA tensors stochastically with a private RNG."""
    return getattr(ema, "_sr_generator", None)


def save_checkpoint(
    directory: str | Path,
    d: Distributed,
    *,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any = None,
    scaler: torch.amp.GradScaler | None = None,
    ema: nn.Module | None = None,
    progress: dict[str, Any],
    write_files: Callable[[Path], None] | None = None,
) -> Path | None:
    """Write a checkpoint directory atomically (called on every rank; rank 0 writes).

    ``progress`` holds plain numbers. ``write_files(tmp_dir)`` adds e.g. ``config.json``
    and the tokenizer (or saves the model with its package's ``save_pretrained``), so the
    checkpoint is also a loadable model folder; ``model.safetensors`` is written here
    unless it did. ``ema``: an EMA wrapper with the averaged model in ``ema.module``
    (timm's ``ModelEmaV3``).
    """
    from safetensors.torch import save_model

    rngs: list[Any] = [None] * d.world_size
    if d.enabled:
        dist.all_gather_object(rngs, _rng_state())
    else:
        rngs = [_rng_state()]
    directory = Path(directory)
    tmp = directory.with_name(directory.name + ".tmp")
    old = directory.with_name(directory.name + ".old")
    if d.is_main:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    fsdp = _fsdp(model)
    if fsdp is not None:  # every rank writes its shards; then rank 0 gets whole weights
        barrier(d)
        fsdp.save_sharded(tmp / SHARDS, model, optimizer)
    with fsdp.full_weights(model) if fsdp is not None else contextlib.nullcontext():
        if d.is_main:
            if write_files is not None:
                write_files(tmp)
            if not (tmp / MODEL).is_file():
                save_model(unwrap(model), str(tmp / MODEL))
            if ema is not None:
                save_model(ema.module, str(tmp / EMA))
            gen = _ema_generator(ema)
            state = {
                "progress": dict(progress),
                "optimizer": optimizer.state_dict() if fsdp is None else None,  # else in dcp/
                "scheduler": scheduler.state_dict() if scheduler is not None else None,
                "scaler": scaler.state_dict() if scaler is not None else None,
                "ema_rng": gen.get_state() if gen is not None else None,
                "rng": rngs,
                "sharded": fsdp is not None,
            }
            torch.save(state, tmp / STATE)
            if directory.exists():
                shutil.rmtree(old, ignore_errors=True)
                os.replace(directory, old)
            os.replace(tmp, directory)
            shutil.rmtree(old, ignore_errors=True)
    barrier(d)
    return directory if d.is_main else None


def _read_state(path: Path) -> dict[str, Any]:
    state = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(state, dict) or not {"progress", "optimizer", "rng"} <= state.keys():
        raise ValueError("not a trainer state")
    return state


def _load_weights(model: nn.Module, path: Path, d: Distributed) -> None:
    """safetensors' ``load_model``; a :class:`ResumeError` if the file is unreadable or does
    not fit ``model``."""
    from safetensors.torch import load_model

    try:
        load_model(model, str(path), device=str(d.device))
    except Exception as e:  # SafetensorError: truncated / corrupt; RuntimeError: other model
        raise _resume_error(path, e, fits=type(e).__name__ != "SafetensorError") from None


def find_checkpoint(directory: str | Path) -> Path | None:
    """``directory`` if it holds a complete checkpoint (or the ``.old`` copy of a swap)."""
    directory = Path(directory)
    for candidate in (directory, directory.with_name(directory.name + ".old")):
        if (candidate / STATE).is_file() and (candidate / MODEL).is_file():
            return candidate
    return None


def read_progress(directory: str | Path) -> dict[str, Any] | None:
    """The ``progress`` record of the checkpoint in ``directory`` (None if there is none)."""
    found = find_checkpoint(directory)
    if found is None:
        return None
    return torch.load(found / STATE, map_location="cpu", weights_only=True)["progress"]


def load_checkpoint(
    directory: str | Path,
    d: Distributed,
    *,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any = None,
    scaler: torch.amp.GradScaler | None = None,
    ema: nn.Module | None = None,
) -> dict[str, Any]:
    """Restore everything :func:`save_checkpoint` wrote; returns ``progress``.

    With another number of processes than the run that saved, training continues but
    not bit-exactly (the RNGs are reseeded).
    """
    found = find_checkpoint(directory)
    if found is None:
        raise FileNotFoundError(f"no checkpoint in {directory}")
    fsdp = _fsdp(model)
    if fsdp is None:
        _load_weights(unwrap(model), found / MODEL, d)
    state = read_checkpoint_file(found / STATE, _read_state)
    if bool(state.get("sharded")) != (fsdp is not None):
        was, run = ("with", "add") if state.get("sharded") else ("without", "leave out")
        raise ResumeError(
            f"cannot resume: {found} was written {was} --fsdp ({run} --fsdp to resume from "
            f"it). Start fresh with --no-resume, or remove {found}"
        )
    if fsdp is not None:
        try:
            fsdp.load_sharded(found / SHARDS, model, optimizer)
        except Exception as e:
            fits = any(w in str(e).lower() for w in ("missing key", "mismatch", "unexpected"))
            raise _resume_error(found / SHARDS, e, fits=fits) from None
    try:
        if optimizer is not None and fsdp is None:
            optimizer.load_state_dict(state["optimizer"])
        if scheduler is not None and state["scheduler"] is not None:
            scheduler.load_state_dict(state["scheduler"])
        if scaler is not None and state["scaler"] is not None:
            scaler.load_state_dict(state["scaler"])
    except (ValueError, KeyError, RuntimeError) as e:
        raise _resume_error(found / STATE, e, fits=True) from None
    if ema is not None:
        if not (found / EMA).is_file():
            raise FileNotFoundError(
                f"cannot resume: {found} has no {EMA} (was the run started without EMA?). "
                f"Start fresh with --no-resume, or remove {found}"
            )
        _load_weights(ema.module, found / EMA, d)
        gen = _ema_generator(ema)
        if gen is not None and state.get("ema_rng") is not None:
            gen.set_state(state["ema_rng"])
    rngs = state["rng"]
    if len(rngs) == d.world_size:
        _set_rng_state(rngs[d.rank])
    else:
        seed_everything(int(state["progress"].get("seed", 0)) + len(rngs), d.rank)
    return state["progress"]
