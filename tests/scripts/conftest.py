"""Fixtures shared by the tests of scripts/*.py."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
sys.path.insert(0, str(SCRIPTS))  # the scripts import scripts/_interrupt.py


@pytest.fixture(autouse=True)
def _restore_threads():
    """In-process runs call torch.set_num_threads(1); give the session its setting back."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def _load(name: str):
    """``scripts/<name>.py`` as a module (registered in sys.modules: dataclasses need it)."""
    spec = importlib.util.spec_from_file_location(f"attn_zoo_script_{name}", SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def load_script():
    """``load_script("train_clip")`` -> the script's module, to call its functions."""
    return _load
