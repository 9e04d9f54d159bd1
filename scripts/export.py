"""Export a CLIP's image and text towers to ONNX / OpenVINO / TensorRT, and/or quantize them
to int8 (dynamic, or static with calibration).

    uv run scripts/export.py --model ViT-B-32 --pretrained laion2b_s34b_b79k --format onnx
    uv run scripts/export.py --model ViT-B-32 --pretrained path/open_clip_model.safetensors \\
        --format onnx openvino --out exports/vit-b-32
    uv run scripts/export.py --model ViT-B-32 --quantize int8      # random weights: a dry run
    uv run scripts/export.py --model demo-shapes --pretrained shapes --quantize int8-static \\
        --calibration data/shapes32/train.csv --zeroshot-dir data/shapes32/heldout \\
        --zeroshot-classnames data/shapes32/classnames.txt

``--format onnx`` writes ``OUT/image.onnx`` (``images (batch, 3, H, W)`` float32 ->
``image_embeds (batch, E)``) and ``OUT/text.onnx`` (``tokens (batch, length)`` int64 ->
``text_embeds (batch, E)``), two separate graphs with a dynamic batch and a dynamic text
length (any ``length <= context_length``, e.g. the tokenizer's 77 columns or fewer). The
embeddings are *not* L2-normalized (as ``encode_image`` / ``encode_text`` with
``normalize=False``); ``OUT/export.json`` keeps the model config, preprocessing and
``logit_scale``. Each graph is then run with onnxruntime at two batch sizes (and two text
lengths) and compared with PyTorch; the script prints the max abs differences and fails
(exit code 1) if any is above ``--atol`` (1e-4).

``--format openvino`` converts those ONNX graphs (``openvino.convert_model``) to OpenVINO IR,
``OUT/image.xml`` / ``.bin`` and ``OUT/text.xml`` / ``.bin`` (fp32 weights, the same inputs
and outputs), checks them the same way (run with ``INFERENCE_PRECISION_HINT f32``: OpenVINO
would otherwise run bf16 on CPUs that have it) and times them against PyTorch, interleaved,
with the same thread count. ``--format tensorrt`` builds TensorRT engines
(``OUT/image.plan``, ``OUT/text.plan``, fp32, TF32 off) from the ONNX graphs and checks them
on the GPU; without a CUDA device or the ``tensorrt`` package it refuses (exit 2). Formats
combine: ``--format onnx openvino``.

``--quantize int8`` applies ``torch.ao`` dynamic int8 quantization to every ``nn.Linear``
(int8 weights, activations quantized on the fly; fbgemm / oneDNN kernels on x86) and
reports the speed ratio to the fp32 model and the cosine similarity of the int8 embeddings
to the fp32 ones (goal >= 0.99), and saves the quantized model with ``torch.save`` as
``OUT/clip_int8.pt`` (a pickled module: load only files you trust).

``--quantize int8-static --calibration CSV_OR_DIR`` is post-training *static* quantization
(int8 weights and activations, scales fixed from calibration) with NNCF on the OpenVINO
model: ``--calibration-size`` (300) real inputs from an open_clip-style CSV
(``filepath,title``: images and their captions) or an ImageFolder (images, and
``"a photo of a {class}"`` as text), ``model_type=TRANSFORMER`` (SmoothQuant; softmax and
norms stay float), the patch embedding and both output projections kept in fp32. It writes
``OUT/image_int8.xml`` / ``OUT/text_int8.xml`` (+ ``.bin``), reports the cosine to the fp32
embeddings on calibration-source rows not used for calibration (goal >= 0.99), zero-shot
top-1 on ``--zeroshot-dir`` (fp32, dynamic int8, static int8; goal: a drop of at most
``--max-drop`` points) and the speed of fp32 / dynamic int8 / OpenVINO fp32 / static int8,
timed interleaved. Both ``--quantize`` values combine.

Nothing is written for bad input; the outputs are written to a hidden folder next to OUT
and moved in when every step has run. Exit codes: 0 ok, 1 a check failed, 2 bad input
(unknown model, missing file, no GPU for TensorRT, ...), 130 Ctrl-C.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

# PyTorch's OpenMP threads spin after each call by default and, in one process with
# OpenVINO's or onnxruntime's threads, take the cores from them (and then wait for them):
# interleaved timings came out 7-80x too slow on 2 cores (docs/benchmarks.md). Read once,
# when torch loads.
if __name__ == "__main__":
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from attn_train.cli import HelpFormatter, one_line, run_main  # noqa: E402
from torch import nn  # noqa: E402

FORMATS = ("onnx", "openvino", "tensorrt")
QUANTIZE = ("int8", "int8-static")

# ----------------------------------------------------------------------------------------
# Exportable towers
# ----------------------------------------------------------------------------------------


class ImageTower(nn.Module):
    """``(B, 3, H, W)`` images -> ``(B, E)`` unnormalized image embeddings."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.model.encode_image(images)


