"""OpenVINO: the ONNX graphs converted to IR, compiled for the CPU, and run as functions."""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from ._deps import require
from .towers import TOWERS


def to_openvino(
    onnx_dir: str | os.PathLike, out_dir: str | os.PathLike, verbose: bool = True
) -> dict[str, Any]:
    """``onnx_dir/{image,text}.onnx`` -> ``out_dir/{image,text}.xml`` + ``.bin`` (fp32
    weights: ``compress_to_fp16=False``); returns the ``openvino.Model`` of each tower."""
    ov = require("openvino")

    onnx_dir, out = Path(onnx_dir), Path(out_dir)
    models = {}
    for name in TOWERS:
        start = time.perf_counter()
        ov_model = ov.convert_model(str(onnx_dir / f"{name}.onnx"))
        ov.save_model(ov_model, str(out / f"{name}.xml"), compress_to_fp16=False)
        models[name] = ov_model
        if verbose:
            mb = (out / f"{name}.bin").stat().st_size / 2**20
            seconds = time.perf_counter() - start
            print(f"wrote {name}.xml / {name}.bin ({mb:.1f} MB) in {seconds:.1f} s")
    return models


class _SignalStack(ctypes.Structure):  # stack_t of sigaltstack(2)
    _fields_ = [("sp", ctypes.c_void_p), ("flags", ctypes.c_int), ("size", ctypes.c_size_t)]


@contextlib.contextmanager
def signal_stack_kept() -> Iterator[None]:
    """Keep the calling thread's alternate signal stack across OpenVINO calls (Linux).

    OpenVINO's CPU plugin installs a signal stack of its own on the thread that compiles a
    model and, when that compiled model is freed, puts back the one it found. Freed in any
    other order than last-in first-out (the text tower after the image tower), the thread is
    left with a freed, unmapped stack, and the next signal Python handles there (Ctrl-C, or a
    SIGCHLD once a DataLoader with workers has run) kills the process with SIGSEGV instead.
    Putting Python's stack back right after each compile means every later "put back" puts
    back a live stack, whatever the order."""
    if not sys.platform.startswith("linux"):
        yield
        return
    libc = ctypes.CDLL(None)
    saved = _SignalStack()
    known = libc.sigaltstack(None, ctypes.byref(saved)) == 0
    try:
        yield
    finally:
        if known:
            libc.sigaltstack(ctypes.byref(saved), None)


def compile_openvino(model_or_path: Any, threads: int, precision: str = "f32") -> Any:
    """An OpenVINO ``CompiledModel`` on the CPU: ``threads`` threads, the latency hint and
    ``INFERENCE_PRECISION_HINT`` ``precision`` ("f32" or "bf16"; OpenVINO's own default is
    bf16 on CPUs with AVX512-BF16 / AMX, which would not pass a 1e-4 check)."""
    ov = require("openvino")

    config = {
        "INFERENCE_NUM_THREADS": threads,
        "PERFORMANCE_HINT": "LATENCY",
        "INFERENCE_PRECISION_HINT": precision,
    }
    model = str(model_or_path) if isinstance(model_or_path, Path) else model_or_path
    with signal_stack_kept():
        return ov.Core().compile_model(model, "CPU", config)


class OpenVINOTower:
    """A compiled OpenVINO tower as a function: tensor in, tensor out (one infer request)."""

    def __init__(self, compiled: Any) -> None:
        self.request = compiled.create_infer_request()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        out = self.request.infer({0: x.contiguous().numpy()}, share_inputs=True)
        return torch.from_numpy(out[0])
