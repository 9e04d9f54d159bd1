"""The optional packages of :mod:`attn_clip.export`, imported only where they are used."""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

EXTRA = "attn-clip[export]"


def install_hint(module: str) -> str:
    """``"<module> is not installed: <how to install it>"``."""
    if module == "tensorrt":  # not in the extra: NVIDIA GPUs only
        return "tensorrt is not installed: pip install tensorrt (it needs an NVIDIA GPU)"
    return f"{module} is not installed: pip install '{EXTRA}' (uv sync installs the dev group)"


def check_installed(*modules: str) -> None:
    """``ImportError`` naming the extra to install for the first of ``modules`` that is not
    installed (looked up without importing it)."""
    for module in modules:
        if importlib.util.find_spec(module) is None:
            raise ImportError(install_hint(module))


def require(module: str) -> ModuleType:
    """``import module``, or an ``ImportError`` that says how to install it."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as err:
        if err.name != module.split(".")[0]:  # it is there, but something it imports is not
            raise
        raise ImportError(install_hint(module)) from None
