"""Every export and quantization step in one call, with its checks: :func:`export_clip`."""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ._deps import check_installed, require
from .evaluate import (
    Encoders,
    cosine_to_fp32,
    int8_report,
    speed_table,
    state_dict_mb,
    zero_shot_top1,
)
from .onnx import export_onnx
from .openvino import OpenVINOTower, compile_openvino, to_openvino
from .quantize import Calibration, keep_fp32, quantize_dynamic_int8, quantize_static
from .tensorrt import export_tensorrt, tensorrt_missing
from .towers import check_runtime

FORMATS = ("onnx", "openvino", "tensorrt")
QUANTIZE = ("int8", "int8-static")


def requirements(formats: Sequence[str], quantize: Sequence[str] = ()) -> list[str]:
    """The optional packages (the ``export`` extra) that :func:`export_clip` imports for
    ``formats`` and ``quantize`` (every path starts from the checked ONNX graphs)."""
    static = "int8-static" in quantize
    needed = ["onnx", "onnxscript", "onnxruntime"] if formats or static else []
    needed += ["openvino"] if "openvino" in formats or static else []
    return needed + (["nncf"] if static else [])


def export_clip(
    model: nn.Module,
    out_dir: str | os.PathLike,
    formats: Sequence[str] = ("onnx",),
    quantize: Sequence[str] = (),
    *,
    name: str | None = None,
    pretrained: str | None = None,
    opset: int = 18,
    atol: float = 1e-4,
    batch: int = 8,
    repeats: int = 5,
    threads: int | None = None,
    calibration: Calibration | None = None,
    zeroshot: Any = None,
    zeroshot_templates: Sequence[str] = ("a photo of a {}",),
    max_drop: float = 1.0,
    verbose: bool = True,
) -> tuple[dict[str, Any], list[str], bool]:
    """Export ``model``'s towers to ``formats`` (of :data:`FORMATS`) and/or quantize it
    (:data:`QUANTIZE`) into ``out_dir``, checking each result; returns ``(report, files
    written, failed)``, ``failed`` when a check missed its goal (max abs diff above ``atol``,
    an int8 cosine below 0.99, a zero-shot top-1 drop above ``max_drop`` points).

    ``"int8-static"`` needs ``calibration`` (:func:`~attn_clip.export.calibration_set`);
    ``zeroshot``: a dataset with ``.classes`` and ``(preprocessed image, label)`` items for
    the top-1 check. ``threads``: of the OpenVINO runtimes (default torch's); ``batch`` /
    ``repeats``: the timings. Writes ``export.json`` (config, preprocessing, ``logit_scale``,
    the inputs of every graph) next to the graphs; ``name`` / ``pretrained`` go in it."""
    formats, quantize = list(dict.fromkeys(formats)), list(dict.fromkeys(quantize))
    unknown = [f for f in formats if f not in FORMATS] + [q for q in quantize if q not in QUANTIZE]
    if unknown:
        raise ValueError(f"unknown format / quantization {unknown}: expected {FORMATS + QUANTIZE}")
    static = "int8-static" in quantize
    if static and calibration is None:
        raise ValueError("int8-static quantization needs calibration inputs")
    if "tensorrt" in formats and (why := tensorrt_missing()):
        raise RuntimeError(f"TensorRT export {why}")
    check_installed(*requirements(formats, quantize))
    say = print if verbose else lambda *args, **kwargs: None
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    threads = threads or torch.get_num_threads()
    result: dict[str, Any] = {"model": name, "pretrained": pretrained, "threads": threads}
    written: list[str] = []
    failed = False
    fp32 = (model.encode_image, model.encode_text)
    runners: dict[str, Encoders] = {"PyTorch fp32": fp32}
    with tempfile.TemporaryDirectory(prefix=".onnx-", dir=out) as tmp:
        onnx_dir = out if "onnx" in formats else Path(tmp)  # (not kept without "onnx")
        if formats or static:
            say(f"exporting {name or 'the model'} to ONNX (opset {opset})")
            diffs = export_onnx(model, onnx_dir, opset, atol, verbose)
            result["onnx_max_abs_diff"] = diffs
            failed |= any(d > atol for d in diffs.values())
            if "onnx" in formats:
                written += ["image.onnx", "text.onnx"]
        ov_models = {}
        if "openvino" in formats or static:
            keep = "openvino" in formats
            say("converting the ONNX graphs to OpenVINO IR (openvino.convert_model)")
            ov_models = to_openvino(onnx_dir, out if keep else onnx_dir, verbose and keep)
            compiled = {
                n: OpenVINOTower(compile_openvino(m, threads)) for n, m in ov_models.items()
            }
            if keep:
                written += ["image.xml", "image.bin", "text.xml", "text.bin"]
                diffs = check_runtime(model, compiled, "OpenVINO", atol, verbose)
                result["openvino_max_abs_diff"] = diffs
                failed |= any(d > atol for d in diffs.values())
            runners["OpenVINO fp32"] = (compiled["image"], compiled["text"])
        if "tensorrt" in formats:
            say("building TensorRT engines from the ONNX graphs")
            diffs = export_tensorrt(model, onnx_dir, out, atol, verbose)
            result["tensorrt_max_abs_diff"] = diffs
            failed |= any(d > atol for d in diffs.values())
            written += ["image.plan", "text.plan"]
        qmodel = quantize_dynamic_int8(model) if quantize else None
        if "int8" in quantize:
            say("quantizing every nn.Linear to int8 (torch.ao dynamic quantization)")
            report = int8_report(model, qmodel, batch, repeats, verbose)
            report["size_mb"] = sizes = {
                "fp32": state_dict_mb(model),
                "int8": state_dict_mb(qmodel),
            }
            say(f"  state dict {sizes['fp32']:.0f} MB -> {sizes['int8']:.0f} MB")
            result["int8"] = report
            failed |= any(r["cosine_min"] < 0.99 for k, r in report.items() if k != "size_mb")
            torch.save(qmodel, out / "clip_int8.pt")
            written.append("clip_int8.pt")
        if static:
            report, int8, ok = _static_int8(
                model, qmodel, ov_models, calibration, out, threads, zeroshot,
                list(zeroshot_templates), max_drop, verbose,
            )  # fmt: skip
            runners = {
                "PyTorch fp32": fp32,
                "PyTorch dynamic int8": (qmodel.encode_image, qmodel.encode_text),
                **{k: v for k, v in runners.items() if k != "PyTorch fp32"},
                "OpenVINO int8 static": int8,
            }
            result["int8_static"] = report
            written += ["image_int8.xml", "image_int8.bin", "text_int8.xml", "text_int8.bin"]
            failed |= not ok
        if len(runners) > 1:
            say(f"speed ({threads} threads each, medians of {repeats} interleaved calls):")
            result["speed_ms"] = speed_table(model, runners, batch, repeats, verbose)
    if formats or static:
        write_export_meta(model, out / "export.json", written, name, pretrained)
        written.append("export.json")
    return result, written, failed


