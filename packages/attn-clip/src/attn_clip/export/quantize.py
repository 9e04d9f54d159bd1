"""int8: dynamic (``torch.ao``, every ``nn.Linear``) and static (NNCF on the OpenVINO model,
calibrated on real inputs), and the calibration inputs."""

from __future__ import annotations

import copy
import logging
import warnings
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ._deps import require
from .openvino import signal_stack_kept
from .towers import cut_tokens


def quantize_dynamic_int8(model: nn.Module) -> nn.Module:
    """A copy of ``model`` with every ``nn.Linear`` dynamically quantized to int8 (int8
    weights, activations quantized on the fly; fbgemm / oneDNN kernels on x86)."""
    from torch.ao.quantization import quantize_dynamic

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao's deprecation notices
        return quantize_dynamic(copy.deepcopy(model).eval(), {nn.Linear}, dtype=torch.qint8)


@dataclass
class Calibration:
    """The inputs of static int8, ``{"image": [(1, 3, H, W)], "text": [(1, L)]}`` each:
    ``rows`` to calibrate on, ``check_rows`` for the cosine check; ``held_out``: no row is
    in both; ``source``: where they came from (for the report)."""

    rows: dict[str, list[torch.Tensor]]
    check_rows: dict[str, list[torch.Tensor]]
    held_out: bool = True
    source: str = ""


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
    ``indices`` of ``data`` (items ``(preprocessed image, caption)`` or None for an
    unreadable one; each caption cut after its own pooled token)."""
    from ..tokenizer import get_tokenizer

    tokenizer = get_tokenizer(model.config)
    rows: dict[str, list[torch.Tensor]] = {"image": [], "text": []}
    for i in indices:
        item = data[i]
        if item is None:
            continue
        rows["image"].append(item[0][None])
        rows["text"].append(cut_tokens(model, tokenizer([item[1]])))
    return rows


def calibration_set(
    data: Any, size: int, model: nn.Module, source: str = "", eval_size: int = 200
) -> Calibration:
    """:class:`Calibration` from a dataset of ``(preprocessed image, caption)`` items:
    ``size`` rows spread over it, and up to ``eval_size`` others for the check."""
    calib, check = calibration_split(len(data), size, eval_size)
    return Calibration(
        rows=load_rows(data, calib, model),
        check_rows=load_rows(data, check, model),
        held_out=not set(check) & set(calib),
        source=source,
    )


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


def cpu_has_vnni() -> bool:
    """Whether this CPU has VNNI int8 dot products (AVX512-VNNI, AVX-VNNI or AMX), read from
    ``/proc/cpuinfo``; False where that cannot be read."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            flags = next((ln for ln in f if ln.startswith("flags")), "").split()
    except OSError:
        return False
    return bool({"avx512_vnni", "avx_vnni", "amx_int8"} & set(flags))


def quantize_static(
    ov_models: dict[str, Any],
    calibration: dict[str, list[torch.Tensor]],
    vit: bool = True,
    overflow_fix: bool | None = None,
) -> dict[str, Any]:
    """NNCF post-training static quantization of each OpenVINO tower (``{"image": model,
    "text": model}``, e.g. from :func:`~attn_clip.export.to_openvino`) with its calibration
    inputs: int8 weights (per channel) and activations (per tensor), transformer rules
    (SmoothQuant; softmax and norms float) for ViT and text towers, :func:`keep_fp32`.

    ``overflow_fix``: NNCF's overflow fix on every layer (weights in 7 bits), for CPUs without
    VNNI, whose int8 kernels (``vpmaddubsw``) saturate pairs of products at int16: there the
    text tower of tests/scripts/test_export.py fell to a cosine of 0.9865 to fp32 without it,
    and kept >= 0.99 with it. ``None``: on where this CPU has no VNNI (:func:`cpu_has_vnni`)."""
    logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)  # "no CUDA" note
    nncf = require("nncf")

    nncf.set_log_level(logging.ERROR)
    fix = not cpu_has_vnni() if overflow_fix is None else overflow_fix
    # off: NNCF's defaults, as before
    advanced = (
        nncf.AdvancedQuantizationParameters(overflow_fix=nncf.OverflowFix.ENABLE) if fix else None
    )
    quantized = {}
    for name, ov_model in ov_models.items():
        data = [x.numpy() for x in calibration[name]]
        transformer = name == "text" or vit
        with warnings.catch_warnings(), signal_stack_kept():  # NNCF compiles models too
            warnings.simplefilter("ignore")
            quantized[name] = nncf.quantize(
                ov_model,
                nncf.Dataset(data),
                subset_size=len(data),
                model_type=nncf.ModelType.TRANSFORMER if transformer else None,
                ignored_scope=nncf.IgnoredScope(names=keep_fp32(ov_model, name), validate=False),
                advanced_parameters=advanced,
            )
    return quantized
