"""scripts/finetune_vit.py on tiny generated shapes: loss goes down, kill + resume is exact
(EMA, drop path, augmentation, accumulation), corrupt images are counted, NaN stops
cleanly, and 2-process torchrun equals one process. (Its parameter groups:
tests/train/test_optim.py.)"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "finetune_vit.py"
TINY = [
    "--model",
    "vit_tiny_patch16_224",
    "--img-size",
    "32",
    "--patch-size",
    "8",
    "--set",
    "depth=2",
    "embed_dim=32",
    "num_heads=2",
    "--threads",
    "1",
    "--quiet",
    "--log-every",
    "1",
    "--warmup",
    "1",
    "--lr",
    "3e-3",
]


@pytest.fixture(scope="module")
def fv(load_script):
    return load_script("finetune_vit")


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    from attn_train import shapes

    root = tmp_path_factory.mktemp("shapes")
    shapes.write_dataset(root, n_train=48, n_val=24, n_heldout=0, image_size=32)
    return root


def records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]


def step_losses(out: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in records(out) if "loss" in r and "event" not in r}


def weights(path: Path, name: str = "model.safetensors") -> dict[str, torch.Tensor]:
    return load_file(path / name)


def script_env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}


def test_loss_goes_down_on_a_fixed_batch(fv, data, tmp_path):
    out = tmp_path / "run"
    args = ["--train-dir", str(data / "train"), "--val-dir", str(data / "val"), *TINY]
    args += ["--no-augment", "--drop-path", "0", "--batch-size", "48", "--epochs", "20"]
    args += ["--label-smoothing", "0"]
    result = fv.main([*args, "--ema-decay", "0.9", "--out", str(out)])
    losses = list(step_losses(out).values())
    assert len(losses) == 20 and all(torch.isfinite(torch.tensor(losses)))
    assert losses[-1] < losses[0] - 0.4, losses  # the same 48 images every step
    evals = [r for r in records(out) if r.get("event") == "eval"]
    assert len(evals) == 20
    last = evals[-1]
    assert 0 <= last["val/top1"] <= last["val/top5"] <= 1 and "val_ema/top1" in last
    assert result["step"] == 20 and result["skipped_images"] == 0
    for name in ("last", "best"):
        assert {"model.safetensors", "ema.safetensors", "trainer_state.pt", "config.json"} <= {
            p.name for p in (out / name).iterdir()
        }
    import attn_vision

    model = attn_vision.create_model(out / "last")  # the checkpoint is a model folder
    assert model.num_classes == 24 and not model.training
    classes = sorted(p.name for p in (data / "train").iterdir())
    assert list(model.pretrained_cfg["label_names"]) == classes
    torch.testing.assert_close(model.state_dict(), weights(out / "last"))


def test_killed_run_resumes_to_the_same_weights(fv, data, tmp_path):
    args = ["--train-dir", str(data / "train"), *TINY, "--batch-size", "8", "--accum", "2"]
    args += ["--max-steps", "30", "--save-every", "1", "--ema-decay", "0.9"]
    args += ["--layer-decay", "0.8", "--scale", "0.5", "1.0"]  # drop path + augmentation on
    fv.main([*args, "--out", str(tmp_path / "straight")])

    out = tmp_path / "killed"
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), *args, "--out", str(out)],
        env=script_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.time() + 120
        while time.time() < deadline and proc.poll() is None:
            if (out / "log.jsonl").is_file() and max(step_losses(out), default=0) >= 3:
                break
            time.sleep(0.01)
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait()
    killed_at = max(step_losses(out))
    assert 3 <= killed_at < 30

    assert fv.main([*args, "--out", str(out)])["step"] == 30
    assert sum(r.get("event") == "resume" for r in records(out)) == 1
    for name in ("model.safetensors", "ema.safetensors"):
        a, b = weights(tmp_path / "straight" / "last", name), weights(out / "last", name)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name


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
    state = torch.load(out / "last" / "trainer_state.pt", weights_only=True)
    assert state["progress"]["step"] == 2
    assert all(torch.isfinite(v).all() for v in weights(out / "last").values())
    assert records(out)[-1]["event"] == "nonfinite_loss"


@pytest.mark.slow
def test_torchrun_two_processes_equal_one_process(fv, data, tmp_path):
    common = ["--train-dir", str(data / "train"), *TINY, "--no-augment", "--drop-path", "0"]
    common += ["--max-steps", "3", "--device", "cpu"]
    fv.main([*common, "--batch-size", "16", "--out", str(tmp_path / "single")])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
    cmd += ["--master-port", str(port), str(SCRIPT), *common, "--batch-size", "8"]
    out = tmp_path / "ddp"
    proc = subprocess.run(
        [*cmd, "--out", str(out)], capture_output=True, text=True, timeout=300, env=script_env()
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert records(out)[0]["world_size"] == 2
    single, ddp = step_losses(tmp_path / "single"), step_losses(out)
    assert single.keys() == ddp.keys() == {1, 2, 3}
    for k in single:
        assert ddp[k] == pytest.approx(single[k], rel=1e-5)
    a, b = weights(tmp_path / "single" / "last"), weights(out / "last")
    for k in a:  # AdamW magnifies rounding on near-zero gradients: compare to part of lr
        torch.testing.assert_close(a[k], b[k], atol=3e-4, rtol=0)
