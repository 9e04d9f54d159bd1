"""scripts/train_text_classifier.py: a few steps on generated reviews lower the loss."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "train_text_classifier.py"


@pytest.fixture(scope="module")
def cls_script(load_script):
    return load_script("train_text_classifier")


def test_a_few_steps_lower_the_loss(cls_script, tmp_path):
    cls_script.make_data(tmp_path / "data", n_train=600, n_dev=100, seed=0)
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


def test_csv_errors(cls_script, tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("sentence,label\nhello,pos\n", encoding="utf-8")
    with pytest.raises(ValueError, match="'text' and 'label' columns"):
        cls_script.read_csv(bad)
    bad.write_text("text,label\nhello,pos\n,neg\n", encoding="utf-8")
    with pytest.raises(ValueError, match="bad.csv:3: empty text or label"):
        cls_script.read_csv(bad)


def test_negation_matters_in_generated_reviews(cls_script):
    import random

    rng = random.Random(1)
    rows = [cls_script.make_review(rng) for _ in range(200)]
    assert {label for _, label in rows} == {"pos", "neg"}
    assert any(" not " in text and label == "pos" for text, label in rows)
