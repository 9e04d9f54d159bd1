"""scripts/train_clip.py on tiny generated shapes: loss goes down, accumulation is exact,
kill + resume is exact, corrupt images are counted, NaN stops cleanly, LiT / SigLIP /
WiSE-FT, and 2-process torchrun equals one process on the same global batch."""

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
SCRIPT = ROOT / "scripts" / "train_clip.py"
# a very small CLIP on 32 px images (16 patches); everything else as in demo-shapes
TINY = [
    "--set",
    "embed_dim=32",
    "vision.image_size=32",
    "vision.width=32",
    "vision.layers=1",
    "text.width=16",
    "text.layers=1",
    "text.context_length=16",
    "--threads",
    "1",
    "--quiet",
    "--lr",
    "3e-3",
    "--warmup",
    "1",
    "--log-every",
    "1",
]


@pytest.fixture(scope="module")
def tc(load_script):
    return load_script("train_clip")


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    from attn_train import shapes

    root = tmp_path_factory.mktemp("shapes")
    # 64 px renders, resized to the model's 32 by its transform: a fixed batch is learnt
    # clearly faster than from 32 px renders (whose small shapes are 8 px wide)
    shapes.write_dataset(root, n_train=48, n_val=12, n_heldout=12, image_size=64)
    lines = (root / "train.csv").read_text().splitlines()
    (root / "fixed.csv").write_text("\n".join(lines[:17]) + "\n")  # 16 pairs: one batch
    return root


def data_args(data: Path, csv: str = "train.csv") -> list[str]:
    return [
        "--train-data",
        str(data / csv),
        "--zeroshot-dir",
        str(data / "heldout"),
        "--zeroshot-classnames",
        str(data / "classnames.txt"),
    ]


def records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]


def step_losses(out: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in records(out) if "loss" in r and "event" not in r}


def weights(path: Path) -> dict[str, torch.Tensor]:
    return load_file(path / "model.safetensors")


def script_env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_loss_goes_down_on_a_fixed_batch_and_outputs_load(tc, data, tmp_path):
    out = tmp_path / "run"
    args = [*data_args(data, "fixed.csv"), "--val-data", str(data / "val.csv")]
    result = tc.main([*args, *TINY, "--out", str(out), "--epochs", "20", "--batch-size", "16"])
    losses = list(step_losses(out).values())
    assert len(losses) == 20 and all(torch.isfinite(torch.tensor(losses)))
    assert losses[-1] < 0.6 * losses[0], losses
    evals = [r for r in records(out) if r.get("event") == "eval"]
    assert len(evals) == 20
    assert 0 <= evals[-1]["zeroshot/heldout/top1"] <= evals[-1]["zeroshot/heldout/top5"] <= 1
    assert 0 <= evals[-1]["val/image_to_text_R@1"] <= 1
    assert result["step"] == 20 and result["skipped_images"] == 0

    import attn_clip

    for folder in ("last", "best", "final"):  # all load through create_model(folder)
        model = attn_clip.create_model(str(out / folder))
        assert model.config.vision.image_size == 32
    final = attn_clip.create_model(str(out / "final"))
    last = weights(out / "last")
    assert all(torch.equal(v, last[k]) for k, v in final.state_dict().items())


def test_ema_is_evaluated_and_becomes_final(tc, data, tmp_path):
    out = tmp_path / "run"
    args = [*data_args(data), *TINY, "--batch-size", "8", "--max-steps", "6", "--epochs", "1"]
    tc.main([*args, "--ema-decay", "0.9", "--out", str(out)])
    evals = [r for r in records(out) if r.get("event") == "eval"]
    assert evals and 0 <= evals[-1]["ema/zeroshot/heldout/top1"] <= 1

    import attn_clip

    final = attn_clip.create_model(str(out / "final")).state_dict()
    ema, raw = load_file(out / "last" / "ema.safetensors"), weights(out / "last")
    assert all(torch.equal(v, ema[k]) for k, v in final.items())  # final/ holds the EMA
    assert any(not torch.equal(v, raw[k]) for k, v in final.items())
    with pytest.raises(ValueError, match="--ema-decay must be in"):
        tc.main([*args, "--ema-decay", "1.5", "--out", str(tmp_path / "bad")])
    assert not (tmp_path / "bad").exists()


def test_accumulation_gives_the_big_batch_update(tc, data, tmp_path):
    common = [*data_args(data), *TINY, "--no-augment", "--max-steps", "2"]
    tc.main([*common, "--out", str(tmp_path / "big"), "--batch-size", "16"])
    tc.main([*common, "--out", str(tmp_path / "acc"), "--batch-size", "8", "--accum", "2"])
    big, acc = step_losses(tmp_path / "big"), step_losses(tmp_path / "acc")
    assert big.keys() == acc.keys() == {1, 2}
    for k in big:
        assert big[k] == pytest.approx(acc[k], rel=1e-5)
    # AdamW turns float-rounding-sized gradient differences on near-zero gradients into
    # visible ones (its update is ~lr * sign(g) early on): compare to a small part of lr
    a, b = weights(tmp_path / "big" / "last"), weights(tmp_path / "acc" / "last")
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=3e-4, rtol=0)
    c = weights(tmp_path / "big" / "last")
    tc.main([*common, "--out", str(tmp_path / "small"), "--batch-size", "8"])
    d = weights(tmp_path / "small" / "last")
    assert max((c[k] - d[k]).abs().max() for k in c) > 1e-3  # a real difference is detected


