"""Export a CLIP's image and text towers to ONNX, and/or quantize its Linear layers to int8.

    uv run scripts/export.py --model ViT-B-32 --pretrained laion2b_s34b_b79k --format onnx
    uv run scripts/export.py --model ViT-B-32 --pretrained path/open_clip_model.safetensors \\
        --format onnx --out exports/vit-b-32
    uv run scripts/export.py --model ViT-B-32 --quantize int8      # random weights: a dry run

``--format onnx`` writes ``OUT/image.onnx`` (``images (batch, 3, H, W)`` float32 ->
``image_embeds (batch, E)``) and ``OUT/text.onnx`` (``tokens (batch, length)`` int64 ->
``text_embeds (batch, E)``), two separate graphs with a dynamic batch and a dynamic text
length (any ``length <= context_length``, e.g. the tokenizer's 77 columns or fewer). The
embeddings are *not* L2-normalized (as ``encode_image`` / ``encode_text`` with
``normalize=False``); ``OUT/export.json`` keeps the model config, preprocessing and
``logit_scale``. Each graph is then run with onnxruntime at two batch sizes (and two text
lengths) and compared with PyTorch; the script prints the max abs differences and fails
(exit code 1) if any is above ``--atol`` (1e-4).

``--quantize int8`` applies ``torch.ao`` dynamic int8 quantization to every ``nn.Linear``
(int8 weights, activations quantized on the fly; fbgemm / oneDNN kernels on x86) and
reports the speed ratio to the fp32 model and the cosine similarity of the int8 embeddings
to the fp32 ones (goal >= 0.99), and saves the quantized model with ``torch.save`` as
``OUT/clip_int8.pt`` (a pickled module: load only files you trust). Both flags combine.

Exit codes: 0 ok, 1 a check failed, 2 bad input (unknown model, missing file, ...).
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
import warnings
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from attn_train.cli import HelpFormatter, one_line, run_main
from torch import nn

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


def export_onnx(
    model: nn.Module, out: Path, opset: int = 18, atol: float = 1e-4, verbose: bool = True
) -> dict[str, float]:
    """Write ``out/image.onnx`` and ``out/text.onnx``, check them with onnxruntime against
    PyTorch at two batch sizes / text lengths; returns ``{check name: max abs diff}``."""
    import onnxruntime as ort

    out.mkdir(parents=True, exist_ok=True)
    model = plain_copy(model)
    ctx = model.config.text.context_length
    images, tokens = _example_inputs(model, 2)
    towers = {
        "image": (ImageTower(model), images, "images", "image_embeds"),
        "text": (TextTower(model), tokens, "tokens", "text_embeds"),
    }
    diffs: dict[str, float] = {}
    for name, (tower, example, in_name, out_name) in towers.items():
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
            )
        if verbose:
            mb = path.stat().st_size / 2**20
            print(f"wrote {path} ({mb:.1f} MB) in {time.perf_counter() - start:.1f} s")
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        cases = [(3, None), (1, None)] if name == "image" else [(3, None), (1, max(2, ctx // 4))]
        for b, length in cases:
            imgs, toks = _example_inputs(model, b, length)
            x = imgs if name == "image" else toks
            with torch.no_grad():
                ref = tower(x).numpy()
            got = session.run([out_name], {in_name: x.numpy()})[0]
            diff = float(abs(got - ref).max())
            key = f"{name} batch {b}" + (f" length {x.shape[1]}" if name == "text" else "")
            diffs[key] = diff
            if verbose:
                status = "ok" if diff <= atol else f"FAILED (> {atol:g})"
                print(f"  onnxruntime vs PyTorch, {key}: max abs diff {diff:.2e} {status}")
    return diffs


def quantize_int8(model: nn.Module) -> nn.Module:
    """A copy of ``model`` with every ``nn.Linear`` dynamically quantized to int8."""
    from torch.ao.quantization import quantize_dynamic

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao's deprecation notices
        return quantize_dynamic(copy.deepcopy(model).eval(), {nn.Linear}, dtype=torch.qint8)


def _median_time(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def int8_report(
    model: nn.Module,
    qmodel: nn.Module,
    batch: int = 8,
    repeats: int = 5,
    verbose: bool = True,
) -> dict[str, Any]:
    """Speed ratio and cosine similarity of the int8 model to the fp32 one."""
    from attn_clip import IMAGENET_CLASSNAMES, OPENAI_IMAGENET_TEMPLATES, get_tokenizer

    images, _ = _example_inputs(model, batch)
    tokenizer = get_tokenizer(model.config)
    tokens = tokenizer([t(IMAGENET_CLASSNAMES[0]) for t in OPENAI_IMAGENET_TEMPLATES])
    report: dict[str, Any] = {}
    with torch.inference_mode():
        for name, args, encode in (
            (f"image batch {batch}", images, "encode_image"),
            (f"text {len(tokens)} prompts", tokens, "encode_text"),
        ):
            fp32 = getattr(model, encode)(args)
            int8 = getattr(qmodel, encode)(args)
            cos = F.cosine_similarity(fp32, int8, dim=-1)
            t32 = _median_time(lambda e=encode, a=args: getattr(model, e)(a), repeats)
            t8 = _median_time(lambda e=encode, a=args: getattr(qmodel, e)(a), repeats)
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


def _size_mb(model: nn.Module) -> float:
    import io

    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    return buf.tell() / 2**20


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("--model", required=True, help="architecture name (ViT-B-32), hf-hub:, folder")
    p.add_argument("--pretrained", default=None, help="pretrained tag or checkpoint path")
    p.add_argument("--format", choices=["onnx"], default=None, help="export format")
    p.add_argument("--quantize", choices=["int8"], default=None, help="dynamic quantization")
    p.add_argument("--out", default=None, help="output folder (default exports/<model>)")
    p.add_argument("--opset", type=int, default=18, help="ONNX opset (default 18)")
    p.add_argument("--atol", type=float, default=1e-4, help="onnxruntime check tolerance")
    p.add_argument("--batch", type=int, default=8, help="image batch for the int8 timing")
    p.add_argument("--repeats", type=int, default=5, help="timed repeats for the int8 report")
    p.add_argument("--json", default=None, help="also write the checks here")
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = build_parser()
    args = p.parse_args(argv)
    if args.format is None and args.quantize is None:
        p.error("nothing to do: pass --format onnx and/or --quantize int8")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import attn_clip
    from attn_core.hub import WeightsError

    if args.out is not None and Path(args.out).is_file():
        print(f"error: --out {args.out} is a file, not a folder", file=sys.stderr)
        return 2
    try:
        model = attn_clip.create_model(args.model, pretrained=args.pretrained)
    except (ValueError, OSError, KeyError, WeightsError) as err:
        message = one_line(str(err).strip("'\""))  # a KeyError's text comes quoted
        print(f"error: {message}", file=sys.stderr)
        return 2
    if args.pretrained is None:
        print("note: no --pretrained given: random weights (a dry run of the export)")
    name = args.model if isinstance(args.model, str) else "model"
    out = Path(args.out or Path("exports") / Path(name.replace(":", "_")).name)
    result: dict[str, Any] = {"model": args.model, "pretrained": args.pretrained}
    failed = False
    if args.format == "onnx":
        print(f"exporting {args.model} to ONNX (opset {args.opset}) in {out}/")
        diffs = export_onnx(model, out, args.opset, args.atol)
        result["onnx_max_abs_diff"] = diffs
        failed |= any(d > args.atol for d in diffs.values())
        meta = {
            "model": args.model,
            "pretrained": args.pretrained,
            "config": model.config.to_open_clip(),
            "preprocess": asdict(model.preprocess_cfg),
            "logit_scale": model.logit_scale.exp().item(),
            "inputs": {"image.onnx": "images float32 (batch, 3, H, W), preprocessed",
                       "text.onnx": "tokens int64 (batch, length <= context_length)"},
            "outputs": "unnormalized embeddings (batch, embed_dim); L2-normalize before use",
        }  # fmt: skip
        (out / "export.json").write_text(json.dumps(meta, indent=2), encoding="utf-8")
    if args.quantize == "int8":
        print("quantizing every nn.Linear to int8 (torch.ao dynamic quantization)")
        qmodel = quantize_int8(model)
        report = int8_report(model, qmodel, args.batch, args.repeats)
        report["size_mb"] = {"fp32": _size_mb(model), "int8": _size_mb(qmodel)}
        sizes = report["size_mb"]
        print(f"  state dict {sizes['fp32']:.0f} MB -> {sizes['int8']:.0f} MB")
        result["int8"] = report
        failed |= any(r["cosine_min"] < 0.99 for k, r in report.items() if k != "size_mb")
        out.mkdir(parents=True, exist_ok=True)
        torch.save(qmodel, out / "clip_int8.pt")
        print(f"wrote {out / 'clip_int8.pt'}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2), encoding="utf-8")
    print("all checks passed" if not failed else "SOME CHECKS FAILED")
    return 1 if failed else 0


if __name__ == "__main__":
    run_main(main)
