"""Section ``mobileclip``: MobileCLIP-S2 (open_clip's ``MobileCLIP-S2``: a timm
``fastvit_mci2`` image tower at 256 px, a 12-block bidirectional text tower), ours against
open_clip on identical weights, fp32.

open_clip builds the model with its own init, then every BatchNorm's statistics are measured
on a batch of noise and moved, and its affine parameters, LayerNorms and layer scales drawn
away from their defaults (so that no fold is an identity); its state dict is saved as
``open_clip_model.safetensors`` with its ``open_clip_config.json`` and ours is
``attn_clip.create_model(folder)``.

* Image tower, batch 1 and 8: ours folded (``model.visual.reparameterize()``, the one switch:
  every MobileOne branch, BatchNorm and layer scale folded into its convolution, which the
  fast path runs through oneDNN with the GELU fused) against open_clip as shipped (timm's
  multi-branch FastViT) and open_clip after timm's ``reparameterize_model`` (its MobileOne
  blocks folded; the ConvMlp and attention BatchNorms and the layer scales kept); ours
  unfolded is shown too. Goals: >= 1.5x open_clip as shipped, >= 1.0x reparameterized.
* Text tower on OpenAI's 80 ImageNet prompts for one class (all 77 columns: without a
  causal mask the padding is attended, on both sides). Goal: >= 1.0x open_clip.

``--quick``: the same layout with one block per stage at 64 px, and one 64-wide text block.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import nn

from benchmarks.caption import cpu_description
from benchmarks.harness import Report, max_diff, peak_memory_mb, time_interleaved

MODEL = "MobileCLIP-S2"


@torch.no_grad()
def _randomize(model: nn.Module, size: int) -> nn.Module:
    """Perturbed weights, BatchNorm statistics measured on noise then moved, affine
    parameters, LayerNorms and layer scales away from their defaults; eval mode."""
    torch.manual_seed(0)
    for p in model.parameters():
        p.add_(torch.randn_like(p) * 0.02)
    norms = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d | nn.LayerNorm):
            m.weight.uniform_(0.5, 1.5)
            m.bias.normal_(0.0, 0.2)
    for name, p in model.named_parameters():
        if name.endswith("gamma"):
            p.uniform_(0.2, 1.0)
    for m in norms:
        m.reset_running_stats()
        m.momentum = None
    model.visual.train()(torch.rand(4, 3, size, size))
    for m in norms:
        m.running_mean.add_(torch.randn_like(m.running_mean) * m.running_var.sqrt() * 0.3)
        m.running_var.mul_(torch.empty_like(m.running_var).uniform_(0.5, 2.0))
    return model.eval()


def build(quick: bool) -> tuple[Any, Any, int]:
    """``(ours unfolded, open_clip, image size)`` on the same random weights, eval mode."""
    import functools

    import open_clip
    import timm
    from attn_clip import create_model
    from safetensors.torch import save_file

    cfg = copy.deepcopy(open_clip.get_model_config(MODEL))
    timm_args = {"layers": [1, 1, 1, 1]} if quick else {}
    if quick:
        cfg["vision_cfg"]["image_size"] = 64
        cfg["text_cfg"].update(layers=1, width=64, heads=2)
    oc_cfg = {k: v for k, v in cfg.items() if k != "custom_text"}
    size = cfg["vision_cfg"]["image_size"]
    create = timm.create_model
    # (not under inference_mode: the weights are written, then saved and read back)
    with torch.inference_mode(False), torch.no_grad():
        timm.create_model = functools.partial(create, **timm_args)
        try:
            ref = _randomize(open_clip.CustomTextCLIP(**oc_cfg), size)
        finally:
            timm.create_model = create
        with tempfile.TemporaryDirectory(prefix="attn-zoo-bench-mobileclip-") as tmp:
            state = {k: v.contiguous() for k, v in ref.state_dict().items()}
            save_file(state, str(Path(tmp) / "open_clip_model.safetensors"))
            if timm_args:
                cfg["vision_cfg"]["timm_model_args"] = timm_args  # (attn_clip's key)
            meta = json.dumps({"model_cfg": cfg})
            (Path(tmp) / "open_clip_config.json").write_text(meta, encoding="utf-8")
            ours = create_model(tmp).eval()
    return ours, ref, size


def bench_mobileclip(args: argparse.Namespace, report: Report) -> None:
    """Image tower rows at batch 1 and 8 (ours folded vs open_clip as shipped, vs timm's
    reparameterize_model, and ours unfolded), then the text tower; the goals."""
    from timm.utils import reparameterize_model

    cpu = cpu_description()
    report.meta["cpu_model"] = cpu
    print(f"  CPU: {cpu}", file=sys.stderr)
    ours, ref, size = build(args.quick)
    with torch.inference_mode(False), torch.no_grad():
        folded = copy.deepcopy(ours)
        folded.visual.reparameterize()
        ref_folded = reparameterize_model(copy.deepcopy(ref.visual))
    name = f"{MODEL} (tiny, 64 px)" if args.quick else MODEL
    section = f"{name} image tower, fp32"
    threads = torch.get_num_threads()
    g = torch.Generator().manual_seed(0)
    for batch in (1, 8):
        x = torch.rand(batch, 3, size, size, generator=g)
        fns = {
            "ours (folded)": lambda x=x: folded.encode_image(x),
            "open_clip": lambda x=x: ref.encode_image(x),
            "open_clip + timm reparameterize_model": lambda x=x: ref_folded(x),
            "ours (unfolded)": lambda x=x: ours.encode_image(x),
        }
        outs = {k: f() for k, f in fns.items()}
        checks = {k: f"max diff {max_diff(v, outs['open_clip']):.1e}" for k, v in outs.items()}
        checks["open_clip"] = "reference for the diffs"
        t = time_interleaved(fns, args.repeats, inner=args.inner if batch == 1 else 1)
        mem = {k: peak_memory_mb(f) for k, f in fns.items()} if args.memory else {}
        rows = report.add_case(
            section, f"batch {batch}, {size} px", t, batch, "img", ours="ours (folded)",
            memory=mem, checks=checks,
        )  # fmt: skip
        shipped = rows["open_clip"].ref_over_ours
        reparam = rows["open_clip + timm reparameterize_model"].ref_over_ours
        where = f"({cpu}, {threads} threads)"
        report.goal(
            f"{MODEL} image tower fp32 batch {batch}, folded vs open_clip as shipped",
            ">= 1.5x", f"{shipped:.2f}x {where}", shipped >= 1.5,
        )  # fmt: skip
        report.goal(
            f"{MODEL} image tower fp32 batch {batch}, folded vs timm reparameterize_model",
            ">= 1.0x", f"{reparam:.2f}x {where}", reparam >= 1.0,
        )  # fmt: skip
    _bench_text(args, report, ours, ref, name, f"({cpu}, {threads} threads)")


def _bench_text(
    args: argparse.Namespace, report: Report, ours: Any, ref: Any, name: str, where: str
) -> None:
    """OpenAI's 80 prompts for one ImageNet class through both text towers."""
    from attn_clip import IMAGENET_CLASSNAMES, Tokenizer

    from benchmarks.clip_models import prompts as class_prompts

    prompts = class_prompts(IMAGENET_CLASSNAMES[0])
    tokens = Tokenizer(ours.context_length)(prompts)  # (80, 77)
    fns = {"ours": lambda: ours.encode_text(tokens), "open_clip": lambda: ref.encode_text(tokens)}
    outs = {k: f() for k, f in fns.items()}
    t = time_interleaved(fns, args.repeats)
    mem = {k: peak_memory_mb(f) for k, f in fns.items()} if args.memory else {}
    rows = report.add_case(
        f"{name} text tower, fp32", f"{len(prompts)} prompts, 77 tokens", t, len(prompts),
        "prompt", memory=mem,
        checks={"open_clip": f"max diff {max_diff(outs['open_clip'], outs['ours']):.1e}"},
    )  # fmt: skip
    ratio = rows["open_clip"].ref_over_ours
    report.goal(f"{MODEL} text tower fp32, {len(prompts)} prompts", ">= 1.0x open_clip",
                f"{ratio:.2f}x {where}", ratio >= 1.0)  # fmt: skip
