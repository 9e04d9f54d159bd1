"""Fixtures for attn_clip tests (helpers live in clip_helpers.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest
import torch
from attn_clip import Tokenizer


def _load_helpers() -> ModuleType:
    path = Path(__file__).with_name("clip_helpers.py")
    spec = importlib.util.spec_from_file_location("attn_clip_test_helpers", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


HELPERS = _load_helpers()


@pytest.fixture(scope="session")
def h() -> ModuleType:
    """clip_helpers: ``oc_cfg``, ``make_open_clip``, ``perturb_``, ``max_diff``, ``CAPTIONS``."""
    return HELPERS


@pytest.fixture
def tiny_tokens() -> torch.Tensor:
    return Tokenizer(20)(HELPERS.CAPTIONS)


@pytest.fixture
def tiny_images() -> torch.Tensor:
    return torch.randn(3, 3, 32, 32)