class TextTower(nn.Module):
    """``(B, L)`` token ids -> ``(B, E)`` unnormalized text embeddings (all ``L`` columns:
    the graph cannot cut the batch at its longest caption, so feed it already cut)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.model.encode_text(tokens, truncate=False)


TOWERS = {"image": ("images", "image_embeds"), "text": ("tokens", "text_embeds")}


def plain_copy(model: nn.Module) -> nn.Module:
    """A copy with the CPU inference fast path off (its oneDNN calls have no ONNX form)."""
    model = copy.deepcopy(model).eval()
    model.visual.trunk.fast_inference = False
    model.text.fast_inference = False
    return model


def _example_inputs(model: nn.Module, batch: int, length: int | None = None):
    size = model.config.vision.image_size
    size = (size, size) if isinstance(size, int) else tuple(size)
    images = torch.randn(batch, 3, *size)
    ctx = model.config.text.context_length
    length = ctx if length is None else length
    g = torch.Generator().manual_seed(batch * 1000 + length)
    tokens = torch.randint(1, 49000, (batch, length), generator=g)
    tokens[:, 0] = 49406  # SOT
    tokens[:, -1] = 49407  # EOT (the argmax)
    return images, tokens


def cut_tokens(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """``tokens`` without the columns after the batch's last pooled token (what the graphs
    should be fed: with causal attention those columns cannot change the embeddings)."""
    from attn_clip.text import pool_positions

    c = model.config.text
    idx = pool_positions(tokens, c.pool_type, c.eos_id) if c.causal else None
    return tokens if idx is None or len(tokens) == 0 else tokens[:, : int(idx.max()) + 1]


def check_runtime(
    model: nn.Module,
    runners: dict[str, Callable[[torch.Tensor], Any]],
    label: str,
    atol: float = 1e-4,
    verbose: bool = True,
) -> dict[str, float]:
    """Run each tower's ``runners[name]`` (tensor in, array / tensor out) at two batch sizes
    (and two text lengths) against PyTorch; returns ``{case: max abs diff}``."""
    plain = plain_copy(model)
    ctx = model.config.text.context_length
    towers = {"image": ImageTower(plain), "text": TextTower(plain)}
    diffs: dict[str, float] = {}
    for name, run in runners.items():
        cases = [(3, None), (1, None)] if name == "image" else [(3, None), (1, max(2, ctx // 4))]
        for b, length in cases:
            imgs, toks = _example_inputs(model, b, length)
            x = imgs if name == "image" else toks
            with torch.no_grad():
                ref = towers[name](x)
            got = torch.as_tensor(run(x)).float().cpu()
            diff = float((got - ref).abs().max())
            key = f"{name} batch {b}" + (f" length {x.shape[1]}" if name == "text" else "")
            diffs[key] = diff
            if verbose:
                status = "ok" if diff <= atol else f"FAILED (> {atol:g})"
                print(f"  {label} vs PyTorch, {key}: max abs diff {diff:.2e} {status}")
    return diffs


# ----------------------------------------------------------------------------------------
# ONNX
# ----------------------------------------------------------------------------------------


def export_onnx(
    model: nn.Module,
    out: Path,
    opset: int = 18,
    atol: float = 1e-4,
    verbose: bool = True,
    towers: tuple[str, ...] = ("image", "text"),
) -> dict[str, float]:
    """Write ``out/image.onnx`` and ``out/text.onnx`` (those of ``towers``), check them with
    onnxruntime against PyTorch at two batch sizes / text lengths; returns ``{check name:
    max abs diff}``."""
    out.mkdir(parents=True, exist_ok=True)
    plain = plain_copy(model)
    ctx = model.config.text.context_length
    images, tokens = _example_inputs(model, 2)
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
    folder: Path,
    threads: int | None = None,
    towers: tuple[str, ...] = ("image", "text"),
    spin: bool = True,
) -> dict[str, Callable]:
    """``{"image": fn, "text": fn}`` running ``folder/{name}.onnx`` with onnxruntime on
    ``threads`` threads (default: its own choice); ``spin=False``: idle threads sleep at
    once instead of spinning (fair to other runtimes timed in the same process)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    if threads:
        opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
    if not spin:
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    runners = {}
    for name in towers:
        in_name, out_name = TOWERS[name]
        session = ort.InferenceSession(
            str(folder / f"{name}.onnx"), opts, providers=["CPUExecutionProvider"]
        )
        runners[name] = lambda x, s=session, i=in_name, o=out_name: torch.from_numpy(
            s.run([o], {i: x.numpy()})[0]
        )
    return runners


