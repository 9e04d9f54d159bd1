"""Fixtures for the tests of benchmarks/: the entry point, loaded the way it runs."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(autouse=True)
def _restore_threads() -> Iterator[None]:
    """In-process runs call torch.set_num_threads(1); give the session its setting back."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def benchmarks_run() -> Iterator[ModuleType]:
    """``benchmarks/run.py`` as a module, to call ``main(argv)``.

    ``uv run benchmarks/run.py`` puts benchmarks/ on sys.path and run.py imports its
    siblings (harness, clip_models, ...) by plain name; so does this fixture, for the
    session (shadowing same-named modules other tests imported, such as apps/zero_shot.py),
    and afterwards it takes the folder and those modules away again."""
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(BENCHMARKS))
        for sibling in BENCHMARKS.glob("*.py"):  # e.g. apps/zero_shot.py imported earlier
            mp.delitem(sys.modules, sibling.stem, raising=False)
        spec = importlib.util.spec_from_file_location(
            "attn_zoo_benchmarks_run", BENCHMARKS / "run.py"
        )
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        mp.setitem(sys.modules, spec.name, module)  # dataclasses need it registered
        spec.loader.exec_module(module)
        yield module
    for name, mod in list(sys.modules.items()):
        if Path(getattr(mod, "__file__", None) or "/").parent == BENCHMARKS:
            del sys.modules[name]
