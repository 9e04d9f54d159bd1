"""What a batch-1 greedy caption step of CoCa ViT-B/32 costs with other kernels (issue 31;
docs/benchmarks.md, Captioning):

    uv run python -m benchmarks.investigations.caption_step            # ~2 min, 1 thread
    uv run python -m benchmarks.investigations.caption_step --quick    # the tiny CoCa

Timed interleaved in one process on the caption section's random weights
(:func:`benchmarks.caption.build`), in CPU time of this thread (``time.thread_time``: on a
shared machine the time the process is descheduled does not count), the min of ``--repeats``:

* a whole 30-token greedy caption (29 steps): as shipped (module calls at one row), with the
  self-attention blocks run fused at one row too (oneDNN products,
  ``TransformerBlock.forward_fused``), and with the ``math`` attention backend forced; every
  variant must give the shipped tokens;
* one step's weight products alone on one row (the blocks' qkv / proj / fc1 / fc2 of the
  text tower and the decoder, the cross-attention blocks' proj / fc1 / fc2; the vocabulary
  projection apart): MKL's ``F.linear`` against oneDNN on pre-packed weights
  (``attn_core.onednn.fused_linear``).
"""

from __future__ import annotations

import argparse
import contextlib
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from benchmarks.caption import STEPS, build


def fused_at_one_row(original: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """``attn_clip.coca.self_attention_block`` that runs the fused block at one row too."""
    from attn_clip import coca

    def run(blk, x, cache, fast, **kwargs) -> torch.Tensor:
        if not (fast and coca.block_supported(blk)):
            return original(blk, x, cache, fast, **kwargs)
        prefix = None if cache is None or cache.is_empty else (cache.key, cache.value)
        own: list[Any] = []
        x = blk.forward_fused(x, prefix=prefix, keep_kv=own, **kwargs)
        if cache is not None:
            cache.update(*own[0])
        return x

    return run


def cpu_time(fn: Callable[[], Any]) -> float:
    """Seconds of this thread's CPU time that ``fn()`` takes."""
    start = time.thread_time()
    fn()
    return time.thread_time() - start


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="the tiny CoCa")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    from attn_clip import coca
    from attn_core import use_backend
    from attn_core.onednn import fused_linear

    ours, _, size = build(args.quick)
    images = torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(0))
    greedy = dict(min_length=0, max_length=1 + STEPS, eos_token_id=None)
    shipped = coca.self_attention_block

    @contextlib.contextmanager
    def variant(name: str):
        if name == "fused blocks at one row":
            coca.self_attention_block = fused_at_one_row(shipped)
        try:
            with use_backend("math") if name == "math attention" else contextlib.nullcontext():
                yield
        finally:
            coca.self_attention_block = shipped

    def caption(name: str) -> Callable[[], Any]:
        def run() -> torch.Tensor:
            with variant(name):
                return ours.generate(images, **greedy)

        return run

    dec = ours.text_decoder
    modules = []
    for blk in [*ours.text.blocks, *dec.blocks]:
        modules += [blk.attn.qkv, blk.attn.proj, blk.mlp.fc1, blk.mlp.fc2]
    for blk in dec.cross_blocks:  # (their keys / values: once per image)
        modules += [blk.attn.proj, blk.mlp.fc1, blk.mlp.fc2]
    linears = [(m.weight, m.bias) for m in modules]
    rows = {w.shape[1]: torch.randn(1, 1, w.shape[1]) for w, _ in linears}
    vocab = [(dec.proj.weight, None)]

    def products(kernel: Callable[..., torch.Tensor], which: list) -> Callable[[], None]:
        def run() -> None:
            for weight, bias in which:
                kernel(rows[weight.shape[1]], weight, bias)

        return run

    captions = ("shipped", "fused blocks at one row", "math attention")
    fns = {name: caption(name) for name in captions}
    fns |= {
        "block products, MKL F.linear": products(F.linear, linears),
        "block products, oneDNN packed": products(fused_linear, linears),
        "vocabulary projection, MKL F.linear": products(F.linear, vocab),
        "vocabulary projection, oneDNN packed": products(fused_linear, vocab),
    }
    with torch.inference_mode():
        tokens = {name: fn() for name, fn in fns.items()}  # (also the warm-up and packing)
        for name in ("fused blocks at one row", "math attention"):
            if not torch.equal(tokens[name], tokens["shipped"]):
                raise SystemExit(f"{name}: the tokens differ from the shipped decoder's")
        times: dict[str, list[float]] = {name: [] for name in fns}
        for _ in range(args.repeats):
            for name, fn in fns.items():
                times[name].append(cpu_time(fn))
    for name, t in times.items():
        per = "caption" if name in captions else "step"
        print(f"{name:38s} {min(t) * 1e3:9.1f} ms CPU per {per} (min of {len(t)})")


if __name__ == "__main__":
    main()
