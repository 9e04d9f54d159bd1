"""Fixtures for attn_nlp: tiny random Marian checkpoints (see marian_helpers.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch


def load_helpers():
    """Import marian_helpers.py by path (pytest runs with --import-mode=importlib)."""
    path = Path(__file__).with_name("marian_helpers.py")
    spec = importlib.util.spec_from_file_location("attn_nlp_test_marian_helpers", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


helpers = load_helpers()
PAD = helpers.PAD


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny tensors: one intra-op thread is much faster than two on a shared 2-core box."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def marian_factory():
    """``make_marian(directory, shared=, seed=, eos_bias=, fmt=, generation=, **config)``."""
    return helpers.make_marian


@pytest.fixture(scope="session")
def marian_dir(tmp_path_factory) -> Path:
    """A shared-embedding Marian checkpoint with opus-mt style generation settings."""
    return helpers.marian_checkpoint(tmp_path_factory.mktemp("marian"))


@pytest.fixture(scope="session")
def hf_marian(marian_dir):
    from transformers import MarianMTModel

    return MarianMTModel.from_pretrained(marian_dir).eval()
