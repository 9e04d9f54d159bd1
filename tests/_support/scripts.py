"""Helpers for tests that drive a script: its environment, a free port, its exit code
and error lines in process (``cli``), and real processes (``run_script``, ``killed_at``,
``torchrun``) for what only a real process shows."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts"


def script_env(**extra: str) -> dict[str, str]:
    """The environment of a script subprocess: one OpenMP thread, no network."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", **extra}


def free_port() -> int:
    """A TCP port nobody listens on right now (for ``torchrun --master-port``)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cli(main: Callable[[], object], capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str]]:
    """``run_main(main)`` in process -> ``(exit code, the non-blank lines on stderr)``."""
    from attn_train.cli import run_main

    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        run_main(main)
    return e.value.code, [line for line in capsys.readouterr().err.splitlines() if line.strip()]


def assert_bad_input(
    module, argv: list[str], out: Path | None, match: str, capsys: pytest.CaptureFixture[str]
) -> str:
    """``module.main(argv + --out OUT)`` is one ``error:`` line naming ``match``, exit code 2,
    and OUT is not created; returns the line."""
    argv = [*argv, *(["--out", str(out)] if out is not None else [])]
    code, lines = cli(lambda: module.main(argv), capsys)
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), lines
    assert match in lines[0], lines[0]
    assert out is None or not out.exists(), "nothing may be written for bad input"
    return lines[0]


def run_script(name: str, argv: Sequence[str], timeout: float = 300) -> subprocess.CompletedProcess:
    """``python scripts/<name>.py ARGV`` as a user runs it (text output captured)."""
    cmd = [sys.executable, str(SCRIPTS / f"{name}.py"), *map(str, argv)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=script_env())


def killed_at(main: Callable[[list[str]], object], argv: Sequence[str], step: int) -> None:
    """``main(argv)`` in a forked child process that SIGKILLs itself while it writes the
    checkpoint of update ``step`` (``--save-every`` must divide it), after the model files and
    before ``trainer_state.pt``: ``OUT/last.tmp`` is left half written and ``OUT/last`` is the
    checkpoint before. No cleanup and no atexit run, exactly as ``kill -9`` at that moment,
    without racing a poller against the run, and without paying for a new interpreter (the
    child has everything imported already)."""
    import torch

    argv = [str(a) for a in argv]
    log = tempfile.TemporaryFile()  # the child's stdout and stderr, for the failure message
    pid = os.fork()
    if pid == 0:  # the child never returns into pytest
        try:
            os.dup2(log.fileno(), 1)
            os.dup2(log.fileno(), 2)
            sys.stdout = sys.stderr = open(2, "w", buffering=1, closefd=False)  # (not pytest's)
            save = torch.save

            def save_or_die(obj, f, *args, **kwargs):
                if str(f).endswith("trainer_state.pt") and obj["progress"]["step"] == step:
                    os.kill(os.getpid(), signal.SIGKILL)
                return save(obj, f, *args, **kwargs)

            torch.save = save_or_die
            main(argv)
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stderr.flush()
            os._exit(3)  # it ran to the end (or failed): not killed where it should have been
    deadline = time.monotonic() + 300
    while not (waited := os.waitpid(pid, os.WNOHANG))[0]:
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise AssertionError(f"the run was not done after 300 s: {argv}")
        time.sleep(0.02)
    log.seek(0)
    output = log.read().decode(errors="replace")[-3000:]
    log.close()
    status = waited[1]
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, (status, output)


def torchrun(argv: Sequence[str], nproc: int = 2, cwd: Path | None = None, timeout: float = 600):
    """``python -m torch.distributed.run --nproc-per-node NPROC ARGV`` (CPU, gloo), with
    scripts/ and tests/ on the path as in pytest (``import train_clip``, ``_support``);
    asserts it exited 0."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc)]
    cmd += ["--master-port", str(free_port()), *map(str, argv)]
    path = os.pathsep.join([str(SCRIPTS), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])
    env = script_env(PYTHONPATH=path.rstrip(os.pathsep))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


# -- what a training run wrote -----------------------------------------------------------------


def records(out: Path) -> list[dict]:
    """The records of ``OUT/log.jsonl``."""
    return [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]


def step_losses(out: Path) -> dict[int, float]:
    """``{update: loss}`` of the training records of ``OUT/log.jsonl``."""
    return {r["step"]: r["loss"] for r in records(out) if "loss" in r and "event" not in r}


def events(out: Path, name: str) -> list[dict]:
    """The records of ``OUT/log.jsonl`` whose event is ``name``."""
    return [r for r in records(out) if r.get("event") == name]


def weights(folder: Path, name: str = "model.safetensors") -> dict:
    """The tensors of ``folder/name``."""
    from safetensors.torch import load_file

    return load_file(folder / name)


def assert_same_weights(a: Path, b: Path, name: str = "model.safetensors") -> None:
    """``a/name`` and ``b/name`` hold bit-identical tensors under the same names."""
    import torch

    wa, wb = weights(a, name), weights(b, name)
    assert wa.keys() == wb.keys() and wa, (a, b)
    for k in wa:
        assert torch.equal(wa[k], wb[k]), (name, k)
