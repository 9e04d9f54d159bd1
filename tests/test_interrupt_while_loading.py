"""Ctrl-C at any moment of any app or script: one ``interrupted`` line on stderr and exit code
130, never a traceback (attn_core.cli). Each command runs with ``-X importtime`` and gets
SIGINT, sent to its process group as a terminal's Ctrl-C is, at one of three moments:

* ``loading`` -- as soon as the toolkit (and its hook) has loaded, before torch;
* ``torch`` -- in the middle of ``import torch``: at the top of a script, and inside
  ``main()`` for the apps, which import torch lazily (the moment that used to print a
  traceback from inside torch, or ``torch can only be initialized once per process``);
* ``working`` -- once ``main()`` has printed its first result (zero_shot.py).

A real process is what this proves (signals, ``os._exit``, interpreter shutdown); each run
stops early, so the 30 runs take about as long as a few full ones."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
APPS = sorted(p.stem for p in (ROOT / "apps").glob("*.py") if not p.name.startswith("_"))
SCRIPTS = sorted(p.stem for p in (ROOT / "scripts").glob("*.py") if not p.name.startswith("_"))
LOADED = "attn_core.cli"  # the module whose import installs the hook
IN_TORCH = "torch._tensor"  # a module that loads early in the middle of `import torch`

# the arguments of a run that gets as far as importing torch (and then works a while)
APP_ARGS = {
    "attention_demo": [],
    "caption": ["--model", "demo-shapes-coca", "--folder", "{images}"],
    "classify": ["--model", "vit_tiny_patch16_224", "--random-weights", "--images", "{images}"],
    "retrieval": ["index", "{images}", "--out", "{tmp}/index", "--model", "demo-shapes"],
    "translate": ["--model", "transformer-tiny", "hello"],
    "web": None,  # its torch loads after gradio (~10 s); a serving web.py: tests/apps/test_web.py
    "zero_shot": ["--model", "demo-shapes", "--images", "{images}", "--labels", "a", "b"],
}
# interrupted once it has printed its first result (a training script's Ctrl-C mid-run,
# TrainingInterrupted naming the checkpoint, is tests/train/test_loop.py's)
WORKING = {"zero_shot": APP_ARGS["zero_shot"] + ["--batch-size", "1", "--json"]}
CASES = (
    [(f"apps/{a}.py", "loading") for a in APPS]
    + [(f"apps/{a}.py", "torch") for a in APPS if APP_ARGS[a] is not None]
    + [(f"scripts/{s}.py", "loading") for s in SCRIPTS]
    + [(f"scripts/{s}.py", "torch") for s in SCRIPTS]
    + [(f"{'apps' if c in APPS else 'scripts'}/{c}.py", "working") for c in WORKING]
)


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("images")
    for i in range(400):  # enough work that the run is still going when it is interrupted
        Image.new("RGB", (24, 24), (i % 256, 40, 200)).save(folder / f"{i:03d}.png")
    return folder


def _argv(command: str, moment: str, images: Path, tmp: Path) -> list[str]:
    name = Path(command).stem
    if moment == "working":
        args = WORKING[name]
    elif name in APP_ARGS and moment == "torch":
        args = APP_ARGS[name]
    else:
        args = ["--help"]  # a script imports torch at its top; --help runs after that
    return [a.format(images=images, tmp=tmp) for a in args]


def _interrupt(argv: list[str], moment: str, tmp: Path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-X", "importtime", *argv],
        cwd=tmp,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,  # its own process group, as a terminal's foreground job
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # even under nohup
    )
    seen: list[str] = []
    out: list[str] = []
    marker = {"loading": LOADED, "torch": IN_TORCH}.get(moment)
    hit = threading.Event()

    def read_err() -> None:
        for line in proc.stderr:
            seen.append(line)
            if marker and line.startswith("import time:") and line.split("|")[-1].strip() == marker:
                hit.set()

    def read_out() -> None:
        for line in proc.stdout:
            out.append(line)
            if moment == "working":
                hit.set()

    threads = [threading.Thread(target=f, daemon=True) for f in (read_err, read_out)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 120
    while not hit.is_set() and proc.poll() is None and time.monotonic() < deadline:
        hit.wait(0.02)
    reached = proc.poll() is None
    if reached:
        os.killpg(proc.pid, signal.SIGINT)
    code = proc.wait(timeout=60)
    for t in threads:
        t.join(timeout=10)
    return reached, code, seen, out


@pytest.mark.parametrize(("command", "moment"), CASES, ids=lambda x: str(x).split("/")[-1])
def test_ctrl_c_is_one_line_and_130(command, moment, images, tmp_path):
    argv = [str(ROOT / command), *_argv(command, moment, images, tmp_path)]
    reached, code, seen, out = _interrupt(argv, moment, tmp_path)
    said = [x for x in seen if not x.startswith("import time:")]
    assert reached, f"finished before the {moment} moment: {code} {said[-5:]}"
    assert code == 130, said[-40:]
    assert [x.rstrip("\n") for x in said] == ["interrupted"], said[-40:]
    loaded = {x.split("|")[-1].strip() for x in seen if x.startswith("import time:")}
    if moment == "loading":
        assert "torch" not in loaded  # it was still loading
    if moment == "working":
        assert out  # main() had started its work


def test_every_command_is_covered():
    assert set(APP_ARGS) == set(APPS)
    assert {Path(c).stem for c, _ in CASES} == set(APPS) | set(SCRIPTS)


def test_imported_as_a_module_it_leaves_sigint_alone(monkeypatch):
    """Importing the toolkit from a function (a test, a library) installs nothing; only a
    program's main module loading it does (the ``loading`` runs above)."""
    import importlib

    import attn_core

    before = signal.getsignal(signal.SIGINT)  # default, or ignored under `cmd &`
    monkeypatch.setattr(attn_core, "cli", importlib.import_module("attn_core.cli"))
    monkeypatch.delitem(sys.modules, "attn_core.cli")
    module = importlib.import_module("attn_core.cli")
    assert signal.getsignal(signal.SIGINT) is before and not module._command
