"""The training loop's exceptions, in a leaf module: :mod:`attn_train.loop` raises them,
:mod:`attn_train.cli` maps them to exit codes."""

from __future__ import annotations

__all__ = ["NonFiniteLossError", "TrainingInterrupted"]


class NonFiniteLossError(RuntimeError):
    """The loss became NaN / inf; the run stopped without saving anything."""


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C during :func:`attn_train.fit`; the message names the last checkpoint to resume
    from."""
