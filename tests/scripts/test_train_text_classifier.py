"""scripts/train_text_classifier.py: a few steps on generated reviews lower the loss. (The
reviews and the CSV reader: tests/train/test_synthetic.py, test_text.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "train_text_classifier.py"


def test_a_few_steps_lower_the_loss(tmp_path):
    from attn_train import synthetic

    synthetic.write_reviews(tmp_path / "data", n_train=600, n_dev=100, seed=0)
    out = tmp_path / "run"
    cmd = [
        sys.executable,
        str(SCRIPT),
        "train",
        "--train",
        str(tmp_path / "data" / "train.csv"),
        "--dev",
        str(tmp_path / "data" / "dev.csv"),
        "--out",
        str(out),
        "--epochs",
        "3",
        "--embed-dim",
        "32",
        "--log-every",
        "5",
        "--threads",
        "1",
        "--lr",
        "3e-3",
        "--warmup",
        "10",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    records = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    done = records[-1]
    assert done["event"] == "done" and done["last_loss"] < done["first_loss"] - 0.2
    dev = [r for r in records if r.get("event") == "dev"]
    assert [r["epoch"] for r in dev] == [1, 2, 3] and dev[-1]["accuracy"] > 0.6

    from attn_nlp import create_model

    model = create_model(out / "best")
    assert model.config.labels == ["neg", "pos"]
    assert model(torch.tensor([[5, 6, 7]])).shape == (1, 2)
