"""scripts/train_translation.py: loss goes down, exact resume, DDP. (The generated corpus and
the TSV reader: tests/train/test_synthetic.py, test_text.py.)"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "train_translation.py"
SMALL = [
    "--set",
    "embed_dim=32",
    "mlp_dim=64",
    "num_heads=4",
    "dropout=0.1",
    "--threads",
    "1",
    "--quiet",
    "--batch-size",
    "16",
    "--warmup",
    "10",
    "--lr",
    "3e-3",
]


@pytest.fixture(scope="module")
def tt(load_script):
    return load_script("train_translation")


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    from attn_train import synthetic

    out = tmp_path_factory.mktemp("numbers")
    synthetic.write_translation_corpus("numbers", out, n_train=400, n_dev=20, seed=0)
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def script_env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}


def test_a_few_steps_lower_the_loss_and_give_a_usable_checkpoint(data, tmp_path):
    out = tmp_path / "run"
    cmd = [
        sys.executable,
        str(SCRIPT),
        "train",
        "--train",
        str(data / "train.tsv"),
        "--dev",
        str(data / "dev.tsv"),
        "--dev-limit",
        "8",
        "--beams",
        "2",
        "--out",
        str(out),
        "--epochs",
        "2",
        "--log-every",
        "5",
        *SMALL,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=script_env())
    assert proc.returncode == 0, proc.stderr[-2000:]
    records = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if "loss" in r]
    assert len(losses) >= 5 and sum(losses[-2:]) / 2 < losses[0] - 0.5
    dev = [r for r in records if r.get("event") == "dev"]
    assert len(dev) == 2 and all(0 <= r["bleu"] <= 100 and 0 <= r["exact"] <= 1 for r in dev)

    from attn_nlp import Translator

    for name in ("last", "best"):
        translator = Translator.from_pretrained(out / name)
        assert isinstance(translator.translate(["three hundred and five"], beams=2)[0], str)


def test_resume_is_exact(tt, data, tmp_path):
    args = [
        "train",
        "--train",
        str(data / "train.tsv"),
        "--epochs",
        "3",
        "--accum",
        "2",
        "--save-every",
        "1000",
        "--log-every",
        "1000",
        *SMALL,
    ]
    tt.main([*args, "--out", str(tmp_path / "straight"), "--max-steps", "16"])
    tt.main([*args, "--out", str(tmp_path / "resumed"), "--max-steps", "8"])
    result = tt.main([*args, "--out", str(tmp_path / "resumed"), "--max-steps", "16"])
    assert result["step"] == 16
    from safetensors.torch import load_file

    a = load_file(tmp_path / "straight" / "last" / "model.safetensors")
    b = load_file(tmp_path / "resumed" / "last" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    first = tt.main([*args, "--out", str(tmp_path / "other"), "--max-steps", "8"])
    c = load_file(tmp_path / "other" / "last" / "model.safetensors")
    assert not all(torch.equal(a[k], c[k]) for k in a)  # 8 vs 16 steps really differ
    assert first["step"] == 8


@pytest.mark.slow
def test_torchrun_ddp_two_processes(data, tmp_path):
    out = tmp_path / "ddp"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "--master-port",
        str(free_port()),
        str(SCRIPT),
        "train",
        "--train",
        str(data / "train.tsv"),
        "--out",
        str(out),
        "--max-steps",
        "4",
        "--save-every",
        "2",
        "--device",
        "cpu",
        *SMALL,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=script_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert records[0]["world_size"] == 2
    state = torch.load(out / "last" / "trainer_state.pt", weights_only=True)
    assert len(state["rng"]) == 2 and state["progress"]["step"] == 4
