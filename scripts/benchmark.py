"""Side-by-side speed benchmarks: attn-zoo against open_clip, timm and transformers.

    uv run scripts/benchmark.py                      # every section (~15 min on 2 cores)
    uv run scripts/benchmark.py --quick              # tiny configs, seconds (a smoke test)
    uv run scripts/benchmark.py --only image,text --json bench.json

Sections (``--only``): ``image`` (CLIP ViT-B/32 image tower, batch 1/8/32, fp32 and bf16
weights), ``text`` (CLIP text tower on OpenAI's 80 ImageNet prompts for one class),
``zeroshot`` (the 1,000-class x 80-prompt ImageNet zero-shot head, timed on a subset of
classes and extrapolated), ``vit`` (timm ``vit_base_patch16_224``, batch 8), ``attention``
(math / sdpa / sliding-window / linear kernels at L = 1k..16k, plus compiled FlexAttention
and a dense-masked SDPA as sliding-window references), ``dispatch`` (``attention()`` vs a
raw ``F.scaled_dot_product_attention`` call), ``compile`` (``CLIP.compile_encoders``) and
``startup`` (the README's first command, offline zero-shot with the bundled model, against
``python -c "import torch"``, each a fresh interpreter).

Method. Every section builds ours and the references in this one process with identical
random weights (transformers' random ``CLIPModel`` -> ours through our converter -> open_clip
through ``to_open_clip`` -> timm through timm's own open_clip converter) and checks that they
agree (the ``check`` column). Each implementation is warmed up, then the implementations are
timed *interleaved* (A, B, C, A, B, C, ...) so that load from other processes hits all of
them alike; the table shows the median (and min) of the repeats, run under
``torch.inference_mode()`` with PyTorch's default thread count. ``ref / ours`` is the
reference's median time divided by ours (> 1: ours is faster). Peak memory is the peak of
live tensor memory allocated during one call (inputs and weights excluded), from the
allocation timeline of ``torch.profiler`` (``profile_memory=True``); ``-`` where that is
unavailable. Rows marked *extrapolated* time a subset and scale it linearly.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import math
import os
import platform
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

# ----------------------------------------------------------------------------------------
# Measuring
# ----------------------------------------------------------------------------------------


@dataclass
class Timing:
    times: list[float]  # seconds per call

    @property
    def median(self) -> float:
        return statistics.median(self.times)

    @property
    def min(self) -> float:
        return min(self.times)


def time_interleaved(
    fns: dict[str, Callable[[], Any]], repeats: int, warmup: int = 1, inner: int = 1
) -> dict[str, Timing]:
    """Warm each function up, then time them round-robin ``repeats`` times (``inner``
    calls per sample); interleaving spreads load from other processes over all of them."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            for _ in range(inner):
                fn()
            times[name].append((time.perf_counter() - start) / inner)
    return {name: Timing(t) for name, t in times.items()}