def test_killed_run_resumes_to_the_same_weights(tc, data, tmp_path):
    args = [*data_args(data), *TINY, "--batch-size", "8", "--max-steps", "40"]
    args += ["--save-every", "1"]
    tc.main([*args, "--out", str(tmp_path / "straight")])

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
    assert not any(r.get("event") == "done" for r in records(out))
    killed_at = max(step_losses(out))
    assert 3 <= killed_at < 40

    result = tc.main([*args, "--out", str(out)])  # the same command resumes
    assert result["step"] == 40
    resumed = [r for r in records(out) if r.get("event") == "resume"]
    assert len(resumed) == 1 and 1 <= resumed[0]["step"] <= killed_at
    a, b = weights(tmp_path / "straight" / "last"), weights(out / "last")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_corrupt_images_are_skipped_and_counted(tc, data, tmp_path):
    good = next((data / "train").rglob("*.png"))
    (tmp_path / "truncated.png").write_bytes(good.read_bytes()[:200])
    (tmp_path / "text.png").write_text("not an image")
    lines = (data / "train.csv").read_text().splitlines()
    rows = [f"{data / line}" for line in lines[1:15]]
    rows += [f"{tmp_path / 'truncated.png'},a red circle", f"{tmp_path / 'text.png'},a red star"]
    (tmp_path / "mixed.csv").write_text("filepath,title\n" + "\n".join(rows) + "\n")
    args = ["--train-data", str(tmp_path / "mixed.csv"), *TINY, "--batch-size", "8"]
    with pytest.warns(UserWarning) as caught:
        result = tc.main([*args, "--epochs", "2", "--out", str(tmp_path / "run")])
    messages = [str(w.message) for w in caught]
    assert sum(m.startswith("skipping unreadable image") for m in messages) == 2
    assert "2 of 16 training items (12%) were unreadable images in epoch 0" in " ".join(messages)
    assert result["skipped_images"] == 4  # two bad files, two epochs
    assert result["step"] == 4
    assert (
        json.loads((tmp_path / "run" / "log.jsonl").read_text().splitlines()[-1])["skipped_images"]
        == 4
    )


def test_nan_loss_stops_with_a_message_and_keeps_the_last_good_checkpoint(data, tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, str(SCRIPT), *data_args(data), *TINY, "--batch-size", "8"]
    cmd += ["--max-steps", "8", "--save-every", "2", "--debug-nan-at-step", "5", "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=script_env())
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "loss is nan at update 5" in proc.stderr
    assert f"the last good checkpoint is {out / 'last'} (step 4)" in proc.stderr
    state = torch.load(out / "last" / "trainer_state.pt", weights_only=True)
    assert state["progress"]["step"] == 4
    w = weights(out / "last")
    assert all(torch.isfinite(v).all() for v in w.values())
    assert records(out)[-1]["event"] == "nonfinite_loss"
    assert not (out / "final").exists()


def test_lit_siglip_and_wise_ft_from_a_trained_folder(tc, data, tmp_path):
    base = tmp_path / "base"
    tc.main([*data_args(data), *TINY, "--batch-size", "16", "--max-steps", "2", "--out", str(base)])
    start = weights(base / "last")
    out = tmp_path / "lit"
    args = ["--model", str(base / "final"), "--train-data", str(data / "train.csv")]
    args += ["--zeroshot-dir", str(data / "heldout"), "--threads", "1", "--quiet"]
    args += ["--loss", "siglip", "--lock-image", "--wise-ft-alpha", "0.25", "--lr", "1e-2"]
    result = tc.main([*args, "--batch-size", "16", "--max-steps", "3", "--out", str(out)])
    tuned = weights(out / "last")
    assert "logit_bias" in tuned and "logit_bias" not in start
    for k, v in start.items():
        if k.startswith("visual."):
            assert torch.equal(v, tuned[k]), k  # the locked image tower did not move
    moved = [k for k in start if k.startswith("text.") and not torch.equal(start[k], tuned[k])]
    assert moved

    import attn_clip
    from attn_clip.convert import convert_open_clip

    wise = convert_open_clip(load_file(out / "wise_ft" / "open_clip_model.safetensors"))
    for k in moved:
        torch.testing.assert_close(wise[k], 0.75 * start[k] + 0.25 * tuned[k])
    assert "wise_ft/zeroshot/heldout/top1" in result
    assert attn_clip.create_model(str(out / "wise_ft")).logit_bias is not None


@pytest.mark.slow
def test_torchrun_two_processes_equal_one_process(tc, data, tmp_path):
    common = [*data_args(data), *TINY, "--no-augment", "--max-steps", "3", "--device", "cpu"]
    tc.main([*common, "--batch-size", "16", "--out", str(tmp_path / "single")])
    out = tmp_path / "ddp"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
    cmd += ["--master-port", str(free_port()), str(SCRIPT), *common, "--batch-size", "8"]
    proc = subprocess.run(
        [*cmd, "--out", str(out)], capture_output=True, text=True, timeout=300, env=script_env()
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    start = records(out)[0]
    assert start["world_size"] == 2 and start["global_batch"] == 16
    single, ddp = step_losses(tmp_path / "single"), step_losses(out)
    assert single.keys() == ddp.keys() == {1, 2, 3}
    for k in single:  # the gathered loss over both ranks is the single-process loss
        assert ddp[k] == pytest.approx(single[k], rel=1e-5)
    a, b = weights(tmp_path / "single" / "last"), weights(out / "last")
    for k in a:  # AdamW: see test_accumulation_gives_the_big_batch_update
        torch.testing.assert_close(a[k], b[k], atol=3e-4, rtol=0)
    state = torch.load(out / "last" / "trainer_state.pt", weights_only=True)
    assert len(state["rng"]) == 2 and state["progress"]["step"] == 3
    shutil.rmtree(out)
