"""attn_train.cli and schedules: overrides, exits, step planning, per-group lr scales."""

from __future__ import annotations

import argparse
import math

import pytest
import torch
from attn_train import LoopConfig, NonFiniteLossError, cosine_schedule, lambda_lr, plan_steps
from attn_train.cli import add_run_args, apply_overrides, parse_overrides, run_main


def test_overrides():
    assert parse_overrides(["depth=6", "qkv_bias=false", "name=vit"]) == {
        "depth": 6,
        "qkv_bias": False,
        "name": "vit",
    }
    with pytest.raises(ValueError, match="KEY=VALUE"):
        parse_overrides(["depth"])
    config = {"embed_dim": 8, "vision": {"layers": 2}}
    assert apply_overrides(config, ["vision.layers=3"])["vision"]["layers"] == 3
    for bad in ("vision.depth=3", "text.layers=1", "embed_dim.x=1"):
        with pytest.raises(ValueError, match="unknown config key"):
            apply_overrides(config, [bad])


@pytest.mark.parametrize(
    "error, code",
    [(NonFiniteLossError("loss is nan"), 1), (ValueError("bad"), 2), (KeyboardInterrupt(), 130)],
)
def test_run_main_exits(error, code, capsys):
    def main():
        raise error

    with pytest.raises(SystemExit) as e:
        run_main(main)
    assert e.value.code == code
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_loop_config_from_the_shared_flags():
    p = argparse.ArgumentParser()
    add_run_args(p, log_every=7)
    args = p.parse_args(["--out", "x"])
    cfg = LoopConfig.from_args(args, 10, 2, grad_clip=1.0)
    assert (cfg.max_steps, cfg.epochs, cfg.log_every, cfg.save_every) == (10, 2, 7, 500)
    assert cfg.accum == 1 and cfg.grad_clip == 1.0 and not cfg.quiet


def test_plan_steps():
    assert plan_steps(10, 2, epochs=3, max_steps=None) == (15, 3)
    assert plan_steps(10, 2, epochs=3, max_steps=40) == (40, 8)  # max_steps wins
    with pytest.raises(ValueError, match="fewer than --accum"):
        plan_steps(1, 2, epochs=1, max_steps=None)


def test_lambda_lr_scales_groups():
    a, b = torch.nn.Parameter(torch.zeros(1)), torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([{"params": [a], "lr_scale": 0.5}, {"params": [b]}], lr=1.0)
    sched = lambda_lr(opt, cosine_schedule(warmup=2, total=4))
    assert [g["lr"] for g in opt.param_groups] == [0.25, 0.5]  # warm-up 1/2
    for _ in range(2):
        opt.step()
        sched.step()
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([0.5, 1.0])
    sched.step()
    assert opt.param_groups[1]["lr"] == pytest.approx(0.5 * (1 + math.cos(math.pi / 2)))
