"""The CLIP towers as exportable modules (tensor in, unnormalized embeddings out), their
example inputs, and the check of a runtime's outputs against PyTorch."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
from attn_core import fast_inference
from torch import nn

# tower -> (input name, output name) of its graph
TOWERS = {"image": ("images", "image_embeds"), "text": ("tokens", "text_embeds")}


class ImageTower(nn.Module):
    """``(B, 3, H, W)`` images -> ``(B, E)`` unnormalized image embeddings."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.model.encode_image(images)


class TextTower(nn.Module):
    """``(B, L)`` token ids -> ``(B, E)`` unnormalized text embeddings (all ``L`` columns:
    the graph cannot cut the batch at its longest caption, so feed it already cut)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.model.encode_text(tokens, truncate=False)


def plain_copy(model: nn.Module) -> nn.Module:
    """An eval-mode copy with the CPU inference fast path off in every module (its oneDNN
    ops have no ONNX / OpenVINO form)."""
    return fast_inference.disable(copy.deepcopy(model).eval())


def example_inputs(
    model: nn.Module, batch: int, length: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``batch`` random images and token rows of ``length`` (default: the context length),
    each row starting with SOT and ending with EOT."""
    size = model.config.vision.image_size
    size = (size, size) if isinstance(size, int) else tuple(size)
    images = torch.randn(batch, 3, *size)
    ctx = model.config.text.context_length
    length = ctx if length is None else length
    g = torch.Generator().manual_seed(batch * 1000 + length)
    tokens = torch.randint(1, 49000, (batch, length), generator=g)
    tokens[:, 0] = 49406  # SOT
    tokens[:, -1] = 49407  # EOT (the argmax)
    return images, tokens


def cut_tokens(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """``tokens`` without the columns after the batch's last pooled token (what the graphs
    should be fed: with causal attention those columns cannot change the embeddings)."""
    from ..text import pool_positions

    c = model.config.text
    idx = pool_positions(tokens, c.pool_type, c.eos_id) if c.causal else None
    return tokens if idx is None or len(tokens) == 0 else tokens[:, : int(idx.max()) + 1]


def check_runtime(
    model: nn.Module,
    runners: dict[str, Callable[[torch.Tensor], Any]],
    label: str,
    atol: float = 1e-4,
    verbose: bool = True,
) -> dict[str, float]:
    """Run each tower's ``runners[name]`` (tensor in, array / tensor out) at two batch sizes
    (and two text lengths) against PyTorch; returns ``{case: max abs diff}``."""
    plain = plain_copy(model)
    ctx = model.config.text.context_length
    towers = {"image": ImageTower(plain), "text": TextTower(plain)}
    diffs: dict[str, float] = {}
    for name, run in runners.items():
        cases = [(3, None), (1, None)] if name == "image" else [(3, None), (1, max(2, ctx // 4))]
        for b, length in cases:
            imgs, toks = example_inputs(model, b, length)
            x = imgs if name == "image" else toks
            with torch.no_grad():
                ref = towers[name](x)
            got = torch.as_tensor(run(x)).float().cpu()
            diff = float((got - ref).abs().max())
            key = f"{name} batch {b}" + (f" length {x.shape[1]}" if name == "text" else "")
            diffs[key] = diff
            if verbose:
                status = "ok" if diff <= atol else f"FAILED (> {atol:g})"
                print(f"  {label} vs PyTorch, {key}: max abs diff {diff:.2e} {status}")
    return diffs
