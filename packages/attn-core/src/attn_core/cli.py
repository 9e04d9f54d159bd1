"""The one command-line toolkit of attn-zoo's apps and scripts: the ``--help`` layout, one-line
messages, the exit codes and Ctrl-C.

Exit codes of :func:`run`: 0 done (or ``main()``'s int), 2 bad input (``ValueError`` --
``attn_core.errors.InputError`` among them --, ``OSError``, ``WeightsError``: one ``error:``
line on stderr), 130 Ctrl-C (one ``interrupted`` line), and what ``exit_codes`` adds (the
training recipes: 1 for a NaN / inf loss). Under ``torchrun`` only rank 0 prints the line.

Ctrl-C at any moment of a command is one line and exit 130, never a traceback:

* *loading*: imported first by a program's main module (an app or a script run as a
  command), this module installs a SIGINT handler; until :func:`run` starts ``main()``, and
  whenever the program is inside an ``import`` (torch imported lazily in a command, say),
  Ctrl-C prints the line and leaves at once (``os._exit(130)``: no half-imported module is
  touched again, no atexit callback runs).
* *working*: inside ``main()`` Ctrl-C is a ``KeyboardInterrupt`` as usual, so the work can
  clean up (a training run saves where to resume); :func:`run` prints the line.
* *finishing*: after ``main()``, Ctrl-C during clean-up and interpreter shutdown leaves at
  once too.

Imported by anything else (the tests, a library, a lazy import inside a function) it leaves
SIGINT alone, as it does when SIGINT is ignored (a background job: ``cmd &``). Importing it
imports neither torch nor any other heavy package.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import sys
import warnings
from collections.abc import Callable, Mapping
from types import FrameType
from typing import Any, NoReturn

from .errors import WeightsError

__all__ = [
    "HelpFormatter",
    "add_subcommand",
    "examples",
    "fail",
    "is_main_rank",
    "make_parser",
    "one_line",
    "run",
    "warn",
]


# -- --help --------------------------------------------------------------------------------


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """--help keeps the description's layout (examples with ``\\`` line continuations stay
    as written) and shows each option's default (those that are not None / False / empty
    and not already named in the help text)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        empty = default is None or default is False or default is argparse.SUPPRESS
        if empty or default in ([], ()) or "default" in text:
            return text
        return f"{text} (default: %(default)s)"


def examples(doc: str) -> str:
    """The first indented block of a module docstring (its usage examples)."""
    block: list[str] = []
    for line in doc.splitlines()[1:]:
        if line.startswith("    "):
            block.append(line)
        elif block and line.strip():
            break
    return "\n".join(block).rstrip()


def make_parser(doc: str, **kwargs: Any) -> argparse.ArgumentParser:
    """A command's parser: :class:`HelpFormatter`, the docstring's first line as the
    description and its example block as the epilog."""
    block = examples(doc)
    return argparse.ArgumentParser(
        description=doc.strip().splitlines()[0],
        epilog=f"examples:\n{block}" if block else None,
        formatter_class=HelpFormatter,
        **kwargs,
    )


def add_subcommand(
    sub: Any, name: str, help: str, description: str | None = None
) -> argparse.ArgumentParser:
    """``sub.add_parser`` with :class:`HelpFormatter` and a description (default: ``help``)."""
    return sub.add_parser(
        name, help=help, description=description or help, formatter_class=HelpFormatter
    )


# -- one-line messages ---------------------------------------------------------------------


def one_line(
    message: Any, *, path_option: str = "--pretrained PATH", list_option: str | None = None
) -> str:
    """A (library) message on one line, in the words of the command: the advice to pass a
    local file (``pretrained=<path>``) names ``path_option`` (the command's own option, e.g.
    ``--model PATH``), ``pretrained='tag'`` reads ``--pretrained tag``, and "see
    attn_clip.list_models()" names ``list_option`` when the command has one."""
    text = " ".join(str(message).split())
    if not text and isinstance(message, BaseException):
        text = type(message).__name__
    text = text.replace("pretrained=<path>", path_option)
    text = re.sub(r"\bpretrained=(['\"])(.*?)\1", r"--pretrained \2", text)
    if list_option is not None:
        text = re.sub(r"see attn_\w+\.list_models\(\)", f"see {list_option}", text)
    return text


def is_main_rank() -> bool:
    """False in the processes of ``torchrun`` other than rank 0 (which speak for all)."""
    return os.environ.get("RANK", "0") == "0"


