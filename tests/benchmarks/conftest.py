"""Fixtures for the tests of benchmarks/ (the package ``benchmarks``, on pytest's pythonpath)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch


@pytest.fixture(autouse=True)
def _restore_threads() -> Iterator[None]:
    """In-process runs call torch.set_num_threads(1); give the session its setting back."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module", autouse=True)
def _exports_removed() -> Iterator[None]:
    """The ONNX folders (and models) the sections export once per process go with each test
    file, not at the worker's exit."""
    yield
    from benchmarks.clip_models import forget_exports

    forget_exports()


@pytest.fixture(scope="module")
def tiny_openvino() -> tuple[Any, Any]:
    """The tiny CLIP with random weights and OpenVINO's model of its image tower (one ONNX
    export), as both investigations build them: ``ours_and_openvino_image(quick=True)``."""
    pytest.importorskip("openvino")
    from benchmarks.clip_models import ours_and_openvino_image

    return ours_and_openvino_image(True)
