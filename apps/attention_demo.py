"""attn-core in a few seconds on CPU.

Runs the readable reference ``scaled_dot_product_attention`` and ``attention()`` on every
backend this machine can serve, shows a causal + padding mask and its attention weights,
and checks that ``MultiHeadAttention`` decoding with a ``KVCache`` matches the full
forward pass.

    uv run apps/attention_demo.py [--seq-len 6] [--heads 4] [--json]
"""

from __future__ import annotations

import json
import time

import attn_core.cli  # first: Ctrl-C while torch loads -> one line, exit 130
import torch
from attn_core import (
    AttentionBackendError,
    KVCache,
    MultiHeadAttention,
    attention,
    available_backends,
    causal_mask,
    last_backend,
    padding_mask,
    scaled_dot_product_attention,
)

HEAD_DIM = 16


def compare_backends(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, names: list[str]) -> dict:
    """Run each backend in ``names`` against the reference; report error, time, who ran."""
    ref, _ = scaled_dot_product_attention(q, k, v, is_causal=True)
    rows = []
    for name in names:
        start = time.perf_counter()
        try:
            out = attention(q, k, v, is_causal=True, backend=name)
        except AttentionBackendError as err:  # e.g. flash_attn needs CUDA
            rows.append({"backend": name, "skipped": str(err)})
            continue
        rows.append(
            {
                "backend": name,
                "ran": last_backend(),
                "max_abs_diff": (out - ref).abs().max().item(),
                "ms": 1000 * (time.perf_counter() - start),
            }
        )
    attention(q, k, v, is_causal=True)  # backend=None: automatic choice
    return {"available": available_backends(), "auto": last_backend(), "results": rows}


def mask_example() -> dict:
    """Causal + key padding on a 2-sequence batch; the weights of the padded sequence."""
    lengths, L = [5, 3], 5
    q, k, v = (torch.randn(2, 1, L, HEAD_DIM) for _ in range(3))
    kpm = padding_mask(lengths, L)  # (B, L), True = padding
    out, w = attention(q, k, v, key_padding_mask=kpm, is_causal=True, need_weights=True)
    fast = attention(q, k, v, key_padding_mask=kpm, is_causal=True, backend="sdpa")
    # the same thing as one explicit "may attend" mask
    explicit = causal_mask(L)[None, None] & ~kpm[:, None, None, :]
    fast2 = attention(q, k, v, attn_mask=explicit, backend="sdpa")
    return {
        "lengths": lengths,
        "key_padding_mask": kpm[1].tolist(),
        "weights": [[round(x, 2) for x in row] for row in w[1, 0].tolist()],
        "sdpa_vs_math": (fast - out).abs().max().item(),
        "explicit_vs_flags": (fast2 - fast).abs().max().item(),
    }


