"""attn_train.cli and schedules: overrides, input checks, --help defaults, exits (one line
each), step planning, per-group lr scales."""

from __future__ import annotations

import argparse
import math
import warnings

import pytest
import torch
from attn_train import (
    LoopConfig,
    NonFiniteLossError,
    TrainingInterrupted,
    check_device,
    cosine_schedule,
    lambda_lr,
    plan_steps,
    start_run,
)
from attn_train.cli import (
    HelpFormatter,
    add_augment_args,
    add_run_args,
    apply_overrides,
    augment_kwargs,
    check_run_args,
    parse_overrides,
    require_dir,
    require_file,
    run_main,
)


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
@pytest.mark.parametrize("rank", ["0", "1"])
def test_run_main_exits(error, code, rank, capsys, monkeypatch):
    """One line and the code; under torchrun only rank 0 says it (every rank exits)."""
    monkeypatch.setenv("RANK", rank)

    def main():
        raise error

    with pytest.raises(SystemExit) as e:
        run_main(main)
    assert e.value.code == code
    assert len(capsys.readouterr().err.strip().splitlines()) == (1 if rank == "0" else 0)


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


def test_help_shows_defaults_except_none_false_and_those_already_named():
    p = argparse.ArgumentParser(formatter_class=HelpFormatter)
    p.add_argument("--seed", type=int, default=0, help="a seed")
    p.add_argument("--lr", type=float, default=1e-3, help="learning rate")
    p.add_argument("--device", default=None, help="a device")
    p.add_argument("--quiet", action="store_true", help="no bar")
    p.add_argument("--sep", default="tab", help="default: from the header")
    text = " ".join(p.format_help().split())
    assert "a seed (default: 0)" in text and "learning rate (default: 0.001)" in text
    assert "a device --quiet" in text and "no bar" in text and text.count("(default:") == 2
    assert "default: from the header" in text


def test_input_checks_name_the_flag(tmp_path):
    (tmp_path / "f.txt").write_text("x")
    require_file(tmp_path / "f.txt", "--text")
    require_dir(tmp_path, "--out")
    require_file(None, "--dev")
    with pytest.raises(ValueError, match=r"^--text .*nope.txt: no such file$"):
        require_file(tmp_path / "nope.txt", "--text")
    with pytest.raises(ValueError, match="is a folder, not a file"):
        require_file(tmp_path, "--text")
    with pytest.raises(ValueError, match="--train-dir .*: no such folder"):
        require_dir(tmp_path / "nope", "--train-dir")
    with pytest.raises(ValueError, match="is a file, not a folder"):
        require_dir(tmp_path / "f.txt", "--train-dir")
    p = argparse.ArgumentParser()
    add_run_args(p)
    for argv, message in (
        (["--out", str(tmp_path / "f.txt")], "--out .* is a file"),
        (["--out", "x", "--log-every", "0"], "--log-every must be >= 1, got 0"),
        (["--out", "x", "--threads", "-1"], "--threads must be >= 1"),
    ):
        with pytest.raises(ValueError, match=message):
            check_run_args(p.parse_args(argv))
    with pytest.raises(ValueError, match=r"unknown config key\(s\) \['depht'\]; known: \['depth'"):
        parse_overrides(["depht=2"], known=["depth", "width"])


def test_check_device():
    assert check_device("cpu") == torch.device("cpu")
    with pytest.raises(ValueError, match="--device 'gpu7' is not a device name"):
        check_device("gpu7")
    with pytest.raises(ValueError, match=r"--device cuda:99: (CUDA is not available|only \d+ GPU)"):
        check_device("cuda:99")


def test_start_run_writes_nothing(tmp_path):
    p = argparse.ArgumentParser()
    add_run_args(p)
    run = start_run(p.parse_args(["--out", str(tmp_path / "run"), "--device", "cpu"]))
    assert not run.resume and not (tmp_path / "run").exists()  # made by the first log record
    run.log.log({"event": "start"})
    assert (tmp_path / "run" / "log.jsonl").is_file()


def exit_of(main, capsys) -> tuple[int, str]:
    with pytest.raises(SystemExit) as e:
        run_main(main)
    return e.value.code, capsys.readouterr().err


