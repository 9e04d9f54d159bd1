"""Export a CLIP's image and text towers to ONNX / OpenVINO / TensorRT, and/or quantize them
to int8 (dynamic, or static with calibration): a recipe over ``attn_clip.export``.

    uv run scripts/export.py --model ViT-B-32 --pretrained laion2b_s34b_b79k --format onnx
    uv run scripts/export.py --model ViT-B-32 --pretrained path/open_clip_model.safetensors \\
        --format onnx openvino --out exports/vit-b-32
    uv run scripts/export.py --model ViT-B-32 --quantize int8      # random weights: a dry run
    uv run scripts/export.py --model demo-shapes --pretrained shapes --quantize int8-static \\
        --calibration data/shapes32/train.csv --zeroshot-dir data/shapes32/heldout \\
        --zeroshot-classnames data/shapes32/classnames.txt

``--format onnx`` writes ``OUT/image.onnx`` (``images (batch, 3, H, W)`` float32 ->
``image_embeds (batch, E)``) and ``OUT/text.onnx`` (``tokens (batch, length)`` int64 ->
``text_embeds (batch, E)``) with a dynamic batch and text length (any ``length <=
context_length``); the embeddings are *not* L2-normalized. ``OUT/export.json`` keeps the
model config, preprocessing and ``logit_scale``. Each graph is run with onnxruntime at two
batch sizes (and two text lengths) and compared with PyTorch: exit code 1 if any max abs
difference is above ``--atol`` (1e-4).

``--format openvino`` converts those graphs to OpenVINO IR (``OUT/image.xml`` / ``.bin``,
``OUT/text.xml`` / ``.bin``, fp32), checks them the same way (``INFERENCE_PRECISION_HINT
f32``) and times them against PyTorch, interleaved, with the same thread count.
``--format tensorrt`` builds fp32 TensorRT engines (``OUT/image.plan``, ``OUT/text.plan``)
and checks them on the GPU; without a CUDA device or the ``tensorrt`` package it refuses
(exit 2). Formats combine: ``--format onnx openvino``.

``--quantize int8``: ``torch.ao`` dynamic int8 of every ``nn.Linear``; reports the speed
ratio and the cosine of the int8 embeddings to the fp32 ones (goal >= 0.99) and saves
``OUT/clip_int8.pt`` (a pickled module: load only files you trust). ``--quantize int8-static
--calibration CSV_OR_DIR``: NNCF static int8 of the OpenVINO model, calibrated on
``--calibration-size`` (300) inputs of an open_clip-style CSV (``filepath,title``) or an
ImageFolder (``"a photo of a {class}"`` as text); writes ``OUT/image_int8.xml`` /
``OUT/text_int8.xml`` (+ ``.bin``) and reports the cosine to fp32 on rows not used for
calibration (goal >= 0.99), zero-shot top-1 on ``--zeroshot-dir`` (goal: a drop of at most
``--max-drop`` points) and the speed of every runtime. Both ``--quantize`` values combine.

Nothing is written for bad input; the outputs are written to a hidden folder next to OUT
and moved in when every step has run. Exit codes: 0 ok, 1 a check failed, 2 bad input
(unknown model, missing file, no GPU for TensorRT, ...), 130 Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from attn_core.cli import HelpFormatter, one_line, run  # first: Ctrl-C while torch loads

# PyTorch's OpenMP threads spin after each call by default and, in one process with
# OpenVINO's or onnxruntime's threads, take the cores from them (and then wait for them):
# interleaved timings came out 7-80x too slow on 2 cores (docs/benchmarks.md). Read once,
# when torch loads.
if __name__ == "__main__":
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
from attn_clip import export as clip_export  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("--model", required=True, help="architecture name (ViT-B-32), hf-hub:, folder")
    p.add_argument("--pretrained", default=None, help="pretrained tag or checkpoint path")
    p.add_argument(
        "--format", nargs="+", choices=clip_export.FORMATS, default=None, help="export format(s)"
    )
    p.add_argument(
        "--quantize", nargs="+", choices=clip_export.QUANTIZE, default=None, help="int8 mode(s)"
    )
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
    """``ValueError`` / ``ImportError`` (one line) for any bad input, before anything is
    loaded or written."""
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
    if "tensorrt" in args.format and (why := clip_export.tensorrt_missing()):
        raise ValueError(f"--format tensorrt {why}")
    clip_export.check_installed(*clip_export.requirements(args.format, args.quantize))


def read_image_text(path: Path, model: torch.nn.Module, template: str = "a photo of a {}") -> Any:
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


def read_static_inputs(args: argparse.Namespace, model: torch.nn.Module) -> tuple[Any, Any]:
    """``(Calibration, zero-shot ImageFolder or None)``: read before anything is written."""
    import attn_clip
    from attn_train.data import ImageFolderDataset

    data = read_image_text(Path(args.calibration), model)
    size = args.calibration_size
    calibration = clip_export.calibration_set(data, size, model, str(args.calibration))
    if not calibration.rows["image"]:
        raise ValueError(f"--calibration {args.calibration}: no readable image")
    if not args.zeroshot_dir:
        return calibration, None
    classnames = None
    if args.zeroshot_classnames:
        lines = Path(args.zeroshot_classnames).read_text(encoding="utf-8").splitlines()
        classnames = [c.strip() for c in lines if c.strip()]
    transform = attn_clip.image_transform(model.preprocess_cfg)
    return calibration, ImageFolderDataset(args.zeroshot_dir, transform, classnames)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import attn_clip
    from attn_core.hub import WeightsError

    calibration = zeroshot = None
    try:
        check_inputs(args)
        model = attn_clip.create_model(args.model, pretrained=args.pretrained)
        if "int8-static" in args.quantize:  # a bad CSV or folder stops before any writing
            calibration, zeroshot = read_static_inputs(args, model)
    except (ValueError, OSError, KeyError, ImportError, WeightsError) as err:
        message = one_line(str(err).strip("'\""))  # a KeyError's text comes quoted
        print(f"error: {message}", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.pretrained is None:
        print("note: no --pretrained given: random weights (a dry run of the export)")
    name = args.model if isinstance(args.model, str) else "model"
    out = Path(args.out or Path("exports") / Path(name.replace(":", "_")).name)
    out.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    try:
        result, written, failed = clip_export.export_clip(
            model, stage, args.format, args.quantize, name=args.model,
            pretrained=args.pretrained, opset=args.opset, atol=args.atol, batch=args.batch,
            repeats=args.repeats, threads=torch.get_num_threads(), calibration=calibration,
            zeroshot=zeroshot, zeroshot_templates=args.zeroshot_templates,
            max_drop=args.max_drop,
        )  # fmt: skip
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
    run(main)
