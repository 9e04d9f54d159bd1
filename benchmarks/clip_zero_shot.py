"""Section ``zeroshot``: the 1,000-class x 80-prompt ImageNet zero-shot head, ours (fp32
and bf16 weights) against ``open_clip.build_zero_shot_classifier``, timed on a subset of
the classes and extrapolated linearly to 1,000."""

from __future__ import annotations

import argparse
import time

import torch

from benchmarks.clip_models import ClipModels, ours_bf16
from benchmarks.harness import Report, Timing, cosine


def bench_zero_shot(args: argparse.Namespace, report: Report, m: ClipModels) -> None:
    """One extrapolated row per implementation; the goal is <= 5 min for the whole head."""
    import open_clip
    from attn_clip import (
        IMAGENET_CLASSNAMES,
        OPENAI_IMAGENET_TEMPLATES,
        Tokenizer,
        build_zero_shot_classifier,
    )

    section = "ImageNet zero-shot head (1,000 classes x 80 prompts)"
    tokenizer = Tokenizer(m.cfg["text_cfg"]["context_length"])
    n, n_ref, per_batch = args.zero_shot_classes, args.zero_shot_ref_classes, args.zero_shot_batch
    classes = list(IMAGENET_CLASSNAMES)
    ours16 = ours_bf16(m)

    def ours(model) -> torch.Tensor:
        return build_zero_shot_classifier(
            model, tokenizer, classes[:n], OPENAI_IMAGENET_TEMPLATES, per_batch, use_tqdm=True
        )

    def ref() -> torch.Tensor:
        return open_clip.build_zero_shot_classifier(
            m.open_clip,
            tokenizer=tokenizer,
            classnames=classes[:n_ref],
            templates=OPENAI_IMAGENET_TEMPLATES,
            num_classes_per_batch=10,
            device="cpu",
            use_tqdm=True,
        )

    for model in (m.ours, ours16):  # warm-up
        build_zero_shot_classifier(model, tokenizer, classes[:2], OPENAI_IMAGENET_TEMPLATES)
    seconds, heads = {}, {}
    for name, fn in (
        ("ours", lambda: ours(m.ours)),
        ("ours bf16 weights", lambda: ours(ours16)),
        ("open_clip", ref),
    ):
        start = time.perf_counter()
        heads[name] = fn()
        seconds[name] = time.perf_counter() - start
    cos = cosine(heads["ours"][:, :n_ref].T, heads["open_clip"].T)
    cos16 = cosine(heads["ours bf16 weights"].T, heads["ours"].T)
    total = len(classes)
    timings = {
        name: Timing([t * total / (n_ref if name == "open_clip" else n)])
        for name, t in seconds.items()
    }
    report.add_case(
        section,
        "1,000 classes",
        timings,
        total,
        "class",
        checks={
            "ours": f"min class cosine to open_clip {cos:.6f}",
            "ours bf16 weights": f"min class cosine to fp32 {cos16:.5f}",
        },
        note=f"extrapolated: ours from {n} classes ({per_batch} per batch), open_clip from {n_ref}",
    )
    for name in ("ours", "ours bf16 weights"):
        est = timings[name].median
        report.goal(
            f"zero-shot head 1,000 x 80, {name}",
            "<= 300 s (5 min), progress bar",
            f"{est:.0f} s (extrapolated from {n} classes)"
            + (f", class cosine to fp32 {cos16:.5f}" if "bf16" in name else ""),
            est <= 300,
        )
