"""Section ``families``: the image towers of the other CLIP families, ours against open_clip
on identical weights: OpenAI's ``RN50`` (ModifiedResNet) and ``convnext_base`` (timm's
ConvNeXt + open_clip's projection head), batch 8, fp32 and with bf16 weights.

open_clip builds each model with its own init (norms, biases and BatchNorm statistics
perturbed so nothing is trivially zero); ours is loaded from its state dict through our
converter (``load_checkpoint``). ``--quick``: the same architectures at 64 px with one
text block (RN50's stage depths cut to one block each)."""

from __future__ import annotations

import argparse
import copy

import torch

from benchmarks.harness import Report, cosine, max_diff, peak_memory_mb, time_interleaved

MODELS = ("RN50", "convnext_base")


@torch.no_grad()
def _perturb_(model: torch.nn.Module) -> torch.nn.Module:
    for p in model.parameters():
        if p.ndim <= 1:  # norms, biases, LayerScale: not constant, not zero (RN50's bn3)
            p.add_(torch.randn_like(p) * 0.05)
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.normal_(0, 0.1)
            m.running_var.uniform_(0.5, 1.5)
    return model.eval()


def build(name: str, quick: bool) -> tuple[torch.nn.Module, torch.nn.Module, int]:
    """``(ours, open_clip, image size)`` with the same weights."""
    import open_clip
    from attn_clip import CLIPConfig, create_model, load_checkpoint

    cfg = copy.deepcopy(open_clip.get_model_config(name))
    if quick:
        cfg["vision_cfg"]["image_size"] = 64
        cfg["text_cfg"]["layers"] = 1
        if name.startswith("RN"):
            cfg["vision_cfg"]["layers"] = [1, 1, 1, 1]
    torch.manual_seed(0)
    ref = _perturb_(open_clip.model.CLIP(**cfg))
    ours = create_model(CLIPConfig.from_open_clip(cfg))
    load_checkpoint(ours, ref.state_dict())
    return ours, ref, cfg["vision_cfg"]["image_size"]


def bench_families(args: argparse.Namespace, report: Report) -> None:
    """Per model: an fp32 row and a bf16-weights row; goals >= 1.0x open_clip."""
    for name in MODELS:
        _bench_model(name, args, report)


def _bench_model(name: str, args: argparse.Namespace, report: Report) -> None:
    batch = 2 if args.quick else 8
    ours, ref, size = build(name, args.quick)
    section = f"CLIP image tower ({name}{', 64 px' if args.quick else ''})"
    x = torch.randn(batch, 3, size, size)
    fns = {"ours": lambda: ours.encode_image(x), "open_clip": lambda: ref.encode_image(x)}
    fp32 = fns["ours"]()
    diff = max_diff(fp32, fns["open_clip"]())
    t = time_interleaved(fns, args.repeats)
    mem = {k: peak_memory_mb(f) for k, f in fns.items()} if args.memory else {}
    rows = report.add_case(
        section, f"fp32 batch {batch}", t, batch, "img", memory=mem,
        checks={"open_clip": f"max diff {diff:.1e}"},
    )  # fmt: skip
    ratio = rows["open_clip"].ref_over_ours
    report.goal(f"{name} image tower fp32 batch {batch}", ">= 1.0x open_clip",
                f"{ratio:.2f}x", ratio >= 1.0)  # fmt: skip

    ours16 = copy.deepcopy(ours).to(torch.bfloat16)
    ref16 = copy.deepcopy(ref).to(torch.bfloat16)
    xb = x.bfloat16()  # (open_clip's timm tower does not cast its input)
    fns = {
        "ours bf16": lambda: ours16.encode_image(xb),
        "open_clip bf16": lambda: ref16.encode_image(xb),
    }
    outs = {k: f() for k, f in fns.items()}
    checks = {k: f"cos to fp32 {cosine(v, fp32):.5f}" for k, v in outs.items()}
    t = time_interleaved(fns, args.repeats)
    mem = {k: peak_memory_mb(f) for k, f in fns.items()} if args.memory else {}
    rows = report.add_case(
        section, f"bf16 weights batch {batch}", t, batch, "img", ours="ours bf16",
        memory=mem, checks=checks,
    )  # fmt: skip
    ratio, cos = rows["open_clip bf16"].ref_over_ours, cosine(outs["ours bf16"], fp32)
    report.goal(
        f"{name} image tower bf16 batch {batch}",
        ">= 1.0x open_clip bf16, cosine >= 0.999",
        f"{ratio:.2f}x, cosine {cos:.5f}",
        ratio >= 1.0 and cos >= 0.999,
    )
