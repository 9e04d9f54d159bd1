"""How an exported or quantized CLIP compares with the fp32 one: cosine of the embeddings,
zero-shot top-1, and speed timed interleaved (so load from other processes falls on every
runtime alike)."""

from __future__ import annotations

import io
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .towers import cut_tokens, example_inputs

# (encode_image, encode_text) of one runtime: tensor in, embeddings out
Encoders = tuple[Callable[[torch.Tensor], torch.Tensor], Callable[[torch.Tensor], torch.Tensor]]


def time_interleaved(fns: dict[str, Callable[[], Any]], repeats: int) -> dict[str, float]:
    """Median seconds per call of each function, warmed up once and then timed round-robin
    (A, B, A, B, ...) so that load from other processes falls on all of them alike."""
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def timing_inputs(model: nn.Module, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``batch`` random images and OpenAI's 80 ImageNet prompts of one class."""
    from ..tokenizer import get_tokenizer
    from ..zero_shot import IMAGENET_CLASSNAMES, OPENAI_IMAGENET_TEMPLATES

    images, _ = example_inputs(model, batch)
    tokenizer = get_tokenizer(model.config)
    tokens = tokenizer([t(IMAGENET_CLASSNAMES[0]) for t in OPENAI_IMAGENET_TEMPLATES])
    return images, tokens


def int8_report(
    model: nn.Module,
    qmodel: nn.Module,
    batch: int = 8,
    repeats: int = 5,
    verbose: bool = True,
) -> dict[str, Any]:
    """Speed ratio and cosine similarity of the int8 model to the fp32 one."""
    images, tokens = timing_inputs(model, batch)
    report: dict[str, Any] = {}
    with torch.inference_mode():
        for name, args, encode in (
            (f"image batch {batch}", images, "encode_image"),
            (f"text {len(tokens)} prompts", tokens, "encode_text"),
        ):
            fp32 = getattr(model, encode)(args)
            int8 = getattr(qmodel, encode)(args)
            cos = F.cosine_similarity(fp32, int8, dim=-1)
            t = time_interleaved(
                {
                    "fp32": lambda e=encode, a=args: getattr(model, e)(a),
                    "int8": lambda e=encode, a=args: getattr(qmodel, e)(a),
                },
                repeats,
            )
            t32, t8 = t["fp32"], t["int8"]
            report[name] = {
                "fp32_ms": t32 * 1e3,
                "int8_ms": t8 * 1e3,
                "speedup": t32 / t8,
                "cosine_min": cos.min().item(),
                "cosine_mean": cos.mean().item(),
            }
            if verbose:
                ok = "ok" if cos.min() >= 0.99 else "BELOW the 0.99 goal"
                print(
                    f"  int8 {name}: {t8 * 1e3:.1f} ms vs fp32 {t32 * 1e3:.1f} ms "
                    f"({t32 / t8:.2f}x); cosine to fp32 min {cos.min():.4f} "
                    f"mean {cos.mean():.4f} {ok}"
                )
    return report


def zero_shot_top1(
    encoders: dict[str, Encoders],
    model: nn.Module,
    data: Any,
    templates: list[str],
    batch: int = 50,
) -> dict[str, float]:
    """Zero-shot top-1 (%) of each ``(encode_image, encode_text)`` pair on ``data`` (a
    dataset with ``.classes`` whose items are ``(preprocessed image, label)``, or None for
    an unreadable image, which is skipped): a classifier of normalized, prompt-averaged
    class embeddings, argmax over classes. ``templates``: ``"a photo of a {}"``-style."""
    from ..tokenizer import get_tokenizer

    names = [c.replace("_", " ") for c in data.classes]
    tokenizer = get_tokenizer(model.config)
    prompts = cut_tokens(model, tokenizer([t.format(c) for c in names for t in templates]))
    classifiers = {}
    for key, (_, encode_text) in encoders.items():
        emb = F.normalize(encode_text(prompts).float(), dim=-1)
        emb = emb.reshape(len(names), len(templates), -1).mean(dim=1)
        classifiers[key] = F.normalize(emb, dim=-1).T
    hits = dict.fromkeys(encoders, 0)
    n = 0
    for start in range(0, len(data), batch):
        chunk = [data[i] for i in range(start, min(start + batch, len(data)))]
        chunk = [item for item in chunk if item is not None]  # unreadable images: skipped
        if not chunk:
            continue
        images = torch.stack([image for image, _ in chunk])
        labels = torch.tensor([label for _, label in chunk])
        for key, (encode_image, _) in encoders.items():
            feats = F.normalize(encode_image(images).float(), dim=-1)
            hits[key] += int(((feats @ classifiers[key]).argmax(dim=-1) == labels).sum())
        n += len(chunk)
    return {key: 100.0 * h / max(1, n) for key, h in hits.items()} | {"n": n}


def cosine_to_fp32(
    reference: Encoders, other: Encoders, rows: dict[str, list[torch.Tensor]]
) -> dict[str, dict[str, float]]:
    """Min / mean cosine of ``other``'s embeddings to ``reference``'s over ``rows``."""
    result = {}
    for i, name in enumerate(("image", "text")):
        cos = torch.cat(
            [F.cosine_similarity(reference[i](x).float(), other[i](x).float()) for x in rows[name]]
        )
        result[name] = {"min": cos.min().item(), "mean": cos.mean().item(), "n": len(cos)}
    return result


def speed_table(
    model: nn.Module,
    runners: dict[str, Encoders],
    batch: int,
    repeats: int,
    verbose: bool = True,
) -> dict[str, dict[str, float]]:
    """Each runner's median ms per call, timed interleaved: ``batch`` random images and the
    80 prompts (cut to the longest); ratios to the first runner."""
    images, tokens = timing_inputs(model, batch)
    tokens = cut_tokens(model, tokens)
    cases = {
        f"image batch {batch}": (0, images),
        f"text {len(tokens)} prompts x {tokens.shape[1]} tokens": (1, tokens),
    }
    table: dict[str, dict[str, float]] = {}
    with torch.inference_mode():
        for case, (i, x) in cases.items():
            fns = {key: (lambda f=enc[i], x=x: f(x)) for key, enc in runners.items()}
            t = time_interleaved(fns, repeats)
            table[case] = {key: s * 1e3 for key, s in t.items()}
            if verbose:
                first = next(iter(t))
                cells = [
                    f"{key} {s * 1e3:.1f} ms" + ("" if key == first else f" ({t[first] / s:.2f}x)")
                    for key, s in t.items()
                ]
                print(f"  {case}: " + ", ".join(cells))
    return table


def state_dict_mb(model: nn.Module) -> float:
    """The size of ``model``'s state dict as ``torch.save`` writes it, in MiB."""
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    return buf.tell() / 2**20
