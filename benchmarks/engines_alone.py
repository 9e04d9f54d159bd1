"""Ours against OpenVINO with each runtime **alone in its own process**, as a deployment runs
one of them: a CLIP image tower (ViT-B/32 by default, or ``--model ViT-B-16``), fp32 and bf16,
same random weights, same threads.

    uv run benchmarks/engines_alone.py                    # batch 1 / 8 / 32, 3 rounds (~4 min)
    uv run benchmarks/engines_alone.py --batches 1 --rounds 5
    uv run benchmarks/engines_alone.py --model ViT-B-16 --precisions fp32   # a CPU without bf16
    uv run benchmarks/engines_alone.py --quick --batches 1 --rounds 1   # the tiny CLIP

The ``engines`` section of run.py times the runtimes interleaved in one process, which needs
``OMP_WAIT_POLICY=PASSIVE``: PyTorch's OpenMP threads then sleep after every op and are woken
for the next one, a cost of tens of microseconds per op that falls on ours alone and adds up
over the ~100 small ops of a batch-1 call (docs/benchmarks.md, "where the time goes"). Here
every round starts one process per runtime, alternating (ours, OpenVINO, ours, ...), each with
the default policy: no runtime shares the cores with another. The table shows the median
over rounds of each process's median call; outputs are compared to ours (fp32: max abs diff;
bf16: cosine to ours in fp32)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from statistics import median

import numpy as np
import torch
from harness import random_fill_, time_interleaved

PRECISIONS = ("fp32", "bf16")


def child(
    runtime: str, model_name: str, precisions: list[str], batches: list[int], repeats: int,
    out: Path, quick: bool,
) -> None:  # fmt: skip
    """Time one runtime on every case; write ``{case: median ms}`` and the outputs."""
    from attn_clip import CLIPConfig, create_model, get_model_config
    from attn_clip import export as ex
    from clip_models import TINY_OC_CFG

    torch.manual_seed(0)
    config = CLIPConfig.from_open_clip(TINY_OC_CFG) if quick else get_model_config(model_name)
    with torch.no_grad():
        model = random_fill_(create_model(config)).eval()
    threads = torch.get_num_threads()
    fns = {}
    if runtime == "ours":
        ours16 = create_model(config, precision="bf16").eval()
        ours16.load_state_dict(model.state_dict())
        fns = {"fp32": lambda x: model.encode_image(x), "bf16": lambda x: ours16.encode_image(x)}
        cast = {"fp32": lambda x: x, "bf16": lambda x: x.bfloat16()}
    else:
        import openvino as ov

        with torch.no_grad(), tempfile.TemporaryDirectory() as tmp:
            ex.export_onnx(model, Path(tmp), towers=("image",), verbose=False)
            graph = ov.convert_model(str(Path(tmp) / "image.onnx"))
        for p, hint in (("fp32", "f32"), ("bf16", "bf16")):
            fns[p] = ex.OpenVINOTower(ex.compile_openvino(graph, threads, hint))
        cast = {"fp32": lambda x: x, "bf16": lambda x: x}
    size = model.config.vision.image_size
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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="ViT-B-32", help="CLIP architecture (random weights)")
    p.add_argument("--precisions", nargs="+", choices=PRECISIONS, default=list(PRECISIONS))
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--rounds", type=int, default=3, help="processes per runtime, alternating")
    p.add_argument("--repeats", type=int, default=7, help="timed samples per case and process")
    p.add_argument("--quick", action="store_true", help="the tiny CLIP (a smoke test)")
    p.add_argument("--child", choices=["ours", "openvino"], help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(
            args.child, args.model, args.precisions, args.batches, args.repeats, args.out,
            args.quick,
        )  # fmt: skip
        return
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}  # the default
    times: dict[str, dict[str, list[float]]] = {"ours": {}, "openvino": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for runtime in times:
                folder = Path(tmp) / f"{runtime}{r}"
                folder.mkdir()
                cmd = [sys.executable, __file__, "--child", runtime, "--out", str(folder)]
                cmd += ["--repeats", str(args.repeats), "--batches", *map(str, args.batches)]
                cmd += ["--model", args.model, "--precisions", *args.precisions]
                cmd += ["--quick"] if args.quick else []
                subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
                for case, ms in json.loads((folder / f"{runtime}.json").read_text()).items():
                    times[runtime].setdefault(case, []).append(ms)
        checks = {}
        for bs in args.batches:
            for prec in args.precisions:
                ref = np.load(Path(tmp) / f"ours0/ours-fp32-{bs}.npy")
                o = np.load(Path(tmp) / f"openvino0/openvino-{prec}-{bs}.npy")
                mine = np.load(Path(tmp) / f"ours0/ours-{prec}-{bs}.npy")
                if prec == "fp32":
                    checks[f"{prec} batch {bs}"] = f"max diff {np.abs(o - ref).max():.1e}"
                else:
                    cos = [
                        float((a * ref).sum() / np.linalg.norm(a) / np.linalg.norm(ref))
                        for a in (mine, o)
                    ]
                    checks[f"{prec} batch {bs}"] = f"cos to fp32 {cos[0]:.5f} / {cos[1]:.5f}"
    name = "tiny CLIP" if args.quick else args.model
    print(
        f"{name} image tower, {torch.get_num_threads()} threads, each runtime alone in its "
        f"own process, {args.rounds} rounds, median of medians\n"
    )
    print("| case | ours ms | OpenVINO ms | ours vs OpenVINO | goal >= 1.0x | check |")
    print("|---|---:|---:|---:|---|---|")
    for case, ours_ms in times["ours"].items():
        o, v = median(ours_ms), median(times["openvino"][case])
        met = "met" if v / o >= 1.0 else "not met"
        spread = f"{min(ours_ms):.1f}-{max(ours_ms):.1f} / "
        spread += f"{min(times['openvino'][case]):.1f}-{max(times['openvino'][case]):.1f}"
        print(f"| {case} | {o:.1f} | {v:.1f} | {v / o:.2f}x | {met} | {checks[case]} "
              f"(ranges {spread} ms) |")  # fmt: skip


if __name__ == "__main__":
    main()
