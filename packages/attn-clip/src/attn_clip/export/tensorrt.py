"""TensorRT engines from the ONNX graphs (fp32, TF32 off), checked on the GPU. Needs a CUDA
device and the ``tensorrt`` package (not in the ``export`` extra)."""

from __future__ import annotations

import importlib.util
import os
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ._deps import require
from .towers import TOWERS, check_runtime


def tensorrt_missing() -> str | None:
    """Why TensorRT cannot run here, as the rest of a sentence ("needs ..."), or None."""
    if not torch.cuda.is_available():
        return (
            "needs an NVIDIA GPU, and torch sees no CUDA device here "
            "(on a CPU export to OpenVINO or ONNX)"
        )
    if importlib.util.find_spec("tensorrt") is None:
        return "needs the tensorrt package (pip install tensorrt): not installed"
    return None


def export_tensorrt(
    model: nn.Module,
    onnx_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    atol: float = 1e-4,
    verbose: bool = True,
) -> dict[str, float]:
    """Build fp32 engines (TF32 off) ``out_dir/{image,text}.plan`` from the ONNX graphs, with
    dynamic batch (1..64 images, 1..256 captions) and text length, and check them on the GPU
    against PyTorch on the CPU; ``RuntimeError`` without a CUDA device."""
    if why := tensorrt_missing():
        raise RuntimeError(f"TensorRT export {why}")
    trt = require("tensorrt")
    onnx_dir, out = Path(onnx_dir), Path(out_dir)

    logger = trt.Logger(trt.Logger.WARNING)
    builder, runtime = trt.Builder(logger), trt.Runtime(logger)
    ctx = model.config.text.context_length
    size = model.config.vision.image_size
    h, w = (size, size) if isinstance(size, int) else tuple(size)
    shapes = {
        "image": ((1, 3, h, w), (8, 3, h, w), (64, 3, h, w)),
        "text": ((1, 2), (80, ctx), (256, ctx)),
    }
    explicit = (
        0
        if int(trt.__version__.split(".")[0]) >= 10
        else 1 << int(trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH)
    )
    runners = {}
    for name, (in_name, out_name) in TOWERS.items():
        network = builder.create_network(explicit)
        parser = trt.OnnxParser(network, logger)
        if not parser.parse_from_file(str(onnx_dir / f"{name}.onnx")):
            errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
            raise RuntimeError(f"TensorRT cannot parse {name}.onnx: {errors}")
        config = builder.create_builder_config()
        config.clear_flag(trt.BuilderFlag.TF32)
        profile = builder.create_optimization_profile()
        profile.set_shape(in_name, *shapes[name])
        config.add_optimization_profile(profile)
        start = time.perf_counter()
        plan = builder.build_serialized_network(network, config)
        if plan is None:
            raise RuntimeError(f"TensorRT could not build the {name} engine")
        (out / f"{name}.plan").write_bytes(bytes(plan))
        if verbose:
            print(f"wrote {name}.plan in {time.perf_counter() - start:.1f} s")
        engine = runtime.deserialize_cuda_engine(plan)
        runners[name] = TensorRTTower(engine, in_name, out_name)
    return check_runtime(model, runners, "TensorRT", atol, verbose)


class TensorRTTower:
    """A deserialized TensorRT engine as a function: CPU tensor in, CPU tensor out."""

    def __init__(self, engine: Any, in_name: str, out_name: str) -> None:
        trt = require("tensorrt")

        self.context = engine.create_execution_context()
        self.in_name, self.out_name = in_name, out_name
        self.in_dtype = torch.int32 if engine.get_tensor_dtype(in_name) == trt.int32 else None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(self.in_dtype or x.dtype).cuda().contiguous()
        self.context.set_input_shape(self.in_name, tuple(x.shape))
        y = torch.empty(tuple(self.context.get_tensor_shape(self.out_name)), device="cuda")
        self.context.set_tensor_address(self.in_name, x.data_ptr())
        self.context.set_tensor_address(self.out_name, y.data_ptr())
        stream = torch.cuda.current_stream()
        self.context.execute_async_v3(stream.cuda_stream)
        stream.synchronize()
        return y.cpu()
