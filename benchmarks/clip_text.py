"""Section ``text``: the CLIP text tower on OpenAI's 80 ImageNet prompts for one class,
ours (trimmed to the longest prompt, and on all 77 columns) against open_clip and
transformers."""

from __future__ import annotations

import argparse

from benchmarks.clip_models import ClipModels, hf_text, prompts
from benchmarks.harness import Report, max_diff, peak_memory_mb, time_interleaved


def bench_text(args: argparse.Namespace, report: Report, m: ClipModels) -> None:
    """One row per implementation; the goal is >= 5x open_clip with the same features."""
    from attn_clip import IMAGENET_CLASSNAMES, Tokenizer

    section = "CLIP text tower, 80 ImageNet prompts of one class"
    ctx = m.cfg["text_cfg"]["context_length"]
    tokens = Tokenizer(ctx)(prompts(IMAGENET_CLASSNAMES[0]))  # (80, 77)
    fns = {
        "ours": lambda: m.ours.encode_text(tokens),
        "ours, all 77 columns": lambda: m.ours.encode_text(tokens, truncate=False),
        "open_clip": lambda: m.open_clip.encode_text(tokens),
        "transformers": lambda: hf_text(m.hf, tokens),
    }
    outs = {k: f() for k, f in fns.items()}
    checks = {k: f"max diff {max_diff(v, outs['open_clip']):.1e}" for k, v in outs.items()}
    checks["open_clip"] = "reference for the diffs"
    trunc = max_diff(outs["ours"], outs["ours, all 77 columns"])
    checks["ours"] += f"; {trunc:.1e} to ours untruncated"
    t = time_interleaved(fns, args.repeats)
    mem = {k: peak_memory_mb(f) for k, f in fns.items()} if args.memory else {}
    longest = int(tokens.argmax(-1).max()) + 1
    rows = report.add_case(
        section, f"80 x {ctx} tokens (longest {longest})", t, len(tokens), "prompt",
        memory=mem, checks=checks,
    )  # fmt: skip
    ratio, diff = rows["open_clip"].ref_over_ours, max_diff(outs["ours"], outs["open_clip"])
    report.goal(
        "text tower, 80 prompts",
        ">= 5x open_clip, max abs diff <= 1e-5",
        f"{ratio:.2f}x, max diff {diff:.1e} (vs untruncated: {trunc:.1e})",
        ratio >= 5 and diff <= 1e-5,
    )
