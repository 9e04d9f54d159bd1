"""ONNX export of the CLIP towers (dynamic batch and text length) and ONNX Runtime runners."""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from ._deps import check_installed, require
from .towers import TOWERS, ImageTower, TextTower, check_runtime, example_inputs, plain_copy


def export_onnx(
    model: nn.Module,
    out_dir: str | os.PathLike,
    opset: int = 18,
    atol: float = 1e-4,
    verbose: bool = True,
    towers: tuple[str, ...] = ("image", "text"),
) -> dict[str, float]:
    """Write ``out_dir/image.onnx`` and ``out_dir/text.onnx`` (those of ``towers``) with
    ``torch.onnx.export(dynamo=True)``, and check them with onnxruntime against PyTorch at two
    batch sizes / text lengths; returns ``{check name: max abs diff}``.

    ``image.onnx``: ``images (batch, 3, H, W)`` float32 -> ``image_embeds (batch, E)``;
    ``text.onnx``: ``tokens (batch, length <= context_length)`` int64 -> ``text_embeds``.
    The embeddings are not L2-normalized."""
    check_installed("onnx", "onnxscript", "onnxruntime")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    plain = plain_copy(model)
    ctx = model.config.text.context_length
    images, tokens = example_inputs(model, 2)
    modules = {"image": (ImageTower(plain), images), "text": (TextTower(plain), tokens)}
    for name in towers:
        tower, example = modules[name]
        in_name, out_name = TOWERS[name]
        path = out / f"{name}.onnx"
        batch = torch.export.Dim("batch", min=1, max=4096)
        dims = {0: batch}
        if name == "text":
            dims[1] = torch.export.Dim("length", min=2, max=ctx)
        start = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(
                tower,
                (example,),
                str(path),
                input_names=[in_name],
                output_names=[out_name],
                dynamic_shapes={in_name: dims},
                opset_version=opset,
                dynamo=True,
                external_data=False,
                verbose=False,
            )
        if verbose:
            mb = path.stat().st_size / 2**20
            seconds = time.perf_counter() - start
            print(f"exported {path.name} ({mb:.1f} MB) in {seconds:.1f} s")
    runners = onnxruntime_runners(out, towers=towers)
    return check_runtime(model, runners, "onnxruntime", atol, verbose)


def onnxruntime_runners(
    folder: str | os.PathLike,
    threads: int | None = None,
    towers: tuple[str, ...] = ("image", "text"),
    spin: bool = True,
) -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
    """``{"image": fn, "text": fn}`` running ``folder/{name}.onnx`` with onnxruntime on
    ``threads`` threads (default: its own choice); ``spin=False``: idle threads sleep at
    once instead of spinning (fair to other runtimes timed in the same process)."""
    ort = require("onnxruntime")

    opts = ort.SessionOptions()
    if threads:
        opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
    if not spin:
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    runners = {}
    for name in towers:
        in_name, out_name = TOWERS[name]
        session = ort.InferenceSession(
            str(Path(folder) / f"{name}.onnx"), opts, providers=["CPUExecutionProvider"]
        )
        runners[name] = lambda x, s=session, i=in_name, o=out_name: torch.from_numpy(
            s.run([o], {i: x.numpy()})[0]
        )
    return runners