def _static_int8(
    model: nn.Module,
    qmodel: nn.Module,
    ov_models: dict[str, Any],
    calibration: Calibration,
    out: Path,
    threads: int,
    zeroshot: Any,
    templates: list[str],
    max_drop: float,
    verbose: bool,
) -> tuple[dict[str, Any], Encoders, bool]:
    """Quantize, save, and check the cosine / zero-shot goals: ``(report, the compiled int8
    towers, goals met)``."""
    ov = require("openvino")
    say = print if verbose else lambda *args, **kwargs: None

    n_img, n_txt = len(calibration.rows["image"]), len(calibration.rows["text"])
    say(
        f"static int8 (NNCF on the OpenVINO model): calibrating on {n_img} images and "
        f"{n_txt} captions from {calibration.source or 'the calibration set'}"
    )
    vision = model.config.vision
    vit = vision.convnext is None and isinstance(vision.layers, int)
    start = time.perf_counter()
    quantized = quantize_static(ov_models, calibration.rows, vit)
    seconds = time.perf_counter() - start
    for name, q in quantized.items():
        ov.save_model(q, str(out / f"{name}_int8.xml"), compress_to_fp16=False)
    sizes = {n: (out / f"{n}_int8.bin").stat().st_size / 2**20 for n in quantized}
    say(
        f"  quantized in {seconds:.0f} s; image_int8.bin {sizes['image']:.1f} MB, "
        f"text_int8.bin {sizes['text']:.1f} MB"
    )
    compiled = {n: OpenVINOTower(compile_openvino(m, threads)) for n, m in quantized.items()}
    int8 = (compiled["image"], compiled["text"])
    fp32 = (model.encode_image, model.encode_text)
    dynamic = (qmodel.encode_image, qmodel.encode_text)
    report: dict[str, Any] = {
        "calibration": {"source": calibration.source, "images": n_img, "captions": n_txt},
        "quantize_s": seconds,
        "size_mb": sizes,
        "kept_fp32": {n: keep_fp32(m, n) for n, m in ov_models.items()},
    }
    ok = True
    with torch.inference_mode():
        where = "rows not used for calibration" if calibration.held_out else "calibration rows"
        report["cosine_to_fp32"] = {}
        for key, enc in (("static int8", int8), ("dynamic int8", dynamic)):
            cos = cosine_to_fp32(fp32, enc, calibration.check_rows)
            report["cosine_to_fp32"][key] = cos
            say(
                f"  {key} cosine to fp32 ({cos['image']['n']} {where}): image min "
                f"{cos['image']['min']:.4f} mean {cos['image']['mean']:.5f}, text min "
                f"{cos['text']['min']:.4f} mean {cos['text']['mean']:.5f}"
            )
        cos = report["cosine_to_fp32"]["static int8"]
        if min(cos["image"]["min"], cos["text"]["min"]) < 0.99:
            say("  static int8 cosine BELOW the 0.99 goal")
            ok = False
        if zeroshot is not None:
            encoders = {"fp32": fp32, "dynamic int8": dynamic, "static int8": int8}
            top1 = zero_shot_top1(encoders, model, zeroshot, templates)
            drop = top1["fp32"] - top1["static int8"]
            report["zero_shot_top1"] = top1 | {"drop_points": drop}
            status = "ok" if drop <= max_drop else f"ABOVE the {max_drop:g}-point goal"
            say(
                f"  zero-shot top-1 on {getattr(zeroshot, 'root', 'the zero-shot set')} "
                f"({top1['n']} images): fp32 {top1['fp32']:.2f}%, dynamic int8 "
                f"{top1['dynamic int8']:.2f}%, static int8 {top1['static int8']:.2f}% "
                f"(drop {drop:+.2f} points) {status}"
            )
            ok &= drop <= max_drop
    return report, int8, ok


def write_export_meta(
    model: nn.Module,
    path: str | os.PathLike,
    files: list[str],
    name: str | None = None,
    pretrained: str | None = None,
) -> None:
    """``export.json``: the model's config (open_clip form), preprocessing, ``logit_scale``
    and the inputs of each graph among ``files``."""
    inputs = {
        "image": "images float32 (batch, 3, H, W), preprocessed",
        "text": "tokens int64 (batch, length <= context_length)",
    }
    meta = {
        "model": name,
        "pretrained": pretrained,
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
    Path(path).write_text(json.dumps(meta, indent=2), encoding="utf-8")
