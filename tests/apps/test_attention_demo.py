"""Smoke test: apps/attention_demo.py runs as a script, in text and JSON modes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "apps" / "attention_demo.py"


def run_demo(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(DEMO), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def text_run() -> subprocess.CompletedProcess[str]:
    return run_demo("--seq-len", "6", "--heads", "2")


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


def test_demo_json_parses():
    proc = run_demo("--json", "--seq-len", "5", "--heads", "3", "--backends", "math,sdpa")
    assert proc.returncode == 0, proc.stderr
    res = json.loads(proc.stdout)
    ran = {r["backend"]: r for r in res["backends"]["results"]}
    assert set(ran) == {"math", "sdpa"}
    assert all(r["ran"] == name and r["max_abs_diff"] < 1e-4 for name, r in ran.items())
    assert res["backends"]["auto"] in res["backends"]["available"]
    assert res["kv_cache"]["max_abs_diff"] < 1e-4
    assert all(abs(sum(row) - 1) < 0.05 for row in res["masks"]["weights"])
