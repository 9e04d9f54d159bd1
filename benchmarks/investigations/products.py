"""The batch-1 gap split in two: the weight products of the blocks alone, and the rest of
the tower (issue 19; docs/benchmarks.md, "On a CPU without AVX-512").

    uv run python -m benchmarks.investigations.products --threads 1   # ViT-B/32 batch 1 (~1 min)
    uv run python -m benchmarks.investigations.products --threads 1 --batch 8 --repeats 5
    GOMP_SPINCOUNT=10000 uv run python -m benchmarks.investigations.products --threads 2
    uv run python -m benchmarks.investigations.products --threads 1 --kernels  # + other kernels
    uv run python -m benchmarks.investigations.products --quick      # the tiny CLIP (a smoke test)

Four things are timed interleaved in one process, on the same random weights and threads:
our image tower and OpenVINO's (the graph ``attn_clip.export`` writes), and each runtime's
products of the 12 blocks alone, as its tower computes them, on fixed inputs of 50 tokens
per image. Ours: ``attn_core.fast_inference.linear_act`` (oneDNN on pre-packed weights)
for qkv, proj, fc1 + GELU and fc2 of every block, the last block's proj / fc1 / fc2 on its
pooled row alone, as ``encode_image`` does. OpenVINO: a graph of the 48 MatMul + bias
(+ GELU) nodes with one output each, which it runs as its ``FullyConnected`` kernels.
``rest`` is the tower minus its products: patch embedding, layer norms, attention,
residual adds, layout, dispatch and Python. One thread keeps the runtimes from taking the
cores from each other between calls; with more, run it with the
``GOMP_SPINCOUNT`` of the ``engines`` section (benchmarks/engines.py). ``--kernels`` adds our
products computed by each CPU kernel PyTorch has for them: oneDNN on pre-packed weights
with GELU fused in (as ``linear_act`` runs them) or run as its own op, the rest with
GELU as its own op: oneDNN on the plain (unpacked) weights, MKL's ``sgemm``
(``F.linear``) and MKL's packed ``sgemm`` (``torch.ops.mkl._mkl_linear``, what Inductor's
weight freezing uses for fp32)."""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from attn_core.fast_inference import linear_act

from benchmarks.clip_models import ours_and_openvino_image
from benchmarks.harness import time_interleaved


def openvino_products(blocks, xw: torch.Tensor, xh: torch.Tensor, threads: int):
    """The blocks' products as one OpenVINO graph on the inputs ``xw`` ``(B, N, D)`` (qkv,
    proj, fc1) and ``xh`` ``(B, N, 4D)`` (fc2), one output per product: ``(run, max abs
    difference of its outputs to ours on the same inputs)``."""
    import openvino as ov
    import openvino.opset13 as op
    from attn_clip import export as ex

    def const(t: torch.Tensor):
        return op.constant(t.detach().numpy())

    x, h = (op.parameter(list(t.shape), np.float32) for t in (xw, xh))
    outs, ours = [], []
    for blk in blocks:
        attn, mlp = blk.attn, blk.mlp
        products = [(x, xw, attn.qkv, None), (x, xw, attn.proj, None)]
        products += [(x, xw, mlp.fc1, mlp.act), (h, xh, mlp.fc2, None)]
        for src, inp, lin, act in products:
            y = op.add(op.matmul(src, const(lin.weight), False, True), const(lin.bias))
            outs.append(y if act is None else op.gelu(y, "erf"))
            ours.append(linear_act(lin, inp, act))
    compiled = ex.compile_openvino(ov.Model(outs, [x, h]), threads, "f32")
    request = compiled.create_infer_request()
    inputs = {0: xw.numpy(), 1: xh.numpy()}
    got = request.infer(inputs)
    diff = max(float((torch.from_numpy(got[i]) - o).abs().max()) for i, o in enumerate(ours))
    return (lambda: request.infer(inputs, share_inputs=True)), diff


def our_items(blocks, xw: torch.Tensor, xh: torch.Tensor) -> list:
    """``(linear, input rows, activation)`` of each product our tower computes: every
    block's four, the last block's proj / fc1 / fc2 on its pooled row alone (``run_blocks``
    with ``rows``), as ``encode_image`` runs them."""
    items = []
    for i, blk in enumerate(blocks):
        w, h = (xw, xh) if i < len(blocks) - 1 else (xw[:, :1], xh[:, :1])
        items.append((blk.attn.qkv, xw.flatten(0, 1), None))
        items.append((blk.attn.proj, w.flatten(0, 1).contiguous(), None))
        items.append((blk.mlp.fc1, w.flatten(0, 1).contiguous(), blk.mlp.act))
        items.append((blk.mlp.fc2, h.flatten(0, 1).contiguous(), None))
    return items


