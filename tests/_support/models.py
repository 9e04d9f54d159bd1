"""What the model tests share: building reference and our models for names and shapes only
(the meta device with every init a no-op) and memoizing builders, so a proof that needs
one model per configuration pays once per distinct tower."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

# in-place tensor methods that change more than values: kept even on the meta device
_NOT_INIT = frozenset({"requires_grad_", "resize_", "resize_as_", "set_", "share_memory_"})
# random factories: their values are never read on the meta device
_RANDOM = frozenset({torch.randn, torch.rand, torch.randn_like, torch.rand_like})


class _SkipInit(TorchFunctionMode):
    """Every in-place op on a meta tensor (``normal_``, ``trunc_normal_``'s ``clamp_``,
    ``nn.init.*``) returns its input; random factories become ``torch.empty``. On the meta
    device neither has a value to change, so names, shapes and dtypes are what a normal
    build gives, without the seconds timm's and torch's init decompositions cost there."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _RANDOM:
            kwargs.pop("generator", None)
            if func in (torch.randn_like, torch.rand_like):
                return torch.empty_like(*args, **kwargs)
            return torch.empty(*args, **kwargs)
        name = getattr(func, "__name__", "")
        if name.endswith("_") and not name.startswith("_") and name not in _NOT_INIT:
            tensor = args[0] if args else kwargs.get("tensor")
            if isinstance(tensor, torch.Tensor) and tensor.is_meta:
                return tensor
        return func(*args, **kwargs)


@contextlib.contextmanager
def meta_build() -> Iterator[None]:
    """Build modules on the meta device with no initialisation: for names and shapes."""
    with torch.device("meta"), _SkipInit():
        yield


def shapes(module_or_state: torch.nn.Module | dict[str, torch.Tensor]) -> dict[str, tuple]:
    """``{name: shape}`` of a module's state dict (or of a state dict)."""
    sd = module_or_state
    if isinstance(sd, torch.nn.Module):
        sd = sd.state_dict()
    return {k: tuple(v.shape) for k, v in sd.items()}


def memoized(build: Callable[..., Any]) -> Callable[..., Any]:
    """``build`` called once per distinct ``repr`` of its arguments (configs are dicts and
    dataclasses); later calls return the same object. For modules built on the meta device
    whose state dicts are only read."""
    cache: dict[str, Any] = {}

    @functools.wraps(build)
    def cached(*args: Any, **kwargs: Any) -> Any:
        key = repr((args, sorted(kwargs.items())))
        if key not in cache:
            cache[key] = build(*args, **kwargs)
        return cache[key]

    cached.cache = cache  # type: ignore[attr-defined]
    return cached