def kv_cache_example(seq_len: int, heads: int) -> dict:
    """Prefill half the sequence, then decode one token at a time through a KVCache."""
    kv_heads = heads // 2 if heads % 2 == 0 else heads  # GQA when possible
    mha = MultiHeadAttention(heads * HEAD_DIM, heads, num_kv_heads=kv_heads, rope=True).eval()
    x = torch.randn(2, seq_len, heads * HEAD_DIM)
    full, _ = mha(x, is_causal=True)

    cache = KVCache()
    prefill = max(seq_len // 2, 1)
    steps = [mha(x[:, :prefill], is_causal=True, kv_cache=cache)[0]]
    for t in range(prefill, seq_len):
        steps.append(mha(x[:, t : t + 1], is_causal=True, kv_cache=cache)[0])
    decoded = torch.cat(steps, dim=1)
    return {
        "embed_dim": mha.embed_dim,
        "num_heads": heads,
        "num_kv_heads": kv_heads,
        "prefill": prefill,
        "decode_steps": seq_len - prefill,
        "cache_shape": list(cache.key.shape),
        "max_abs_diff": (decoded - full).abs().max().item(),
    }


def format_table(weights: list[list[float]], padding: list[bool]) -> str:
    labels = [f"k{j}{'*' if p else ''}" for j, p in enumerate(padding)]
    lines = ["       " + "".join(f"{s:>6}" for s in labels)]
    for i, row in enumerate(weights):
        lines.append(f"  q{i:<4}" + "".join(f"{x:6.2f}" for x in row))
    return "\n".join(lines)


def report(res: dict) -> None:
    b = res["backends"]
    print(f"attn-core demo  q/k/v: {res['shape']} (B, H, L, D), causal")
    print(f"\n1. backends (available here: {', '.join(b['available'])})")
    print("   reference: scaled_dot_product_attention (the 'math' code, returns weights)")
    for r in b["results"]:
        if "skipped" in r:
            print(f"   {r['backend']:<11} skipped: {r['skipped']}")
        else:
            print(
                f"   {r['backend']:<11} last_backend()={r['ran']:<6} "
                f"max|diff|={r['max_abs_diff']:.1e}  {r['ms']:7.1f} ms"
            )
    print(f"   automatic choice (backend=None): {b['auto']}")
    if any(r.get("backend") == "flex" and "ms" in r for r in b["results"]):
        print("   (flex's first call pays a one-off set-up cost)")

    m = res["masks"]
    print("\n2. causal + key padding (lengths {}), sequence 1, head 0".format(m["lengths"]))
    print("   key_padding_mask True = padding (*); attn_mask True = may attend")
    print(format_table(m["weights"], m["key_padding_mask"]))
    print("   rows sum to 1; padded keys and future keys get 0.")
    print("   padded queries (q3, q4) still attend to real keys: drop their outputs yourself.")
    print(
        f"   sdpa vs math: {m['sdpa_vs_math']:.1e}; one explicit bool mask vs the flags: "
        f"{m['explicit_vs_flags']:.1e}"
    )

    c = res["kv_cache"]
    print(
        f"\n3. MultiHeadAttention E={c['embed_dim']} H={c['num_heads']} "
        f"Hkv={c['num_kv_heads']} with RoPE"
    )
    print(
        f"   prefill: {c['prefill']} tokens at once, then {c['decode_steps']} steps of 1 token; "
        f"cache (B, Hkv, L, hd) = {tuple(c['cache_shape'])}"
    )
    print(f"   KV-cache decoding vs full causal forward: max|diff| = {c['max_abs_diff']:.1e}")


def main(argv: list[str] | None = None) -> int:
    parser = attn_core.cli.make_parser(__doc__)
    parser.add_argument("--seq-len", type=int, default=8, help="tokens per sequence")
    parser.add_argument("--heads", type=int, default=4, help="attention heads")
    parser.add_argument(
        "--backends",
        default=",".join(available_backends()),
        help="comma-separated backends to compare (default: all importable here)",
    )
    parser.add_argument("--seed", type=int, default=0, help="random seed of the inputs")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)
    if args.seq_len < 1 or args.heads < 1:
        return attn_core.cli.fail(
            f"--seq-len and --heads must be >= 1, got {args.seq_len}, {args.heads}"
        )

    torch.manual_seed(args.seed)
    shape = (2, args.heads, args.seq_len, HEAD_DIM)
    with torch.inference_mode():
        q, k, v = (torch.randn(shape) for _ in range(3))
        res = {
            "shape": list(shape),
            "backends": compare_backends(q, k, v, args.backends.split(",")),
            "masks": mask_example(),
            "kv_cache": kv_cache_example(args.seq_len, args.heads),
        }
    if args.json:
        print(json.dumps(res, indent=2))
    else:
        report(res)
    ok = [r["max_abs_diff"] < 1e-4 for r in res["backends"]["results"] if "ran" in r]
    ok += [res["kv_cache"]["max_abs_diff"] < 1e-4, res["masks"]["sdpa_vs_math"] < 1e-4]
    return 0 if all(ok) else 1


if __name__ == "__main__":
    attn_core.cli.run(main)