# ----------------------------------------------------------------------------------------
# OpenVINO
# ----------------------------------------------------------------------------------------


def ov_compile(model_or_path: Any, threads: int, precision: str = "f32") -> Any:
    """An OpenVINO ``CompiledModel`` on the CPU: ``threads`` threads, the latency hint and
    ``INFERENCE_PRECISION_HINT`` ``precision`` ("f32" or "bf16"; OpenVINO's own default is
    bf16 on CPUs with AVX512-BF16 / AMX, which would not pass a 1e-4 check)."""
    import openvino as ov

    config = {
        "INFERENCE_NUM_THREADS": threads,
        "PERFORMANCE_HINT": "LATENCY",
        "INFERENCE_PRECISION_HINT": precision,
    }
    model = str(model_or_path) if isinstance(model_or_path, Path) else model_or_path
    return ov.Core().compile_model(model, "CPU", config)


class OVTower:
    """A compiled OpenVINO tower as a function: tensor in, tensor out (one infer request)."""

    def __init__(self, compiled: Any) -> None:
        self.request = compiled.create_infer_request()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        out = self.request.infer({0: x.contiguous().numpy()}, share_inputs=True)
        return torch.from_numpy(out[0])


def convert_openvino(onnx_dir: Path, out: Path, verbose: bool = True) -> dict[str, Any]:
    """``onnx_dir/{image,text}.onnx`` -> ``out/{image,text}.xml`` + ``.bin`` (fp32 weights);
    returns the ``openvino.Model`` of each tower."""
    import openvino as ov

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


# ----------------------------------------------------------------------------------------
# TensorRT (a CUDA device and the tensorrt package)
# ----------------------------------------------------------------------------------------


def tensorrt_missing() -> str | None:
    """Why ``--format tensorrt`` cannot run here, or None."""
    if not torch.cuda.is_available():
        return (
            "--format tensorrt needs an NVIDIA GPU, and torch sees no CUDA device here "
            "(on a CPU use --format openvino or onnx)"
        )
    if importlib.util.find_spec("tensorrt") is None:
        return "--format tensorrt needs the tensorrt package (pip install tensorrt): not installed"
    return None


def export_tensorrt(
    model: nn.Module, onnx_dir: Path, out: Path, atol: float = 1e-4, verbose: bool = True
) -> dict[str, float]:
    """Build fp32 engines (TF32 off) ``out/{image,text}.plan`` from the ONNX graphs, with
    dynamic batch (1..64 images, 1..256 captions) and text length, and check them on the GPU
    against PyTorch on the CPU."""
    import tensorrt as trt

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
        runners[name] = _TRTTower(engine, in_name, out_name)
    return check_runtime(model, runners, "TensorRT", atol, verbose)


class _TRTTower:
    def __init__(self, engine: Any, in_name: str, out_name: str) -> None:
        import tensorrt as trt

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


# ----------------------------------------------------------------------------------------
# int8: dynamic (torch.ao) and static (NNCF on the OpenVINO model)
# ----------------------------------------------------------------------------------------


def quantize_int8(model: nn.Module) -> nn.Module:
    """A copy of ``model`` with every ``nn.Linear`` dynamically quantized to int8."""
    from torch.ao.quantization import quantize_dynamic

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao's deprecation notices
        return quantize_dynamic(copy.deepcopy(model).eval(), {nn.Linear}, dtype=torch.qint8)


