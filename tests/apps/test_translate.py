"""apps/translate.py: arguments, stdin, --json, our own checkpoints, exit code 2 on bad input."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest
import translate as app  # apps/translate.py
from _support.apps import error_line, run_app
from nlp.marian_helpers import marian_checkpoint


@pytest.fixture(scope="module")
def marian_dir(tmp_path_factory) -> Path:
    """A tiny random opus-mt style checkpoint with a real Marian tokenizer."""
    return marian_checkpoint(tmp_path_factory.mktemp("marian"))


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


def test_stdin_and_json_as_a_script(checkpoint):
    """The one real process: stdin, --json, exit 0 (bad input and Ctrl-C in a real process:
    tests/test_interrupt_while_loading.py; in process: below)."""
    proc = run_app(
        "translate", "--model", checkpoint, "--beams", "2", "--json", stdin="one two\nfive six\n"
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["beams"] == 2
    assert [t["source"] for t in result["translations"]] == ["one two", "five six"]
    assert all(isinstance(t["translation"], str) for t in result["translations"])


def test_text_argument_in_process(checkpoint, capsys):
    from attn_nlp import Translator

    assert app.main(["--model", str(checkpoint), "--beams", "1", "one two three"]) == 0
    expected = Translator.from_pretrained(checkpoint).translate(["one two three"], beams=1)[0]
    assert capsys.readouterr().out == expected + "\n"


def test_marian_checkpoint_in_process(marian_dir, capsys):
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
        (["--model", "transformer-huge", "hello"], "", "error: unknown model"),
    ],
)
def test_bad_input_exits_2(checkpoint, capsys, monkeypatch, argv, stdin, message):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    argv = [str(checkpoint / "config.json") if a == "CHECKPOINT_FILE" else a for a in argv]
    assert app.main(argv) == 2
    line = error_line(capsys)
    assert message in line
    assert "--pretrained" not in line  # advice names this app's own option (--model PATH)


def test_offline_advice_names_the_model_option(capsys, monkeypatch, tmp_path):
    """Weights not available offline: the advice to pass a local folder says --model PATH,
    this app's option (the library's words are pretrained=<path>)."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    assert app.main(["--model", "Helsinki-NLP/opus-mt-en-zh", "hello"]) == 2
    line = error_line(capsys)
    assert "--model PATH" in line and "pretrained" not in line, line


def test_over_long_input_is_truncated_with_a_warning(checkpoint, capsys):
    long = " ".join(["seven"] * 100)
    assert (
        app.main(["--model", str(checkpoint), "--beams", "1", "--max-new-tokens", "3", long]) == 0
    )
    assert "truncated to max_positions=32" in capsys.readouterr().err
