"""Section ``caption``: CoCa captioning, ours (``CoCa.generate``: the image encoded once,
each cross-attention block's keys / values once per image, KV caches) against the plain loop
over open_clip's ``forward`` -- the only open_clip path that runs here (its
``CoCa.generate()`` needs transformers' ``BeamSearchScorer``, which transformers 5 no longer
has): the image encoded once with ``_encode_image``, then every step the whole prefix through
the text tower and the multimodal decoder, argmax of the last row.

open_clip builds a ``coca_ViT-B-32`` (``--quick``: a tiny CoCa of the same layout) and every
parameter is drawn (``random_fill_``; open_clip leaves ``text_decoder.text_projection`` as
``torch.empty``); its state dict is saved as ``open_clip_model.safetensors`` with its
``open_clip_config.json`` and ours is ``attn_clip.create_model(folder)``, so both hold the
same weights.

* Greedy, 30 tokens (the start token and 29 decoded; open_clip's ``seq_len=30``), batch 1 and
  8, with ``min_length=0`` and no end-of-text so both sides run every step; the ``check``
  column says whether the tokens are the same. ``ours, use_cache=False`` (batch 1) re-runs the
  whole prefix every step as open_clip does, with the cross-attention keys / values still
  computed once. ``weights alone (a bound)`` (batch 1 and 8) is no decoding at all: the image
  tower, then per step only the products whose weights a cached step must read (every text
  and decoder block's, the cross-attention queries' and the vocabulary projection, on that
  many rows, on the kernels ours runs them on at one row: MKL's ``F.linear`` for the blocks,
  oneDNN's packed product for the projection). One step of one caption streams ~530 MB of
  fp32 weights; on a memory-bound CPU no exact decoder can be faster than this row, so
  ``open_clip / bound`` is the most any fp32 decoder can reach there.
* The batch-1 step split: ``generate`` with forward hooks that stamp the clock where a step
  enters the text tower's blocks, the decoder, its final norm and leaves the decoder: the text
  tower's cached step, the decoder's blocks (cached self-attention, cross-attention over the
  precomputed keys / values, MLPs) and the vocabulary projection, per step.
* Beam search, 6 beams, batch 1 and 2 (``--quick``: 1): ours' whole ``generate``, its image
  tower alone (what it runs, once per image: counted with a forward hook) and the decoding
  (the difference); and as the reference row the image tower on 6 copies of each image, the
  cost of open_clip's ``_generate_beamsearch``, which repeats every image once per beam
  before encoding it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import sys
import tempfile
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from benchmarks.harness import Report, Timing, peak_memory_mb, random_fill_, time_interleaved

SOT = 49406
STEPS = 29  # decoded tokens after the start token: 30 tokens in all
BEAMS = 6
TINY_COCA_CFG = {  # --quick: open_clip's coca_ViT-B-32 layout at a few percent of its size
    "embed_dim": 64,
    "vision_cfg": {
        "image_size": 32, "layers": 2, "width": 64, "patch_size": 8, "head_width": 16,
        "attentional_pool": True, "attn_pooler_heads": 4, "attn_pooler_queries": 16,
        "output_tokens": True,
    },
    "text_cfg": {
        "context_length": 76, "vocab_size": 49408, "width": 64, "heads": 4, "layers": 2,
        "embed_cls": True, "output_tokens": True,
    },
    "multimodal_cfg": {
        "context_length": 76, "vocab_size": 49408, "width": 64, "heads": 4, "layers": 2,
        "attn_pooler_heads": 4,
    },
}  # fmt: skip


def cpu_description() -> str:
    """``/proc/cpuinfo``'s model name and the widest vector ISA (AVX-512 / AVX2), e.g.
    ``"AMD EPYC, AVX2 (no AVX-512)"``; the platform's name elsewhere."""
    import platform

    try:
        info = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return platform.processor() or platform.machine()
    name = re.search(r"^model name\s*:\s*(.+)$", info, re.M)
    flags = re.search(r"^flags\s*:\s*(.+)$", info, re.M)
    flag_set = set(flags.group(1).split()) if flags else set()
    isa = (
        "AVX-512" if "avx512f" in flag_set
        else "AVX2 (no AVX-512)" if "avx2" in flag_set
        else "no AVX2"
    )  # fmt: skip
    return f"{name.group(1).strip() if name else platform.machine()}, {isa}"


