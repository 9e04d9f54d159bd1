"""Section ``compile``: ``CLIP.compile_encoders()`` (torch.compile) against eager ours,
on an image batch of 8 and the 80 prompts of one class; the first call's compile time is
reported in the check column."""

from __future__ import annotations

import argparse
import time

import torch

from benchmarks.clip_models import ClipModels, prompts
from benchmarks.harness import Report, max_diff, time_interleaved


def bench_compile(args: argparse.Namespace, report: Report, m: ClipModels) -> None:
    """Run under ``torch.no_grad()``, not ``inference_mode``: compiled graphs are made there."""
    from attn_clip import IMAGENET_CLASSNAMES, CLIPConfig, Tokenizer, create_model

    section = "torch.compile path (CLIP.compile_encoders)"
    compiled = create_model(CLIPConfig.from_open_clip(m.cfg))
    compiled.load_state_dict(m.ours.state_dict())
    compiled.compile_encoders()
    size = m.cfg["vision_cfg"]["image_size"]
    x = torch.randn(8, 3, size, size)
    tokens = Tokenizer(m.cfg["text_cfg"]["context_length"])(prompts(IMAGENET_CLASSNAMES[0]))
    cases = (
        ("image batch 8", 8, "img", lambda: m.ours.encode_image(x),
         lambda: compiled.encode_image(x)),
        ("text 80 prompts", 80, "prompt", lambda: m.ours.encode_text(tokens),
         lambda: compiled.encode_text(tokens)),
    )  # fmt: skip
    for case, items, unit, eager, comp in cases:
        start = time.perf_counter()
        out = comp()
        compile_s = time.perf_counter() - start
        diff = max_diff(out, eager())
        t = time_interleaved({"ours eager": eager, "ours compiled": comp}, args.repeats)
        check = f"first call (compile) {compile_s:.1f} s; max diff {diff:.1e}"
        report.add_case(
            section, case, t, items, unit, ours="ours compiled", checks={"ours compiled": check}
        )
        report.goal(
            f"torch.compile path, {case}",
            "correct (max diff <= 1e-4) and measured",
            f"max diff {diff:.1e}; compiled {t['ours compiled'].median * 1e3:.0f} ms vs eager "
            f"{t['ours eager'].median * 1e3:.0f} ms; compile {compile_s:.0f} s",
            diff <= 1e-4,
        )
