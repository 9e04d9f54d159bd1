"""tests/_support/disk.py, the plugin that keeps the suite's disk use down, on a tiny suite
run by pytest in a subprocess."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

FIRST = """
import pytest

@pytest.fixture(scope="session")
def kept(tmp_path_factory):
    return tmp_path_factory.mktemp("session_made")

@pytest.fixture(scope="module")
def module_folder(tmp_path_factory, kept):
    return tmp_path_factory.mktemp("module_made")

@pytest.fixture(scope="module")
def lazy(tmp_path_factory):
    return lambda: tmp_path_factory.mktemp("lazily_made")

def test_one(module_folder, kept, lazy, tmp_path):
    (module_folder / "weights").write_bytes(b"x" * 1000)
    (tmp_path / "passed").write_text("")
    lazy()

def test_two(module_folder, tmp_path_factory, tmp_path):
    assert (module_folder / "weights").is_file()  # there for the whole file
    tmp_path_factory.mktemp("test_made")
    (tmp_path / "failed").write_text("")
    assert False
"""

SECOND = """
def test_after_the_first_file(tmp_path_factory):
    base = tmp_path_factory.getbasetemp()
    names = sorted(p.name for p in base.iterdir() if not p.is_symlink())  # (not "*current")
    assert [n for n in names if not n.startswith("test_after")] == [
        "session_made0", "test_two0"
    ], names
    assert (base / "test_two0" / "failed").is_file()  # a failed test's tmp_path stays
"""


def test_a_files_folders_go_with_it(tmp_path: Path) -> None:
    (tmp_path / "test_a.py").write_text(FIRST)
    (tmp_path / "test_b.py").write_text(SECOND)
    tests = Path(__file__).parent
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "_support.disk",
         "-o", "tmp_path_retention_policy=failed", "--basetemp", str(tmp_path / "base"),
         "-q", "test_a.py", "test_b.py"],
        cwd=tmp_path, env={"PYTHONPATH": str(tests), "PATH": ""}, capture_output=True,
        text=True, timeout=120,
    )  # fmt: skip
    assert "1 failed, 2 passed" in out.stdout, out.stdout + out.stderr
    assert "test_a.py::test_two" in out.stdout  # the one expected to fail
