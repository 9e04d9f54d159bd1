"""scripts/finetune_vit.py on tiny generated shapes: loss goes down, the checkpoints are model
folders, kill -9 + resume is exact (EMA, drop path, augmentation, accumulation, layer
decay), corrupt images are counted, NaN stops cleanly. (2-process torchrun equals one
process, and FSDP equals DDP: tests/train/test_distributed.py; its parameter groups:
tests/train/test_optim.py; bad input and Ctrl-C: test_errors.py.)"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from _support.scripts import assert_same_weights, events, killed_at, records, step_losses, weights
from _support.train import RUN, VIT_TINY, shapes_data
from attn_train import read_progress

TINY = [*VIT_TINY, *RUN]


@pytest.fixture(scope="module")
def fv():
    import finetune_vit

    return finetune_vit


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return shapes_data(tmp_path_factory)


def straight_args(data: Path) -> list[str]:
    """8 updates of 2 x 8 images (3 an epoch), augmentation, drop path, layer decay and an
    EMA on, evaluated after each epoch, a checkpoint every 2 updates."""
    args = ["--train-dir", str(data / "train"), "--val-dir", str(data / "val"), *TINY]
    args += ["--batch-size", "8", "--accum", "2", "--max-steps", "8", "--save-every", "2"]
    return [*args, "--ema-decay", "0.9", "--layer-decay", "0.8", "--scale", "0.5", "1.0"]


@pytest.fixture(scope="module")
def straight(fv, data, tmp_path_factory) -> Path:
    """The run the tests below read (its folders, log, and the resume reference)."""
    out = tmp_path_factory.mktemp("finetune_vit") / "straight"
    fv.main([*straight_args(data), "--out", str(out)])
    return out


def test_loss_goes_down_on_a_fixed_batch(fv, data, tmp_path):
    out = tmp_path / "run"
    args = ["--train-dir", str(data / "train"), *TINY, "--no-augment", "--drop-path", "0"]
    args += ["--batch-size", "48", "--epochs", "8", "--label-smoothing", "0"]
    result = fv.main([*args, "--out", str(out)])
    losses = list(step_losses(out).values())
    assert len(losses) == 8 and all(torch.isfinite(torch.tensor(losses)))
    assert losses[-1] < losses[0] - 0.2, losses  # the same 48 images every step: 3.19 -> 2.88
    assert result["step"] == 8 and result["skipped_images"] == 0


def test_the_checkpoints_are_model_folders_and_the_log_tells_the_run(data, straight):
    import attn_vision

    evals = events(straight, "eval")
    assert [r["step"] for r in evals] == [3, 6, 8]  # after each epoch (the last one cut short)
    last = evals[-1]
    assert 0 <= last["val/top1"] <= last["val/top5"] <= 1 and 0 <= last["val_ema/top1"] <= 1
    assert events(straight, "done")[0]["step"] == 8
    for name in ("last", "best"):
        assert {"model.safetensors", "ema.safetensors", "trainer_state.pt", "config.json"} <= {
            p.name for p in (straight / name).iterdir()
        }
    model = attn_vision.create_model(straight / "last")  # the checkpoint is a model folder
    assert model.num_classes == 24 and not model.training
    classes = sorted(p.name for p in (data / "train").iterdir())
    assert list(model.pretrained_cfg["label_names"]) == classes
    torch.testing.assert_close(model.state_dict(), weights(straight / "last"))


def test_killed_run_resumes_to_the_same_weights(fv, data, straight, tmp_path):
    """kill -9 while the checkpoint of update 6 is being written (last/ holds update 4, the
    first of epoch 1): the same command resumes and ends bit-identical to the straight run."""
    out = tmp_path / "killed"
    killed_at(fv.main, [*straight_args(data), "--out", out], step=6)
    assert read_progress(out / "last")["step"] == 4 and (out / "last.tmp").is_dir()
    assert max(step_losses(out)) == 6 and not events(out, "done")

    assert fv.main([*straight_args(data), "--out", str(out)])["step"] == 8
    assert [r["step"] for r in events(out, "resume")] == [4]
    for name in ("model.safetensors", "ema.safetensors"):
        assert_same_weights(straight / "last", out / "last", name)
    a, b = weights(straight / "last"), weights(out / "last", "ema.safetensors")
    assert any(not torch.equal(a[k], b[k]) for k in a)  # the EMA is not the model


def test_corrupt_images_are_skipped_and_counted(fv, data, tmp_path):
    train = tmp_path / "train"
    shutil.copytree(data / "train", train)
    cls = sorted(train.iterdir())[0]
    good = next(cls.glob("*.png"))
    (cls / "truncated.png").write_bytes(good.read_bytes()[:100])
    (cls / "empty.png").write_bytes(b"")
    args = ["--train-dir", str(train), *TINY, "--batch-size", "25", "--epochs", "2"]
    with pytest.warns(UserWarning, match="skipping unreadable image"):
        result = fv.main([*args, "--out", str(tmp_path / "run")])
    assert result["skipped_images"] == 4 and result["step"] == 4  # 50 files, 2 epochs


def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(fv, data, tmp_path):
    out = tmp_path / "run"
    args = ["--train-dir", str(data / "train"), *TINY, "--batch-size", "8", "--max-steps", "6"]
    args += ["--save-every", "2", "--debug-nan-at-step", "3", "--out", str(out)]
    from attn_train import NonFiniteLossError

    with pytest.raises(NonFiniteLossError, match=r"loss is nan at update 3.*\(step 2\)"):
        fv.main(args)
    assert read_progress(out / "last")["step"] == 2
    assert all(torch.isfinite(v).all() for v in weights(out / "last").values())
    assert records(out)[-1]["event"] == "nonfinite_loss"