def kernel_variants(items: list) -> dict:
    """Our products on the other kernels (see the module docstring), by name."""
    onednn, mkl = torch.ops.mkldnn._linear_pointwise, torch.ops.mkl
    rows = [x.shape[0] for _, x, _ in items]
    packed = [torch.ops.mkldnn._reorder_linear_weight(lin.weight, 64) for lin, _, _ in items]
    mkl_packed = [mkl._mkl_reorder_linear_weight(lin.weight, x.shape[0]) for lin, x, _ in items]

    def run(product) -> None:  # GELU as its own op
        for i, (lin, x, act) in enumerate(items):
            y = product(i, lin, x)
            if act is not None:
                act(y)

    def fused() -> None:
        for i, (lin, x, act) in enumerate(items):
            post = ("none", "") if act is None else ("gelu", act.approximate)
            onednn(x, packed[i], lin.bias, post[0], [], post[1])

    return {
        "products, oneDNN, GELU fused in": fused,
        "products, oneDNN, GELU its own op": lambda: run(
            lambda i, lin, x: onednn(x, packed[i], lin.bias, "none", [], "")
        ),
        "products, oneDNN on plain weights": lambda: run(
            lambda i, lin, x: onednn(x, lin.weight, lin.bias, "none", [], "")
        ),
        "products, MKL sgemm (F.linear)": lambda: run(
            lambda i, lin, x: F.linear(x, lin.weight, lin.bias)
        ),
        "products, MKL packed sgemm": lambda: run(
            lambda i, lin, x: mkl._mkl_linear(x, mkl_packed[i], lin.weight, lin.bias, rows[i])
        ),
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line; counts below 1 are refused (exit 2)."""
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.investigations.products", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--batch", type=int, default=1, help="images (products: 50 rows each)")
    p.add_argument("--threads", type=int, default=None, help="default: torch's thread count")
    p.add_argument("--repeats", type=int, default=15, help="timed samples of each")
    p.add_argument("--quick", action="store_true", help="the tiny CLIP")
    p.add_argument("--kernels", action="store_true", help="our products on other kernels")
    args = p.parse_args(argv)
    for name in ("batch", "threads", "repeats"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            p.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    return args


def products_table(args: argparse.Namespace, ours: Any, graph: Any) -> str:
    """Time the towers and the products (``ours``, OpenVINO's ``graph`` of its image tower,
    from ``ours_and_openvino_image``); the table as markdown, with its heading line."""
    from attn_clip import export as ex

    threads = torch.get_num_threads()
    config = ours.config
    tower = ex.OpenVINOTower(ex.compile_openvino(graph, threads))
    blocks = list(ours.visual.trunk.blocks)
    size, patch = config.vision.image_size, config.vision.patch_size
    tokens = (size // patch) ** 2 + 1
    x = torch.randn(args.batch, 3, size, size)
    xw = torch.randn(args.batch, tokens, blocks[0].attn.qkv.in_features)
    xh = torch.randn(args.batch, tokens, blocks[0].mlp.fc1.out_features)

    items = our_items(blocks, xw, xh)

    def our_products() -> None:
        for lin, rows, act in items:
            linear_act(lin, rows, act)

    with torch.inference_mode():
        ov_products, diff = openvino_products(blocks, xw, xh, threads)
        fns = {
            "ours tower": lambda: ours.encode_image(x),
            "OpenVINO tower": lambda: tower(x),
            "ours products": our_products,
            "OpenVINO products": ov_products,
        }
        if args.kernels:
            fns.update(kernel_variants(items))
        t = {k: v.median * 1e3 for k, v in time_interleaved(fns, args.repeats, 2).items()}
    name = "tiny CLIP" if args.quick else "ViT-B/32"
    lines = [
        f"{name} image tower, batch {args.batch}, {threads} threads, median of {args.repeats} "
        f"interleaved calls; products: those of the {len(blocks)} blocks (OpenVINO's outputs "
        f"to ours: max diff {diff:.1e})",
        "",
        "| ms per call | ours | OpenVINO | ours vs OpenVINO |",
        "|---|---:|---:|---:|",
    ]
    rows = {
        "tower": (t["ours tower"], t["OpenVINO tower"]),
        "products": (t["ours products"], t["OpenVINO products"]),
    }
    rows["rest (tower - products)"] = tuple(a - b for a, b in zip(*rows.values(), strict=True))
    for label, (o, v) in rows.items():
        lines.append(f"| {label} | {o:.1f} | {v:.1f} | {v / o:.2f}x |")
    for label in fns:
        if label.startswith("products, "):
            o, v = t[label], t["OpenVINO products"]
            lines.append(f"| ours {label} | {o:.1f} | {v:.1f} | {v / o:.2f}x |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    print(products_table(args, *ours_and_openvino_image(args.quick)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