def build(quick: bool) -> tuple[Any, Any, int]:
    """``(ours, open_clip's CoCa, image size)`` on the same random weights, in eval mode."""
    import open_clip
    from attn_clip import create_model
    from safetensors.torch import save_file

    cfg = TINY_COCA_CFG if quick else open_clip.get_model_config("coca_ViT-B-32")
    cfg = {k: v for k, v in cfg.items() if k != "custom_text"}
    torch.manual_seed(0)
    # (not under inference_mode: the weights are written, then saved and read back)
    with torch.inference_mode(False), torch.no_grad():
        ref = random_fill_(open_clip.CoCa(**cfg))
        with tempfile.TemporaryDirectory(prefix="attn-zoo-bench-coca-") as tmp:
            state = {k: v.contiguous() for k, v in ref.state_dict().items()}
            save_file(state, str(Path(tmp) / "open_clip_model.safetensors"))
            config = json.dumps({"model_cfg": cfg})
            (Path(tmp) / "open_clip_config.json").write_text(config, encoding="utf-8")
            ours = create_model(tmp).eval()
    return ours, ref, cfg["vision_cfg"]["image_size"]


def open_clip_greedy(ref: Any, images: torch.Tensor, steps: int = STEPS) -> torch.Tensor:
    """The plain loop over open_clip's forward: ``(B, 1 + steps)`` ids from the start token."""
    latent, embs = ref._encode_image(images)
    out = torch.full((images.shape[0], 1), SOT, dtype=torch.long)
    for _ in range(steps):
        logits = ref(images, out, image_latent=latent, image_embs=embs, output_labels=False)
        out = torch.cat((out, logits["logits"][:, -1].argmax(-1, keepdim=True)), dim=1)
    return out


@contextlib.contextmanager
def images_seen(model: Any) -> Iterator[list[int]]:
    """Count the images ``model``'s image tower encodes inside the block (one entry per
    call: the batch its attentional pooler, or final norm, is called on)."""
    seen: list[int] = []
    module = model.visual.attn_pool or model.visual.ln_post
    handle = module.register_forward_pre_hook(lambda m, args: seen.append(args[0].shape[0]))
    try:
        yield seen
    finally:
        handle.remove()


def bench_caption(args: argparse.Namespace, report: Report) -> None:
    """Greedy at batch 1 and 8 against open_clip's loop (goal: >= 5x, same tokens), then
    beam search with the image tower's share (goal: the tower runs once per image)."""
    cpu = cpu_description()
    report.meta["cpu_model"] = cpu
    print(f"  CPU: {cpu}", file=sys.stderr)
    ours, ref, size = build(args.quick)
    name = "tiny CoCa" if args.quick else "CoCa ViT-B/32"
    g = torch.Generator().manual_seed(0)
    for batch in (1, 8):
        images = torch.randn(batch, 3, size, size, generator=g)
        _greedy(args, report, ours, ref, images, name, cpu)
        if batch == 1:
            _step_split(args, report, ours, images, name)
    for batch in (1,) if args.quick else (1, 2):
        images = torch.randn(batch, 3, size, size, generator=g)
        _beam_search(args, report, ours, ref, images, name, cpu)


