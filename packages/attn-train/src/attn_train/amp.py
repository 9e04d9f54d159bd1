"""Mixed precision: ``--precision auto|fp32|bf16|fp16``.

``auto`` is bf16 on a GPU that supports it, else fp32. bf16 / fp16 run the forward pass
under ``torch.autocast`` (the weights stay fp32); fp16 also scales the loss
(``GradScaler``), which is a no-op for the other precisions.
"""

from __future__ import annotations

import contextlib

import torch

__all__ = ["PRECISIONS", "autocast", "make_scaler", "resolve_precision"]

PRECISIONS = ("auto", "fp32", "bf16", "fp16")


def resolve_precision(precision: str, device: torch.device) -> str:
    """``"auto"`` -> ``"bf16"`` on a GPU that supports it, else ``"fp32"``."""
    if precision not in PRECISIONS:
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
