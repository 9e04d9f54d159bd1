"""scripts/train_clip.py on tiny generated shapes: loss goes down, the outputs load and the
log tells the run, the EMA becomes final/, accumulation is exact, kill -9 + resume is exact,
corrupt images are counted, NaN stops cleanly, LiT / SigLIP / WiSE-FT, a CoCa (both loss
terms and their weights, exact accumulation and resume, refused flags). (2-process torchrun
equals one process, and FSDP equals DDP: tests/train/test_distributed.py; a SigLIP
checkpoint: test_train_clip_siglip.py; bad input and Ctrl-C: test_errors.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from _support.scripts import (
    assert_same_weights,
    cli,
    events,
    killed_at,
    records,
    step_losses,
    weights,
)
from _support.train import CLIP_TINY, COCA_TINY, RUN, shapes_data
from attn_train import read_progress

TINY = ["--set", *CLIP_TINY, *RUN]
COCA = [*COCA_TINY, *RUN]


@pytest.fixture(scope="module")
def tc():
    import train_clip

    return train_clip


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    # 64 px renders, resized to the model's 32 by its transform: a fixed batch is learnt
    # clearly faster than from 32 px renders (whose small shapes are 8 px wide)
    return shapes_data(tmp_path_factory, image_size=64)


def data_args(data: Path, csv: Path | None = None) -> list[str]:
    return [
        "--train-data",
        str(csv or data / "train.csv"),
        "--zeroshot-dir",
        str(data / "heldout"),
        "--zeroshot-classnames",
        str(data / "classnames.txt"),
    ]


def straight_args(data: Path) -> list[str]:
    """8 updates of 8 pairs (6 an epoch, so one epoch and a part), evaluated zero-shot and by
    retrieval after each epoch, with an EMA, a checkpoint every 2 updates."""
    args = [*data_args(data), "--val-data", str(data / "val.csv"), *TINY, "--batch-size", "8"]
    return [*args, "--max-steps", "8", "--save-every", "2", "--ema-decay", "0.9"]


@pytest.fixture(scope="module")
def straight(tc, data, tmp_path_factory) -> Path:
    """The run the tests below read (outputs, log, EMA, the resume reference, LiT's start)."""
    out = tmp_path_factory.mktemp("train_clip") / "straight"
    tc.main([*straight_args(data), "--out", str(out)])
    return out


def test_loss_goes_down_on_a_fixed_batch(tc, data, tmp_path):
    lines = (data / "train.csv").read_text().splitlines()
    fixed = tmp_path / "fixed.csv"  # 16 pairs: one batch, the same every update
    fixed.write_text("filepath,title\n" + "".join(f"{data / row}\n" for row in lines[1:17]))
    out = tmp_path / "run"
    result = tc.main([*data_args(data, fixed), *TINY, "--out", str(out), "--epochs", "8"])
    losses = list(step_losses(out).values())
    assert len(losses) == 8 and all(torch.isfinite(torch.tensor(losses)))
    assert losses[-1] < 0.8 * losses[0], losses  # 3.02 -> 2.17 on the AVX2 CPU
    assert result["step"] == 8 and result["skipped_images"] == 0


def test_the_outputs_load_and_the_log_tells_the_run(straight):
    import attn_clip

    (start,) = events(straight, "start")
    assert start["global_batch"] == 8 and start["steps"] == 8 and start["world_size"] == 1
    assert list(step_losses(straight)) == list(range(1, 9))
    evals = events(straight, "eval")
    assert [r["step"] for r in evals] == [6, 8]  # after each epoch (the last one cut short)
    last = evals[-1]
    assert 0 <= last["zeroshot/heldout/top1"] <= last["zeroshot/heldout/top5"] <= 1
    assert 0 <= last["val/image_to_text_R@1"] <= 1 and 0 <= last["ema/val/image_to_text_R@1"] <= 1
    (done,) = events(straight, "done")
    assert done["step"] == 8 and done["skipped_images"] == 0
    for folder in ("last", "best", "final"):  # all load through create_model(folder)
        model = attn_clip.create_model(str(straight / folder))
        assert model.config.vision.image_size == 32


def test_ema_is_evaluated_and_becomes_final(straight):
    import attn_clip

    assert 0 <= events(straight, "eval")[-1]["ema/zeroshot/heldout/top1"] <= 1
    final = attn_clip.create_model(str(straight / "final")).state_dict()
    ema, raw = weights(straight / "last", "ema.safetensors"), weights(straight / "last")
    assert all(torch.equal(v, ema[k]) for k, v in final.items())  # final/ holds the EMA
    assert any(not torch.equal(v, raw[k]) for k, v in final.items())


def test_killed_run_resumes_to_the_same_weights(tc, data, straight, tmp_path):
    """kill -9 while the checkpoint of update 6 is being written (last/ holds update 4, a
    half-written last.tmp lies beside it): the same command resumes mid-epoch and ends
    bit-identical to the straight run, EMA included."""
    out = tmp_path / "killed"
    killed_at(tc.main, [*straight_args(data), "--out", out], step=6)
    assert read_progress(out / "last")["step"] == 4 and (out / "last.tmp").is_dir()
    assert max(step_losses(out)) == 6 and not events(out, "done")

    result = tc.main([*straight_args(data), "--out", str(out)])  # the same command resumes
    assert result["step"] == 8
    (resumed,) = events(out, "resume")
    assert resumed["step"] == 4
    assert_same_weights(straight / "last", out / "last")
    assert_same_weights(straight / "last", out / "last", "ema.safetensors")
    assert {k: v for k, v in step_losses(out).items() if k > 4} == {
        k: v for k, v in step_losses(straight).items() if k > 4
    }  # updates 5 and 6 were done twice, the same way


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
    tc.main([*common, "--out", str(tmp_path / "small"), "--batch-size", "8"])
    d = weights(tmp_path / "small" / "last")
    assert max((a[k] - d[k]).abs().max() for k in a) > 1e-3  # a real difference is detected


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
    assert result["step"] == 4 and result["skipped_images"] == 4  # two bad files, two epochs
    assert records(tmp_path / "run")[-1]["skipped_images"] == 4


def test_nan_loss_stops_with_a_message_and_keeps_the_last_good_checkpoint(
    tc, data, tmp_path, capsys
):
    out = tmp_path / "run"
    argv = [*data_args(data), *TINY, "--batch-size", "8", "--max-steps", "8", "--save-every", "2"]
    argv += ["--debug-nan-at-step", "5", "--out", str(out)]
    code, lines = cli(lambda: tc.main(argv), capsys)
    assert code == 1 and len(lines) == 1, lines
    assert "loss is nan at update 5" in lines[0]
    assert f"the last good checkpoint is {out / 'last'} (step 4)" in lines[0]
    assert read_progress(out / "last")["step"] == 4
    assert all(torch.isfinite(v).all() for v in weights(out / "last").values())
    assert records(out)[-1]["event"] == "nonfinite_loss"
    assert not (out / "final").exists()


def test_lit_siglip_and_wise_ft_from_a_trained_folder(tc, data, straight, tmp_path):
    import attn_clip
    from attn_clip.convert import convert_open_clip

    base = straight / "final"
    start = attn_clip.create_model(str(base)).state_dict()
    out = tmp_path / "lit"
    args = ["--model", str(base), "--train-data", str(data / "train.csv")]
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

    wise = convert_open_clip(weights(out / "wise_ft", "open_clip_model.safetensors"))
    for k in moved:
        torch.testing.assert_close(wise[k], 0.75 * start[k] + 0.25 * tuned[k])
    assert "wise_ft/zeroshot/heldout/top1" in result
    assert attn_clip.create_model(str(out / "wise_ft")).logit_bias is not None
    assert json.loads((out / "log.jsonl").read_text().splitlines()[0])["loss"] == "siglip"


def coca_args(data: Path, *extra: str) -> list[str]:
    return [*data_args(data), *COCA, "--batch-size", "8", *extra]


def test_coca_trains_with_its_loss_and_resumes_to_the_same_weights(tc, data, tmp_path):
    """A CoCa trains with CoCaLoss (weights from the flags); kill -9 while update 4 is
    being written, rerun: the same weights as the straight run, bit for bit."""
    import attn_clip

    argv = coca_args(data, "--max-steps", "6", "--save-every", "2", "--caption-loss-weight", "1.5")
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    tc.main([*argv, "--clip-loss-weight", "0.5", "--out", str(straight)])
    (start,) = events(straight, "start")
    assert start["loss"] == "coca" and start["steps"] == 6
    losses = list(step_losses(straight).values())
    assert len(losses) == 6 and losses[-1] < losses[0], losses
    model = attn_clip.create_model(str(straight / "final"))
    assert isinstance(model, attn_clip.CoCa) and model.config.multimodal.width == 16
    image = torch.rand(1, 3, 32, 32)
    assert isinstance(model.caption(image, max_new_tokens=3)[0], str)

    killed_at(tc.main, [*argv, "--clip-loss-weight", "0.5", "--out", killed], step=4)
    assert read_progress(killed / "last")["step"] == 2
    tc.main([*argv, "--clip-loss-weight", "0.5", "--out", str(killed)])
    assert events(killed, "resume")[0]["step"] == 2
    assert_same_weights(straight / "last", killed / "last")
    assert step_losses(killed) == step_losses(straight)


def test_coca_loss_weights_scale_the_two_terms(tc, data, tmp_path):
    """One update from the same start: the caption term alone is the cross-entropy of a
    49,408-word vocabulary at init (~ln V), the contrastive term alone that of 8 pairs
    (~ln 8); both weighted = the weighted sum. --lock-image freezes the whole image tower
    (its attentional pooler too, as open_clip's lock_image_tower)."""
    import math

    import attn_clip

    def first_loss(name: str, caption: str, clip: str, *extra: str) -> float:
        out = tmp_path / name
        weights = ["--caption-loss-weight", caption, "--clip-loss-weight", clip]
        tc.main([*coca_args(data, "--max-steps", "1", "--no-augment"), *weights, *extra,
                 "--out", str(out)])  # fmt: skip
        return step_losses(out)[1]

    caption = first_loss("caption", "2", "0", "--lock-image")
    clip = first_loss("clip", "0", "1")
    both = first_loss("both", "2", "0.5")
    assert abs(caption / 2 - math.log(49408)) < 1.5, caption
    assert abs(clip - math.log(8)) < 1.0, clip
    assert both == pytest.approx(caption + 0.5 * clip, rel=1e-5)
    (start,) = events(tmp_path / "caption", "start")
    visual = attn_clip.create_model(str(tmp_path / "caption" / "final")).visual
    assert start["trainable"] == start["params"] - sum(p.numel() for p in visual.parameters())


def test_coca_accumulation_gives_the_big_batch_losses(tc, data, tmp_path):
    common = [*data_args(data), *COCA, "--no-augment", "--max-steps", "2"]
    tc.main([*common, "--out", str(tmp_path / "big"), "--batch-size", "16"])
    tc.main([*common, "--out", str(tmp_path / "acc"), "--batch-size", "8", "--accum", "2"])
    big, acc = step_losses(tmp_path / "big"), step_losses(tmp_path / "acc")
    assert big.keys() == acc.keys() == {1, 2}
    for k in big:
        assert big[k] == pytest.approx(acc[k], rel=1e-5)
    # AdamW moves a weight whose gradient is ~0 by up to lr (3e-3) on the sign of rounding
    # noise, which differs between the two summation orders (3.3e-4 seen on an AVX-512 EPYC):
    # almost every weight agrees at 1e-5, and none is off by a wrong update's size.
    a, b = weights(tmp_path / "big" / "last"), weights(tmp_path / "acc" / "last")
    off = sum(int(((a[k] - b[k]).abs() > 1e-5).sum()) for k in a)
    assert off <= 1e-3 * sum(v.numel() for v in a.values()), off
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=1.5e-3, rtol=0)


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["--set", *CLIP_TINY, "--caption-loss-weight", "1"], "loss weights are for CoCa models"),
        (["--set", *CLIP_TINY, "--clip-loss-weight", "0.5"], "loss weights are for CoCa models"),
        ([*COCA, "--loss", "siglip"], "a CoCa trains with CoCa's loss"),
    ],
)
def test_coca_flags_are_refused_where_they_do_not_apply(tc, data, tmp_path, capsys, argv, match):
    out = tmp_path / "run"
    code, lines = cli(lambda: tc.main([*data_args(data), *argv, "--out", str(out)]), capsys)
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error:"), lines
    assert match in lines[0] and not out.exists()
