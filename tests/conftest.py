"""Shared test fixtures: deterministic seeds, small shapes, CUDA detection."""

from __future__ import annotations

import importlib.util
import os
import sys

# Write .pyc files during the tests even where PYTHONDONTWRITEBYTECODE=1 is set (as on this
# project's machines and CI): the dozens of interpreters the tests start (CLI, torchrun,
# Ctrl-C) then read torch & co. compiled instead of compiling them from source each time
# (`import torch, open_clip`: 15-17 s -> 6-7 s of CPU). Before torch is imported below.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False
from pathlib import Path  # noqa: E402 (after the bytecode switch)
from types import ModuleType  # noqa: E402 (after the bytecode switch)

import pytest  # noqa: E402 (after the bytecode switch)
import torch  # noqa: E402 (after the bytecode switch)

if os.environ.get("PYTEST_XDIST_WORKER"):  # one of pytest -n's processes: a core each
    torch.set_num_threads(
        max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))
    )


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def pytest_configure(config: pytest.Config) -> None:
    # a test file's temporary folders go with it (disk: tests/_support/disk.py); registered
    # here, not as a hook of this conftest, which would not see the set-up of session-scoped
    # fixtures (it runs on the session's node, outside tests/)
    config.pluginmanager.import_plugin("_support.disk")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# -- hostile TorchScript archives (builder in tests/payloads.py) ------------------------------


def _load_payloads() -> ModuleType:
    """tests/payloads.py as module ``attn_zoo_test_payloads`` (``--import-mode=importlib``
    puts no test folder on sys.path); registered in sys.modules for ``importlib.import_module``."""
    name = "attn_zoo_test_payloads"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name("payloads.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


PAYLOADS = _load_payloads()


@pytest.fixture
def torchscript_payload(tmp_path: Path) -> tuple[Path, Path]:
    """``(archive_path, marker_path)``: ``torch.jit.load(archive_path)`` creates ``marker_path``
    (its ``__setstate__`` calls ``torch.from_file(marker, shared=True)``); both under tmp_path.
    A safe loader refuses the archive or returns tensors, and the marker never appears."""
    archive, marker = tmp_path / "payload.pt", tmp_path / "payload-ran.marker"
    PAYLOADS.make_torchscript_payload(archive, marker)
    return archive, marker


def _fake_hub_cache(cache: Path, repo_id: str, files: dict[str, bytes]) -> Path:
    """Lay ``files`` out the way huggingface_hub caches a download of ``repo_id``@main;
    returns the snapshot folder."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    root = cache / f"models--{repo_id.replace('/', '--')}"
    (root / "refs").mkdir(parents=True, exist_ok=True)
    (root / "refs" / "main").write_text(commit)
    snap = root / "snapshots" / commit
    snap.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (snap / name).write_bytes(data)
    return snap


@pytest.fixture
def fake_hub_cache():
    """``fake_hub_cache(cache_dir, repo_id, {name: bytes})``: a hub cache with those files."""
    return _fake_hub_cache