def time_interleaved(fns: dict[str, Callable[[], Any]], repeats: int) -> dict[str, float]:
    """Median seconds per call of each function, warmed up once and then timed round-robin
    (A, B, A, B, ...) so that load from other processes falls on all of them alike."""
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def _timing_inputs(model: nn.Module, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``batch`` random images and OpenAI's 80 ImageNet prompts of one class."""
    from attn_clip import IMAGENET_CLASSNAMES, OPENAI_IMAGENET_TEMPLATES, get_tokenizer

    images, _ = _example_inputs(model, batch)
    tokenizer = get_tokenizer(model.config)
    tokens = tokenizer([t(IMAGENET_CLASSNAMES[0]) for t in OPENAI_IMAGENET_TEMPLATES])
    return images, tokens


def int8_report(
    model: nn.Module,
    qmodel: nn.Module,
    batch: int = 8,
    repeats: int = 5,
    verbose: bool = True,
) -> dict[str, Any]:
    """Speed ratio and cosine similarity of the int8 model to the fp32 one."""
    images, tokens = _timing_inputs(model, batch)
    report: dict[str, Any] = {}
    with torch.inference_mode():
        for name, args, encode in (
            (f"image batch {batch}", images, "encode_image"),
            (f"text {len(tokens)} prompts", tokens, "encode_text"),
        ):
            fp32 = getattr(model, encode)(args)
            int8 = getattr(qmodel, encode)(args)
            cos = F.cosine_similarity(fp32, int8, dim=-1)
            t = time_interleaved(
                {
                    "fp32": lambda e=encode, a=args: getattr(model, e)(a),
                    "int8": lambda e=encode, a=args: getattr(qmodel, e)(a),
                },
                repeats,
            )
            t32, t8 = t["fp32"], t["int8"]
            report[name] = {
                "fp32_ms": t32 * 1e3,
                "int8_ms": t8 * 1e3,
                "speedup": t32 / t8,
                "cosine_min": cos.min().item(),
                "cosine_mean": cos.mean().item(),
            }
            if verbose:
                ok = "ok" if cos.min() >= 0.99 else "BELOW the 0.99 goal"
                print(
                    f"  int8 {name}: {t8 * 1e3:.1f} ms vs fp32 {t32 * 1e3:.1f} ms "
                    f"({t32 / t8:.2f}x); cosine to fp32 min {cos.min():.4f} "
                    f"mean {cos.mean():.4f} {ok}"
                )
    return report


def read_image_text(path: Path, model: nn.Module, template: str = "a photo of a {}") -> Any:
    """The images (preprocessed for ``model``) and captions of a CSV (``filepath,title``) or
    an ImageFolder (captions ``template.format(class)``): a dataset whose items are
    ``(image (3, H, W), caption)`` or None for an unreadable image."""
    import attn_clip
    from attn_train.data import CsvImageTextDataset, ImageFolderDataset

    transform = attn_clip.image_transform(model.preprocess_cfg)
    if not path.is_dir():
        return CsvImageTextDataset(path, transform, None)
    try:
        folder = ImageFolderDataset(path, transform)
    except FileNotFoundError as err:  # no class folders, or no image in them
        raise ValueError(
            f"{path}: {err} (expected DIR/<class>/<image> or a CSV with filepath,title)"
        ) from None
    names = [c.replace("_", " ") for c in folder.classes]

    class Captioned(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return len(folder)

        def __getitem__(self, i: int) -> tuple[torch.Tensor, str] | None:
            item = folder[i]
            return None if item is None else (item[0], template.format(names[item[1]]))

    return Captioned()


def calibration_split(n: int, size: int, eval_size: int = 200) -> tuple[list[int], list[int]]:
    """``size`` indices spread evenly over ``n`` rows for calibration and up to
    ``eval_size`` of the others (also spread) for the cosine check; when every row is used
    for calibration the check reuses them."""
    calib = sorted({i * n // size for i in range(size)}) if n > size else list(range(n))
    taken = set(calib)
    rest = [i for i in range(n) if i not in taken]
    if not rest:
        return calib, calib[:eval_size]
    step = max(1, len(rest) // eval_size)
    return calib, rest[::step][:eval_size]


def load_rows(data: Any, indices: list[int], model: nn.Module) -> dict[str, list[torch.Tensor]]:
    """``{"image": [(1, 3, H, W)], "text": [(1, L)]}`` for the readable rows among
    ``indices`` (each caption cut after its own pooled token)."""
    from attn_clip import get_tokenizer

    tokenizer = get_tokenizer(model.config)
    rows: dict[str, list[torch.Tensor]] = {"image": [], "text": []}
    for i in indices:
        item = data[i]
        if item is None:
            continue
        rows["image"].append(item[0][None])
        rows["text"].append(cut_tokens(model, tokenizer([item[1]])))
    return rows


def keep_fp32(ov_model: Any, name: str) -> list[str]:
    """The layers static int8 leaves in fp32: the tower's output projection (the last
    MatMul before the output) and, for the image tower, the patch embedding (the first
    Convolution / MatMul after the input). Quantizing either cost the most accuracy."""
    compute = ("MatMul", "Convolution")
    node = ov_model.get_results()[0].input_value(0).get_node()
    while node.get_type_name() not in compute and node.get_input_size() > 0:
        node = node.input_value(0).get_node()
    keep = [node.get_friendly_name()] if node.get_type_name() in compute else []
    if name == "image":
        frontier, seen = list(ov_model.get_parameters()), set()
        while frontier:
            nxt = []
            for n in frontier:
                for target in (t.get_node() for o in n.outputs() for t in o.get_target_inputs()):
                    if target.get_friendly_name() in seen:
                        continue
                    seen.add(target.get_friendly_name())
                    if target.get_type_name() in compute:
                        return keep + [target.get_friendly_name()]
                    nxt.append(target)
            frontier = nxt
    return keep


def quantize_static(
    ov_models: dict[str, Any], calibration: dict[str, list[torch.Tensor]], vit: bool = True
) -> dict[str, Any]:
    """NNCF post-training static quantization of each OpenVINO tower with its calibration
    inputs: int8 weights (per channel) and activations (per tensor), transformer rules
    (SmoothQuant; softmax and norms float) for ViT and text towers, :func:`keep_fp32`."""
    import logging

    logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)  # "no CUDA" note
    import nncf

    nncf.set_log_level(logging.ERROR)
    quantized = {}
    for name, ov_model in ov_models.items():
        data = [x.numpy() for x in calibration[name]]
        transformer = name == "text" or vit
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            quantized[name] = nncf.quantize(
                ov_model,
                nncf.Dataset(data),
                subset_size=len(data),
                model_type=nncf.ModelType.TRANSFORMER if transformer else None,
                ignored_scope=nncf.IgnoredScope(names=keep_fp32(ov_model, name), validate=False),
            )
    return quantized


Encoders = tuple[Callable[[torch.Tensor], torch.Tensor], Callable[[torch.Tensor], torch.Tensor]]


def zero_shot_top1(
    encoders: dict[str, Encoders],
    model: nn.Module,
    folder: Path,
    classnames: list[str] | None,
    templates: list[str],
    batch: int = 50,
) -> dict[str, float]:
    """Zero-shot top-1 (%) of each ``(encode_image, encode_text)`` pair on an ImageFolder:
    a classifier of normalized, prompt-averaged class embeddings, argmax over classes."""
    import attn_clip
    from attn_train.data import ImageFolderDataset

    transform = attn_clip.image_transform(model.preprocess_cfg)
    data = ImageFolderDataset(folder, transform, classnames)
    names = [c.replace("_", " ") for c in data.classes]
    tokenizer = attn_clip.get_tokenizer(model.config)
    prompts = cut_tokens(model, tokenizer([t.format(c) for c in names for t in templates]))
    classifiers = {}
    for key, (_, encode_text) in encoders.items():
        emb = F.normalize(encode_text(prompts).float(), dim=-1)
        emb = emb.reshape(len(names), len(templates), -1).mean(dim=1)
        classifiers[key] = F.normalize(emb, dim=-1).T
    hits = dict.fromkeys(encoders, 0)
    n = 0
    for start in range(0, len(data), batch):
        chunk = [data[i] for i in range(start, min(start + batch, len(data)))]
        chunk = [item for item in chunk if item is not None]  # unreadable images: skipped
        if not chunk:
            continue
        images = torch.stack([image for image, _ in chunk])
        labels = torch.tensor([label for _, label in chunk])
        for key, (encode_image, _) in encoders.items():
            feats = F.normalize(encode_image(images).float(), dim=-1)
            hits[key] += int(((feats @ classifiers[key]).argmax(dim=-1) == labels).sum())
        n += len(chunk)
    return {key: 100.0 * h / max(1, n) for key, h in hits.items()} | {"n": n}


def cosine_to_fp32(
    reference: Encoders, other: Encoders, rows: dict[str, list[torch.Tensor]]
) -> dict[str, dict[str, float]]:
    """Min / mean cosine of ``other``'s embeddings to ``reference``'s over ``rows``."""
    result = {}
    for i, name in enumerate(("image", "text")):
        cos = torch.cat(
            [F.cosine_similarity(reference[i](x).float(), other[i](x).float()) for x in rows[name]]
        )
        result[name] = {"min": cos.min().item(), "mean": cos.mean().item(), "n": len(cos)}
    return result


def speed_table(
    model: nn.Module,
    runners: dict[str, Encoders],
    batch: int,
    repeats: int,
    verbose: bool = True,
) -> dict[str, dict[str, float]]:
    """Each runner's median ms per call, timed interleaved: ``batch`` random images and the
    80 prompts (cut to the longest); ratios to the first runner."""
    images, tokens = _timing_inputs(model, batch)
    tokens = cut_tokens(model, tokens)
    cases = {
        f"image batch {batch}": (0, images),
        f"text {len(tokens)} prompts x {tokens.shape[1]} tokens": (1, tokens),
    }
    table: dict[str, dict[str, float]] = {}
    with torch.inference_mode():
        for case, (i, x) in cases.items():
            fns = {key: (lambda f=enc[i], x=x: f(x)) for key, enc in runners.items()}
            t = time_interleaved(fns, repeats)
            table[case] = {key: s * 1e3 for key, s in t.items()}
            if verbose:
                first = next(iter(t))
                cells = [
                    f"{key} {s * 1e3:.1f} ms" + ("" if key == first else f" ({t[first] / s:.2f}x)")
                    for key, s in t.items()
                ]
                print(f"  {case}: " + ", ".join(cells))
    return table


def _size_mb(model: nn.Module) -> float:
    import io

    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    return buf.tell() / 2**20


# ----------------------------------------------------------------------------------------
# The command
# ----------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("--model", required=True, help="architecture name (ViT-B-32), hf-hub:, folder")
    p.add_argument("--pretrained", default=None, help="pretrained tag or checkpoint path")
    p.add_argument("--format", nargs="+", choices=FORMATS, default=None, help="export format(s)")
    p.add_argument("--quantize", nargs="+", choices=QUANTIZE, default=None, help="int8 mode(s)")
    p.add_argument("--out", default=None, help="output folder (default exports/<model>)")
    p.add_argument("--opset", type=int, default=18, help="ONNX opset (default 18)")
    p.add_argument("--atol", type=float, default=1e-4, help="runtime check tolerance (fp32)")
    p.add_argument("--batch", type=int, default=8, help="image batch for the timings")
    p.add_argument("--repeats", type=int, default=5, help="timed repeats (interleaved)")
    p.add_argument("--threads", type=int, default=None, help="threads of every runtime (torch's)")
    p.add_argument("--calibration", default=None, help="int8-static: CSV (filepath,title) or DIR")
    p.add_argument("--calibration-size", type=int, default=300, help="calibration inputs")
    p.add_argument("--zeroshot-dir", default=None, help="int8-static: ImageFolder for top-1")
    p.add_argument("--zeroshot-classnames", default=None, help="one class per line (all classes)")
    p.add_argument(
        "--zeroshot-templates", nargs="+", default=["a photo of a {}"], help="zero-shot prompts"
    )
    p.add_argument("--max-drop", type=float, default=1.0, help="int8-static top-1 drop goal (pts)")
    p.add_argument("--json", default=None, help="also write the checks here")
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = build_parser()
    args = p.parse_args(argv)
    args.format = list(dict.fromkeys(args.format or []))
    args.quantize = list(dict.fromkeys(args.quantize or []))
    if not args.format and not args.quantize:
        p.error("nothing to do: pass --format onnx|openvino|tensorrt and/or --quantize")
    return args


def check_inputs(args: argparse.Namespace) -> None:
    """``ValueError`` (one line) for any bad input, before anything is loaded or written."""
    from attn_train.cli import require_dir, require_file

    if args.out is not None and Path(args.out).exists() and not Path(args.out).is_dir():
        raise ValueError(f"--out {args.out} is a file, not a folder")
    static = "int8-static" in args.quantize
    if static and args.calibration is None:
        raise ValueError("--quantize int8-static needs --calibration CSV_OR_DIR")
    if not static:
        for flag in ("calibration", "zeroshot_dir", "zeroshot_classnames"):
            if getattr(args, flag) is not None:
                name = "--" + flag.replace("_", "-")
                raise ValueError(f"{name} is only read by --quantize int8-static")
    if static:
        path = Path(args.calibration)
        if not path.exists():
            raise ValueError(f"--calibration {path}: no such file or folder")
        require_dir(args.zeroshot_dir, "--zeroshot-dir")
        require_file(args.zeroshot_classnames, "--zeroshot-classnames")
        if args.zeroshot_classnames and not args.zeroshot_dir:
            raise ValueError("--zeroshot-classnames needs --zeroshot-dir")
        for t in args.zeroshot_templates:
            if "{}" not in t:
                raise ValueError(f"--zeroshot-templates {t!r} has no {{}} for the class name")
    for flag in ("batch", "repeats", "calibration_size", "threads"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be >= 1, got {value}")
    if "tensorrt" in args.format and (why := tensorrt_missing()):
        raise ValueError(why)
    needed = {"onnxruntime": bool(args.format) or static}  # (every ONNX graph is checked)
    needed["openvino"] = "openvino" in args.format or static
    needed["nncf"] = static
    for module, wanted in needed.items():
        if wanted and importlib.util.find_spec(module) is None:
            raise ValueError(f"{module} is not installed (uv sync installs the dev group)")


def run(
    args: argparse.Namespace,
    model: nn.Module,
    stage: Path,
    threads: int,
    inputs: dict[str, Any],
) -> tuple[dict[str, Any], list[str], bool]:
    """Every export / quantization step into ``stage``: ``(report, files written, failed)``."""
    formats, static = set(args.format), "int8-static" in args.quantize
    result: dict[str, Any] = {"model": args.model, "pretrained": args.pretrained}
    result["threads"] = threads
    written: list[str] = []
    failed = False
    atol = args.atol
    fp32 = (model.encode_image, model.encode_text)
    runners: dict[str, Encoders] = {"PyTorch fp32": fp32}
    onnx_dir = stage if "onnx" in formats else stage / "onnx"  # (not kept without --format onnx)
    if formats or static:
        print(f"exporting {args.model} to ONNX (opset {args.opset})")
        diffs = export_onnx(model, onnx_dir, args.opset, atol)
        result["onnx_max_abs_diff"] = diffs
        failed |= any(d > atol for d in diffs.values())
        if "onnx" in formats:
            written += ["image.onnx", "text.onnx"]
    ov_models = {}
    if "openvino" in formats or static:
        keep = "openvino" in formats
        print("converting the ONNX graphs to OpenVINO IR (openvino.convert_model)")
        ov_models = convert_openvino(onnx_dir, stage if keep else onnx_dir, verbose=keep)
        compiled = {n: OVTower(ov_compile(m, threads)) for n, m in ov_models.items()}
        if keep:
            written += ["image.xml", "image.bin", "text.xml", "text.bin"]
            diffs = check_runtime(model, compiled, "OpenVINO", atol)
            result["openvino_max_abs_diff"] = diffs
            failed |= any(d > atol for d in diffs.values())
        runners["OpenVINO fp32"] = (compiled["image"], compiled["text"])
    if "tensorrt" in formats:
        print("building TensorRT engines from the ONNX graphs")
        diffs = export_tensorrt(model, onnx_dir, stage, atol)
        result["tensorrt_max_abs_diff"] = diffs
        failed |= any(d > atol for d in diffs.values())
        written += ["image.plan", "text.plan"]
    qmodel = quantize_int8(model) if args.quantize else None
    if "int8" in args.quantize:
        print("quantizing every nn.Linear to int8 (torch.ao dynamic quantization)")
        report = int8_report(model, qmodel, args.batch, args.repeats)
        report["size_mb"] = {"fp32": _size_mb(model), "int8": _size_mb(qmodel)}
        sizes = report["size_mb"]
        print(f"  state dict {sizes['fp32']:.0f} MB -> {sizes['int8']:.0f} MB")
        result["int8"] = report
        failed |= any(r["cosine_min"] < 0.99 for k, r in report.items() if k != "size_mb")
        torch.save(qmodel, stage / "clip_int8.pt")
        written.append("clip_int8.pt")
    if static:
        report, ok = static_int8(args, model, qmodel, ov_models, inputs, stage, threads)
        runners = {
            "PyTorch fp32": fp32,
            "PyTorch dynamic int8": (qmodel.encode_image, qmodel.encode_text),
            **{k: v for k, v in runners.items() if k != "PyTorch fp32"},
            "OpenVINO int8 static": report.pop("_runner"),
        }
        result["int8_static"] = report
        written += ["image_int8.xml", "image_int8.bin", "text_int8.xml", "text_int8.bin"]
        failed |= not ok
    if len(runners) > 1:
        print(f"speed ({threads} threads each, medians of {args.repeats} interleaved calls):")
        result["speed_ms"] = speed_table(model, runners, args.batch, args.repeats)
    if formats or static:
        _write_meta(model, args, stage / "export.json", written)
        written.append("export.json")
    return result, written, failed


def static_int8(
    args: argparse.Namespace,
    model: nn.Module,
    qmodel: nn.Module,
    ov_models: dict[str, Any],
    inputs: dict[str, Any],
    stage: Path,
    threads: int,
) -> tuple[dict[str, Any], bool]:
    """Quantize, save, and check the cosine / zero-shot goals; the report carries the
    compiled int8 towers under ``_runner``."""
    import openvino as ov

    calibration, rows = inputs["calibration"], inputs["check_rows"]
    n_img, n_txt = len(calibration["image"]), len(calibration["text"])
    print(
        f"static int8 (NNCF on the OpenVINO model): calibrating on {n_img} images and "
        f"{n_txt} captions from {args.calibration}"
    )
    vision = model.config.vision
    vit = vision.convnext is None and isinstance(vision.layers, int)
    start = time.perf_counter()
    quantized = quantize_static(ov_models, calibration, vit)
    seconds = time.perf_counter() - start
    for name, q in quantized.items():
        ov.save_model(q, str(stage / f"{name}_int8.xml"), compress_to_fp16=False)
    sizes = {n: (stage / f"{n}_int8.bin").stat().st_size / 2**20 for n in quantized}
    print(
        f"  quantized in {seconds:.0f} s; image_int8.bin {sizes['image']:.1f} MB, "
        f"text_int8.bin {sizes['text']:.1f} MB"
    )
    compiled = {n: OVTower(ov_compile(m, threads)) for n, m in quantized.items()}
    int8 = (compiled["image"], compiled["text"])
    fp32 = (model.encode_image, model.encode_text)
    dynamic = (qmodel.encode_image, qmodel.encode_text)
    report: dict[str, Any] = {
        "calibration": {"source": str(args.calibration), "images": n_img, "captions": n_txt},
        "quantize_s": seconds,
        "size_mb": sizes,
        "kept_fp32": {n: keep_fp32(m, n) for n, m in ov_models.items()},
    }
    ok = True
    with torch.inference_mode():
        where = "rows not used for calibration" if inputs["held_out"] else "calibration rows"
        report["cosine_to_fp32"] = {}
        for key, enc in (("static int8", int8), ("dynamic int8", dynamic)):
            cos = cosine_to_fp32(fp32, enc, rows)
            report["cosine_to_fp32"][key] = cos
            print(
                f"  {key} cosine to fp32 ({cos['image']['n']} {where}): image min "
                f"{cos['image']['min']:.4f} mean {cos['image']['mean']:.5f}, text min "
                f"{cos['text']['min']:.4f} mean {cos['text']['mean']:.5f}"
            )
        cos = report["cosine_to_fp32"]["static int8"]
        if min(cos["image"]["min"], cos["text"]["min"]) < 0.99:
            print("  static int8 cosine BELOW the 0.99 goal")
            ok = False
        if args.zeroshot_dir:
            encoders = {"fp32": fp32, "dynamic int8": dynamic, "static int8": int8}
            top1 = zero_shot_top1(
                encoders, model, Path(args.zeroshot_dir), inputs["classnames"],
                args.zeroshot_templates,
            )  # fmt: skip
            drop = top1["fp32"] - top1["static int8"]
            report["zero_shot_top1"] = top1 | {"drop_points": drop}
            status = "ok" if drop <= args.max_drop else f"ABOVE the {args.max_drop:g}-point goal"
            print(
                f"  zero-shot top-1 on {args.zeroshot_dir} ({top1['n']} images): fp32 "
                f"{top1['fp32']:.2f}%, dynamic int8 {top1['dynamic int8']:.2f}%, static int8 "
                f"{top1['static int8']:.2f}% (drop {drop:+.2f} points) {status}"
            )
            ok &= drop <= args.max_drop
    report["_runner"] = int8
    return report, ok


def _write_meta(model: nn.Module, args: argparse.Namespace, path: Path, files: list[str]) -> None:
    inputs = {
        "image": "images float32 (batch, 3, H, W), preprocessed",
        "text": "tokens int64 (batch, length <= context_length)",
    }
    meta = {
        "model": args.model,
        "pretrained": args.pretrained,
        "config": model.config.to_open_clip(),
        "preprocess": asdict(model.preprocess_cfg),
        "logit_scale": model.logit_scale.exp().item(),
        "inputs": {
            f: inputs["image" if f.startswith("image") else "text"]
            for f in files
            if f.endswith((".onnx", ".xml", ".plan"))
        },
        "outputs": "unnormalized embeddings (batch, embed_dim); L2-normalize before use",
    }
    path.write_text(json.dumps(meta, indent=2), encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import attn_clip
    from attn_core.hub import WeightsError

    inputs: dict[str, Any] = {}
    try:
        check_inputs(args)
        model = attn_clip.create_model(args.model, pretrained=args.pretrained)
        static = "int8-static" in args.quantize
        if static:  # read the inputs now: a bad CSV or folder stops before anything is written
            data = read_image_text(Path(args.calibration), model)
            calib_idx, eval_idx = calibration_split(len(data), args.calibration_size)
            calibration = load_rows(data, calib_idx, model)
            if not calibration["image"]:
                raise ValueError(f"--calibration {args.calibration}: no readable image")
            inputs["calibration"] = calibration
            inputs["check_rows"] = load_rows(data, eval_idx, model)
            inputs["held_out"] = not set(eval_idx) & set(calib_idx)
            inputs["classnames"] = classnames = None
            if args.zeroshot_classnames:
                lines = Path(args.zeroshot_classnames).read_text(encoding="utf-8").splitlines()
                classnames = [c.strip() for c in lines if c.strip()]
                inputs["classnames"] = classnames
            if args.zeroshot_dir:
                from attn_train.data import ImageFolderDataset

                ImageFolderDataset(args.zeroshot_dir, None, classnames)  # the folders match
    except (ValueError, OSError, KeyError, WeightsError) as err:
        message = one_line(str(err).strip("'\""))  # a KeyError's text comes quoted
        print(f"error: {message}", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    if args.pretrained is None:
        print("note: no --pretrained given: random weights (a dry run of the export)")
    name = args.model if isinstance(args.model, str) else "model"
    out = Path(args.out or Path("exports") / Path(name.replace(":", "_")).name)
    out.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    try:
        result, written, failed = run(args, model, stage, threads, inputs)
        out.mkdir(exist_ok=True)
        for f in written:
            os.replace(stage / f, out / f)
        print(f"wrote {', '.join(written)} to {out}/")
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2), encoding="utf-8")
    print("all checks passed" if not failed else "SOME CHECKS FAILED")
    return 1 if failed else 0


if __name__ == "__main__":
    run_main(main)
