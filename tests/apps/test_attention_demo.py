"""apps/attention_demo.py: once as a script (text mode), and in process (JSON mode, bad
input)."""

from __future__ import annotations

import json
import subprocess

import attention_demo  # apps/attention_demo.py
import pytest
from _support.apps import error_line, run_app


@pytest.fixture(scope="module")
def text_run() -> subprocess.CompletedProcess[str]:
    return run_app("attention_demo", "--seq-len", "6", "--heads", "2")


def test_demo_exits_zero(text_run):
    assert text_run.returncode == 0, text_run.stderr


def test_demo_mentions_backends(text_run):
    out = text_run.stdout
    for name in ("math", "sdpa"):
        assert f"last_backend()={name}" in out
    # every backend importable here is either run or reported as skipped
    available = out.split("available here: ", 1)[1].split(")", 1)[0].split(", ")
    for name in available:
        assert f"last_backend()={name}" in out or f"{name:<11} skipped" in out
    assert "automatic choice" in out
    assert "KV-cache decoding" in out


def test_demo_json_parses(capsys):
    argv = ["--json", "--seq-len", "5", "--heads", "3", "--backends", "math,sdpa"]
    assert attention_demo.main(argv) == 0
    res = json.loads(capsys.readouterr().out)
    ran = {r["backend"]: r for r in res["backends"]["results"]}
    assert set(ran) == {"math", "sdpa"}
    assert all(r["ran"] == name and r["max_abs_diff"] < 1e-4 for name, r in ran.items())
    assert res["backends"]["auto"] in res["backends"]["available"]
    assert res["kv_cache"]["max_abs_diff"] < 1e-4
    assert all(abs(sum(row) - 1) < 0.05 for row in res["masks"]["weights"])


def test_bad_sizes_are_one_line_and_2(capsys):
    assert attention_demo.main(["--seq-len", "0"]) == 2
    assert "--seq-len and --heads must be >= 1" in error_line(capsys)
