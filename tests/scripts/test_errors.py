"""Every script answers like the apps: bad input -> one ``error:`` line, exit code 2 and
nothing written; Ctrl-C -> one ``interrupted`` line and 130 (training: where the last
checkpoint is, and the same command resumes from it); --help describes every option with
its default; the progress bar is as long as the run. In process, through ``run_main`` and
each script's ``main`` and ``__main__`` block; one subprocess checks the real entry point."""

from __future__ import annotations

import argparse
import io
import itertools
import json
import runpy
import sys
from pathlib import Path

import pytest
import torch
import tqdm
from _support.scripts import SCRIPTS, assert_bad_input, cli, run_script
from _support.train import CLIP_TINY
from attn_train import loop
from attn_train.cli import HelpFormatter

TRAINING = ["train_clip", "finetune_vit", "train_translation", "train_text_classifier"]
TRAINING += ["train_char_lm"]
VIT_TINY = "--img-size 32 --patch-size 8 --set depth=1 embed_dim=32 num_heads=2 --warmup 1"
NLP_TINY = "--set embed_dim=32 mlp_dim=64 num_heads=4 encoder_depth=1 decoder_depth=1"
CLS_TINY = "--embed-dim 16 --depth 1 --heads 2 --vocab-size 200 --max-len 16"
LM_TINY = "--context 16 --embed-dim 16 --depth 1 --heads 2 --warmup 1"
RUN = ["--threads", "1", "--log-every", "1", "--save-every", "1", "--batch-size", "8"]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """Tiny data for every script, a file that is not an image and a pickle that runs code."""
    from attn_train import shapes, synthetic

    root = tmp_path_factory.mktemp("data")
    shapes.write_dataset(root / "shapes", n_train=16, n_val=0, n_heldout=0, image_size=32)
    synthetic.write_translation_corpus("numbers", root / "numbers", n_train=32, n_dev=4, seed=0)
    synthetic.write_reviews(root / "reviews", n_train=32, n_dev=8, seed=0)
    (root / "rhymes.txt").write_text(synthetic.rhymes(40), encoding="utf-8")
    for name in ("a", "b"):  # an image folder and a CSV where nothing can be read
        (root / "bad" / name).mkdir(parents=True)
        (root / "bad" / name / "1.png").write_text("not an image")
    rows = "".join(f"{root / 'bad' / n / '1.png'},a {n}\n" for n in "ab")
    (root / "bad.csv").write_text("filepath,title\n" + rows)

    class Payload:
        def __reduce__(self):
            return (print, ("this ran",))

    torch.save({"weight": Payload()}, root / "evil.pt")
    return root


DATA = {  # the training data of each recipe, under the data fixture
    "csv": "shapes/train.csv",
    "folder": "shapes/train",
    "tsv": "numbers/train.tsv",
    "reviews": "reviews/train.csv",
    "text": "rhymes.txt",
}


def recipe(name: str, data: Path, steps: int) -> list[str]:
    """A valid, tiny command line of training script ``name`` (without ``--out``)."""
    d = {k: str(data / v) for k, v in DATA.items()}
    return {
        "train_clip": ["--train-data", d["csv"], "--set", *CLIP_TINY, "--warmup", "1"]
        + ["--max-steps", str(steps)],
        "finetune_vit": ["--train-dir", d["folder"], *VIT_TINY.split(), "--max-steps", str(steps)],
        "train_translation": ["train", "--train", d["tsv"], *NLP_TINY.split()]
        + ["--max-steps", str(steps)],
        "train_text_classifier": ["train", "--train", d["reviews"], *CLS_TINY.split()]
        + ["--max-steps", str(steps)],
        "train_char_lm": ["train", "--text", d["text"], *LM_TINY.split(), "--steps", str(steps)],
    }[name] + RUN


@pytest.fixture
def offline(monkeypatch, tmp_path):
    """No network and an empty hub cache: every pretrained tag is unavailable."""
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))


