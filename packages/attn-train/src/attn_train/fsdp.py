"""``--fsdp``: PyTorch FSDP2 (``fully_shard``) inside :func:`attn_train.fit`, under torchrun.

* :func:`shard`: ``fully_shard`` per transformer block, then the root; each rank keeps 1/N of
  the weights, gradients and AdamW state. Activation checkpointing via the model's
  ``set_grad_checkpointing``; ``--precision bf16`` gathers bf16 weights and reduces fp32
  gradients (``MixedPrecisionPolicy``; the sharded master weights stay fp32). FSDP2 cannot
  shard 0-d parameters (CLIP's ``logit_scale``, pytorch/pytorch#130810): they stay whole and
  :func:`sync_replicated_grads` averages their gradients, as DDP does.
* :func:`gathered`: every block all-gathered, so that rank 0 alone can evaluate.
* :func:`pin_full_weights` / :func:`full_weights`: the whole fp32 weights on rank 0's CPU,
  returned there by ``model.state_dict()``, so the rank-0 code writing model files (config +
  ``model.safetensors``, ``final/``) is unchanged and writes whole weights.
* :func:`save_sharded` / :func:`load_sharded`: model + optimizer with
  ``torch.distributed.checkpoint``, one file per rank. DCP unpickles ``.metadata`` with plain
  ``pickle`` (pytorch/pytorch#189308) and its other items with ``weights_only=False``: both
  are checked first here, so a hostile file is refused.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import pickle
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from attn_core.blocks import TransformerBlock
from attn_core.fast_inference import release_packed_weights
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from .distributed import Distributed

__all__ = ["full_weights", "gathered", "load_sharded", "pin_full_weights", "save_sharded", "shard"]
__all__ += ["sync_replicated_grads"]


def shard(
    model: nn.Module, optimizer: torch.optim.Optimizer, d: Distributed, precision: str
) -> nn.Module:
    """Shard ``model`` in place over the process group and point ``optimizer`` (built on the
    whole parameters, not yet stepped) at the sharded ones. Returns ``model``."""
    if optimizer.state:
        raise ValueError("--fsdp: the optimizer must not have stepped before fit()")
    names = {id(p): name for name, p in model.named_parameters()}
    whole = {p for p in model.parameters() if p.dim() == 0}  # FSDP2 cannot shard scalars
    dtype = torch.bfloat16 if precision == "bf16" else None  # fp16: refused by the CLI
    kw: dict[str, Any] = dict(
        mesh=init_device_mesh(d.device.type, (d.world_size,)),
        mp_policy=MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32),
        ignored_params=whole,
    )
    with torch.no_grad():  # as DDP does: every rank starts from rank 0's weights, buffers
        for t in [*model.parameters(), *model.buffers()]:
            dist.broadcast(t, src=0)
    if hasattr(model, "set_grad_checkpointing"):
        model.set_grad_checkpointing(True)  # the model's blocks call torch's checkpoint()
    for block in [m for m in model.modules() if isinstance(m, TransformerBlock)]:
        fully_shard(block, **kw)
    fully_shard(model, **kw)  # the rest (embeddings, norms, heads) as one group
    params = dict(model.named_parameters())  # fully_shard made new (DTensor) parameters
    for group in optimizer.param_groups:
        group["params"] = [params.get(names.get(id(p), ""), p) for p in group["params"]]
    # CLIP returns logits.T, a view; we never write into outputs in place
    warnings.filterwarnings("ignore", "FSDP2-wrapped module .* returned a view tensor")
    return model


def sync_replicated_grads(model: nn.Module) -> None:
    """Average the gradients of the parameters left whole (the scalars) over the ranks;
    call after the backward passes of an update, before clipping."""
    grads = [
        p.grad for p in model.parameters() if not isinstance(p, DTensor) and p.grad is not None
    ]
    if grads:
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat)  # a sum: gloo has no AVG
        for g, v in zip(grads, flat.split([g.numel() for g in grads]), strict=True):
            g.copy_(v.view_as(g) / dist.get_world_size())


@contextlib.contextmanager
def gathered(model: nn.Module) -> Iterator[None]:
    """Every rank: all-gather every block and keep it gathered inside, so that rank 0 alone
    can run forwards (evaluation: no collective is left to wait for the other ranks)."""
    modules = [m for m in model.modules() if isinstance(m, FSDPModule)]
    for m in modules:
        m.set_reshard_after_forward(False, recurse=False)
        m.unshard()
    release_packed_weights(model)  # the fast path's cache cannot see FSDP's writes
    try:
        yield
    finally:
        release_packed_weights(model)
        for m in modules:  # FSDP's defaults: blocks free their gathered weights, the root not
            m.set_reshard_after_forward(m is not model, recurse=False)
            m.reshard()


def pin_full_weights(model: nn.Module) -> None:
    """Every rank: gather the whole fp32 weights to rank 0's CPU; from now on
    ``model.state_dict()`` returns them on rank 0 (what ``fit`` leaves a recipe with)."""
    model.__dict__.pop("state_dict", None)  # gather from the sharded parameters
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    full = get_model_state_dict(model, options=options)  # {} on the other ranks
    # a weight gathered from uneven shards can be a view into a padded buffer: copy those
    full = {
        k: v if v.untyped_storage().nbytes() == v.nbytes else v.clone() for k, v in full.items()
    }
    if full:
        model.state_dict = lambda *args, **kwargs: dict(full)  # type: ignore[method-assign]


@contextlib.contextmanager
def full_weights(model: nn.Module) -> Iterator[None]:
    """:func:`pin_full_weights` for the duration of the block (writing a checkpoint)."""
    pin_full_weights(model)
    try:
        yield
    finally:
        model.__dict__.pop("state_dict", None)


def save_sharded(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Every rank writes its shards of the weights and optimizer state into ``path``."""
    model_state, optim_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optimizer": optim_state}, checkpoint_id=path)


