"""Hostile test archives: TorchScript files that write a marker file when ``torch.jit.load``-ed.

The payload is a ``__setstate__`` -- TorchScript runs it while the archive loads -- that calls
``torch.from_file(marker, shared=True, size=8)``: a shared file mapping creates the file (8 zero
bytes). Its result is stored in an attribute so TorchScript keeps the call. Loaders must read
such an archive as tensors only (or refuse it), and the marker must never appear.

tests/conftest.py loads this file (pytest runs with ``--import-mode=importlib``) and offers
the ``torchscript_payload`` fixture.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import torch
from torch import nn

__all__ = ["make_torchscript_payload"]


class _PayloadModule(nn.Module):
    """A module whose own ``__setstate__`` writes the marker (the archive's root)."""

    def __init__(self, marker: str) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(4, 4))
        self.bias = nn.Parameter(torch.zeros(4))
        self.marker = marker
        self.mark = torch.zeros(8, dtype=torch.uint8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight.t() + self.bias

    @torch.jit.export
    def __getstate__(self) -> tuple[str, torch.Tensor, torch.Tensor, bool]:
        return (self.marker, self.weight, self.bias, self.training)

    @torch.jit.export
    def __setstate__(self, state: tuple[str, torch.Tensor, torch.Tensor, bool]) -> None:
        self.marker = state[0]
        self.weight = state[1]
        self.bias = state[2]
        self.training = state[3]
        self.mark = torch.from_file(self.marker, True, 8, dtype=torch.uint8)


class _Trigger:
    """A TorchScript class (not a module) whose ``__setstate__`` writes the marker."""

    def __init__(self, marker: str) -> None:
        self.marker = marker
        self.mark = torch.zeros(8, dtype=torch.uint8)

    def __getstate__(self) -> str:
        return self.marker

    def __setstate__(self, state: str) -> None:
        self.marker = state
        self.mark = torch.from_file(state, True, 8, dtype=torch.uint8)


class _HostModule(nn.Module):
    """A benign-looking module that carries a :class:`_Trigger` attribute."""

    def __init__(self, marker: str) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.trigger = _Trigger(marker)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x) + self.trigger.mark.float().sum()


def make_torchscript_payload(
    archive_path: str | os.PathLike, marker_path: str | os.PathLike, *, in_attribute: bool = False
) -> Path:
    """Write a TorchScript archive that creates ``marker_path`` when ``torch.jit.load``-ed.

    Default: the root module's ``__setstate__`` does it (a tensor-only reader must refuse the
    archive: that module's state can only be restored by its code). ``in_attribute=True``:
    a TorchScript-class attribute does it instead; the module tree itself is plain
    (``proj.weight``, ``proj.bias``), so a tensor-only reader can return those.
    """
    archive, marker = Path(archive_path), Path(marker_path)
    module = _HostModule(str(marker)) if in_attribute else _PayloadModule(str(marker))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch.jit.* is deprecated
        torch.jit.save(torch.jit.script(module), str(archive))
    assert not marker.exists(), "building the payload must not fire it"
    return archive