def bad_inputs(name: str, data: Path) -> dict[str, tuple[list[str], str]]:
    """``{case: (argv, expected part of the error line)}`` of a training script."""
    ok = recipe(name, data, 2)
    missing = str(data / "missing")
    if name == "train_clip":
        return {
            "missing CSV": (["--train-data", missing, *ok[2:]], f"--train-data {missing}: no"),
            "unknown model": ([*ok, "--model", "no-such-clip"], "unknown model 'no-such-clip'"),
            "pretrained offline": (
                [*ok[:2], *RUN, "--model", "ViT-B-32", "--pretrained", "openai"],
                "offline",
            ),
            "missing pretrained": (
                [*ok[:2], *RUN, "--pretrained", missing],
                f"--pretrained {missing} is neither",
            ),
            "unsafe pretrained": (
                [*ok[:2], *RUN, "--pretrained", str(data / "evil.pt")],
                "refusing",
            ),
            "bad --set": ([*ok, "--set", "vision.depth=2"], "unknown config key 'vision.depth'"),
            "bad --ema-decay": ([*ok, "--ema-decay", "1.5"], "--ema-decay must be in"),
            "unreadable images": (
                ["--train-data", str(data / "bad.csv"), *ok[2:]],
                "none of the 2 images",
            ),
        }
    if name == "finetune_vit":
        return {
            "missing folder": (["--train-dir", missing, *ok[2:]], f"--train-dir {missing}: no"),
            "unknown model": ([*ok, "--model", "no_such_vit"], "unknown model 'no_such_vit'"),
            "pretrained offline": ([*ok, "--pretrained"], "offline"),
            "missing pretrained": ([*ok, "--pretrained", missing + ".safetensors"], "neither"),
            "unsafe pretrained": ([*ok, "--pretrained", str(data / "evil.pt")], "refusing"),
            "bad --set": ([*ok, "--set", "dpeth=1"], "dpeth"),
            "unreadable images": (
                ["--train-dir", str(data / "bad"), *ok[2:]],
                "none of the 2 images",
            ),
        }
    if name == "train_translation":
        return {
            "missing TSV": (["train", "--train", missing, *ok[3:]], f"--train {missing}: no"),
            "missing dev": ([*ok, "--dev", missing], f"--dev {missing}: no such file"),
            "unknown preset": ([*ok, "--preset", "transformer-huge"], "unknown preset"),
            "bad --set": ([*ok, "--set", "depth=1"], "unknown config key(s) ['depth']"),
        }
    if name == "train_text_classifier":
        return {
            "missing CSV": (["train", "--train", missing, *ok[3:]], f"--train {missing}: no"),
            "missing dev": ([*ok, "--dev", missing], f"--dev {missing}: no such file"),
            "bad size": ([*ok, "--heads", "3"], "not a multiple of --heads 3"),
        }
    return {
        "missing text": (["train", "--text", missing, *ok[3:]], f"--text {missing}: no such"),
        "text too short": ([*ok, "--context", "4000"], "too short for --context 4000"),
    }


@pytest.mark.parametrize("name", TRAINING)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(
    name, load_script, data, tmp_path, offline, capsys
):
    module = load_script(name)
    cases = bad_inputs(name, data)
    cases["no such device"] = ([*recipe(name, data, 2), "--device", "cuda:99"], "--device cuda:99")
    cases["zero log-every"] = ([*recipe(name, data, 2), "--log-every", "0"], "--log-every must")
    for case, (argv, match) in cases.items():
        out = tmp_path / case.replace(" ", "_")
        assert_bad_input(module, argv, out, match, capsys)


TRUNCATED = {
    "train_clip": "model.safetensors",
    "finetune_vit": "trainer_state.pt",
    "train_translation": "tokenizer.json",
    "train_text_classifier": "model.safetensors",
    "train_char_lm": "config.json",
}


class Bar(tqdm.tqdm):
    """A silent tqdm that remembers its instances."""

    made: list[Bar] = []

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **{**kwargs, "file": io.StringIO()})
        Bar.made.append(self)


@pytest.mark.parametrize("name", TRAINING)
def test_ctrl_c_then_the_same_command_resumes_and_a_truncated_checkpoint_is_refused(
    name, load_script, data, tmp_path, monkeypatch, capsys
):
    module = load_script(name)
    out = tmp_path / "run"
    argv = [*recipe(name, data, 5), "--out", str(out)]
    to_device, calls, depth = loop._to_device, itertools.count(1), [0]

    def ctrl_c_at_the_third_batch(batch, device):  # (_to_device recurses into the batch)
        if depth[0] == 0 and next(calls) == 3:
            raise KeyboardInterrupt
        depth[0] += 1
        try:
            return to_device(batch, device)
        finally:
            depth[0] -= 1

    monkeypatch.setattr(loop, "_to_device", ctrl_c_at_the_third_batch)
    monkeypatch.setattr(tqdm, "tqdm", Bar)
    assert cli(lambda: module.main(argv), capsys) == (
        130,
        [
            f"interrupted: the last checkpoint is {out / 'last'} (update 2); run the same "
            "command again to resume from it"
        ],
    )
    Bar.made.clear()
    result = module.main(argv)  # the same command resumes, and its bar counts on from 2
    assert result["step"] == 5
    (bar,) = Bar.made
    assert (bar.initial, bar.n, bar.total) == (2, 5, 5)
    events = [json.loads(line).get("event") for line in (out / "log.jsonl").open()]
    assert events.count("start") == events.count("resume") == 1

    path = out / "last" / TRUNCATED[name]
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    line = assert_bad_input(module, argv, None, f"cannot resume: {path} is truncated", capsys)
    assert line.endswith(f"Start fresh with --no-resume, or remove {out / 'last'}")


def test_the_progress_bar_is_as_long_as_the_run(load_script, data, tmp_path, monkeypatch):
    """--max-steps 5 over 2 batches an epoch (16 images of 8): 5 of 5, not 1 of 2."""
    monkeypatch.setattr(tqdm, "tqdm", Bar)
    Bar.made.clear()
    argv = [*recipe("finetune_vit", data, 5), "--out", str(tmp_path)]
    result = load_script("finetune_vit").main(argv)
    (bar,) = Bar.made
    assert bar.total == bar.n == result["step"] == 5