@contextlib.contextmanager
def _quiet_stderr():
    """Silence file descriptor 2 (the profiler's C++ start / stop lines)."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def peak_memory_mb(fn: Callable[[], Any]) -> float | None:
    """Peak live tensor memory (MB) allocated while ``fn()`` runs, from the profiler's
    allocation timeline; None when the profiler cannot tell."""
    try:
        from torch.profiler import ProfilerActivity, profile
        from torch.profiler._memory_profiler import MemoryProfile

        with (
            _quiet_stderr(),
            profile(
                activities=[ProfilerActivity.CPU],
                profile_memory=True,
                record_shapes=True,
                with_stack=True,
            ) as prof,
        ):
            fn()  # (already warmed up: nothing worth seeing goes to stderr)
        live = peak = 0
        for _, action, _, size in MemoryProfile(prof.profiler.kineto_results).timeline:
            if action.name == "CREATE":
                live += size
            elif action.name == "DESTROY":
                live -= size
            peak = max(peak, live)
        return peak / 2**20
    except Exception as err:  # private API: report "-" rather than fail the benchmark
        warnings.warn(f"peak memory unavailable: {err}", stacklevel=2)
        return None


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float() - b.float()).abs().max().item()


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    """Smallest row-wise cosine similarity."""
    return F.cosine_similarity(a.float(), b.float(), dim=-1).min().item()


# ----------------------------------------------------------------------------------------
# Report
# ----------------------------------------------------------------------------------------


@dataclass
class Row:
    section: str
    case: str  # what is computed, e.g. "image fp32 batch 8"
    impl: str  # "ours", "open_clip", ...
    median_ms: float
    min_ms: float
    throughput: float | None  # items per second (median)
    unit: str  # what an item is
    peak_mb: float | None = None
    ref_over_ours: float | None = None  # reference median / ours median (> 1: ours faster)
    check: str = ""
    note: str = ""


@dataclass
class Goal:
    name: str
    target: str
    measured: str
    met: bool


@dataclass
class Report:
    rows: list[Row] = field(default_factory=list)
    goals: list[Goal] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)

    def add_case(
        self,
        section: str,
        case: str,
        timings: dict[str, Timing],
        items: int,
        unit: str,
        *,
        ours: str = "ours",
        memory: dict[str, float | None] | None = None,
        checks: dict[str, str] | None = None,
        note: str = "",
        scale: float = 1.0,
    ) -> dict[str, Row]:
        """One row per implementation; ``scale`` multiplies times (extrapolation)."""
        memory, checks = memory or {}, checks or {}
        base = timings[ours].median * scale if ours in timings else None
        rows = {}
        for impl, t in timings.items():
            med, mn = t.median * scale, t.min * scale
            row = Row(
                section,
                case,
                impl,
                med * 1e3,
                mn * 1e3,
                items / med if med > 0 else None,
                unit,
                memory.get(impl),
                med / base if base and impl != ours else None,
                checks.get(impl, ""),
                note,
            )
            self.rows.append(row)
            rows[impl] = row
            print(
                f"  {case:<34} {impl:<24} {med * 1e3:10.1f} ms"
                + (f"  ref/ours {row.ref_over_ours:.2f}x" if row.ref_over_ours else ""),
                file=sys.stderr,
                flush=True,
            )
        return rows

    def goal(self, name: str, target: str, measured: str, met: bool) -> None:
        self.goals.append(Goal(name, target, measured, bool(met)))
        print(f"  GOAL {name}: {measured} ({'met' if met else 'NOT met'})", file=sys.stderr)

    def markdown(self) -> str:
        out = []
        section = None
        for r in self.rows:
            if r.section != section:
                section = r.section
                out += [
                    "",
                    f"### {section}",
                    "",
                    "| case | impl | median ms | min ms | throughput | peak MB | ref / ours "
                    "| check |",
                    "|---|---|---:|---:|---:|---:|---:|---|",
                ]
            thr = f"{r.throughput:,.1f} {r.unit}/s" if r.throughput else "-"
            mem = f"{r.peak_mb:,.1f}" if r.peak_mb is not None else "-"
            ratio = f"{r.ref_over_ours:.2f}x" if r.ref_over_ours else ""
            case = r.case + (f" ({r.note})" if r.note else "")
            out.append(
                f"| {case} | {r.impl} | {r.median_ms:,.1f} | {r.min_ms:,.1f} | {thr} | {mem} "
                f"| {ratio} | {r.check} |"
            )
        if self.goals:
            out += ["", "### Goals", "", "| goal | target | measured | met |", "|---|---|---|---|"]
            for g in self.goals:
                out.append(f"| {g.name} | {g.target} | {g.measured} | {'yes' if g.met else 'NO'} |")
        return "\n".join(out).strip() + "\n"


# ----------------------------------------------------------------------------------------
# Models with identical weights
# ----------------------------------------------------------------------------------------

TINY_OC_CFG = {  # --quick: a CLIP small enough to build and run in a second
    "embed_dim": 32,
    "vision_cfg": {"image_size": 32, "patch_size": 8, "width": 64, "layers": 2, "head_width": 16},
    "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 48, "heads": 4, "layers": 2},
}


def _hf_config(oc_cfg: dict[str, Any]):
    """A transformers CLIPConfig with the architecture of an open_clip model config."""
    from transformers import CLIPConfig as HFCLIPConfig

    v, t = oc_cfg["vision_cfg"], oc_cfg["text_cfg"]
    return HFCLIPConfig(
        text_config=dict(
            vocab_size=t.get("vocab_size", 49408),
            hidden_size=t["width"],
            intermediate_size=int(t["width"] * t.get("mlp_ratio", 4.0)),
            num_hidden_layers=t["layers"],
            num_attention_heads=t["heads"],
            max_position_embeddings=t["context_length"],
            hidden_act="gelu",
            eos_token_id=2,  # legacy id: pool at argmax, as open_clip does
        ),
        vision_config=dict(
            hidden_size=v["width"],
            intermediate_size=int(v["width"] * v.get("mlp_ratio", 4.0)),
            num_hidden_layers=v["layers"],
            num_attention_heads=v["width"] // v.get("head_width", 64),
            image_size=v["image_size"],
            patch_size=v["patch_size"],
            hidden_act="gelu",
        ),
        projection_dim=oc_cfg["embed_dim"],
    )


@torch.no_grad()
def _random_fill_(model: torch.nn.Module, std: float = 0.02) -> torch.nn.Module:
    """Norm scales ~ 1 + noise, every other parameter ~ N(0, std^2)."""
    for name, p in model.named_parameters():
        if p.ndim == 1 and "norm" in name and name.endswith("weight"):
            p.normal_(1.0, 0.1)
        elif name.endswith("logit_scale"):
            p.fill_(math.log(1 / 0.07))
        else:
            p.normal_(0.0, std)
    return model.eval()


@dataclass
class ClipModels:
    cfg: dict[str, Any]
    ours: Any
    open_clip: Any
    hf: Any
    timm: Any | None


def build_clip_models(quick: bool, with_timm: bool = True) -> ClipModels:
    import open_clip
    import transformers
    from attn_clip import CLIPConfig, create_model, load_checkpoint, to_open_clip

    torch.manual_seed(0)
    cfg = copy.deepcopy(TINY_OC_CFG) if quick else open_clip.get_model_config("ViT-B-32")
    try:
        from transformers.initialization import no_init_weights
    except ImportError:  # transformers 4.x
        from transformers.modeling_utils import no_init_weights
    with no_init_weights():  # every weight is set right below
        hf = transformers.CLIPModel(_hf_config(cfg))
    _random_fill_(hf)
    ours = create_model(CLIPConfig.from_open_clip(cfg))
    load_checkpoint(ours, hf.state_dict())  # transformers -> ours (our converter)
    oc = open_clip.model.CLIP(**copy.deepcopy(cfg)).eval()
    oc.load_state_dict(to_open_clip(ours.state_dict()))  # ours -> open_clip
    tm = None
    if with_timm:
        import timm
        from timm.models.vision_transformer import _convert_openai_clip

        v = cfg["vision_cfg"]
        tm = timm.create_model(
            "vit_base_patch32_clip_224",
            pretrained=False,
            num_classes=cfg["embed_dim"],
            img_size=v["image_size"],
            patch_size=v["patch_size"],
            embed_dim=v["width"],
            depth=v["layers"],
            num_heads=v["width"] // v.get("head_width", 64),
        ).eval()
        tm.load_state_dict(_convert_openai_clip(oc.state_dict(), tm))  # open_clip -> timm
    return ClipModels(cfg, ours, oc, hf, tm)


def hf_image(hf, x: torch.Tensor) -> torch.Tensor:
    return hf.visual_projection(hf.vision_model(pixel_values=x).pooler_output)


def hf_text(hf, tokens: torch.Tensor) -> torch.Tensor:
    return hf.text_projection(hf.text_model(input_ids=tokens).pooler_output)


# ----------------------------------------------------------------------------------------
# Sections
# ----------------------------------------------------------------------------------------


def bench_image(args, report: Report, m: ClipModels) -> None:
    from attn_clip import CLIPConfig, create_model, load_checkpoint

    section = "CLIP image tower (ViT-B/32)" if not args.quick else "CLIP image tower (tiny)"
    size = m.cfg["vision_cfg"]["image_size"]
    ours_bf16 = create_model(CLIPConfig.from_open_clip(m.cfg), precision="bf16")
    load_checkpoint(ours_bf16, m.ours.state_dict())
    oc_bf16 = copy.deepcopy(m.open_clip).to(torch.bfloat16)
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
            "ours bf16": lambda xb=xb: ours_bf16.encode_image(xb),
            "open_clip bf16": lambda xb=xb: oc_bf16.encode_image(xb),
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


def _prompts(classname: str) -> list[str]:
    from attn_clip import OPENAI_IMAGENET_TEMPLATES

    return [t(classname) for t in OPENAI_IMAGENET_TEMPLATES]


def bench_text(args, report: Report, m: ClipModels) -> None:
    from attn_clip import IMAGENET_CLASSNAMES, Tokenizer

    section = "CLIP text tower, 80 ImageNet prompts of one class"
    ctx = m.cfg["text_cfg"]["context_length"]
    tokens = Tokenizer(ctx)(_prompts(IMAGENET_CLASSNAMES[0]))  # (80, 77)
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


def bench_zero_shot(args, report: Report, m: ClipModels) -> None:
    import open_clip
    from attn_clip import (
        IMAGENET_CLASSNAMES,
        OPENAI_IMAGENET_TEMPLATES,
        CLIPConfig,
        Tokenizer,
        build_zero_shot_classifier,
        create_model,
        load_checkpoint,
    )

    section = "ImageNet zero-shot head (1,000 classes x 80 prompts)"
    tokenizer = Tokenizer(m.cfg["text_cfg"]["context_length"])
    n, n_ref, per_batch = args.zero_shot_classes, args.zero_shot_ref_classes, args.zero_shot_batch
    classes = list(IMAGENET_CLASSNAMES)
    ours_bf16 = create_model(CLIPConfig.from_open_clip(m.cfg), precision="bf16")
    load_checkpoint(ours_bf16, m.ours.state_dict())

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

    for model in (m.ours, ours_bf16):  # warm-up
        build_zero_shot_classifier(model, tokenizer, classes[:2], OPENAI_IMAGENET_TEMPLATES)
    seconds, heads = {}, {}
    for name, fn in (
        ("ours", lambda: ours(m.ours)),
        ("ours bf16 weights", lambda: ours(ours_bf16)),
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


def bench_vit(args, report: Report) -> None:
    import timm
    from attn_vision import convert_timm_vit
    from attn_vision import create_model as create_vit
    from attn_vision.patch_embed import to_2tuple

    torch.manual_seed(0)
    name = "vit_base_patch16_224"
    kw = dict(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4) if args.quick else {}
    ref = _random_fill_(timm.create_model(name, pretrained=False, **kw))
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


def _attention_case(args, report: Report, L: int, peaks: dict[int, float | None]) -> None:
    from attn_core import attention, sliding_window_attention, sliding_window_mask
    from attn_core.linear_attention import elu_feature_map, linear_attention

    section = "Attention kernels (causal, B=1, H=8, D=64)"
    B, H, D, w = 1, 8, 64, args.window
    torch.manual_seed(0)
    q, k, v = (torch.randn(B, H, L, D) for _ in range(3))
    ours = f"sliding window w={w} (ours)"
    fns: dict[str, Callable[[], Any]] = {
        ours: lambda: sliding_window_attention(q, k, v, w),
        "linear (elu+1, ours)": lambda: linear_attention(
            elu_feature_map(q), elu_feature_map(k), v, causal=True
        ),
        "sdpa (attention())": lambda: attention(q, k, v, is_causal=True),
    }
    score_gb = B * H * L * L * 4 / 2**30
    note = ""
    if score_gb <= args.math_max_gb:
        fns["math (attention(backend='math'))"] = lambda: attention(
            q, k, v, is_causal=True, backend="math"
        )
    else:
        note = f"math skipped: {score_gb:.0f} GiB of scores"
    t = time_interleaved(fns, args.attn_repeats)
    mem = {name: peak_memory_mb(f) for name, f in fns.items()} if args.memory else {}
    peaks[L] = mem.get(ours)
    report.add_case(section, f"L={L}", t, L, "tok", ours=ours, memory=mem, note=note)
    if L != args.flex_length:
        return

    # the references for the sliding window: a dense mask, and compiled FlexAttention
    dense_mask = sliding_window_mask(L, w)
    refs = {
        ours: fns[ours],
        "sdpa + dense window mask": lambda: F.scaled_dot_product_attention(
            q, k, v, attn_mask=dense_mask
        ),
    }
    ref_out = refs["sdpa + dense window mask"]()
    checks = {ours: f"max diff {max_diff(refs[ours](), ref_out):.1e} to dense"}
    flex_name, compile_s = "FlexAttention, compiled", None
    try:
        if not args.flex:
            raise LookupError
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        def rule(b, h, qi, ki):
            return (ki <= qi) & (ki > qi - w)

        block_mask = create_block_mask(rule, None, None, L, L, device="cpu")
        flex = torch.compile(flex_attention)
        start = time.perf_counter()
        flex_out = flex(q, k, v, block_mask=block_mask)
        compile_s = time.perf_counter() - start
        refs[flex_name] = lambda: flex(q, k, v, block_mask=block_mask)
        diff = max_diff(flex_out, ref_out)
        checks[flex_name] = f"compile {compile_s:.1f} s; max diff {diff:.1e}"
    except LookupError:
        pass  # --no-flex
    except Exception as err:  # no C++ compiler, ...
        warnings.warn(f"compiled FlexAttention unavailable: {err}", stacklevel=2)
    t = time_interleaved(refs, args.attn_repeats)
    mem = {name: peak_memory_mb(f) for name, f in refs.items()} if args.memory else {}
    rows = report.add_case(
        section, f"sliding window refs L={L} w={w}", t, L, "tok", ours=ours, memory=mem,
        checks=checks,
    )  # fmt: skip
    if flex_name in rows:
        ratio = rows[flex_name].ref_over_ours
        report.goal(
            f"sliding window L={L} w={w}",
            "<= compiled FlexAttention time, no compile step",
            f"{ratio:.2f}x flex's speed (flex compiles {compile_s:.1f} s first)",
            ratio >= 1.0,
        )


def bench_attention(args, report: Report) -> None:
    B, H, w = 1, 8, args.window
    peaks: dict[int, float | None] = {}
    for L in args.lengths:
        _attention_case(args, report, L, peaks)
    lens = [L for L in args.lengths if peaks.get(L)]
    if len(lens) >= 2:
        lo, hi = lens[0], lens[-1]
        growth = peaks[hi] / peaks[lo]
        report.goal(
            "sliding window extra memory O(L*w)",
            f"peak grows ~linearly: x{hi // lo} length -> ~x{hi // lo} memory",
            f"{peaks[lo]:.1f} MB at L={lo} -> {peaks[hi]:.1f} MB at L={hi} (x{growth:.1f}); "
            f"L*w*H fp32 scores would be {B * H * hi * w * 4 / 2**20:.0f} MB",
            growth <= 1.25 * hi / lo,
        )


def bench_dispatch(args, report: Report) -> None:
    import timeit

    from attn_core import attention

    L = args.dispatch_length
    q, k, v = (torch.randn(1, 8, L, 64) for _ in range(3))
    fns = {
        "attention()": lambda: attention(q, k, v),
        "F.scaled_dot_product_attention": lambda: F.scaled_dot_product_attention(q, k, v),
    }
    t = time_interleaved(fns, args.dispatch_repeats, warmup=3, inner=20)
    rows = report.add_case(
        "attention() dispatch overhead", f"B=1 H=8 L={L} D=64", t, 1, "call",
        ours="attention()",
    )  # fmt: skip
    tiny = [torch.randn(1, 1, 1, 8) for _ in range(3)]
    per_call = {
        name: min(timeit.repeat(lambda f=f: f(*tiny), number=2000, repeat=5)) / 2000
        for name, f in (("attention", attention), ("sdpa", F.scaled_dot_product_attention))
    }
    overhead_us = (per_call["attention"] - per_call["sdpa"]) * 1e6
    kernel = t["F.scaled_dot_product_attention"].median
    pct = overhead_us * 1e-6 / kernel * 100
    ratio = rows["F.scaled_dot_product_attention"].ref_over_ours
    report.goal(
        f"attention() dispatch overhead at L={L}",
        "<= 5% over raw F.scaled_dot_product_attention",
        f"{overhead_us:.1f} us per call = {pct:.2f}% of the {kernel * 1e3:.2f} ms kernel "
        f"(interleaved medians: sdpa/attention() = {ratio:.3f})",
        pct <= 5,
    )


README_COMMAND = (  # the README's first command, after `uv run`
    "apps/zero_shot.py", "--model", "demo-shapes", "--image", "docs/assets/red_circle.png",
    "--labels", "red circle", "red square", "blue circle", "green star",
)  # fmt: skip


def bench_startup(args, report: Report) -> None:
    """Wall time of fresh interpreters: the README's first command vs importing torch."""
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    commands = {
        "import torch": [sys.executable, "-c", "import torch"],
        "README first command": [sys.executable, *README_COMMAND],
    }

    def run(cmd: list[str]) -> None:
        subprocess.run(cmd, cwd=root, env=env, check=True, capture_output=True, timeout=300)

    fns = {name: (lambda c=cmd: run(c)) for name, cmd in commands.items()}
    t = time_interleaved(fns, args.startup_repeats, warmup=1)
    report.add_case(
        "start-up (fresh interpreter, wall time)", "offline zero-shot, demo-shapes", t, 1, "run",
        ours="README first command",
        note="python apps/zero_shot.py ... as `uv run` starts it, without uv's own check",
    )  # fmt: skip
    extra = t["README first command"].median - t["import torch"].median
    report.goal(
        "start-up: the README's first command",
        '<= 1.0 s more than python -c "import torch"',
        f"{extra:+.2f} s ({t['README first command'].median:.2f} s vs "
        f"{t['import torch'].median:.2f} s, medians of {args.startup_repeats})",
        extra <= 1.0,
    )


