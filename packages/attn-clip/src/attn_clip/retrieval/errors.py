"""The errors of an index (a leaf module: every other retrieval module may import it).

All are ``attn_core.errors.InputError`` (hence ``ValueError``) subclasses whose message is
one line saying what is wrong and what to do: an app prints it as it is.
"""

from __future__ import annotations

from attn_core.errors import InputError

__all__ = [
    "AnnError",
    "IndexBusyError",
    "IndexFormatError",
    "IndexNotFoundError",
    "ModelMismatchError",
    "RankError",
    "RetrievalError",
]


class RetrievalError(InputError):
    """Something about an index, its folder or its model is wrong (the message says what)."""


class IndexNotFoundError(RetrievalError):
    """No index (no manifest) at the path given."""


class IndexFormatError(RetrievalError):
    """An index file is unreadable, corrupt, truncated, of an unknown version, or does not
    match the other files of its index."""


class IndexBusyError(RetrievalError):
    """Another process holds the index's lock (it is being updated)."""


class ModelMismatchError(RetrievalError):
    """The model at hand is not the one an index was built with (another name, or weights
    that no longer give its embeddings)."""


class AnnError(RetrievalError):
    """The approximate index asked for cannot be built: ``option`` names the setting at
    fault (``"ann"``, ``"factory"``, ``"memory"`` or ``"build"``), ``detail`` says why."""

    def __init__(self, option: str, detail: str) -> None:
        names = {"ann": "ann='on'", "factory": "ann factory", "memory": "ann memory budget"}
        super().__init__(f"{names.get(option, 'approximate index')}: {detail}")
        self.option, self.detail = option, detail


class RankError(RetrievalError):
    """Under torchrun: bad input that only this rank saw (it reports it itself; errors of
    rank 0 reach the other ranks as plain :class:`RetrievalError`)."""