def parsers(parser: argparse.ArgumentParser):
    """``parser`` and, recursively, its subcommands' parsers."""
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from parsers(sub)


@pytest.mark.parametrize("name", [*TRAINING, "make_shapes", "export"])
def test_help_describes_every_option_with_its_default(name, load_script):
    for parser in parsers(load_script(name).build_parser()):
        assert parser.formatter_class is HelpFormatter, parser.prog
        assert parser.description, parser.prog
        for action in parser._actions:
            assert action.help, f"{parser.prog}: {action.dest} has no help"
        defaults = [a.default for a in parser._actions if a.option_strings]
        if any(d not in (None, False, argparse.SUPPRESS, []) for d in defaults):
            assert "(default: " in parser.format_help(), parser.prog


def test_make_shapes_and_export_answer_the_same_way(
    load_script, data, tmp_path, monkeypatch, capsys
):
    ms, export = load_script("make_shapes"), load_script("export")
    out = tmp_path / "shapes"
    assert_bad_input(ms, [str(out), "--n-train", "-1"], None, "counts must be >= 0", capsys)
    (tmp_path / "file").write_text("x")
    assert_bad_input(ms, [str(tmp_path / "file")], None, "is a file, not a folder", capsys)
    assert not out.exists()
    for argv, match in (
        (["--model", "no-such-clip"], "unknown model"),
        (["--model", "demo-shapes", "--pretrained", str(data / "evil.pt")], "refusing"),
    ):
        argv += ["--format", "onnx", "--out", str(out)]
        assert_bad_input(export, argv, None, match, capsys)
        assert not out.exists()

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    from attn_train import shapes

    monkeypatch.setattr(shapes, "write_dataset", interrupted)
    assert cli(lambda: ms.main([str(out)]), capsys) == (130, ["interrupted"])
    monkeypatch.setattr("attn_clip.create_model", interrupted)
    assert cli(lambda: export.main(["--model", "x", "--quantize", "int8"]), capsys) == (
        130,
        ["interrupted"],
    )


def test_the_real_entry_point(data, tmp_path):
    """``python scripts/train_clip.py`` with a missing CSV: one line, exit 2, no traceback
    (the one script run as a new process here: what the process adds -- the interpreter's
    exit code, nothing else on stderr -- is the same for every script, whose ``__main__``
    blocks the next test runs)."""
    out = tmp_path / "run"
    proc = run_script("train_clip", ["--out", out, "--train-data", data / "missing.csv"])
    assert proc.returncode == 2 and not out.exists()
    assert proc.stderr == f"error: --train-data {data / 'missing.csv'}: no such file\n"


MAIN_BAD_INPUT = {  # a missing file for each script run as __main__: (argv, the error line)
    "train_clip": (["--train-data", "{missing}"], "error: --train-data {missing}: no such file"),
    "finetune_vit": (["--train-dir", "{missing}"], "error: --train-dir {missing}: no such"),
    "train_translation": (["train", "--train", "{missing}"], "error: --train {missing}: no"),
    "train_text_classifier": (["train", "--train", "{missing}"], "error: --train {missing}"),
    "train_char_lm": (["train", "--text", "{missing}"], "error: --text {missing}: no such"),
    "distill_clip": (["--teacher", "{missing}", "--train-data", "{missing}"], "error: "),
    "distill_text_classifier": (["--teacher", "{missing}", "--train", "{missing}"], "error: "),
    "export": (["--model", "{missing}", "--format", "onnx"], "error: "),
    "make_shapes": (["{out}", "--n-train", "-1"], "error: counts must be >= 0"),
}


@pytest.mark.parametrize("name", sorted(MAIN_BAD_INPUT))
def test_every_script_run_as_main_answers_bad_input_with_one_line_and_2(
    name, tmp_path, monkeypatch, capsys
):
    """Each script's ``if __name__ == "__main__"`` block, run in this process: the toolkit's
    exit handling is what the command runs."""
    assert sorted(MAIN_BAD_INPUT) == sorted(
        p.stem for p in SCRIPTS.glob("*.py") if not p.name.startswith("_")
    )
    out = tmp_path / "out"
    where = {"missing": str(tmp_path / "missing"), "out": str(out)}
    argv, line = MAIN_BAD_INPUT[name]
    argv = [a.format(**where) for a in argv]
    if name != "make_shapes":  # (its OUT is positional)
        argv += ["--out", str(out)]
    monkeypatch.setattr(sys, "argv", [name, *argv])
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")  # export.py's setdefault, undone after
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        runpy.run_path(str(SCRIPTS / f"{name}.py"), run_name="__main__")
    lines = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert e.value.code == 2 and len(lines) == 1 and lines[0].startswith(line.format(**where))
    assert not out.exists()
