"""attn_clip.retrieval: everything an image index is, and its metrics.

- :class:`RetrievalIndex` (:mod:`.api`): an index of a folder, opened or created, updated
  incrementally, searched by text or image -- what ``apps/retrieval.py`` drives.
- :class:`EmbeddingIndex` (:mod:`.index`): the embedding matrix and its exact / faiss /
  approximate (:mod:`.ann`) search, saved as safetensors + a JSON sidecar.
- :mod:`.store` (generations, the atomic manifest switch, the lock), :mod:`.manifest`
  (the versioned :class:`Manifest`), :mod:`.fingerprint` (the model an index was made
  with), :mod:`.plan` (the incremental update plan), :mod:`.embed` (the embedding loop),
  :mod:`.update` (writing an update), :mod:`.options` (how an update runs),
  :mod:`.shards` (torchrun shards), :mod:`.tars` (an index of webdataset tar shards),
  :mod:`.backbone` (image-only attn_vision models:
  which names are theirs, their pooled embedding), :mod:`.errors`,
  :mod:`.sheet` (a contact sheet of search results).
- :func:`retrieval_metrics` / :func:`evaluate_retrieval` (:mod:`.metrics`): recall@k.

Names are imported on first use: ``from attn_clip.retrieval.errors import ...`` does not
import torch.
"""

# ruff: noqa: F401  (the TYPE_CHECKING imports below re-export __all__)
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "ann": ["check_ann_factory", "choose_ann_factory", "ivf_lists"],
    "api": ["Hit", "RetrievalIndex"],
    "backbone": ["model_kind"],
    "embed": ["IndexModel", "embed_files", "embed_images"],
    "errors": [
        "AnnError",
        "IndexBusyError",
        "IndexFormatError",
        "IndexNotFoundError",
        "ModelMismatchError",
        "RankError",
        "RetrievalError",
    ],
    "fingerprint": ["ModelRecord"],
    "index": ["EmbeddingIndex", "SearchResult"],
    "manifest": ["Manifest", "index_base", "manifest_path"],
    "metrics": ["evaluate_captions", "evaluate_retrieval", "retrieval_metrics"],
    "sheet": ["contact_sheet"],
    "store": ["index_lock", "load_index_set", "save_index_set"],
    "options": ["AnnOptions"],
    "update": ["UpdateResult"],
}
_ALIASES = {"choose_ann_factory": "choose_factory", "check_ann_factory": "check_factory"}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        module = importlib.import_module(f".{_WHERE[name]}", __name__)
        value = getattr(module, _ALIASES.get(name, name))
        globals()[name] = value
        return value
    raise AttributeError(f"module 'attn_clip.retrieval' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)


if TYPE_CHECKING:  # the same names, eagerly, for type checkers and IDEs
    from .ann import check_factory as check_ann_factory
    from .ann import choose_factory as choose_ann_factory
    from .ann import ivf_lists
    from .api import Hit, RetrievalIndex
    from .backbone import model_kind
    from .embed import IndexModel, embed_files, embed_images
    from .errors import (
        AnnError,
        IndexBusyError,
        IndexFormatError,
        IndexNotFoundError,
        ModelMismatchError,
        RankError,
        RetrievalError,
    )
    from .fingerprint import ModelRecord
    from .index import EmbeddingIndex, SearchResult
    from .manifest import Manifest, index_base, manifest_path
    from .metrics import evaluate_captions, evaluate_retrieval, retrieval_metrics
    from .options import AnnOptions
    from .sheet import contact_sheet
    from .store import index_lock, load_index_set, save_index_set
    from .update import UpdateResult
