"""scripts/train_char_lm.py: a few steps on generated text lower the loss; resume; sampling."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "train_char_lm.py"
SMALL = [
    "--context",
    "32",
    "--embed-dim",
    "32",
    "--depth",
    "2",
    "--heads",
    "4",
    "--batch-size",
    "16",
    "--warmup",
    "5",
    "--threads",
    "1",
    "--quiet",
]


@pytest.fixture(scope="module")
def lm_script(load_script):
    return load_script("train_char_lm")


@pytest.fixture(scope="module")
def text(tmp_path_factory) -> Path:
    from attn_train import synthetic

    path = tmp_path_factory.mktemp("lm") / "rhymes.txt"
    path.write_text(synthetic.rhymes(300), encoding="utf-8")
    return path


def test_a_few_steps_lower_the_loss_then_sample(text, tmp_path):
    out = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    train = [
        sys.executable,
        str(SCRIPT),
        "train",
        "--text",
        str(text),
        "--out",
        str(out),
        "--steps",
        "40",
        "--eval-every",
        "10",
        *SMALL,
    ]
    proc = subprocess.run(train, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    records = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    val = [r["val_loss"] for r in records if "val_loss" in r]
    assert len(val) == 4 and val[-1] < val[0] - 0.3
    done = records[-1]
    assert done["event"] == "done" and done["last_loss"] < done["first_loss"] - 0.5


def test_sampling_and_resume_in_process(lm_script, text, tmp_path, capsys):
    args = ["train", "--text", str(text), "--eval-every", "1000", "--save-every", "5", *SMALL]
    lm_script.main([*args, "--out", str(tmp_path / "a"), "--steps", "10"])
    lm_script.main([*args, "--out", str(tmp_path / "b"), "--steps", "5"])
    lm_script.main([*args, "--out", str(tmp_path / "b"), "--steps", "10"])
    from safetensors.torch import load_file

    a = load_file(tmp_path / "a" / "last" / "model.safetensors")
    b = load_file(tmp_path / "b" / "last" / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
    capsys.readouterr()
    result = lm_script.main(
        [
            "sample",
            "--model",
            str(tmp_path / "a" / "last"),
            "--prompt",
            "the ",
            "--max-new-tokens",
            "12",
            "--top-k",
            "5",
        ]
    )
    assert result["sample"].startswith("the ") and len(result["sample"]) == 16
    assert result["sample"] in capsys.readouterr().out
    with pytest.raises(ValueError, match="not in the model's vocabulary"):
        lm_script.main(["sample", "--model", str(tmp_path / "a" / "last"), "--prompt", "XYZ"])


def test_read_chars_reads_the_saved_character_set(lm_script, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"extra": {"chars": ["\n", "a", "b"]}}), encoding="utf-8")
    assert lm_script.read_chars(path) == ["\n", "a", "b"]
