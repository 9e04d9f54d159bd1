"""scripts/train_translation.py: a few updates lower the loss and give checkpoints that
translate, kill -9 + resume is exact. (Under torchrun: tests/train/test_distributed.py; the
generated corpus and the TSV reader: tests/train/test_synthetic.py, test_text.py; bad input
and Ctrl-C: test_errors.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from _support.scripts import assert_same_weights, events, killed_at, step_losses, weights
from attn_train import read_progress

SMALL = ["--set", "embed_dim=32", "mlp_dim=64", "num_heads=4", "dropout=0.1"]
SMALL += ["--threads", "1", "--quiet", "--batch-size", "16", "--warmup", "2", "--lr", "3e-3"]


@pytest.fixture(scope="module")
def tt():
    import train_translation

    return train_translation


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    from attn_train import synthetic

    out = tmp_path_factory.mktemp("numbers")
    synthetic.write_translation_corpus("numbers", out, n_train=160, n_dev=8, seed=0)
    return out


def straight_args(data: Path) -> list[str]:
    """8 updates of 2 x 16 pairs (5 an epoch) with dropout, scored on the dev set (BLEU,
    2 beams) after each epoch, a checkpoint every 2 updates."""
    args = ["train", "--train", str(data / "train.tsv"), "--dev", str(data / "dev.tsv")]
    args += ["--beams", "2", "--epochs", "3", "--accum", "2", "--max-steps", "8"]
    return [*args, "--save-every", "2", "--log-every", "1", *SMALL]


@pytest.fixture(scope="module")
def straight(tt, data, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("train_translation") / "straight"
    tt.main([*straight_args(data), "--out", str(out)])
    return out


def test_a_few_updates_lower_the_loss_and_give_a_usable_checkpoint(straight):
    losses = list(step_losses(straight).values())
    assert len(losses) == 8 and sum(losses[-2:]) / 2 < losses[0] - 0.5, losses  # 6.0 -> 4.5
    dev = events(straight, "dev")
    assert [r["step"] for r in dev] == [5, 8]
    assert all(0 <= r["bleu"] <= 100 and 0 <= r["exact"] <= 1 for r in dev)

    from attn_nlp import Translator

    for name in ("last", "best"):
        translator = Translator.from_pretrained(straight / name)
        assert isinstance(translator.translate(["three hundred and five"], beams=2)[0], str)


def test_killed_run_resumes_to_the_same_weights(tt, data, straight, tmp_path):
    """kill -9 while update 4's checkpoint is written: last/ holds update 2 (mid-epoch 0);
    the same command redoes 3 and 4 (dropout, data order, then the dev score of epoch 0)
    and ends bit-identical to the straight run."""
    out = tmp_path / "killed"
    killed_at(tt.main, [*straight_args(data), "--out", out], step=4)
    assert read_progress(out / "last")["step"] == 2
    early = weights(out / "last")
    assert tt.main([*straight_args(data), "--out", str(out)])["step"] == 8
    assert [r["step"] for r in events(out, "resume")] == [2]
    assert_same_weights(straight / "last", out / "last")
    late = weights(out / "last")
    assert not all(torch.equal(early[k], late[k]) for k in early)  # 2 vs 8 updates differ
