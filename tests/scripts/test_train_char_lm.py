"""scripts/train_char_lm.py: a few updates on generated text lower the loss, kill -9 + resume
is exact, sampling. (Bad input and Ctrl-C: test_errors.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _support.scripts import assert_same_weights, events, killed_at, records
from attn_train import read_progress

SMALL = ["--context", "32", "--embed-dim", "32", "--depth", "2", "--heads", "4"]
SMALL += ["--batch-size", "16", "--warmup", "5", "--threads", "1", "--quiet"]


@pytest.fixture(scope="module")
def lm_script():
    import train_char_lm

    return train_char_lm


@pytest.fixture(scope="module")
def text(tmp_path_factory) -> Path:
    from attn_train import synthetic

    path = tmp_path_factory.mktemp("lm") / "rhymes.txt"
    path.write_text(synthetic.rhymes(300), encoding="utf-8")
    return path


def straight_args(text: Path) -> list[str]:
    """20 updates (dropout 0.1), the validation loss every 5, a checkpoint every 5."""
    args = ["train", "--text", str(text), "--steps", "20", "--eval-every", "5"]
    return [*args, "--save-every", "5", *SMALL]


@pytest.fixture(scope="module")
def straight(lm_script, text, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("train_char_lm") / "straight"
    lm_script.main([*straight_args(text), "--out", str(out)])
    return out


def test_a_few_updates_lower_the_loss(straight):
    val = [r["val_loss"] for r in records(straight) if "val_loss" in r]
    assert len(val) == 4 and val[-1] < val[0] - 0.3, val  # 2.96 -> 2.48 on the AVX2 CPU
    (done,) = events(straight, "done")
    assert done["last_loss"] < done["first_loss"] - 0.4, done  # 3.14 -> 2.55


def test_killed_run_resumes_to_the_same_weights(lm_script, text, straight, tmp_path):
    """kill -9 while update 10's checkpoint is written: the same command resumes from update
    5 and ends bit-identical to the straight run."""
    out = tmp_path / "killed"
    killed_at(lm_script.main, [*straight_args(text), "--out", out], step=10)
    assert read_progress(out / "last")["step"] == 5
    lm_script.main([*straight_args(text), "--out", str(out)])
    assert [r["step"] for r in events(out, "resume")] == [5]
    assert_same_weights(straight / "last", out / "last")


def test_sampling(lm_script, straight, capsys):
    model = str(straight / "last")
    capsys.readouterr()
    argv = ["sample", "--model", model, "--prompt", "the ", "--max-new-tokens", "12"]
    result = lm_script.main([*argv, "--top-k", "5"])
    assert result["sample"].startswith("the ") and len(result["sample"]) == 16
    assert result["sample"] in capsys.readouterr().out
    with pytest.raises(ValueError, match="not in the model's vocabulary"):
        lm_script.main(["sample", "--model", model, "--prompt", "XYZ"])


def test_read_chars_reads_the_saved_character_set(lm_script, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"extra": {"chars": ["\n", "a", "b"]}}), encoding="utf-8")
    assert lm_script.read_chars(path) == ["\n", "a", "b"]
