"""A pytest plugin (registered by ``tests/conftest.py``): a test file's temporary folders go
with it.

pyproject's ``tmp_path_retention_policy = "failed"`` deletes a passing test's ``tmp_path``
when it ends. The folders made with ``tmp_path_factory.mktemp`` by module- or class-scoped
fixtures, or by the tests themselves (checkpoints of reference models, hundreds of MB in
some files), would stay until the end of the run (~15 GB over the suite; CI once ran out of
disk): they are deleted when the test file is done. Folders made by session-scoped fixtures
stay for the session (data a helper caches for the session goes there, or in
``getbasetemp()``)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

_SETTING_UP: list[str] = []  # the scopes of the fixtures being set up, innermost last
_FOLDERS: list[Path] = []  # the folders of the test file that runs
_MKTEMP = pytest.TempPathFactory.mktemp


def _mktemp(factory: pytest.TempPathFactory, basename: str, numbered: bool = True) -> Path:
    path = _MKTEMP(factory, basename, numbered)
    if not _SETTING_UP or _SETTING_UP[-1] in ("module", "class"):
        _FOLDERS.append(path)
    return path


def pytest_configure(config: pytest.Config) -> None:
    pytest.TempPathFactory.mktemp = _mktemp  # type: ignore[method-assign]


def pytest_unconfigure(config: pytest.Config) -> None:
    pytest.TempPathFactory.mktemp = _MKTEMP  # type: ignore[method-assign]


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef, request):  # noqa: ANN001, ANN201 (pytest's hook)
    _SETTING_UP.append(fixturedef.scope)
    try:
        return (yield)
    finally:
        _SETTING_UP.pop()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):  # noqa: ANN001, ANN201 (pytest's hook)
    try:
        return (yield)  # the file's fixtures are torn down in here, after its last test
    finally:
        if nextitem is None or nextitem.path != item.path:
            while _FOLDERS:
                shutil.rmtree(_FOLDERS.pop(), ignore_errors=True)
