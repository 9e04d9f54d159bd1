"""Section ``image``: the CLIP ViT-B/32 image tower, ours against open_clip, timm and
transformers, at each batch size in fp32 and with bf16 weights."""

from __future__ import annotations

import argparse
import copy

import torch

from benchmarks.clip_models import ClipModels, hf_image, ours_bf16
from benchmarks.harness import Report, cosine, max_diff, peak_memory_mb, time_interleaved


def bench_image(args: argparse.Namespace, report: Report, m: ClipModels) -> None:
    """fp32 rows (ours vs every reference) and bf16 rows (ours vs open_clip) per batch."""
    section = "CLIP image tower (ViT-B/32)" if not args.quick else "CLIP image tower (tiny)"
    size = m.cfg["vision_cfg"]["image_size"]
    ours16 = ours_bf16(m)
    oc16 = copy.deepcopy(m.open_clip).to(torch.bfloat16)
    for bs in args.batches:
        x = torch.randn(bs, 3, size, size)
        xb = x.bfloat16()
        fns = {
            "ours": lambda x=x: m.ours.encode_image(x),
            "open_clip": lambda x=x: m.open_clip.encode_image(x),
            "timm": lambda x=x: m.timm(x),
            "transformers": lambda x=x: hf_image(m.hf, x),
        }
        outs = {k: f() for k, f in fns.items()}
        checks = {k: f"max diff {max_diff(v, outs['ours']):.1e}" for k, v in outs.items()}
        checks["ours"] = "reference for the diffs"
        t = time_interleaved(fns, args.repeats, inner=args.inner if bs == 1 else 1)
        mem = {k: peak_memory_mb(f) for k, f in fns.items()} if args.memory else {}
        rows = report.add_case(section, f"fp32 batch {bs}", t, bs, "img", memory=mem, checks=checks)
        fastest = min(rows[k].ref_over_ours for k in fns if k != "ours")
        target = 1.2 if bs == 1 else 1.0
        report.goal(
            f"image tower fp32 batch {bs}",
            f">= {target:.1f}x the fastest reference",
            f"{fastest:.2f}x",
            fastest >= target,
        )
        fns = {
            "ours bf16": lambda xb=xb: ours16.encode_image(xb),
            "open_clip bf16": lambda xb=xb: oc16.encode_image(xb),
        }
        outs = {k: f() for k, f in fns.items()}
        ref = m.ours.encode_image(x)
        checks = {k: f"cos to fp32 {cosine(v, ref):.5f}" for k, v in outs.items()}
        t = time_interleaved(fns, args.repeats, inner=args.inner if bs == 1 else 1)
        mem = {k: peak_memory_mb(f) for k, f in fns.items()} if args.memory else {}
        rows = report.add_case(
            section, f"bf16 weights batch {bs}", t, bs, "img", ours="ours bf16", memory=mem,
            checks=checks,
        )  # fmt: skip
        ratio, cos = rows["open_clip bf16"].ref_over_ours, cosine(outs["ours bf16"], ref)
        report.goal(
            f"image tower bf16 batch {bs}",
            ">= 1.0x open_clip bf16, cosine >= 0.999",
            f"{ratio:.2f}x, cosine {cos:.5f}",
            ratio >= 1.0 and cos >= 0.999,
        )