def _greedy(
    args: argparse.Namespace,
    report: Report,
    ours: Any,
    ref: Any,
    images: torch.Tensor,
    name: str,
    cpu: str,
) -> None:
    """One batch of greedy captions: ours, open_clip's loop (and ours uncached at batch 1)."""
    batch = images.shape[0]
    greedy = dict(min_length=0, max_length=1 + STEPS, eos_token_id=None)
    fns = {
        "ours": lambda: ours.generate(images, **greedy),
        "open_clip forward loop": lambda: open_clip_greedy(ref, images),
    }
    if batch == 1:
        fns["ours, use_cache=False"] = lambda: ours.generate(images, **greedy, use_cache=False)
    outs = {k: f() for k, f in fns.items()}  # (also the warm-up)
    same = {k: torch.equal(v, outs["open_clip forward loop"]) for k, v in outs.items()}
    checks = {k: "same tokens" if ok else "TOKENS DIFFER" for k, ok in same.items()}
    checks["open_clip forward loop"] = f"reference, {tuple(outs['ours'].shape)} ids"
    bound = "weights alone (a bound)"
    fns[bound] = partial(weights_alone, ours, images)
    fns[bound]()  # (its warm-up: the projection's weights packed)
    checks[bound] = "no tokens: the tower + each step's products"
    t = time_interleaved(fns, args.caption_repeats, warmup=0)
    mem = {"ours": peak_memory_mb(fns["ours"])} if args.memory else {}
    rows = report.add_case(
        f"{name} captions: greedy, {1 + STEPS} tokens", f"batch {batch}", t, batch * STEPS,
        "token", memory=mem, checks=checks,
        note=f"{t['ours'].median / STEPS * 1e3:.1f} ms per step, ours",
    )  # fmt: skip
    ratio = rows["open_clip forward loop"].ref_over_ours
    most = t["open_clip forward loop"].median / t[bound].median
    report.goal(
        f"greedy captions batch {batch}, {name}",
        ">= 5x open_clip's forward loop, same tokens",
        f"{ratio:.2f}x, {'same' if all(same.values()) else 'DIFFERENT'} tokens ({cpu}, "
        f"{torch.get_num_threads()} threads; the weights alone: {most:.2f}x)",
        ratio >= 5 and all(same.values()),
    )


def weights_alone(model: Any, images: torch.Tensor, steps: int = STEPS) -> None:
    """The image tower, then ``steps`` times only the products a cached greedy step must
    read the weights of, on one row per image (a lower bound on a memory-bound CPU)."""
    from attn_core.fast_inference import linear_act

    dec = model.text_decoder
    linears = []  # (weight, bias) of one step's products, in the order a step runs them
    for blk in [*model.text.blocks, *dec.blocks]:
        linears += [blk.attn.qkv, blk.attn.proj, blk.mlp.fc1, blk.mlp.fc2]
    width = dec.config.width
    for blk in dec.cross_blocks:  # the query rows of its in-projection (keys / values: once)
        q = (blk.attn.qkv.weight[:width], blk.attn.qkv.bias[:width])
        linears += [q, blk.attn.proj, blk.mlp.fc1, blk.mlp.fc2]
    linears = [lin if isinstance(lin, tuple) else (lin.weight, lin.bias) for lin in linears]
    model.encode_image_tokens(images)
    n = images.shape[0]
    rows = {w.shape[1]: torch.randn(n, 1, w.shape[1]) for w, _ in linears}
    for _ in range(steps):
        for weight, bias in linears:
            F.linear(rows[weight.shape[1]], weight, bias)
        linear_act(dec.proj, rows[width], enabled=True)


