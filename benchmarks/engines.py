"""Section ``engines``: our CLIP ViT-B/32 image tower against ONNX Runtime and OpenVINO, both
fed the ONNX graph ``attn_clip.export.export_onnx`` writes from the same random weights,
interleaved in this one process, every runtime on the same number of threads.

Cases per image batch (1 / 8 / 32): ``fp32`` (ours, ONNX Runtime, OpenVINO with
``INFERENCE_PRECISION_HINT f32``), ``bf16`` (ours with bf16 weights, OpenVINO with the bf16
precision hint, on CPUs that have bf16 instructions; ONNX Runtime's CPU provider has no bf16
kernels for these ops) and ``int8`` (ours with ``torch.ao`` dynamic int8 Linear layers,
OpenVINO static int8 from ``attn_clip.export.quantize_static`` (NNCF), calibrated on generated
captioned-shapes images). Then the text tower in fp32 on OpenAI's 80 prompts of one class,
the engines fed the token batch cut after its longest prompt. fp32 rows check their max abs
difference to ours; bf16 and int8 rows their cosine to ours in fp32. Goals (issue 19): ours
>= 1.0x OpenVINO in fp32 and bf16, and for the text tower.

Threads: ``torch.get_num_threads()`` (``--threads``) for all three; OpenVINO with the latency
hint; ONNX Runtime without spinning between calls. PyTorch's OpenMP (GNU libgomp) threads
spin for a while after every op before they sleep; by default long enough to slow down the
other runtimes timed between its calls (3-30x on 2 cores). ``OMP_WAIT_POLICY=PASSIVE`` stops
that, but then our threads sleep after *every* op and are woken for the next one, tens of
microseconds each time, which at batch 1 costs ours 15-20% (docs/benchmarks.md, "where the
time goes"). Run this section with ``GOMP_SPINCOUNT=10000``: a spin of a few microseconds
bridges the gaps between our ops and is over before another runtime starts. The case names
say when neither is set. ``--quick``: the tiny CLIP, batch 1 and 8."""

from __future__ import annotations

import argparse
import os

import torch

from benchmarks.clip_models import prompts, random_clip_onnx
from benchmarks.harness import Report, cosine, max_diff, time_interleaved


