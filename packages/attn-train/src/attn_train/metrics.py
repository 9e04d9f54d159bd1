"""Evaluation helpers shared by the recipes: top-k accuracy of an image classifier, the
accuracy of a text classifier, the held-out loss of a language model."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

from .amp import autocast
from .data import readable_batches
from .text import RandomWindows

__all__ = ["accuracy", "classification_metrics", "next_token_loss"]


@torch.no_grad()
def classification_metrics(
    logits_fn: Callable[[torch.Tensor], torch.Tensor],
    dataset: Dataset,
    *,
    batch_size: int,
    device: torch.device,
    precision: str = "fp32",
) -> dict[str, float]:
    """Top-1 / top-5 accuracy and mean cross-entropy of ``logits_fn(images) (B, C)`` over
    an ``(image, label)`` data set (unreadable images skipped); ``n`` images scored."""
    correct1 = correct5 = n = 0
    loss_sum = 0.0
    for batch in readable_batches(dataset, batch_size):
        images, labels = batch[0].to(device), batch[1].to(device)
        with autocast(device, precision):
            logits = logits_fn(images).float()
        top = logits.topk(min(5, logits.shape[-1]), dim=-1).indices
        correct1 += (top[:, 0] == labels).sum().item()
        correct5 += (top == labels[:, None]).any(dim=-1).sum().item()
        loss_sum += F.cross_entropy(logits, labels, reduction="sum").item()
        n += len(labels)
    m = max(1, n)
    return {"top1": correct1 / m, "top5": correct5 / m, "loss": loss_sum / m, "n": n}


@torch.no_grad()
def accuracy(model: nn.Module, loader: DataLoader, device: torch.device | str) -> float:
    """Fraction of ``model(batch["ids"]).argmax(-1) == batch["labels"]`` over a loader of
    dict batches (e.g. :class:`attn_train.text.LabelledTexts`); puts ``model`` in eval mode."""
    model.eval()
    right = total = 0
    for batch in loader:
        pred = model(batch["ids"].to(device)).argmax(-1).cpu()
        right += int((pred == batch["labels"]).sum())
        total += len(pred)
    return right / max(1, total)


@torch.no_grad()
def next_token_loss(
    model: nn.Module,
    data: torch.Tensor,
    context: int,
    device: torch.device | str,
    batches: int = 4,
    batch_size: int = 32,
    seed: int = 1234,
) -> float:
    """Mean next-token cross-entropy of a language model (``(B, T)`` ids -> ``(B, T, V)``
    logits) on the same ``batches`` x ``batch_size`` random windows of the token stream
    ``data`` every time (drawn from ``seed``); puts ``model`` in eval mode."""
    windows = RandomWindows(data, context, length=batch_size * batches, seed=seed)
    model.eval()
    total = 0.0
    for x, y in DataLoader(windows, batch_size=batch_size):
        logits = model(x.to(device))
        total += F.cross_entropy(logits.flatten(0, 1), y.to(device).flatten()).item()
    return total / batches
