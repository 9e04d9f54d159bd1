"""OpenVINO: the ONNX graphs converted to IR, compiled for the CPU, and run as functions."""

from __future__ import annotations

import os
import time
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
    return ov.Core().compile_model(model, "CPU", config)


class OpenVINOTower:
    """A compiled OpenVINO tower as a function: tensor in, tensor out (one infer request)."""

    def __init__(self, compiled: Any) -> None:
        self.request = compiled.create_infer_request()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        out = self.request.infer({0: x.contiguous().numpy()}, share_inputs=True)
        return torch.from_numpy(out[0])