def cpu_bf16() -> str:
    """What this CPU has for bf16, from /proc/cpuinfo: e.g. ``avx512_bf16, no AMX``."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            flags = next(
                (line.split(":", 1)[1].split() for line in f if line.startswith("flags")), []
            )
    except OSError:
        return "unknown"
    avx = "avx512_bf16" if "avx512_bf16" in flags else "no avx512_bf16"
    amx = "AMX" if "amx_bf16" in flags else "no AMX"
    return f"{avx}, {amx}"


def calibration_images(model: torch.nn.Module, n: int) -> list[torch.Tensor]:
    """``n`` generated captioned-shapes images, preprocessed for ``model``, one per item."""
    from attn_clip import image_transform
    from attn_train import shapes

    transform = image_transform(model.preprocess_cfg)
    return [transform(s.image())[None] for s in shapes.make_dataset(n, seed=1, image_size=64)]


def bench_engines(args: argparse.Namespace, report: Report) -> None:
    """Per batch: fp32, bf16 and int8 rows; goals >= 1.0x OpenVINO in fp32 and bf16."""
    import openvino as ov
    from attn_clip import IMAGENET_CLASSNAMES, Tokenizer, create_model
    from attn_clip import export as ex

    threads = torch.get_num_threads()
    policy = os.environ.get("OMP_WAIT_POLICY", "unset")
    spin = os.environ.get("GOMP_SPINCOUNT")
    note = "" if policy.upper() == "PASSIVE" or spin else "spinning threads: see engines.py"
    section = "CLIP image tower vs inference engines (" + ("tiny" if args.quick else "ViT-B/32")
    section += f", {threads} threads each)"
    ours, folder = random_clip_onnx(args.quick)  # the model and its graphs, shared: read-only
    config = ours.config
    # run.py runs the sections under inference_mode: the models and the quantization are
    # made outside it (inference tensors cannot be copied)
    with torch.inference_mode(False), torch.no_grad():
        ours16 = create_model(config, precision="bf16").eval()
        ours16.load_state_dict(ours.state_dict())
        ours8 = ex.quantize_dynamic_int8(ours)
        size = config.vision.image_size
        runners = ex.onnxruntime_runners(folder, threads, spin=False)
        ort, ort_text = runners["image"], runners["text"]
        ov_model = ov.convert_model(str(folder / "image.onnx"))
        ov_text = ex.OpenVINOTower(
            ex.compile_openvino(ov.convert_model(str(folder / "text.onnx")), threads, "f32")
        )
        ov32 = ex.OpenVINOTower(ex.compile_openvino(ov_model, threads, "f32"))
        has_bf16 = "BF16" in ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")
        ov16 = (
            ex.OpenVINOTower(ex.compile_openvino(ov_model, threads, "bf16")) if has_bf16 else None
        )
        calib = calibration_images(ours, 8 if args.quick else 64)
        ov8_model = ex.quantize_static({"image": ov_model}, {"image": calib})["image"]
        ov8 = ex.OpenVINOTower(ex.compile_openvino(ov8_model, threads, "f32"))
    bf16_label = f"bf16 ({cpu_bf16()})"

    with torch.inference_mode():
        for bs in args.batches:
            x = torch.randn(bs, 3, size, size)
            inner = args.inner if bs == 1 else 1
            ref = ours.encode_image(x)
            fns = {
                "ours": lambda x=x: ours.encode_image(x),
                "ONNX Runtime": lambda x=x: ort(x),
                "OpenVINO": lambda x=x: ov32(x),
            }
            checks = {
                k: f"max diff {max_diff(f(), ref):.1e}" for k, f in fns.items() if k != "ours"
            }
            checks["ours"] = "reference for the diffs"
            t = time_interleaved(fns, args.repeats, inner=inner)
            rows = report.add_case(
                section, f"fp32 batch {bs}", t, bs, "img", checks=checks, note=note
            )
            ratio = rows["OpenVINO"].ref_over_ours
            report.goal(
                f"image tower fp32 batch {bs} vs OpenVINO",
                ">= 1.0x OpenVINO (same threads, same weights)",
                f"{ratio:.2f}x (ONNX Runtime {rows['ONNX Runtime'].ref_over_ours:.2f}x)",
                ratio >= 1.0,
            )

            xb = x.bfloat16()
            fns = {"ours bf16": lambda xb=xb: ours16.encode_image(xb)}
            if ov16 is not None:
                fns["OpenVINO bf16"] = lambda x=x: ov16(x)
            checks = {k: f"cos to fp32 {cosine(f(), ref):.5f}" for k, f in fns.items()}
            t = time_interleaved(fns, args.repeats, inner=inner)
            rows = report.add_case(
                section, f"{bf16_label} batch {bs}", t, bs, "img", ours="ours bf16",
                checks=checks, note=note,
            )  # fmt: skip
            if ov16 is not None:
                ratio, cos = rows["OpenVINO bf16"].ref_over_ours, cosine(fns["ours bf16"](), ref)
                report.goal(
                    f"image tower bf16 batch {bs} vs OpenVINO",
                    ">= 1.0x OpenVINO bf16, cosine >= 0.999",
                    f"{ratio:.2f}x, cosine {cos:.5f}",
                    ratio >= 1.0 and cos >= 0.999,
                )

            fns = {
                "ours dynamic int8": lambda x=x: ours8.encode_image(x),
                "OpenVINO static int8": lambda x=x: ov8(x),
            }
            checks = {k: f"cos to fp32 {cosine(f(), ref):.5f}" for k, f in fns.items()}
            t = time_interleaved(fns, args.repeats, inner=inner)
            report.add_case(
                section, f"int8 batch {bs}", t, bs, "img", ours="ours dynamic int8",
                checks=checks, note=note,
            )  # fmt: skip

        # the text tower on OpenAI's 80 prompts of one class; the engines get the token batch
        # cut after its longest prompt (ours truncates and shares prefixes by itself)
        tokens = Tokenizer(config.text.context_length)(prompts(IMAGENET_CLASSNAMES[0]))
        cut = tokens[:, : int(tokens.argmax(dim=-1).max()) + 1]  # EOT has the largest id
        ref = ours.encode_text(tokens)
        fns = {
            "ours": lambda: ours.encode_text(tokens),
            "ONNX Runtime": lambda: ort_text(cut),
            "OpenVINO": lambda: ov_text(cut),
        }
        checks = {k: f"max diff {max_diff(f(), ref):.1e}" for k, f in fns.items() if k != "ours"}
        checks["ours"] = f"reference; engines get {cut.shape[1]} of {tokens.shape[1]} tokens"
        t = time_interleaved(fns, args.repeats)
        rows = report.add_case(
            section, "fp32 text, 80 prompts", t, len(tokens), "prompt", checks=checks, note=note
        )
        ratio = rows["OpenVINO"].ref_over_ours
        report.goal(
            "text tower fp32, 80 prompts vs OpenVINO",
            ">= 1.0x OpenVINO (the same truncated token batch)",
            f"{ratio:.2f}x (ONNX Runtime {rows['ONNX Runtime'].ref_over_ours:.2f}x)",
            ratio >= 1.0,
        )
