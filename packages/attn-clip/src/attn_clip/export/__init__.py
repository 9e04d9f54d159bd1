"""Export a CLIP's image and text towers to ONNX / OpenVINO / TensorRT and quantize them to
int8, each result checked against the PyTorch model.

    from attn_clip import create_model, export

    model = create_model("ViT-B-32", pretrained="laion2b_s34b_b79k")
    export.export_onnx(model, "exports/vit-b-32")        # image.onnx, text.onnx; max abs diffs
    ov_models = export.to_openvino("exports/vit-b-32", "exports/vit-b-32")  # image.xml, text.xml
    int8 = export.quantize_dynamic_int8(model)           # torch.ao, every nn.Linear
    report, files, failed = export.export_clip(model, "out", ["onnx", "openvino"], ["int8"])

The graphs take ``images (batch, 3, H, W)`` float32 / ``tokens (batch, length)`` int64 and
return *unnormalized* embeddings, with a dynamic batch and text length. Static int8
(:func:`quantize_static`) is NNCF post-training quantization of the OpenVINO models with
calibration inputs (:func:`calibration_set`). The command line is ``scripts/export.py`` in
the attn-zoo repository.

onnx, onnxscript, onnxruntime, openvino and nncf are imported only by the functions that use
them: ``pip install 'attn-clip[export]'`` (TensorRT: a CUDA device and ``pip install
tensorrt``). Without them a function raises an ``ImportError`` that says so.
"""

from ._deps import EXTRA, check_installed, require
from .evaluate import (
    Encoders,
    cosine_to_fp32,
    int8_report,
    speed_table,
    state_dict_mb,
    time_interleaved,
    timing_inputs,
    zero_shot_top1,
)
from .onnx import export_onnx, onnxruntime_runners
from .openvino import OpenVINOTower, compile_openvino, signal_stack_kept, to_openvino
from .pipeline import FORMATS, QUANTIZE, export_clip, requirements, write_export_meta
from .quantize import (
    Calibration,
    calibration_set,
    calibration_split,
    keep_fp32,
    load_rows,
    quantize_dynamic_int8,
    quantize_static,
)
from .tensorrt import TensorRTTower, export_tensorrt, tensorrt_missing
from .towers import (
    TOWERS,
    ImageTower,
    TextTower,
    check_runtime,
    cut_tokens,
    example_inputs,
    plain_copy,
)

__all__ = [
    "EXTRA",
    "FORMATS",
    "QUANTIZE",
    "TOWERS",
    "Calibration",
    "Encoders",
    "ImageTower",
    "OpenVINOTower",
    "TensorRTTower",
    "TextTower",
    "calibration_set",
    "calibration_split",
    "check_installed",
    "check_runtime",
    "compile_openvino",
    "cosine_to_fp32",
    "cut_tokens",
    "example_inputs",
    "export_clip",
    "export_onnx",
    "export_tensorrt",
    "int8_report",
    "keep_fp32",
    "load_rows",
    "onnxruntime_runners",
    "plain_copy",
    "quantize_dynamic_int8",
    "quantize_static",
    "require",
    "signal_stack_kept",
    "requirements",
    "speed_table",
    "state_dict_mb",
    "tensorrt_missing",
    "time_interleaved",
    "timing_inputs",
    "to_openvino",
    "write_export_meta",
    "zero_shot_top1",
]
