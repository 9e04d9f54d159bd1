"""What a first-time user sees from the apps: Ctrl-C, --help defaults, --list-models, messages
in command-line words, CJK tables, long labels (extreme images: tests/apps/test_zero_shot.py).
In-process (the apps' main() functions), to save interpreter starts."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from PIL import Image

ROOT = Path(__file__).resolve().parents[2]
APPS = ROOT / "apps"


def load(monkeypatch, name: str):
    monkeypatch.syspath_prepend(str(APPS))  # as when run as a script: finds _common
    spec = importlib.util.spec_from_file_location(f"messages_{name}", APPS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    return module


def error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def test_ctrl_c_is_one_line_and_130(monkeypatch, capsys):
    common = load(monkeypatch, "_common")

    def interrupted() -> int:
        raise KeyboardInterrupt

    with pytest.raises(SystemExit) as done:
        common.run(interrupted)
    assert done.value.code == 130 and capsys.readouterr().err == "interrupted\n"
    for app in ("zero_shot", "retrieval", "translate", "attention_demo"):  # all go through run()
        assert (APPS / f"{app}.py").read_text().rstrip().endswith("run(main)"), app


@pytest.mark.parametrize("app", ["zero_shot", "retrieval", "translate"])
def test_help_shows_defaults(app, monkeypatch, capsys):
    with pytest.raises(SystemExit):
        load(monkeypatch, app).main(["--help"] if app != "retrieval" else ["index", "--help"])
    out = capsys.readouterr().out
    assert "(default: " in out and "(default: None)" not in out and "(default: False)" not in out


def test_docstring_examples_keep_their_line_continuations():
    """A backslash ending a line of a plain (not raw) docstring joins it with the next, so
    ``--help`` showed ``red_circle.png         --labels``: no example line in the help of an
    app or script holds such a join, and each continued line still ends with a backslash."""
    import ast
    import re

    files = sorted([*APPS.glob("*.py"), *(APPS.parent / "scripts").glob("*.py")])
    for path in files:
        tree = ast.parse(path.read_text())
        doc = ast.get_docstring(tree, clean=False) or ""
        source = ast.get_source_segment(path.read_text(), tree.body[0]) if doc else ""
        assert not re.search(r"\S {4,}--", doc), path.name
        assert source.count("\\\n") == doc.count("\\\n"), path.name


def test_list_models(monkeypatch, capsys):
    assert load(monkeypatch, "zero_shot").main(["--list-models"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "demo-shapes: shapes" in lines and any(ln.startswith("ViT-B-32: openai") for ln in lines)


def test_unknown_model_matches_case_first_and_names_the_cli_option(monkeypatch, capsys, tmp_path):
    image = tmp_path / "red.png"
    Image.new("RGB", (32, 32), "red").save(image)
    app = load(monkeypatch, "zero_shot")
    assert app.main(["--model", "vit-b-32", "--image", str(image), "--labels", "a", "b"]) == 2
    assert "did you mean ['ViT-B-32'" in error_line(capsys)
    assert app.main(["--model", "no-such-model", "--image", str(image), "--labels", "a"]) == 2
    line = error_line(capsys)
    assert "--list-models" in line and "attn_clip." not in line


def test_a_file_where_a_folder_is_expected(monkeypatch, capsys, tmp_path):
    image = tmp_path / "red.png"
    Image.new("RGB", (32, 32), "red").save(image)
    args = ["--model", "demo-shapes", "--images", str(image), "--labels", "a"]
    assert load(monkeypatch, "zero_shot").main(args) == 2
    assert "is a file, not a folder" in error_line(capsys)
    args = ["index", str(image), "--out", str(tmp_path / "i"), "--model", "demo-shapes"]
    assert load(monkeypatch, "retrieval").main(args) == 2
    assert "is a file, not a folder" in error_line(capsys)


def test_cjk_labels_line_up_and_long_labels_are_named(monkeypatch, capsys, tmp_path):
    image = tmp_path / "red.png"
    Image.new("RGB", (32, 32), "red").save(image)
    long = "a red circle " + "with a very long description " * 3
    labels = ["红色圆形", "red circle", long]
    args = ["--model", "demo-shapes", "--image", str(image), "--labels", *labels, "--top-k", "3"]
    assert load(monkeypatch, "zero_shot").main(args) == 0
    captured = capsys.readouterr()
    rows = [ln for ln in captured.out.splitlines() if ln.strip()[:1].isdigit()]
    common = load(monkeypatch, "_common")
    ends = {common.display_width(row.rsplit("%", 1)[0]) for row in rows}
    assert len(rows) == 3 and len(ends) == 1, rows  # the probabilities end in one column
    assert f"label {long.strip()!r}" in captured.err and "cut off" in captured.err


def test_translate_device_that_is_not_there(monkeypatch, capsys, tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    app = load(monkeypatch, "translate")
    assert app.main(["--model", "transformer-tiny", "--device", "cuda", "hello"]) == 2
    assert "CUDA is not available" in error_line(capsys)


def test_huge_jpegs_are_decoded_at_reduced_scale(monkeypatch, tmp_path):
    common = load(monkeypatch, "_common")
    path = tmp_path / "big.jpg"
    Image.new("RGB", (9000, 4000), "blue").save(path, quality=50)
    image, _ = common.load_image_file(path)
    assert image.size == (4500, 2000)  # 1/2 scale: the longer side still >= DRAFT_SIDE
    small = tmp_path / "small.jpg"
    Image.new("RGB", (1200, 800), "blue").save(small)
    assert common.load_image_file(small)[0].size == (1200, 800)  # ordinary photos: full size


def test_a_tag_wins_over_a_folder_of_the_same_name(monkeypatch, tmp_path):
    """demo-shapes' tag is "shapes": a folder called shapes/ in the working directory (as
    scripts/make_shapes.py writes it) must not turn the tag into a path."""
    common = load(monkeypatch, "_common")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "shapes").mkdir()
    assert common.resolve_model_args("demo-shapes", "shapes") == ("demo-shapes", "shapes")
    (tmp_path / "ckpt").mkdir()
    name, weights = common.resolve_model_args("demo-shapes", "ckpt")
    assert weights == str(tmp_path / "ckpt")  # not a tag: a path, made absolute
