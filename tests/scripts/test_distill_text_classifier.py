"""scripts/distill_text_classifier.py: a tiny teacher distilled into a smaller student; bad
input, and an interrupted run resumed equals an uninterrupted one."""

from __future__ import annotations

import itertools
import json

import pytest
import torch
from attn_train import loop
from attn_train.cli import run_main
from safetensors.torch import load_file

TINY = ["--threads", "1", "--batch-size", "8", "--log-every", "1", "--warmup", "1", "--quiet"]


@pytest.fixture(scope="module")
def teacher(tmp_path_factory, load_script):
    """A 2-block classifier trained for a few steps on generated reviews (and its data)."""
    from attn_train import synthetic

    root = tmp_path_factory.mktemp("distill")
    synthetic.write_reviews(root / "reviews", n_train=48, n_dev=16, seed=0)
    train = load_script("train_text_classifier")
    argv = ["train", "--train", str(root / "reviews" / "train.csv"), "--out", str(root / "t")]
    argv += ["--embed-dim", "32", "--depth", "2", "--heads", "4", "--vocab-size", "200"]
    train.main([*argv, "--max-len", "16", "--max-steps", "4", *TINY])
    return root


def args(teacher, out, steps):
    data = teacher / "reviews"
    return [
        "--teacher", str(teacher / "t" / "last"), "--train", str(data / "train.csv"),
        "--dev", str(data / "dev.csv"), "--out", str(out), "--embed-dim", "16", "--depth", "1",
        "--heads", "2", "--max-len", "16", "--max-steps", str(steps), "--save-every", "1", *TINY,
    ]  # fmt: skip


def test_distils_into_a_smaller_loadable_student(teacher, load_script, tmp_path):
    from attn_nlp import TextClassifier, create_model

    result = load_script("distill_text_classifier").main(args(teacher, tmp_path / "s", 3))
    assert result["step"] == 3 and result["layer_map"] == [1]
    assert result["student_params"] < result["teacher_params"] / 2
    assert 0.0 <= result["teacher_accuracy"] <= 1.0
    records = [json.loads(r) for r in (tmp_path / "s" / "log.jsonl").read_text().splitlines()]
    assert [r["accuracy"] for r in records if r.get("event") == "dev"] == [
        result["eval"]["accuracy"]
    ]
    student = create_model(tmp_path / "s" / "last" / "student")
    assert isinstance(student, TextClassifier) and student.config.embed_dim == 16
    assert student(torch.tensor([[5, 6, 7]])).shape == (1, 2)


def test_resume_after_ctrl_c_equals_an_uninterrupted_run(teacher, load_script, tmp_path, capsys):
    module = load_script("distill_text_classifier")
    module.main(args(teacher, tmp_path / "once", 4))
    calls, to_device = itertools.count(1), loop._to_device

    def ctrl_c_at_the_third_batch(batch, device):
        if isinstance(batch, dict) and next(calls) == 3:
            raise KeyboardInterrupt
        return to_device(batch, device)

    loop._to_device = ctrl_c_at_the_third_batch
    try:
        with pytest.raises(SystemExit) as e:
            run_main(lambda: module.main(args(teacher, tmp_path / "twice", 4)))
    finally:
        loop._to_device = to_device
    assert e.value.code == 130 and "update 2" in capsys.readouterr().err
    module.main(args(teacher, tmp_path / "twice", 4))
    once = load_file(str(tmp_path / "once" / "last" / "model.safetensors"))
    twice = load_file(str(tmp_path / "twice" / "last" / "model.safetensors"))
    assert once.keys() == twice.keys() and any(k.startswith("hidden.proj") for k in once)
    for k in once:
        torch.testing.assert_close(twice[k], once[k], rtol=0, atol=0)


@pytest.mark.parametrize(
    "change, message",
    [
        (["--teacher", "MISSING"], "--teacher MISSING"),
        (["--depth", "3"], "deeper than the teacher (2)"),
        (["--embed-dim", "15"], "--embed-dim"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(
    change, message, teacher, load_script, tmp_path, capsys
):
    argv = args(teacher, tmp_path / "out", 2)
    for i in range(0, len(change), 2):
        argv[argv.index(change[i]) + 1] = change[i + 1]
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        run_main(lambda: load_script("distill_text_classifier").main(argv))
    lines = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(lines) == 1 and message in lines[0], lines
    assert not (tmp_path / "out").exists()
