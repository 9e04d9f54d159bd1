"""scripts/distill_clip.py: a tiny CLIP teacher folder distilled into a narrower student;
an interrupted run resumes to the same weights; bad input is one line and writes nothing."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch
from _support.train import tiny_clip_config
from attn_train import loop
from attn_train.cli import run_main
from safetensors.torch import load_file

SMALL = ["embed_dim=32", "vision.image_size=32", "vision.layers=1", "text.layers=1"]
SMALL += ["text.context_length=16"]
RUN = ["--threads", "1", "--quiet", "--batch-size", "16", "--warmup", "1", "--log-every", "1"]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """Shapes data and a teacher folder (a random CLIP, width 32 / 16)."""
    import attn_clip
    from attn_train import shapes

    root = tmp_path_factory.mktemp("distill_clip")
    shapes.write_dataset(root, n_train=32, n_val=0, n_heldout=12, image_size=32)
    teacher = attn_clip.create_model(tiny_clip_config(**{"text.width": 32}))
    attn_clip.save_pretrained(teacher, root / "teacher")
    return root


def args(data: Path, out: Path, *extra: str, student: tuple[str, ...] = ()) -> list[str]:
    return [
        "--teacher", str(data / "teacher"), "--train-data", str(data / "train.csv"),
        "--zeroshot-dir", str(data / "heldout"), "--zeroshot-classnames",
        str(data / "classnames.txt"), "--out", str(out), "--set", *SMALL, "vision.width=16",
        "vision.head_width=16", "text.width=16", *student, *RUN, *extra,
    ]  # fmt: skip


def test_student_is_smaller_learns_and_loads(data, load_script, tmp_path):
    import attn_clip

    result = load_script("distill_clip").main(args(data, tmp_path / "s", "--max-steps", "3"))
    assert result["step"] == 3 and result["student_params"] < result["teacher_params"] / 2
    assert "zeroshot/heldout/top1" in result["teacher"]
    assert result["last_loss"] < result["first_loss"]
    student = attn_clip.create_model(tmp_path / "s" / "last")
    assert student.config.vision.width == 16
    assert student.encode_image(torch.randn(1, 3, 32, 32)).shape == (1, 32)


def test_ema_student_is_scored_and_written_to_final(data, load_script, tmp_path):
    import attn_clip

    out = tmp_path / "ema"
    argv = args(data, out, "--max-steps", "3", "--ema-decay", "0.9")
    result = load_script("distill_clip").main(argv)
    assert {"ema/zeroshot/heldout/top1", "zeroshot/heldout/top1"} <= result["eval"].keys()
    ema = load_file(str(out / "last" / "ema.safetensors"))
    final = attn_clip.create_model(out / "final").state_dict()
    weights = load_file(str(out / "last" / "model.safetensors"))
    for k, v in final.items():  # final/ is the EMA, not the last weights
        torch.testing.assert_close(v, ema[k], rtol=0, atol=0)
    assert any(not torch.equal(weights[k], ema[k]) for k in weights)


def test_resume_after_ctrl_c_equals_an_uninterrupted_run(data, load_script, tmp_path, capsys):
    module = load_script("distill_clip")
    run = ("--max-steps", "4", "--save-every", "1")
    module.main(args(data, tmp_path / "once", *run))
    calls, to_device = itertools.count(1), loop._to_device

    def ctrl_c_at_the_third_batch(batch, device):
        if isinstance(batch, (list, tuple)) and next(calls) == 3:  # not its tensors
            raise KeyboardInterrupt
        return to_device(batch, device)

    loop._to_device = ctrl_c_at_the_third_batch
    try:
        with pytest.raises(SystemExit) as e:
            run_main(lambda: module.main(args(data, tmp_path / "twice", *run)))
    finally:
        loop._to_device = to_device
    assert e.value.code == 130 and "update 2" in capsys.readouterr().err
    module.main(args(data, tmp_path / "twice", *run))
    once = load_file(str(tmp_path / "once" / "last" / "model.safetensors"))
    twice = load_file(str(tmp_path / "twice" / "last" / "model.safetensors"))
    assert once.keys() == twice.keys()
    for k in once:
        torch.testing.assert_close(twice[k], once[k], rtol=0, atol=0)


@pytest.mark.parametrize(
    "student, extra, message",
    [
        (["embed_dim=16"], [], "--w-feature needs the teacher's embed_dim (32)"),
        (["vision.image_size=64"], [], "image preprocessing"),
        (["text.context_length=24"], [], "text vocabulary and context length"),
        ([], ["--accum", "2"], "--accum is not supported"),
        ([], ["--ema-decay", "1.5"], "--ema-decay must be in (0, 1)"),
        ([], ["--teacher", "no-such-clip"], "unknown model 'no-such-clip'"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(
    student, extra, message, data, load_script, tmp_path, capsys
):
    argv = args(data, tmp_path / "out", *extra, student=tuple(student))
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        run_main(lambda: load_script("distill_clip").main(argv))
    lines = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(lines) == 1 and message in lines[0], lines
    assert not (tmp_path / "out").exists()