def fail(message: Any) -> int:
    """Print ``error: <message>`` on one line (rank 0 only) and return exit code 2."""
    if is_main_rank():
        print(f"error: {' '.join(str(message).split())}", file=sys.stderr)
    return 2


def warn(message: Any) -> None:
    """Print ``warning: <message>`` on one line on stderr, above any progress bar."""
    text = f"warning: {' '.join(str(message).split())}"
    if "tqdm" in sys.modules:  # a bar may be showing: tqdm.write keeps it intact
        from tqdm import tqdm

        tqdm.write(text, file=sys.stderr)
    else:
        print(text, file=sys.stderr)


def _show_warning(
    message: Any, category: type, filename: str, lineno: int, file: Any = None, line: Any = None
) -> None:
    warn(message)


# -- exits and Ctrl-C ----------------------------------------------------------------------

_command = False  # the hook is installed: this process is an app or a script run as a command
_working = False  # main() is running (Ctrl-C -> KeyboardInterrupt)


def _in_import(frame: FrameType | None) -> bool:
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


def _exit_interrupted() -> NoReturn:
    """One ``interrupted`` line and exit 130 now, running no clean-up (safe in a handler)."""
    if is_main_rank():
        os.write(2, b"interrupted\n")
    for stream in (sys.stdout, sys.stderr):  # what was printed before stays printed
        try:
            stream.flush()
        except BaseException:  # a write that the signal interrupted mid-way
            pass
    os._exit(130)


def _on_sigint(signum: int, frame: FrameType | None) -> None:
    if _working and not _in_import(frame):
        raise KeyboardInterrupt
    _exit_interrupted()


def _loaded_by_main_module() -> bool:
    """True when this module is imported from the main module's top level (directly or
    through other modules' top levels): a command that is still loading."""
    frame = sys._getframe(1)
    while frame is not None:
        is_module_body = frame.f_code.co_name == "<module>"
        if is_module_body and frame.f_globals.get("__name__") == "__main__":
            return True
        if not (is_module_body or frame.f_code.co_filename.startswith("<frozen importlib")):
            return False  # imported inside a function: not the loading of a command
        frame = frame.f_back
    return False


if _loaded_by_main_module() and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
    signal.signal(signal.SIGINT, _on_sigint)
    _command = True


def _interrupted(error: BaseException) -> bool:
    """``error`` is a Ctrl-C, or was raised while handling one (e.g. in an ``except``)."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, KeyboardInterrupt):
            return True
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return False


def run(
    main: Callable[[], Any],
    *,
    exit_codes: Mapping[type[BaseException], int] | None = None,
    path_option: str = "--pretrained PATH",
) -> NoReturn:
    """Run a command's ``main()`` and exit with its code (see the module docstring):
    ``exit_codes`` maps more exception types to codes (checked first); ``path_option`` is the
    command's option for a local weights file, named in error advice (see :func:`one_line`).
    Warnings print as one ``warning:`` line each."""
    global _working
    show, warnings.showwarning = warnings.showwarning, _show_warning
    message, code = "", 0
    _working = True
    try:
        result = main()
        code = result if isinstance(result, int) else 0
    except BaseException as e:  # every way out is one line and a code (or re-raised)
        _working = False
        message, code = _exit_for(e, exit_codes or {}, path_option)
    finally:
        _working = False
        warnings.showwarning = show
    if message and is_main_rank():  # under torchrun every rank has the same error: say it once
        print(message, file=sys.stderr)
    if code == 130 and _command:  # no clean-up that a second Ctrl-C or torch could break
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(130)
    raise SystemExit(code)


def _exit_for(
    e: BaseException, exit_codes: Mapping[type[BaseException], int], path_option: str
) -> tuple[str, int]:
    if isinstance(e, SystemExit):  # argparse's --help / usage errors, sys.exit() in main
        raise e
    if _interrupted(e):  # attn_train.TrainingInterrupted says where to resume
        text = str(e) if isinstance(e, KeyboardInterrupt) else ""
        return "interrupted" + (f": {one_line(text)}" if text else ""), 130
    for kind, code in exit_codes.items():
        if isinstance(e, kind):
            return f"error: {one_line(e, path_option=path_option)}", code
    if isinstance(e, (ValueError, OSError, WeightsError)):
        return f"error: {one_line(e, path_option=path_option)}", 2
    raise e
