"""Fixtures for attn_clip tests: the tiny CLIP of tests/_support/clip.py (its helpers as
the ``h`` fixture, its session-scoped models), tiny inputs."""

from __future__ import annotations

from types import ModuleType

import pytest
import torch
from _support import clip as HELPERS
from _support.clip import tiny_clip, tiny_open_clip
from attn_clip import Tokenizer

__all__ = ["tiny_clip", "tiny_open_clip"]


@pytest.fixture(scope="session")
def h() -> ModuleType:
    """tests/_support/clip.py: ``oc_cfg``, ``make_open_clip``, ``perturb_``, ``max_diff``,
    ``CAPTIONS``, ..."""
    return HELPERS


@pytest.fixture
def tiny_tokens() -> torch.Tensor:
    return Tokenizer(20)(HELPERS.CAPTIONS)


@pytest.fixture
def tiny_images() -> torch.Tensor:
    return torch.randn(3, 3, 32, 32)
