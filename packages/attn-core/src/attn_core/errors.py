"""The exceptions several modules and packages share, in one leaf module (imports nothing).

Apps and scripts catch these once (:mod:`attn_core.cli` turns them into one line on stderr
and exit code 2)::

    InputError (also ValueError)                 bad user input: a file, a flag, a value
    WeightsError                                 every weight-loading failure
    ├── WeightsUnavailableError (also OSError)   not on disk, not in the cache, not downloadable
    └── CheckpointError (also ValueError)        unreadable, or does not fit the model
        └── UnsafeCheckpointError                would run code / points outside its folder

``attn_vision.images.ImageError`` (an image that cannot be used) is an :class:`InputError`.
"""

from __future__ import annotations

__all__ = [
    "CheckpointError",
    "InputError",
    "UnsafeCheckpointError",
    "WeightsError",
    "WeightsUnavailableError",
]


class InputError(ValueError):
    """Bad user input: reported as one line on stderr with exit code 2."""


class WeightsError(Exception):
    """Base of every weight-loading failure in attn-zoo; apps catch this one."""


class WeightsUnavailableError(WeightsError, OSError):
    """The weights are not on disk, not in the hub cache, and cannot be downloaded."""


class CheckpointError(WeightsError, ValueError):
    """A checkpoint cannot be read, or does not fit the model it is loaded into."""


class UnsafeCheckpointError(CheckpointError):
    """A checkpoint that would run code when loaded, or names files outside its folder."""
