"""apps/translate.py: arguments, stdin, --json, our own checkpoints, exit code 2 on bad input."""

from __future__ import annotations

import importlib.util
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "apps" / "translate.py"


def load_app():
    spec = importlib.util.spec_from_file_location("translate_app", APP)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def marian_dir(tmp_path_factory) -> Path:
    """A tiny random opus-mt style checkpoint with a real Marian tokenizer."""
    path = ROOT / "tests" / "nlp" / "marian_helpers.py"
    spec = importlib.util.spec_from_file_location("attn_nlp_test_marian_helpers", path)
    helpers = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(helpers)
    return helpers.marian_checkpoint(tmp_path_factory.mktemp("marian"))


@pytest.fixture(scope="module")
def app():
    return load_app()


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """A small attn-nlp translation checkpoint (random weights, real BPE tokenizer)."""
    from attn_nlp import BPETokenizer, create_model, save_pretrained

    directory = tmp_path_factory.mktemp("ours")
    texts = ["one two three", "four five six seven", "一 二 三", "四 五 六 七"] * 20
    tok = BPETokenizer.train(texts, vocab_size=60, min_frequency=1)
    model = create_model("transformer-tiny", src_vocab_size=tok.vocab_size, max_positions=32)
    save_pretrained(model.eval(), directory, tokenizer=tok)
    return directory


def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(APP), *args],
        cwd=ROOT,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"},
    )


def test_stdin_and_json_as_a_script(checkpoint):
    proc = run("--model", str(checkpoint), "--beams", "2", "--json", stdin="one two\nfive six\n")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["beams"] == 2
    assert [t["source"] for t in result["translations"]] == ["one two", "five six"]
    assert all(isinstance(t["translation"], str) for t in result["translations"])


def test_unknown_model_exits_2_with_one_line(tmp_path):
    proc = run("--model", "transformer-huge", "hello")
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: unknown model") and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_text_argument_in_process(app, checkpoint, capsys):
    from attn_nlp import Translator

    assert app.main(["--model", str(checkpoint), "--beams", "1", "one two three"]) == 0
    expected = Translator.from_pretrained(checkpoint).translate(["one two three"], beams=1)[0]
    assert capsys.readouterr().out == expected + "\n"


def test_marian_checkpoint_in_process(app, marian_dir, capsys):
    from attn_nlp import Translator

    texts = ["i love deep learning", "the dog reads"]
    assert app.main(["--model", str(marian_dir), *texts]) == 0
    lines = capsys.readouterr().out.splitlines()
    expected = Translator.from_pretrained(marian_dir).translate(texts, beams=4)
    assert lines == [f"{s}\t{t}" for s, t in zip(texts, expected, strict=True)]


@pytest.mark.parametrize(
    "argv, stdin, message",
    [
        (["one", "  "], "", "input text 2 is empty"),
        ([], "", "no input text"),
        (["--beams", "0", "one"], "", "--beams must be >= 1"),
        (
            ["--model", "no/such-model-offline", "one"],
            "",
            "could not get config.json from the Hugging Face hub repo 'no/such-model-offline'",
        ),
        (["--model", "CHECKPOINT_FILE", "one"], "", "unknown model"),
    ],
)
def test_bad_input_exits_2(app, checkpoint, capsys, monkeypatch, argv, stdin, message):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    argv = [str(checkpoint / "config.json") if a == "CHECKPOINT_FILE" else a for a in argv]
    assert app.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err


def test_over_long_input_is_truncated_with_a_warning(app, checkpoint, capsys):
    long = " ".join(["seven"] * 100)
    assert (
        app.main(["--model", str(checkpoint), "--beams", "1", "--max-new-tokens", "3", long]) == 0
    )
    assert "truncated to max_positions=32" in capsys.readouterr().err
