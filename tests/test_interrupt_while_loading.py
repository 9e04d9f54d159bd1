"""Ctrl-C while a script or app is still importing torch: one ``interrupted`` line on stderr
and exit code 130, no traceback (scripts/_interrupt.py, apps/_common.py). Each command is
started with ``-X importtime`` and interrupted as soon as the handler's module has loaded,
before torch and the packages, so the signal lands while they are loading."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted(p for p in (ROOT / "scripts").glob("*.py") if not p.name.startswith("_"))
COMMANDS = [(p, "_interrupt") for p in SCRIPTS] + [(ROOT / "apps/attention_demo.py", "_common")]


@pytest.mark.parametrize(("path", "marker"), COMMANDS, ids=lambda x: getattr(x, "stem", x))
def test_ctrl_c_while_torch_loads_is_one_line_and_130(path, marker):
    proc = subprocess.Popen(
        [sys.executable, "-X", "importtime", str(path), "--help"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # even under nohup
    )
    seen = []
    for line in proc.stderr:  # "import time: self | cumulative | module", once it is loaded
        seen.append(line)
        if line.rstrip().endswith(f"| {marker}"):
            proc.send_signal(signal.SIGINT)
            break
    stdout, rest = proc.communicate(timeout=60)
    assert proc.returncode == 130, seen + [rest]
    assert [x for x in rest.splitlines() if not x.startswith("import time:")] == ["interrupted"]
    assert stdout == ""  # stopped before main() could print the --help text
    assert not any(x.rstrip().endswith("| attn_core") for x in seen)  # it was still loading


def test_a_script_imported_as_a_module_leaves_sigint_alone(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    monkeypatch.delitem(sys.modules, "_interrupt", raising=False)
    before = signal.getsignal(signal.SIGINT)  # default, or ignored under `cmd &`
    import _interrupt  # noqa: F401  (as the tests' load_script does)

    assert signal.getsignal(signal.SIGINT) is before
