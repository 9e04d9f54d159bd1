"""attn_core.cli, the one command-line toolkit: exit codes and one-line messages of run(),
error advice in the command's own words, the --help layout; importing it stays light.
(Ctrl-C in real processes: tests/test_interrupt_while_loading.py; the recipes' run_main:
tests/train/test_cli.py.)"""

from __future__ import annotations

import argparse
import subprocess
import sys
import warnings

import pytest
from attn_core.cli import HelpFormatter, make_parser, one_line, run
from attn_core.errors import CheckpointError, InputError, WeightsUnavailableError


def exit_of(main, capsys, **kwargs) -> tuple[int, str]:
    with pytest.raises(SystemExit) as e:
        run(main, **kwargs)
    return e.value.code, capsys.readouterr().err


def raising(error: BaseException):
    def main():
        raise error

    return main


@pytest.mark.parametrize(
    "error",
    [
        InputError("bad --top-k"),
        ValueError("bad"),
        OSError("disk full"),
        CheckpointError("truncated"),
        WeightsUnavailableError("offline"),
    ],
)
def test_bad_input_is_one_line_and_2(error, capsys):
    assert exit_of(raising(error), capsys) == (2, f"error: {error}\n")


def test_ctrl_c_and_what_it_set_off_are_130(capsys):
    assert exit_of(raising(KeyboardInterrupt()), capsys) == (130, "interrupted\n")

    def lazy_import_after_ctrl_c():  # `except attn_clip.SomeError:` re-importing torch
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise ImportError("torch can only be initialized once per process") from None

    assert exit_of(lazy_import_after_ctrl_c, capsys) == (130, "interrupted\n")


def test_exit_codes_map_more_errors_and_the_rest_is_a_traceback(capsys):
    class Diverged(RuntimeError):
        pass

    codes = {Diverged: 1}
    assert exit_of(raising(Diverged("loss is nan")), capsys, exit_codes=codes) == (
        1,
        "error: loss is nan\n",
    )
    with pytest.raises(ZeroDivisionError):  # a bug stays a bug
        run(raising(ZeroDivisionError("oops")))
    assert exit_of(raising(SystemExit(0)), capsys) == (0, "")  # --help
    assert exit_of(lambda: None, capsys) == (0, "")


def test_rank_0_speaks_for_torchrun(capsys, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    assert exit_of(raising(ValueError("bad")), capsys) == (2, "")


def test_warnings_are_one_line_each(capsys):
    def main():
        warnings.warn("two\nlines", UserWarning, stacklevel=1)
        return 0

    assert exit_of(main, capsys) == (0, "warning: two lines\n")


def test_advice_names_the_commands_own_option(capsys):
    library = "weights not found: pass the folder instead (pretrained=<path>)"
    assert one_line(library) == "weights not found: pass the folder instead (--pretrained PATH)"
    assert one_line(library, path_option="--model PATH").endswith("(--model PATH)")
    assert exit_of(raising(WeightsUnavailableError(library)), capsys, path_option="--model PATH")[
        1
    ].endswith("(--model PATH)\n")
    assert one_line("unknown tag: pretrained='laion' ") == "unknown tag: --pretrained laion"
    listed = "unknown model 'x'; see attn_clip.list_models()"
    assert one_line(listed, list_option="--list-models") == "unknown model 'x'; see --list-models"
    assert one_line(listed) == listed  # a command without such an option keeps the words
    assert one_line(KeyError()) == "KeyError"


def test_help_shows_defaults_and_keeps_example_continuations():
    doc = """Do a thing.

    uv run apps/x.py --a 1 \\
        --b 2
    uv run apps/x.py --c

Details that are not examples.
"""
    p = make_parser(doc)
    p.add_argument("--workers", type=int, default=0, help="worker processes")
    p.add_argument("--scale", type=float, nargs=2, default=(0.08, 1.0), help="area range")
    p.add_argument("--device", default=None, help="a device")
    p.add_argument("--quiet", action="store_true", help="no bar")
    p.add_argument("--sep", default="tab", help="default: from the header")
    p.add_argument("--items", nargs="*", default=[], help="things")
    text = p.format_help()
    assert "worker processes (default: 0)" in text  # 0 is a default worth showing
    assert "(default: (0.08, 1.0))" in " ".join(text.split())
    assert text.count("(default:") == 2 and "default: from the header" in text
    assert text.endswith("examples:\n    uv run apps/x.py --a 1 \\\n        --b 2\n"
                         "    uv run apps/x.py --c\n")  # fmt: skip
    assert p.description == "Do a thing." and p.formatter_class is HelpFormatter
    assert isinstance(p, argparse.ArgumentParser)


def test_importing_the_toolkit_imports_no_torch():
    code = "import sys, attn_core.cli, attn_core.errors; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stderr
