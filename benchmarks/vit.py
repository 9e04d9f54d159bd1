"""Section ``vit``: timm's ``vit_base_patch16_224`` at batch 8, ours (attn_vision, loaded
through ``convert_timm_vit``) against timm on the same random weights."""

from __future__ import annotations

import argparse

import torch

from benchmarks.harness import Report, max_diff, peak_memory_mb, random_fill_, time_interleaved


def bench_vit(args: argparse.Namespace, report: Report) -> None:
    """One row each for ours and timm; the goal is >= 1.0x timm."""
    import timm
    from attn_vision import convert_timm_vit
    from attn_vision import create_model as create_vit
    from attn_vision.patch_embed import to_2tuple

    torch.manual_seed(0)
    name = "vit_base_patch16_224"
    kw = dict(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4) if args.quick else {}
    ref = random_fill_(timm.create_model(name, pretrained=False, **kw))
    ours = create_vit(name, **kw).eval()
    ours.load_state_dict(convert_timm_vit(ref.state_dict(), ours.config))
    x = torch.randn(8, 3, *to_2tuple(ours.config.img_size))
    fns = {"ours": lambda: ours(x), "timm": lambda: ref(x)}
    diff = max_diff(fns["ours"](), fns["timm"]())
    t = time_interleaved(fns, args.repeats)
    mem = {k: peak_memory_mb(f) for k, f in fns.items()} if args.memory else {}
    case = f"{name}{' (tiny)' if args.quick else ''} batch 8"
    rows = report.add_case(
        "timm ViT (attn_vision)", case, t, 8, "img", memory=mem,
        checks={"timm": f"max diff {diff:.1e}"},
    )  # fmt: skip
    ratio = rows["timm"].ref_over_ours
    report.goal(f"timm {name} batch 8", ">= 1.0x timm", f"{ratio:.2f}x", ratio >= 1)