def test_run_main_lines_codes_and_warnings(capsys):
    from attn_core.hub import WeightsError

    def interrupted():
        raise TrainingInterrupted("the last checkpoint is runs/x/last (update 4); rerun")

    assert exit_of(interrupted, capsys) == (
        130,
        "interrupted: the last checkpoint is runs/x/last (update 4); rerun\n",
    )

    def unavailable():
        raise WeightsError("no weights:\n  pass one (pretrained=<path>)")

    assert exit_of(unavailable, capsys) == (2, "error: no weights: pass one (--pretrained PATH)\n")
    assert exit_of(lambda: 3, capsys) == (3, "")  # an int from main() is the exit code
    assert exit_of(lambda: {"step": 1}, capsys) == (0, "")

    def warns():
        warnings.warn("two\nlines", UserWarning, stacklevel=1)
        return 0

    assert exit_of(warns, capsys) == (0, "warning: two lines\n")


def test_size_checks_and_text_files_name_the_flag(tmp_path):
    from attn_train.cli import read_text_file, require_multiple, require_positive

    args = argparse.Namespace(embed_dim=64, heads=6, depth=0, context=None)
    require_positive(args, "embed_dim", "context")  # None is skipped
    with pytest.raises(ValueError, match=r"^--depth must be >= 1, got 0$"):
        require_positive(args, "embed_dim", "depth")
    with pytest.raises(ValueError, match=r"^--embed-dim 64 is not a multiple of --heads 6$"):
        require_multiple(args, "embed_dim", "heads")
    (tmp_path / "t.txt").write_text("héllo", encoding="utf-8")
    assert read_text_file(tmp_path / "t.txt", "--text") == "héllo"
    (tmp_path / "b.txt").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ValueError, match=r"^--text .*b.txt is not UTF-8 text"):
        read_text_file(tmp_path / "b.txt", "--text")
    with pytest.raises(ValueError, match="no such file"):
        read_text_file(tmp_path / "nope.txt", "--text")


def test_optimizer_and_image_loader_flags():
    from attn_train.cli import add_image_loader_args, add_optimizer_args

    p = argparse.ArgumentParser()
    add_optimizer_args(p, wd=0.1, min_lr_ratio=0.0, betas=(0.9, 0.98), eps=1e-6)
    add_image_loader_args(p)
    a = p.parse_args(["--beta2", "0.95", "--grad-clip", "1"])
    assert (a.wd, a.beta1, a.beta2, a.eps, a.min_lr_ratio, a.grad_clip) == (
        0.1, 0.9, 0.95, 1e-6, 0.0, 1.0
    )  # fmt: skip
    assert (a.workers, a.warn_skipped_fraction, a.eval_batch_size) == (0, 0.1, 256)
    with pytest.raises(ValueError, match="--eval-batch-size must be >= 1, got 0"):
        check_run_args(p.parse_args(["--eval-batch-size", "0"]))
    p = argparse.ArgumentParser()
    add_optimizer_args(p, wd=0.05, min_lr_ratio=0.01)  # no betas / eps flags
    assert not hasattr(p.parse_args([]), "beta1") and not hasattr(p.parse_args([]), "eps")


def test_augment_args_and_their_transform_kwargs():
    p = argparse.ArgumentParser()
    add_augment_args(p)
    args = p.parse_args(["--scale", "0.5", "1", "--aa", "none", "--reprob", "0"])
    assert not args.no_augment and args.crop_pct is None
    assert augment_kwargs(args) == {
        "scale": [0.5, 1.0],
        "hflip": 0.5,
        "auto_augment": "none",
        "color_jitter": 0.4,
        "re_prob": 0.0,
    }
    assert p.parse_args(["--no-augment"]).no_augment


@pytest.mark.parametrize("decay", ["0", "1", "1.5", "-0.1"])
def test_ema_decay_out_of_range_is_refused_for_every_recipe(decay):
    """One check for --ema-decay (finetune_vit, train_clip, distill_clip); 0.998 passes."""
    p = argparse.ArgumentParser()
    p.add_argument("--ema-decay", type=float)
    check_run_args(p.parse_args(["--ema-decay", "0.998"]))
    with pytest.raises(ValueError, match=r"--ema-decay must be in \(0, 1\), got"):
        check_run_args(p.parse_args(["--ema-decay", decay]))
