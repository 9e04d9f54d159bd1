"""How an update runs: the approximate-index options, and the torchrun rank it runs on.

Light (no torch, no faiss imported here): the retrieval app imports it at start.
"""

from __future__ import annotations

import importlib.util
import os
import re
from collections.abc import Callable
from dataclasses import dataclass

from .errors import AnnError

__all__ = ["ANN_THRESHOLD", "AnnOptions", "parse_size", "rank_device", "torchrun_rank"]

ANN_THRESHOLD = 100_000  # mode "auto": an approximate index from this many images on


def torchrun_rank() -> int | None:
    """This process's rank when ``torchrun`` started it, else None."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return int(os.environ["RANK"])
    return None


def rank_device() -> str | None:
    """This rank's GPU (``cuda:LOCAL_RANK``) when there are GPUs, else None (the default)."""
    import torch

    if torch.cuda.is_available():
        return f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}"
    return None


def parse_size(text: str) -> int:
    """``"256MB"`` / ``"1.5GiB"`` / ``"300000000"`` -> bytes (ValueError if not a size)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kmgt]?i?b?)\s*", text.lower())
    if not m:
        raise ValueError(f"not a size: {text!r} (e.g. 256MB, 2GiB)")
    unit = m[2].rstrip("b").rstrip("i")
    return int(float(m[1]) * (1024 ** "_kmgt".index(unit) if unit else 1))


@dataclass
class AnnOptions:
    """Whether (and how) an update builds an approximate faiss index."""

    mode: str = "auto"  # "auto" (from ``threshold`` images on), "on" or "off"
    threshold: int = ANN_THRESHOLD
    memory: int | str | None = None  # bytes ("256MB"); default 1/8 of the float32 embeddings
    factory: str | None = None  # a faiss index_factory string instead of the choice by size

    def wanted(self, count: int) -> bool:
        return self.mode == "on" or (self.mode == "auto" and count >= self.threshold)

    def check(self, dim: int, count: int) -> None:
        """:class:`AnnError` before any work when what is asked for cannot be built:
        ``"on"`` without faiss, a factory string faiss cannot parse, a budget nothing fits."""
        if isinstance(self.memory, str):
            try:
                self.memory = parse_size(self.memory)
            except ValueError as e:
                raise AnnError("memory", str(e)) from None
        if self.mode not in ("auto", "on", "off"):
            raise AnnError("ann", f"mode must be auto, on or off, got {self.mode!r}")
        if self.mode == "off":
            return
        if importlib.util.find_spec("faiss") is None:
            if self.mode == "on":
                raise AnnError("ann", "needs faiss: pip install 'attn-clip[faiss]'")
            return
        from . import ann  # (faiss and numpy: only when an approximate index is asked for)

        try:
            if self.factory:
                ann.check_factory(dim, self.factory)
        except ValueError as e:
            raise AnnError("factory", str(e)) from None
        if not self.factory and self.wanted(count):
            self.factory_for(count, dim)

    def budget(self, count: int, dim: int) -> int:
        return self.memory if self.memory is not None else count * dim * 4 // 8

    def factory_for(self, count: int, dim: int) -> str:
        from . import ann

        try:
            return self.factory or ann.choose_factory(count, dim, self.budget(count, dim))
        except ValueError as e:
            raise AnnError("memory", str(e)) from None

    def build(self, index, old_index, warn: Callable[[str], None]) -> dict | None:
        """Build the approximate index when wanted; an update whose old index has one of the
        same factory keeps its training. Returns its info, or None."""
        if not self.wanted(len(index)):
            return None
        if importlib.util.find_spec("faiss") is None:
            warn(f"{len(index)} images: an approximate index needs faiss (pip install "
                 "'attn-clip[faiss]'); search stays exact")  # fmt: skip
            return None
        factory = self.factory_for(len(index), index.dim)
        old_info = getattr(old_index, "ann_info", None) or {}
        trained = old_index.ann if old_info.get("factory") == factory else None
        budget = self.budget(len(index), index.dim)
        try:
            return index.build_ann(factory, memory_budget=budget, trained=trained)
        except ValueError as e:
            raise AnnError("build", str(e)) from None
