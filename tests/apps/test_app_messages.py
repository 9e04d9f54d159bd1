"""What a first-time user sees from the apps: Ctrl-C, --help defaults, --list-models, messages
in command-line words, CJK tables, long labels (extreme images: tests/apps/test_zero_shot.py).
In-process (the apps' main() functions), to save interpreter starts; Ctrl-C in a real
process: tests/test_interrupt_while_loading.py, the toolkit itself: tests/core/test_cli.py."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys

import _common  # apps/_common.py
import pytest
import zero_shot  # apps/zero_shot.py
from _support.apps import APPS, error_line
from PIL import Image

COMMANDS = sorted(
    p for p in [*APPS.glob("*.py"), *(APPS.parent / "scripts").glob("*.py")]
    if not p.name.startswith("_")
)  # fmt: skip


@pytest.mark.parametrize("path", COMMANDS, ids=lambda p: p.stem)
def test_every_command_runs_through_the_toolkit(path):
    """Every app and script ends in ``run(main...)`` of attn_core.cli (directly, through
    apps/_common or attn_train.cli's run_main), which gives the one-line errors, exit codes
    2 / 130 and the Ctrl-C handling; and it imports the toolkit before torch."""
    tree = ast.parse(path.read_text())
    last = tree.body[-1]
    assert isinstance(last, ast.If) and "__main__" in ast.unparse(last.test), path.name
    call = ast.unparse(last.body[-1])
    assert call.split("(")[0].split(".")[-1] in ("run", "run_main"), call
    imports = [ast.unparse(n) for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)]
    first = next(
        i for i, line in enumerate(imports) if "attn_core.cli" in line or "_common" in line
    )
    assert not any("torch" in line for line in imports[:first]), (path.name, imports)


@pytest.mark.parametrize("app", ["zero_shot", "retrieval", "translate", "classify"])
def test_help_shows_defaults(app, capsys):
    with pytest.raises(SystemExit):
        module = importlib.import_module(app)
        module.main(["--help"] if app != "retrieval" else ["index", "--help"])
    out = capsys.readouterr().out
    assert "(default: " in out and "(default: None)" not in out and "(default: False)" not in out


def test_docstring_examples_keep_their_line_continuations():
    """A backslash ending a line of a plain (not raw) docstring joins it with the next, so
    ``--help`` showed ``red_circle.png         --labels``: no example line in the help of an
    app or script holds such a join, and each continued line still ends with a backslash."""
    import re

    files = sorted([*APPS.glob("*.py"), *(APPS.parent / "scripts").glob("*.py")])
    for path in files:
        tree = ast.parse(path.read_text())
        doc = ast.get_docstring(tree, clean=False) or ""
        source = ast.get_source_segment(path.read_text(), tree.body[0]) if doc else ""
        assert not re.search(r"\S {4,}--", doc), path.name
        assert source.count("\\\n") == doc.count("\\\n"), path.name


def test_list_models(capsys):
    assert zero_shot.main(["--list-models"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "demo-shapes: shapes" in lines and any(ln.startswith("ViT-B-32: openai") for ln in lines)


def test_unknown_model_matches_case_first_and_names_the_cli_option(capsys, tmp_path):
    image = tmp_path / "red.png"
    Image.new("RGB", (32, 32), "red").save(image)
    app = zero_shot
    assert app.main(["--model", "vit-b-32", "--image", str(image), "--labels", "a", "b"]) == 2
    assert "did you mean ['ViT-B-32'" in error_line(capsys)
    assert app.main(["--model", "no-such-model", "--image", str(image), "--labels", "a"]) == 2
    line = error_line(capsys)
    assert "--list-models" in line and "attn_clip." not in line


def test_a_file_where_a_folder_is_expected(capsys, tmp_path):
    image = tmp_path / "red.png"
    Image.new("RGB", (32, 32), "red").save(image)
    args = ["--model", "demo-shapes", "--images", str(image), "--labels", "a"]
    assert zero_shot.main(args) == 2
    assert "is a file, not a folder" in error_line(capsys)
    args = ["index", str(image), "--out", str(tmp_path / "i"), "--model", "demo-shapes"]
    assert importlib.import_module("retrieval").main(args) == 2
    assert "is a file, not a folder" in error_line(capsys)


def test_cjk_labels_line_up_and_long_labels_are_named(capsys, tmp_path):
    image = tmp_path / "red.png"
    Image.new("RGB", (32, 32), "red").save(image)
    long = "a red circle " + "with a very long description " * 3
    labels = ["红色圆形", "red circle", long]
    args = ["--model", "demo-shapes", "--image", str(image), "--labels", *labels, "--top-k", "3"]
    assert zero_shot.main(args) == 0
    captured = capsys.readouterr()
    rows = [ln for ln in captured.out.splitlines() if ln.strip()[:1].isdigit()]
    ends = {_common.display_width(row.rsplit("%", 1)[0]) for row in rows}
    assert len(rows) == 3 and len(ends) == 1, rows  # the probabilities end in one column
    assert f"label {long.strip()!r}" in captured.err and "cut off" in captured.err


def test_translate_device_that_is_not_there(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    app = importlib.import_module("translate")
    assert app.main(["--model", "transformer-tiny", "--device", "cuda", "hello"]) == 2
    assert "CUDA is not available" in error_line(capsys)


def test_huge_jpegs_are_decoded_at_reduced_scale(tmp_path):
    common = _common
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
    common = _common
    monkeypatch.chdir(tmp_path)
    (tmp_path / "shapes").mkdir()
    assert common.resolve_model_args("demo-shapes", "shapes") == ("demo-shapes", "shapes")
    (tmp_path / "ckpt").mkdir()
    name, weights = common.resolve_model_args("demo-shapes", "ckpt")
    assert weights == str(tmp_path / "ckpt")  # not a tag: a path, made absolute


def test_help_is_fast_the_apps_import_torch_only_when_they_work():
    """Importing the apps (what ``--help`` runs before printing) loads no torch: one
    interpreter imports them all."""
    code = "import sys, classify, retrieval, translate, zero_shot; print('torch' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=APPS, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stderr[-2000:]