def _step_split(
    args: argparse.Namespace, report: Report, ours: Any, images: torch.Tensor, name: str
) -> None:
    """Where a batch-1 greedy step goes: the text tower's cached step, the decoder's blocks,
    the vocabulary projection (forward hooks stamp the clock), per step."""
    marks: list[tuple[str, float]] = []

    def stamp(label: str) -> Any:
        return lambda *_: marks.append((label, time.perf_counter()))

    dec = ours.text_decoder
    hooks = [
        ours.text.blocks[0].register_forward_pre_hook(stamp("text")),
        dec.register_forward_pre_hook(stamp("decoder")),
        dec.ln_final.register_forward_pre_hook(stamp("vocab")),
        dec.register_forward_hook(stamp("end")),
    ]
    parts = ("text tower step", "decoder blocks", "vocabulary projection")
    per_step: dict[str, list[float]] = {p: [] for p in parts}
    greedy = dict(min_length=0, max_length=1 + STEPS, eos_token_id=None)
    try:
        for _ in range(args.caption_repeats):
            marks.clear()
            ours.generate(images, **greedy)
            stamps = [t for _, t in marks]
            labels = [label for label, _ in marks]
            if labels != ["text", "decoder", "vocab", "end"] * STEPS:
                raise RuntimeError(f"unexpected step hooks: {labels[:8]}")
            for i, part in enumerate(parts):  # the spans text->decoder, ->vocab, ->end
                spans = [stamps[j + i + 1] - stamps[j + i] for j in range(0, len(stamps), 4)]
                per_step[part].append(sum(spans) / STEPS)
    finally:
        for h in hooks:
            h.remove()
    timings = {p: Timing(v) for p, v in per_step.items()}
    total = sum(t.median for t in timings.values())
    report.add_case(
        f"{name} captions: greedy batch 1, one step split", "per step", timings, 1, "step",
        ours="", checks={p: f"{t.median / total:.0%} of the three" for p, t in timings.items()},
    )  # fmt: skip


def _beam_search(
    args: argparse.Namespace,
    report: Report,
    ours: Any,
    ref: Any,
    images: torch.Tensor,
    name: str,
    cpu: str,
) -> None:
    """One batch of 6-beam captions: generate, its image tower and the decoding, and the
    tower on one copy of each image per beam (ours and open_clip's)."""
    batch = images.shape[0]
    beams = dict(num_beams=BEAMS, max_length=1 + STEPS)
    per_beam = images.repeat_interleave(BEAMS, dim=0)  # open_clip's _generate_beamsearch
    with images_seen(ours) as seen:
        ids = ours.generate(images, **beams)  # (also the warm-up)
    fns = {
        "generate": lambda: ours.generate(images, **beams),
        "tower": lambda: ours.encode_image_tokens(images),
        "ours per beam": lambda: ours.encode_image_tokens(per_beam),
        "open_clip per beam": lambda: ref._encode_image(per_beam),
    }
    for f in list(fns.values())[1:]:
        f()
    t = time_interleaved(fns, args.caption_repeats, warmup=0)
    total, tower = t["generate"], t["tower"]
    decode = Timing([max(a - b, 0.0) for a, b in zip(total.times, tower.times, strict=True)])
    share = tower.median / total.median
    section = f"{name} captions: beam search, {BEAMS} beams, up to {1 + STEPS} tokens"
    case = f"batch {batch}"
    report.add_case(
        section, f"{case}: generate", {"ours": total}, batch, "img",
        checks={"ours": f"{tuple(ids.shape)} ids; the tower saw {sum(seen)} image(s)"},
    )  # fmt: skip
    report.add_case(
        section, f"{case}: decoding (generate - tower)", {"ours": decode}, batch, "img",
        checks={"ours": f"{1 - share:.0%} of generate"},
    )  # fmt: skip
    report.add_case(
        section, f"{case}: image tower", {"ours, once per image": tower,
        "ours, once per beam": t["ours per beam"],
        "open_clip, once per beam": t["open_clip per beam"]}, batch, "img",
        ours="ours, once per image",
        checks={"ours, once per image": f"{share:.0%} of generate",
                "ours, once per beam": f"{batch} x {BEAMS} images",
                "open_clip, once per beam": f"{batch} x {BEAMS} images (its beam search)"},
    )  # fmt: skip
    per_beam_ms = t["open_clip per beam"].median * 1e3
    report.goal(
        f"beam search {BEAMS} beams batch {batch}: image tower once per image",
        f"the tower encodes {batch} image(s) (open_clip: {batch * BEAMS})",
        f"{sum(seen)} image(s) in {len(seen)} call(s); tower {tower.median * 1e3:.1f} ms "
        f"({share:.0%}) of {total.median * 1e3:.0f} ms, decoding "
        f"{decode.median * 1e3:.0f} ms; open_clip's tower once per beam: {per_beam_ms:.1f} ms "
        f"({cpu})",
        sum(seen) == batch,
    )
