"""Imported first by every script: Ctrl-C while torch and the packages are still loading
prints one ``interrupted`` line and exits with 130, like Ctrl-C later on
(``attn_train.cli.run_main`` puts Python's handler back once the script starts). Does
nothing when a script is imported as a module (e.g. by the tests), or when SIGINT is
ignored (a background job of a non-interactive shell: `cmd &`)."""

from __future__ import annotations

import signal
import sys
from pathlib import Path


def _interrupted_while_loading(signum: int, frame: object) -> None:
    print("interrupted", file=sys.stderr)
    raise SystemExit(130)


_main = getattr(sys.modules.get("__main__"), "__file__", None)
if (
    _main is not None
    and Path(_main).resolve().parent == Path(__file__).resolve().parent
    and signal.getsignal(signal.SIGINT) is signal.default_int_handler
):
    signal.signal(signal.SIGINT, _interrupted_while_loading)
