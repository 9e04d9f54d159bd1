"""Learning-rate schedules: multipliers of the base lr per optimizer update, for ``LambdaLR``.

The loop calls ``scheduler.step()`` once per update (not per micro-batch). A parameter
group's ``lr_scale`` (timm's layer-wise decay) multiplies the schedule for that group.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

__all__ = ["cosine_schedule", "inverse_sqrt_schedule", "lambda_lr", "plan_steps"]

Schedule = Callable[[int], float]


def inverse_sqrt_schedule(warmup: int) -> Schedule:
    """Linear warm-up to 1 over ``warmup`` updates, then ``sqrt(warmup / step)`` (Vaswani)."""
    warmup = max(1, warmup)
    return lambda step: min((step + 1) / warmup, math.sqrt(warmup / (step + 1)))


def cosine_schedule(warmup: int, total: int, floor: float = 0.0) -> Schedule:
    """Linear warm-up, then cosine decay to ``floor`` at ``total`` updates."""

    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / max(1, warmup)
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))

    return f


def lambda_lr(
    optimizer: torch.optim.Optimizer, schedule: Schedule
) -> torch.optim.lr_scheduler.LambdaLR:
    """``LambdaLR`` with ``schedule`` times each group's ``lr_scale`` (1 when absent)."""

    def scaled(scale: float) -> Schedule:
        return lambda step: scale * schedule(step)

    lambdas = [scaled(group.get("lr_scale", 1.0)) for group in optimizer.param_groups]
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambdas)


def plan_steps(
    batches_per_epoch: int, accum: int, epochs: int, max_steps: int | None
) -> tuple[int, int]:
    """``(max_steps, epochs)`` of a run: ``max_steps`` defaults to ``epochs`` full epochs of
    updates; a larger ``max_steps`` gets as many epochs as it needs."""
    if accum < 1:
        raise ValueError(f"--accum must be >= 1, got {accum}")
    steps_per_epoch = batches_per_epoch // accum
    if steps_per_epoch == 0:
        raise ValueError(
            f"an epoch has {batches_per_epoch} batches per process, fewer than --accum {accum}"
        )
    max_steps = max_steps or epochs * steps_per_epoch
    return max_steps, max(epochs, math.ceil(max_steps / steps_per_epoch))