def bench_compile(args, report: Report, m: ClipModels) -> None:
    from attn_clip import IMAGENET_CLASSNAMES, CLIPConfig, Tokenizer, create_model

    section = "torch.compile path (CLIP.compile_encoders)"
    compiled = create_model(CLIPConfig.from_open_clip(m.cfg))
    compiled.load_state_dict(m.ours.state_dict())
    compiled.compile_encoders()
    size = m.cfg["vision_cfg"]["image_size"]
    x = torch.randn(8, 3, size, size)
    tokens = Tokenizer(m.cfg["text_cfg"]["context_length"])(_prompts(IMAGENET_CLASSNAMES[0]))
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


# ----------------------------------------------------------------------------------------


SECTIONS = ("image", "text", "zeroshot", "vit", "attention", "dispatch", "compile", "startup")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny configs (a smoke test)")
    p.add_argument("--only", default=None, help=f"comma-separated sections of {SECTIONS}")
    p.add_argument("--skip", default="", help="comma-separated sections to leave out")
    p.add_argument("--json", default=None, help="also write the rows and goals here")
    p.add_argument("--markdown", default=None, help="also write the tables here")
    p.add_argument("--repeats", type=int, default=None, help="timed repeats per row")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--batches", default=None, help="image batch sizes, e.g. 1,8,32")
    p.add_argument("--zero-shot-classes", type=int, default=None, help="classes timed for ours")
    p.add_argument(
        "--zero-shot-ref-classes", type=int, default=None, help="classes timed for open_clip"
    )
    p.add_argument(
        "--zero-shot-batch", type=int, default=10, help="classes per text batch (default 10)"
    )
    p.add_argument("--lengths", default=None, help="attention lengths, e.g. 1024,4096")
    p.add_argument("--window", type=int, default=None, help="sliding window")
    p.add_argument("--no-memory", dest="memory", action="store_false", help="skip peak memory")
    p.add_argument(
        "--flex", action=argparse.BooleanOptionalAction, default=None,
        help="time compiled FlexAttention (compiles ~10 s; default: on, off with --quick)",
    )  # fmt: skip
    args = p.parse_args(argv)
    q = args.quick
    args.sections = [s for s in (args.only.split(",") if args.only else SECTIONS) if s]
    if q and not args.only:
        # compiling takes ~20 s; start-up runs fresh interpreters
        args.sections = [s for s in SECTIONS if s not in ("compile", "startup")]
    skip = set(filter(None, args.skip.split(",")))
    unknown = (set(args.sections) | skip) - set(SECTIONS)
    if unknown:
        p.error(f"unknown sections {sorted(unknown)}; expected some of {SECTIONS}")
    args.sections = [s for s in args.sections if s not in skip]
    args.repeats = args.repeats or (2 if q else 7)
    args.inner = 1 if q else 3
    args.attn_repeats = 2 if q else 5
    args.dispatch_repeats = 3 if q else 15
    args.startup_repeats = 2 if q else 7
    default_batches = "1,8" if q else "1,8,32"
    args.batches = [int(b) for b in (args.batches or default_batches).split(",")]
    args.zero_shot_classes = args.zero_shot_classes or (3 if q else 50)
    args.zero_shot_ref_classes = args.zero_shot_ref_classes or (1 if q else 3)
    default_lengths = "128,256" if q else "1024,4096,8192,16384"
    args.lengths = [int(n) for n in (args.lengths or default_lengths).split(",")]
    args.window = args.window or (32 if q else 256)
    args.flex_length = 256 if q else 8192
    args.flex = (not q) if args.flex is None else args.flex
    args.math_max_gb = 0.6
    args.dispatch_length = 64 if q else 256
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", message=".*No pretrained weights loaded.*")
    report = Report()
    report.meta = {
        "command": "uv run scripts/benchmark.py "
        + " ".join(sys.argv[1:] if argv is None else argv),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpu": platform.processor() or platform.machine(),
        "loadavg_start": os.getloadavg(),
        "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "(default)"),
        "quick": args.quick,
    }
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, load average "
        f"{os.getloadavg()[0]:.2f}, OMP_WAIT_POLICY {report.meta['OMP_WAIT_POLICY']}; "
        f"sections: {', '.join(args.sections)}",
        file=sys.stderr,
    )
    started = time.perf_counter()
    clip_sections = {"image", "text", "zeroshot", "compile"} & set(args.sections)
    models = build_clip_models(args.quick, "image" in args.sections) if clip_sections else None
    with torch.inference_mode():
        for section in args.sections:
            print(f"[{section}]", file=sys.stderr, flush=True)
            if section == "image":
                bench_image(args, report, models)
            elif section == "text":
                bench_text(args, report, models)
            elif section == "zeroshot":
                bench_zero_shot(args, report, models)
            elif section == "vit":
                bench_vit(args, report)
            elif section == "attention":
                bench_attention(args, report)
            elif section == "dispatch":
                bench_dispatch(args, report)
            elif section == "startup":
                bench_startup(args, report)
    if "compile" in args.sections:  # compiled graphs are made outside inference_mode
        with torch.no_grad():
            print("[compile]", file=sys.stderr, flush=True)
            bench_compile(args, report, models)
    report.meta["loadavg_end"] = os.getloadavg()
    report.meta["wall_s"] = time.perf_counter() - started
    text = report.markdown()
    print(text)
    print(
        f"{report.meta['command']}: torch {torch.__version__}, {report.meta['threads']} "
        f"threads, OMP_WAIT_POLICY {report.meta['OMP_WAIT_POLICY']}; load average at start "
        f"{report.meta['loadavg_start'][0]:.2f}, at end {report.meta['loadavg_end'][0]:.2f}; "
        f"{report.meta['wall_s']:.0f} s",
    )
    if args.markdown:
        with open(args.markdown, "w", encoding="utf-8") as f:
            f.write(text)
    if args.json:
        payload = {
            "meta": report.meta,
            "rows": [asdict(r) for r in report.rows],
            "goals": [asdict(g) for g in report.goals],
        }
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(payload, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
