"""The recipes from webdataset shards (attn_train.wds): make_shapes.py --format wds writes
img2dataset's layout; train_clip.py killed with kill -9 mid-epoch (an odd batch count, no
DataLoader workers) resumes to the uninterrupted run's losses and weights bit for bit, and so
does finetune_vit.py on the shards' labels and distill_clip.py on their captions (with a
teacher); bad input is one line and exit 2 with nothing written; word dropout keeps the model's
own pad id.
(2 processes from shards == 1 process: tests/train/test_distributed.py.)"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from _support.scripts import assert_bad_input, assert_same_weights, events, killed_at, step_losses
from _support.train import CLIP_TINY, RUN, VIT_TINY

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create")  # 2 cores


@pytest.fixture(scope="module")
def shards(load_script, tmp_path_factory):
    """64 training samples in 8 shards of 8 (+ 8 val, 8 held-out images), 32 px."""
    root = tmp_path_factory.mktemp("shapes_wds")
    args = ["--n-train", "64", "--n-val", "8", "--n-heldout", "8", "--image-size", "32"]
    load_script("make_shapes").main([str(root), *args, "--format", "wds", "--shard-size", "8"])
    return root


def spec(root) -> str:
    return str(root / "train" / "{00000..00007}.tar")


def assert_killed_run_resumes(main, argv, tmp_path, kill_at: int, saved: int):
    """Run ``argv`` straight, then again killed with kill -9 while update ``kill_at`` is
    written (``last/`` holds update ``saved``): the same command resumes from ``saved`` and
    ends with the straight run's losses and weights, bit for bit. In process (no DataLoader
    workers). Returns ``(the straight run's result, the killed run's folder)``."""
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    result = main([*argv, "--out", str(straight)])
    killed_at(main, [*argv, "--out", killed], step=kill_at)
    assert max(step_losses(killed)) == kill_at and not events(killed, "done")
    assert main([*argv, "--out", str(killed)])["step"] == result["step"]
    assert events(killed, "resume")[0]["step"] == saved
    assert step_losses(killed) == step_losses(straight)
    assert_same_weights(straight / "last", killed / "last")
    assert (killed / "last" / "shards.json").is_file()
    return result, killed


def test_make_shapes_writes_img2datasets_layout(shards):
    import pyarrow.parquet as pq
    from attn_vision import wds

    meta = json.loads((shards / "meta.json").read_text())
    assert meta["train_shards"] == "train/{00000..00007}.tar" and meta["counts"]["train"] == 64
    assert not (shards / "train.csv").exists() and (shards / "val.csv").is_file()
    names = (shards / "classnames.txt").read_text().splitlines()
    with wds.ShardReader(shards / "train" / "00003.tar") as shard:
        assert shard.keys == [f"00003{i:04d}" for i in range(8)]
        samples = list(shard)
    rows = pq.read_table(shards / "train" / "00003.parquet").to_pylist()
    for sample, row in zip(samples, rows, strict=True):
        assert set(sample) == {"__key__", "__url__", "jpg", "txt", "json", "cls"}
        label = wds.sample_label(sample)
        assert names[label] == row["class"].replace("_", " ") and row["label"] == label
        assert wds.sample_caption(sample) == row["caption"] and row["key"] == sample["__key__"]
        assert wds.sample_image(sample).size == (32, 32)


def clip_argv(root, *extra: str) -> list[str]:
    return ["--train-data", spec(root), "--set", *CLIP_TINY, *RUN, *extra]


def test_a_killed_run_resumes_to_the_same_samples_and_weights(
    load_script, shards, tmp_path, capsys
):
    """kill -9 while update 6 is written: last/ holds update 3, so the resumed run starts
    after an odd number of batches. In process (no DataLoader workers): a run killed in a
    forked child with worker processes of its own took pytest-xdist's worker down with it
    ('node down: Not properly terminated', twice in full runs); the workers' hand-off on
    resume is tested with 0, 2 and 3 workers in tests/train/test_wds.py."""
    tc = load_script("train_clip")
    argv = clip_argv(shards, "--batch-size", "4", "--max-steps", "6", "--save-every", "3")
    argv += ["--workers", "0"]
    result, killed = assert_killed_run_resumes(tc.main, argv, tmp_path, kill_at=6, saved=3)
    assert result["step"] == 6 and result["skipped_images"] == 0
    state = json.loads((killed / "last" / "shards.json").read_text())
    assert state["workers"] == 1 and state["num_samples"] == 64 and state["shards"] == 8  # 1 reader

    other = [*argv[:-1], "2", "--out", str(killed)]  # 2 workers: other batches, refused
    line = assert_bad_input(tc, other, None, "another layout (workers 1 -> 2)", capsys)
    assert "--no-resume" in line


def test_finetune_vit_trains_on_the_shards_labels(load_script, shards, tmp_path):
    import attn_vision

    fv = load_script("finetune_vit")
    out = tmp_path / "vit"
    argv = ["--train-data", spec(shards), "--classnames", str(shards / "classnames.txt")]
    argv += ["--val-dir", str(shards / "val"), *VIT_TINY, *RUN, "--batch-size", "8"]
    result = fv.main([*argv, "--max-steps", "3", "--train-num-samples", "48", "--out", str(out)])
    assert result["step"] == 3 and result["eval"]["val/n"] == 8
    (start,) = events(out, "start")
    assert start["classes"] == 30 and start["samples"] == 48
    model = attn_vision.create_model(str(out / "last"))
    names = (shards / "classnames.txt").read_text().splitlines()
    assert model.num_classes == 30 and list(model.pretrained_cfg["label_names"]) == names


def test_finetune_vit_killed_resumes_to_the_same_weights(load_script, shards, tmp_path):
    """The label path: kill -9 while update 4 is written (last/ holds update 2), the same
    command resumes and ends bit-identical to the uninterrupted run (in process, as above)."""
    fv = load_script("finetune_vit")
    argv = ["--train-data", spec(shards), "--classnames", str(shards / "classnames.txt")]
    argv += [*VIT_TINY, *RUN, "--batch-size", "8", "--max-steps", "5", "--save-every", "2"]
    argv += ["--workers", "0"]
    result, _ = assert_killed_run_resumes(fv.main, argv, tmp_path, kill_at=4, saved=2)
    assert result["step"] == 5


def test_distill_clip_from_shards(load_script, shards, tmp_path):
    dc = load_script("distill_clip")
    argv = ["--teacher", "demo-shapes", "--teacher-pretrained", "shapes", "--model", "demo-shapes"]
    argv += ["--set", "vision.width=32", "vision.layers=1", "text.token_dim=8", *RUN]
    argv += ["--train-data", spec(shards), "--batch-size", "8", "--max-steps", "2"]
    result = dc.main([*argv, "--dataset-resampled", "--out", str(tmp_path / "d")])
    assert result["step"] == 2 and (tmp_path / "d" / "last" / "shards.json").is_file()
    assert json.loads((tmp_path / "d" / "last" / "shards.json").read_text())["resampled"]


def test_distill_clip_killed_resumes_to_the_same_weights(load_script, shards, tmp_path):
    """The caption path with a teacher: kill -9 while update 4 is written (last/ holds
    update 2), the same command resumes and ends bit-identical to the uninterrupted run (in
    process, as above)."""
    dc = load_script("distill_clip")
    argv = ["--teacher", "demo-shapes", "--teacher-pretrained", "shapes", "--model", "demo-shapes"]
    argv += ["--set", "vision.width=32", "vision.layers=1", "text.token_dim=8", *RUN]
    argv += ["--train-data", spec(shards), "--batch-size", "8", "--max-steps", "5"]
    argv += ["--save-every", "2", "--workers", "0"]
    result, _ = assert_killed_run_resumes(dc.main, argv, tmp_path, kill_at=4, saved=2)
    assert result["step"] == 5


@pytest.mark.parametrize(
    "script, extra, match",
    [
        ("train_clip", ["--train-data", "{0..3}.tar"], "4 of the 4 shards"),
        ("train_clip", ["--train-data", "pipe:cat {0..1}.tar"], "only local shard files"),
        ("train_clip", ["--train-num-samples", "9"], "are for webdataset shards"),
        ("train_clip", ["--train-data", "SPEC", "--workers", "9"], "8 shards cannot be split"),
        ("distill_clip", ["--train-data", "SPEC", "--train-num-samples", "0"], "must be >= 1"),
        ("finetune_vit", ["--train-data", "SPEC"], "--classnames FILE"),
        ("finetune_vit", ["--train-data", "SPEC", "--train-dir", "x"], "one of them"),
    ],
)
def test_bad_input_is_one_line_and_nothing_written(
    load_script, shards, tmp_path, capsys, script, extra, match
):
    base = {
        "train_clip": ["--set", *CLIP_TINY, "--train-data", str(shards / "val.csv")],
        "distill_clip": ["--teacher", "demo-shapes", "--train-data", str(shards / "val.csv")],
        "finetune_vit": [*VIT_TINY],
    }[script]
    argv = [*base, *RUN, *[spec(shards) if a == "SPEC" else a for a in extra]]
    assert_bad_input(load_script(script), argv, tmp_path / "out", match, capsys)


def test_word_dropout_keeps_the_models_own_pad_id(load_script):
    """A CoCa over RoBERTa pads with 1 (model.pad_id), not its config's 0 (commit 75c1c60)."""
    tc = load_script("train_clip")
    tokenizer = SimpleNamespace(sot_token_id=0, eot_token_id=2)
    config = SimpleNamespace(is_coca=True, text=SimpleNamespace(pad_id=0))
    assert tc.caption_special_ids(SimpleNamespace(config=config, pad_id=1), tokenizer) == (0, 2, 1)
    clip = SimpleNamespace(config=SimpleNamespace(is_coca=False))
    assert tc.caption_special_ids(clip, tokenizer) == ()
