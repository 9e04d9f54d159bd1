"""Fixtures shared by the tests of scripts/*.py (which import as top-level modules: pytest's
``pythonpath`` has scripts/). Shared helpers: tests/_support/scripts.py and train.py."""

from __future__ import annotations

import importlib

import pytest
import torch


@pytest.fixture(autouse=True)
def _restore_threads():
    """In-process runs call torch.set_num_threads(1); give the session its setting back."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def load_script():
    """``load_script("train_clip")`` -> the script's module, to call its functions."""
    return importlib.import_module