def load_sharded(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Every rank reads its shards back from ``path``; any failure (on any rank) raises
    ``RuntimeError`` on every rank, naming the first cause."""
    from torch.distributed.checkpoint.api import CheckpointException

    model_state, optim_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optimizer": optim_state}
    try:
        with open(path / ".metadata", "rb") as f:
            _MetadataUnpickler(f).load()  # refuses what DCP's pickle.load would run
        dcp.load(state, checkpoint_id=path, planner=_WeightsOnlyPlanner())
    except CheckpointException as e:  # a BaseException: carries every rank's failure
        rank, (cause, _) = min(e.failures.items(), key=lambda f: (not str(f[1][0]), f[0]))
        raise RuntimeError(f"rank {rank}: {type(cause).__name__}: {cause}") from None
    set_state_dict(
        model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"]
    )


# -- reading DCP files without running their code -------------------------------------

_METADATA = "torch.distributed.checkpoint.metadata"
_MODULES = (_METADATA, "torch.distributed.checkpoint.filesystem", "torch.serialization")
_MODULES += ("torch", "pathlib", "pathlib._local")


class _MetadataUnpickler(pickle.Unpickler):
    """DCP's ``.metadata`` names only its own record classes, torch sizes / dtypes / layouts
    and the checkpoint's path; any other global is refused (before importing anything)."""

    def find_class(self, module: str, name: str) -> Any:
        value = getattr(importlib.import_module(module), name, None) if module in _MODULES else None
        allowed = (
            (module == _METADATA and getattr(value, "__module__", None) == _METADATA)
            or (module, name) == ("torch.distributed.checkpoint.filesystem", "_StorageInfo")
            or (module, name) == ("torch.serialization", "_get_layout")
            or (module == "torch" and (name == "Size" or isinstance(value, torch.dtype)))
            or (module.startswith("pathlib") and value is not None and name.endswith("Path"))
        )
        if not allowed:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name} from a checkpoint")
        return value


class _WeightsOnlyPlanner(dcp.DefaultLoadPlanner):
    """DCP's planner, but non-tensor items (optimizer hyper-parameters) are loaded only
    if ``torch.load(weights_only=True)`` accepts them."""

    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        torch.load(value, weights_only=True)
        value.seek(0)
        super().load_bytes(read_item, value)
