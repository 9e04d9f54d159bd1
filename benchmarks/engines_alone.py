"""Section ``engines-alone``: ours against OpenVINO with each runtime **alone in its own
process**, as a deployment runs one of them: a CLIP image tower (ViT-B/32 by default, or
``--alone-model ViT-B-16``), fp32 and bf16 (``--precisions``), same random weights, same
threads.

The ``engines`` section times the runtimes interleaved in one process, where PyTorch's OpenMP
threads need ``GOMP_SPINCOUNT`` (or ``OMP_WAIT_POLICY=PASSIVE``, which costs ours tens of
microseconds per op at batch 1) to leave the cores to the other runtime (docs/benchmarks.md).
Here every round starts one process per runtime, alternating (ours, OpenVINO, ours, ...),
each with the default OpenMP policy and the parent's thread count: no runtime shares the
cores with another. A row's median is the median over rounds of each process's median call,
its min the fastest round; outputs are compared to ours (fp32: max abs diff; bf16: cosine to
ours in fp32). ``--rounds`` (3; ``--quick`` 1), ``--quick``: the tiny CLIP."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.clip_models import random_clip, random_clip_config, random_clip_onnx
from benchmarks.harness import Report, Timing, time_interleaved

ROOT = Path(__file__).resolve().parents[1]  # the repository: children run `-m benchmarks...`
PRECISIONS = ("fp32", "bf16")


def child(
    runtime: str, config: Any, precisions: list[str], batches: list[int], repeats: int,
    out: Path, onnx: Path,
) -> None:  # fmt: skip
    """Time one runtime on every case; write ``{case: median ms}`` and the outputs. OpenVINO
    runs ``onnx``, the graph of ``random_clip(config)``'s image tower the parent exported."""
    from attn_clip import create_model
    from attn_clip import export as ex

    threads = torch.get_num_threads()
    if runtime == "ours":
        model = random_clip(config)
        ours16 = create_model(config, precision="bf16").eval()
        ours16.load_state_dict(model.state_dict())
        fns = {"fp32": lambda x: model.encode_image(x), "bf16": lambda x: ours16.encode_image(x)}
        cast = {"fp32": lambda x: x, "bf16": lambda x: x.bfloat16()}
    else:
        import openvino as ov

        graph = ov.convert_model(str(onnx))
        hints = {"fp32": "f32", "bf16": "bf16"}
        fns = {
            p: ex.OpenVINOTower(ex.compile_openvino(graph, threads, hints[p]))
            for p in {"fp32", *precisions}
        }
        cast = {"fp32": lambda x: x, "bf16": lambda x: x}
    size = config.vision.image_size
    result = {}
    with torch.inference_mode():
        for bs in batches:
            x = torch.randn(bs, 3, size, size, generator=torch.Generator().manual_seed(bs))
            inner = 10 if bs == 1 else 1
            if "fp32" not in precisions:  # the reference of the bf16 check
                np.save(out / f"{runtime}-fp32-{bs}.npy", fns["fp32"](x).numpy())
            for p in precisions:
                xi, fn = cast[p](x), fns[p]
                np.save(out / f"{runtime}-{p}-{bs}.npy", fn(xi).float().numpy())
                t = time_interleaved({p: lambda fn=fn, xi=xi: fn(xi)}, repeats, inner=inner)
                result[f"{p} batch {bs}"] = t[p].median * 1e3
    (out / f"{runtime}.json").write_text(json.dumps(result))


def cosine_to(a: np.ndarray, ref: np.ndarray) -> float:
    """Cosine between two whole output arrays."""
    return float((a * ref).sum() / np.linalg.norm(a) / np.linalg.norm(ref))


def bench_engines_alone(args: argparse.Namespace, report: Report) -> None:
    """One row pair per precision and batch; goals >= 1.0x OpenVINO, each runtime alone."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}  # the default
    threads = torch.get_num_threads()
    name = "tiny CLIP" if args.quick else args.alone_model
    times: dict[str, dict[str, list[float]]] = {"ours": {}, "openvino": {}}
    onnx = random_clip_onnx(args.quick, args.alone_model)[1] / "image.onnx"  # exported here
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for runtime in times:
                folder = Path(tmp) / f"{runtime}{r}"
                folder.mkdir()
                cmd = [sys.executable, "-m", "benchmarks.engines_alone", runtime, str(folder)]
                cmd += ["--repeats", str(args.repeats), "--threads", str(threads)]
                cmd += ["--batches", *map(str, args.batches), "--model", args.alone_model]
                cmd += ["--precisions", *args.precisions, "--onnx", str(onnx)]
                cmd += ["--quick"] * args.quick
                subprocess.run(cmd, cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL)
                for case, ms in json.loads((folder / f"{runtime}.json").read_text()).items():
                    times[runtime].setdefault(case, []).append(ms / 1e3)
        checks = {}
        for bs in args.batches:
            ref = np.load(Path(tmp) / f"ours0/ours-fp32-{bs}.npy")
            for prec in args.precisions:
                theirs = np.load(Path(tmp) / f"openvino0/openvino-{prec}-{bs}.npy")
                mine = np.load(Path(tmp) / f"ours0/ours-{prec}-{bs}.npy")
                if prec == "fp32":
                    checks[f"{prec} batch {bs}"] = f"max diff {np.abs(theirs - ref).max():.1e}"
                else:
                    cos = f"{cosine_to(mine, ref):.5f} / {cosine_to(theirs, ref):.5f}"
                    checks[f"{prec} batch {bs}"] = f"cos to fp32 {cos}"
    section = f"CLIP image tower, each runtime alone ({name}, {threads} threads each)"
    for case, ours_s in times["ours"].items():
        timings = {"ours": Timing(ours_s), "OpenVINO": Timing(times["openvino"][case])}
        spread = " / ".join(f"{min(t.times) * 1e3:.1f}-{max(t.times) * 1e3:.1f}" for t in
                            timings.values())  # fmt: skip
        check = f"{checks[case]} (ours / OpenVINO: ranges {spread} ms over {args.rounds} rounds)"
        bs = int(case.rsplit(" ", 1)[1])
        rows = report.add_case(
            section, case, timings, bs, "img", checks={"OpenVINO": check},
            note=f"median of {args.rounds} processes' medians",
        )  # fmt: skip
        ratio = rows["OpenVINO"].ref_over_ours
        report.goal(
            f"{name} {case}, each runtime alone",
            ">= 1.0x OpenVINO (same threads, same weights)",
            f"{ratio:.2f}x",
            ratio >= 1.0,
        )


def main(argv: list[str] | None = None) -> None:
    """The child process: time one runtime (see ``child``)."""
    p = argparse.ArgumentParser(description="one runtime of the engines-alone section")
    p.add_argument("runtime", choices=["ours", "openvino"])
    p.add_argument("out", type=Path)
    p.add_argument("--model", default="ViT-B-32")
    p.add_argument("--precisions", nargs="+", choices=PRECISIONS, default=list(PRECISIONS))
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--onnx", type=Path, required=True, help="the exported image tower")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    config = random_clip_config(args.quick, args.model)
    child(args.runtime, config, args.precisions, args.batches, args.repeats, args.out, args.onnx)


if __name__ == "__main__":
    main()
