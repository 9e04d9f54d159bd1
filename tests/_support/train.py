"""What the training tests share: the tiny model command lines of the recipes, the generated
data they train on (written once a session), and a tiny MLP trained by ``attn_train.fit``
(used in process by tests/train/test_loop.py and under torchrun by test_distributed.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

# scripts/train_clip.py: a CLIP of ~0.8 M parameters on 32 px images (16 patches), the rest
# as in demo-shapes
CLIP_TINY = ["embed_dim=32", "vision.image_size=32", "vision.width=32", "vision.layers=1"]
CLIP_TINY += ["text.width=16", "text.layers=1", "text.context_length=16"]
# scripts/train_clip.py with a CoCa: demo-shapes-coca's layout shrunk to 16 wide (pooler, text
# tower, decoder), one block each, on 32 px images (the 49,408-word tables stay)
COCA_TINY = ["--model", "demo-shapes-coca", "--set", "embed_dim=16", "vision.image_size=32"]
COCA_TINY += ["vision.width=32", "vision.layers=1", "vision.attn_pooler_queries=4"]
COCA_TINY += ["text.width=16", "text.layers=1", "multimodal.width=16", "multimodal.layers=1"]
# scripts/finetune_vit.py: a 2-block ViT on 32 px images (16 patches)
VIT_TINY = ["--model", "vit_tiny_patch16_224", "--img-size", "32", "--patch-size", "8"]
VIT_TINY += ["--set", "depth=2", "embed_dim=32", "num_heads=2"]
# every recipe's run flags in the tests: one thread, no bar, a short warm-up, a high lr
RUN = ["--threads", "1", "--quiet", "--log-every", "1", "--warmup", "1", "--lr", "3e-3"]


def tiny_clip_config(**overrides: object):
    """demo-shapes' CLIPConfig shrunk by ``CLIP_TINY``, then ``overrides`` (``"text.width"``
    style keys)."""
    import attn_clip
    from attn_train.cli import apply_overrides

    sets = [*CLIP_TINY, *(f"{k}={v}" for k, v in overrides.items())]
    config = apply_overrides(attn_clip.get_model_config("demo-shapes").to_dict(), sets)
    return attn_clip.CLIPConfig.from_dict(config)


_DATA: dict[tuple, Path] = {}


def shapes_data(factory: pytest.TempPathFactory, image_size: int = 32) -> Path:
    """The generated captioned shapes (attn_train.shapes): 48 train, 24 val, 12 held-out
    images of ``image_size`` px, as folders (``train/<class>/``) and CSVs; written once a
    session for each size (the folder is shared: copy it before changing it)."""
    key = ("shapes", image_size)
    if key not in _DATA:
        from attn_train import shapes

        # in the session's folder, not a mktemp one (tests/_support/disk.py deletes those with
        # the test file that made them): this one is cached for the session
        root = factory.getbasetemp() / f"session-shapes{image_size}"
        root.mkdir()
        shapes.write_dataset(root, n_train=48, n_val=24, n_heldout=12, image_size=image_size)
        _DATA[key] = root
    return _DATA[key]


# -- a tiny MLP trained by attn_train.fit -------------------------------------------------------


def mlp_dataset(n: int = 32) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``n`` pairs of a fixed linear regression (4 -> 2)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 4, generator=g)
    y = x @ torch.randn(4, 2, generator=g)
    return list(zip(x, y, strict=True))


def mse(model: nn.Module, batch: list[torch.Tensor]) -> torch.Tensor:
    return F.mse_loss(model(batch[0]), batch[1])


def run_args(out: Path, **kw: object) -> argparse.Namespace:
    """The parsed run flags ``attn_train.start_run`` reads (CPU, seed 0, fp32, resume)."""
    base = {"device": "cpu", "threads": None, "seed": 0, "precision": "fp32", "no_resume": False}
    return argparse.Namespace(out=out, **{**base, **kw})


def train_mlp(out: Path, *, batch_size=8, max_steps=4, total=4, dropout=0.0, ema=None, **config):
    """A small MLP on ``mlp_dataset()`` with AdamW and ``total`` updates of cosine schedule,
    through ``start_run`` + ``fit``; returns fit()'s result. ``config``: LoopConfig fields,
    and ``evaluate``."""
    from attn_train import (
        LoopConfig,
        cosine_schedule,
        fit,
        lambda_lr,
        make_loader,
        param_groups,
        start_run,
    )

    evaluate = config.pop("evaluate", None)
    run = start_run(run_args(out))
    model = nn.Sequential(nn.Linear(4, 16), nn.Dropout(dropout), nn.Linear(16, 2))
    if ema is not None:
        from timm.utils import ModelEmaV3

        ema = ModelEmaV3(model, decay=ema, use_warmup=True)
    loader = make_loader(mlp_dataset(), batch_size, run.d, seed=0)
    optimizer = torch.optim.AdamW(param_groups(model, 0.01), lr=1e-2)
    scheduler = lambda_lr(optimizer, cosine_schedule(1, total))
    cfg = LoopConfig(max_steps, epochs=100, log_every=1, quiet=True, **config)
    result = fit(
        run, model, optimizer, scheduler, loader, cfg, loss_fn=mse, evaluate=evaluate, ema=ema
    )
    run.close(result)
    return result
