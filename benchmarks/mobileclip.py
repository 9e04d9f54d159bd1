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

``uv run python -m benchmarks.mobileclip [--quick] [--repeats N]``: the same cases timed by
the thread's CPU time instead of the wall clock (one thread, interleaved; time-sharing with
other processes on a loaded machine does not count, cache and memory contention still do),
with the ratios of the goals, and ours folded with the fast path's choices for the other
kind of CPU (on AVX-512 AVX2's: NCHW, MKL's products from 1024 rows; on AVX2 AVX-512's);
``--kernels`` adds the products of both towers by each kernel
(MKL's ``sgemm`` + the GELU after it, oneDNN on packed weights with the GELU fused; the
ConvMlps' 1x1 convs also as PyTorch's NCHW convolution) and the depthwise convs in NCHW and
channels-last memory, on random inputs of their shapes.
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from attn_core import onednn
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


def _as_on_the_other_isa(fn: Any, *args: Any) -> Any:
    """``fn(*args)`` with the fast path's choices for the other kind of CPU: on AVX-512,
    AVX2's (NCHW convnets, MKL from 1024 rows), elsewhere AVX-512's (channels-last, oneDNN)."""
    saved = onednn.CHANNELS_LAST_CONVS, onednn._MKL_ROWS
    other = (False, 1024) if onednn._AVX512 else (True, None)
    onednn.CHANNELS_LAST_CONVS, onednn._MKL_ROWS = other
    try:
        return fn(*args)
    finally:
        onednn.CHANNELS_LAST_CONVS, onednn._MKL_ROWS = saved


def _cpu_times(fns: dict[str, Any], repeats: int) -> dict[str, float]:
    """Median thread CPU seconds per call of each function, interleaved, after a warm-up."""
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.thread_time()
            fn()
            times[name].append(time.thread_time() - start)
    return {name: sorted(t)[len(t) // 2] for name, t in times.items()}


def _kernel_fns(rows: int, cin: int, cout: int, gelu: bool, conv: bool) -> dict[str, Any]:
    """One product ``(rows, cin) -> (rows, cout)`` (+ GELU) by each kernel."""
    import torch.nn.functional as F
    from attn_core.onednn import _packed_weight

    x, w, b = torch.randn(rows, cin), torch.randn(cout, cin) * 0.05, torch.randn(cout)
    act = F.gelu if gelu else (lambda y: y)
    packed, (attr, alg) = _packed_weight(w), ("gelu", "none") if gelu else ("none", "")
    fns = {
        "oneDNN": lambda: torch.ops.mkldnn._linear_pointwise(x, packed, b, attr, [], alg),
        "MKL": lambda: act(F.linear(x, w, b)),
    }
    if conv:  # the 1x1 conv on an NCHW image of these pixels
        side = int(rows**0.5)
        image, kernel = x.T.reshape(1, cin, side, side).contiguous(), w[:, :, None, None]
        fns["NCHW conv"] = lambda: act(F.conv2d(image, kernel, b))
    return fns


def _kernels(repeats: int) -> None:
    """MKL vs oneDNN (and NCHW convolution) on the towers' product shapes: the text tower's
    on 80 prompts, the image tower's ConvMlps at batch 1; its depthwise convs in each layout."""
    text = [(80 * 77, 512, 1536, False), (80 * 77, 512, 512, False),
            (80 * 77, 512, 2048, True), (80 * 77, 2048, 512, False)]  # fmt: skip
    convs = [(side * side, c * k, c * (4 - k), k == 1)
             for c, side in ((80, 64), (160, 32), (320, 16), (640, 8)) for k in (1, 3)]  # fmt: skip
    for shape in text + convs:
        t = _cpu_times(_kernel_fns(*shape, conv=shape in convs), repeats)
        rows, cin, cout, gelu = shape
        cells = "; ".join(f"{k} {v * 1e3:.2f} ms ({v / t['oneDNN']:.2f}x)" for k, v in t.items())
        print(f"{rows} x {cin} -> {cout}{' + GELU' if gelu else ''}: {cells}", flush=True)
    for c, side in ((80, 64), (160, 32), (320, 16), (640, 8)):
        for k in (3, 7):  # the depthwise convs (RepMixer's, ConvMlp's) in each layout
            conv = nn.Conv2d(c, c, k, padding=k // 2, groups=c)
            x = torch.randn(1, c, side, side)
            x_cl = x.contiguous(memory_format=torch.channels_last)
            t = _cpu_times({"NCHW": functools.partial(conv, x),
                            "channels-last": functools.partial(conv, x_cl)}, repeats)  # fmt: skip
            cells = "; ".join(f"{k} {v * 1e3:.3f} ms" for k, v in t.items())
            print(f"depthwise {k}x{k}, {c} x {side} x {side} px: {cells}", flush=True)


def main(argv: list[str] | None = None) -> int:
    """The section's cases by thread CPU time (see the module docstring)."""
    from timm.utils import reparameterize_model

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="the shrunk model")
    p.add_argument("--repeats", type=int, default=7, help="timed calls per case")
    p.add_argument("--kernels", action="store_true", help="also each product by each kernel")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    print(f"CPU: {cpu_description()}, 1 thread, thread CPU time (median of {args.repeats})")
    if args.kernels:
        with torch.no_grad():
            _kernels(args.repeats)
    ours, ref, size = build(args.quick)
    with torch.inference_mode(False), torch.no_grad():
        folded = copy.deepcopy(ours)
        folded.visual.reparameterize()
        ref_folded = reparameterize_model(copy.deepcopy(ref.visual))
    from attn_clip import IMAGENET_CLASSNAMES, Tokenizer

    from benchmarks.clip_models import prompts as class_prompts

    tokens = Tokenizer(ours.context_length)(class_prompts(IMAGENET_CLASSNAMES[0]))
    cases = {}
    for batch in (1, 8):
        x = torch.rand(batch, 3, size, size, generator=torch.Generator().manual_seed(0))
        cases[f"image, batch {batch}"] = {
            "ours (folded)": lambda x=x: folded.encode_image(x),
            "open_clip": lambda x=x: ref.encode_image(x),
            "open_clip + reparameterize_model": lambda x=x: ref_folded(x),
            "ours (unfolded)": lambda x=x: ours.encode_image(x),
        }
        other = "NCHW + MKL" if onednn._AVX512 else "channels-last + oneDNN"
        cases[f"image, batch {batch}"][f"ours (folded, {other})"] = functools.partial(
            _as_on_the_other_isa, folded.encode_image, x
        )
    cases[f"text, {len(tokens)} prompts"] = {
        "ours": lambda: ours.encode_text(tokens),
        "open_clip": lambda: ref.encode_text(tokens),
    }
    with torch.no_grad():
        for case, fns in cases.items():
            t = _cpu_times(fns, args.repeats)
            ours_t = next(iter(t.values()))
            cells = [f"{k} {v * 1e3:,.1f} ms ({v / ours_t:.2f}x)" for k, v in t.items()]
            print(f"{case}: " + "; ".join(cells), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
