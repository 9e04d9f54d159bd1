"""Evaluation helpers shared by the recipes."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

from .amp import autocast
from .data import collate_skip_unreadable

__all__ = ["classification_metrics"]


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
    loader = DataLoader(dataset, batch_size=batch_size, collate_fn=collate_skip_unreadable)
    correct1 = correct5 = n = 0
    loss_sum = 0.0
    for batch, _ in loader:
        if batch is None:
            continue
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
