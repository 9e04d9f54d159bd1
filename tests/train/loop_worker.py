"""A tiny MLP trained with attn_train.fit: imported by test_loop.py, and run as a script
under torchrun for its DDP test (``python loop_worker.py OUT BATCH_SIZE ACCUM MAX_STEPS``)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from attn_train import (
    LoopConfig,
    cosine_schedule,
    fit,
    lambda_lr,
    make_loader,
    param_groups,
    start_run,
)
from torch import nn


def dataset(n: int = 32) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 4, generator=g)
    y = x @ torch.randn(4, 2, generator=g)
    return list(zip(x, y, strict=True))


def mse(model: nn.Module, batch: list[torch.Tensor]) -> torch.Tensor:
    return F.mse_loss(model(batch[0]), batch[1])


def args(out: Path, **kw) -> argparse.Namespace:
    base = {"device": "cpu", "threads": None, "seed": 0, "precision": "fp32", "no_resume": False}
    return argparse.Namespace(out=out, **{**base, **kw})


def records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]


def step_losses(out: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in records(out) if "loss" in r and "event" not in r}


def train(out: Path, *, batch_size=8, max_steps=4, total=4, dropout=0.0, ema=None, **config):
    """A small MLP on a fixed regression set, ``total`` updates of schedule; returns fit()'s
    result. ``config``: LoopConfig fields, and ``evaluate``."""
    evaluate = config.pop("evaluate", None)
    run = start_run(args(out))
    model = nn.Sequential(nn.Linear(4, 16), nn.Dropout(dropout), nn.Linear(16, 2))
    if ema is not None:
        from timm.utils import ModelEmaV3

        ema = ModelEmaV3(model, decay=ema, use_warmup=True)
    loader = make_loader(dataset(), batch_size, run.d, seed=0)
    optimizer = torch.optim.AdamW(param_groups(model, 0.01), lr=1e-2)
    scheduler = lambda_lr(optimizer, cosine_schedule(1, total))
    cfg = LoopConfig(max_steps, epochs=100, log_every=1, quiet=True, **config)
    result = fit(
        run, model, optimizer, scheduler, loader, cfg, loss_fn=mse, evaluate=evaluate, ema=ema
    )
    run.close(result)
    return result


if __name__ == "__main__":
    out, batch_size, accum, max_steps = sys.argv[1:]
    train(Path(out), batch_size=int(batch_size), accum=int(accum), max_steps=int(max_steps))
