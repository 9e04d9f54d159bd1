"""The embedding matrix of an index and its search (exact, faiss, approximate).

Shape legend: ``N`` indexed vectors, ``Q`` queries, ``D`` embedding width.

``EmbeddingIndex`` keeps L2-normalized embeddings with string ids (file paths,
captions, ...), answers exact cosine top-k in chunks so memory stays at
``O(Q * chunk_size)``, uses faiss (``faiss.knn``, exact as well) for large indexes when
it is installed, and saves as ``<name>.safetensors`` + a ``<name>.json`` sidecar holding the
ids and a SHA-256 of the tensor file, so a corrupt or truncated index is detected on load.
Loading memory-maps float32 embeddings (searching them reads the file's pages from the page
cache; nothing is copied into the process).

For large collections :meth:`EmbeddingIndex.build_ann` adds an approximate faiss index
(:mod:`.ann`), saved next to the embeddings as ``<name>.faiss`` (its SHA-256 in the
sidecar); its candidates are re-ranked with the exact embeddings, so the scores returned
are exact cosines.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from attn_core import hub

from . import ann
from .errors import IndexFormatError

__all__ = ["EmbeddingIndex", "SearchResult"]

FORMAT = "attn_clip.EmbeddingIndex"
VERSION = 1
_CHECK_ROWS = 65_536  # rows per block when checking or copying embeddings


@dataclass
class SearchResult:
    """Top-k hits per query, best first."""

    scores: torch.Tensor  # (Q, k) cosine similarities
    indices: torch.Tensor  # (Q, k) row numbers in the index
    ids: list[list[str]]  # (Q, k) ids of those rows


class EmbeddingIndex:
    """Exact cosine-similarity index over ``(N, D)`` embeddings with string ids, plus an
    optional approximate faiss index (:meth:`build_ann`) for large ones."""

    def __init__(self, dim: int, *, faiss_threshold: int = 200_000) -> None:
        if dim <= 0:
            raise ValueError(f"dim must be positive, got {dim}")
        self.dim = dim
        self.faiss_threshold = faiss_threshold
        self.ids: list[str] = []
        self._chunks: list[torch.Tensor] = []
        self.ann = None  # a faiss index over the rows (build_ann / load), or None
        self.ann_info: dict | None = None  # how it was built, its tuned nprobe, its recall

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def embeddings(self) -> torch.Tensor:
        """All stored (normalized, float32) embeddings ``(N, D)`` (memory-mapped after
        :meth:`load`: writes to it stay in this process, the file is never changed)."""
        if len(self._chunks) != 1:
            empty = torch.empty(0, self.dim)
            self._chunks = [torch.cat(self._chunks) if self._chunks else empty]
        return self._chunks[0]

    def _matrix(self) -> np.ndarray:
        """The embeddings as a C-contiguous float32 numpy array (no copy)."""
        return np.ascontiguousarray(self.embeddings.numpy())

    def add(self, embeddings: torch.Tensor, ids: Sequence[str] | None = None) -> None:
        """Append ``(n, D)`` embeddings (normalized here) with their ids (default: row numbers).

        Drops the approximate index, if any (it does not know the new rows)."""
        if embeddings.ndim != 2 or embeddings.shape[1] != self.dim:
            raise ValueError(f"embeddings must be (n, {self.dim}), got {tuple(embeddings.shape)}")
        n = embeddings.shape[0]
        if ids is None:
            ids = [str(len(self) + i) for i in range(n)]
        ids = [str(i) for i in ids]
        if len(ids) != n:
            raise ValueError(f"got {n} embeddings but {len(ids)} ids")
        emb = F.normalize(embeddings.detach().to("cpu", torch.float32), dim=-1)
        self._chunks.append(emb)
        self.ids.extend(ids)
        self.ann, self.ann_info = None, None

    def _use_faiss(self, use_faiss: bool | None) -> bool:
        have = importlib.util.find_spec("faiss") is not None
        if use_faiss and not have:
            raise ImportError("use_faiss=True needs faiss: pip install 'attn-clip[faiss]'")
        return have and len(self) >= self.faiss_threshold if use_faiss is None else use_faiss

    @torch.no_grad()
    def search(
        self,
        queries: torch.Tensor,
        k: int = 10,
        *,
        chunk_size: int = 65_536,
        use_faiss: bool | None = None,
        exact: bool | None = None,
        nprobe: int | None = None,
    ) -> SearchResult:
        """Top-``k`` rows by cosine similarity for ``(Q, D)`` (or ``(D,)``) queries.

        With an approximate index (:meth:`build_ann`), unless ``exact`` is true or
        ``use_faiss`` is given: its candidates (``nprobe`` lists scanned, or HNSW's
        ``efSearch``; default: the value tuned at build time) re-ranked by their exact
        cosine. Otherwise exact: chunked matrix products (peak memory ``Q * chunk_size``)
        or, for indexes of at least ``faiss_threshold`` rows when faiss is installed,
        ``faiss.knn`` on the stored array. ``use_faiss`` forces the choice between those two.
        """
        if len(self) == 0:
            raise ValueError("the index is empty: add() embeddings first")
        q = queries.reshape(1, -1) if queries.ndim == 1 else queries
        if q.ndim != 2 or q.shape[1] != self.dim:
            raise ValueError(f"queries must be (Q, {self.dim}), got {tuple(queries.shape)}")
        if k <= 0:
            raise ValueError(f"k must be positive, got {k}")
        if nprobe is not None and nprobe < 1:
            raise ValueError(f"nprobe must be >= 1, got {nprobe}")
        q = q.detach().to("cpu", torch.float32)
        k = min(k, len(self))
        if self.ann is not None and not exact and use_faiss is None:
            # numpy and faiss only: torch's OpenMP threads would contend with faiss's
            qn = np.array(q.numpy(), dtype=np.float32, order="C")
            qn /= np.maximum(np.linalg.norm(qn, axis=1, keepdims=True), 1e-12)  # F.normalize
            scores, idx = ann.search(self, torch.from_numpy(qn), k, nprobe)
        elif self._use_faiss(use_faiss):
            scores, idx = self._faiss_search(F.normalize(q, dim=-1), k)
        else:
            scores, idx = self._exact_search(F.normalize(q, dim=-1), k, chunk_size)
        ids = [[self.ids[i] for i in row] for row in idx.tolist()]
        return SearchResult(scores, idx, ids)

    def _exact_search(
        self, q: torch.Tensor, k: int, chunk_size: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        emb = self.embeddings
        best_s = torch.empty(q.shape[0], 0)
        best_i = torch.empty(q.shape[0], 0, dtype=torch.long)
        for start in range(0, emb.shape[0], chunk_size):
            sims = q @ emb[start : start + chunk_size].T  # (Q, c)
            s, i = sims.topk(min(k, sims.shape[1]), dim=1)
            best_s = torch.cat([best_s, s], dim=1)
            best_i = torch.cat([best_i, i + start], dim=1)
            best_s, order = best_s.topk(min(k, best_s.shape[1]), dim=1)
            best_i = best_i.gather(1, order)
        return best_s, best_i

    def _faiss_search(self, q: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Exact top-k by faiss, straight on the stored (possibly memory-mapped) array."""
        import faiss

        qn = np.ascontiguousarray(q.numpy())
        scores, idx = faiss.knn(qn, self._matrix(), k, metric=faiss.METRIC_INNER_PRODUCT)
        return torch.from_numpy(scores), torch.from_numpy(idx).long()

    def build_ann(
        self,
        factory: str | None = None,
        *,
        memory_budget: int | None = None,
        target_recall: float = 0.95,
        rerank: int = 100,
        train_size: int | None = None,
        check_queries: int = 500,
        seed: int = 0,
        trained=None,
    ) -> dict:
        """Build, tune and attach an approximate index; return :attr:`ann_info`.

        ``factory``: a ``faiss.index_factory`` string; default :func:`.ann.choose_factory`
        for this size and ``memory_budget`` (bytes; default 1/8 of the float32 embeddings).
        It is trained on ``train_size`` rows drawn at random (default 50 per IVF list), or
        ``trained`` -- an index of the same factory and width trained before (an update)
        -- is emptied and refilled. Then ``check_queries`` stored rows are searched both
        ways (each query's own row left out) and ``nprobe`` (HNSW: ``efSearch``) is doubled
        from 1 until recall@10 against exact search reaches ``target_recall``; searches use
        that value unless told otherwise. ``rerank`` candidates are re-scored exactly.
        """
        return ann.build(
            self, factory, memory_budget=memory_budget, target_recall=target_recall,
            rerank=rerank, train_size=train_size, check_queries=check_queries, seed=seed,
            trained=trained,
        )  # fmt: skip

    # -- files -------------------------------------------------------------------------------

    def save(self, path: str | os.PathLike) -> tuple[Path, Path]:
        """Write ``<path>.safetensors`` (and ``<path>.faiss`` with an approximate index),
        then the ``<path>.json`` sidecar (each atomically)."""
        from safetensors.torch import save_file

        tensor_path, meta_path = _paths(path)
        with hub.atomic_path(tensor_path) as tmp:
            save_file({"embeddings": self.embeddings.contiguous()}, tmp)
            sha256 = _sha256(Path(tmp))
        meta = {
            "format": FORMAT,
            "version": VERSION,
            "dim": self.dim,
            "count": len(self),
            "tensor_file": tensor_path.name,
            "sha256": sha256,
            "ids": self.ids,
        }
        if self.ann is not None:
            import faiss

            ann_path = ann.file_of(tensor_path)
            data = faiss.serialize_index(self.ann).tobytes()
            with hub.atomic_write(ann_path, "wb") as f:
                f.write(data)
            digest = hashlib.sha256(data).hexdigest()
            meta["ann"] = {**(self.ann_info or {}), "file": ann_path.name, "sha256": digest}
        with hub.atomic_write(meta_path, "w") as f:
            json.dump(meta, f)
        return tensor_path, meta_path

    @classmethod
    def load(cls, path: str | os.PathLike, *, verify: bool = True) -> EmbeddingIndex:
        """Read an index written by :meth:`save` (float32 embeddings memory-mapped).

        Raises ``FileNotFoundError`` for a missing file and ``IndexFormatError`` (a
        ValueError saying which file and what is wrong) for a corrupt, truncated or
        mismatched one. The approximate
        index, if any, is checked against its SHA-256 before faiss reads it.
        """
        tensor_path, meta_path = _paths(path)
        for p in (meta_path, tensor_path):
            if not p.is_file():
                raise FileNotFoundError(f"embedding index file missing: {p}")
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
            ok = isinstance(meta, dict) and meta.get("format") == FORMAT
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise IndexFormatError(f"corrupt embedding index sidecar {meta_path}: {e}") from None
        if not ok:
            raise IndexFormatError(f"{meta_path} is not an attn_clip embedding index sidecar")
        if meta.get("version") != VERSION:
            raise IndexFormatError(
                f"{meta_path}: unsupported index version {meta.get('version')!r}"
            )
        if verify and _sha256(tensor_path) != meta.get("sha256"):
            raise IndexFormatError(
                f"corrupt or truncated embedding index {tensor_path}: its SHA-256 does not "
                f"match the one recorded in {meta_path.name}; rebuild the index"
            )
        try:
            emb = _read_embeddings(tensor_path)
        except Exception as e:
            raise IndexFormatError(
                f"corrupt or truncated embedding index {tensor_path}: {e}"
            ) from None
        dim, count, ids = meta.get("dim"), meta.get("count"), meta.get("ids")
        if tuple(emb.shape) != (count, dim) or not isinstance(ids, list) or len(ids) != count:
            raise IndexFormatError(
                f"embedding index {tensor_path} does not match its sidecar: tensor "
                f"{tuple(emb.shape)}, sidecar count={count} dim={dim} ids={len(ids or [])}"
            )
        _check_embeddings(emb, tensor_path)
        index = cls(dim)
        index._chunks, index.ids = [emb.float()], [str(i) for i in ids]
        if meta.get("ann") is not None:
            index.ann, index.ann_info = ann.load(meta["ann"], tensor_path, meta_path, verify)
            if index.ann is not None and (index.ann.d, index.ann.ntotal) != (dim, count):
                raise IndexFormatError(
                    f"approximate index {ann.file_of(tensor_path)} does not match its sidecar: "
                    f"{index.ann.ntotal} x {index.ann.d} vectors, expected {count} x {dim}"
                )
        return index


def _paths(path: str | os.PathLike) -> tuple[Path, Path]:
    p = Path(path)
    if p.suffix in (".safetensors", ".json"):
        p = p.with_suffix("")
    return p.with_name(p.name + ".safetensors"), p.with_name(p.name + ".json")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _read_embeddings(path: Path) -> torch.Tensor:
    """The ``embeddings`` tensor of a safetensors file: float32 ones memory-mapped
    (copy-on-write: the file is never changed), any other dtype read with safetensors."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ValueError("no safetensors header")
        n_header = int.from_bytes(head, "little")
        if n_header > min(size - 8, 100 << 20):
            raise ValueError(f"header length {n_header} does not fit the file ({size} bytes)")
        header = json.loads(f.read(n_header))
    info = header.get("embeddings") if isinstance(header, dict) else None
    if not isinstance(info, dict) or info.get("dtype") != "F32":
        from safetensors.torch import load_file

        return load_file(str(path))["embeddings"]  # (errors and other dtypes: as before)
    shape, offsets = info.get("shape"), info.get("data_offsets")
    ok = isinstance(shape, list) and len(shape) == 2 and isinstance(offsets, list)
    ok = ok and len(offsets) == 2 and all(isinstance(v, int) and v >= 0 for v in shape + offsets)
    if not ok or offsets[1] - offsets[0] != shape[0] * shape[1] * 4:
        raise ValueError(f"malformed tensor entry {info}")
    start = 8 + n_header + offsets[0]
    if start + shape[0] * shape[1] * 4 > size:
        raise ValueError(f"the tensor data ends past the end of the file ({size} bytes)")
    if shape[0] * shape[1] == 0:
        return torch.empty(shape[0], shape[1])
    array = np.memmap(path, dtype="<f4", mode="c", offset=start, shape=tuple(shape))
    return torch.from_numpy(array)


def _check_embeddings(emb: torch.Tensor, path: Path) -> None:
    """Stored embeddings must be finite, floating point and L2-normalized (a file that
    passes its checksum can still hold anything). Checked in blocks: memory stays small."""
    if not emb.is_floating_point():
        raise IndexFormatError(f"embedding index {path} holds {emb.dtype} embeddings, not floats")
    lo, hi = float("inf"), float("-inf")
    for start in range(0, emb.shape[0], _CHECK_ROWS):
        block = emb[start : start + _CHECK_ROWS].float()
        if not bool(torch.isfinite(block).all()):
            raise IndexFormatError(f"embedding index {path} holds NaN or infinite embeddings")
        norms = block.norm(dim=-1)
        lo, hi = min(lo, norms.min().item()), max(hi, norms.max().item())
    if emb.shape[0] and not (abs(lo - 1) < 1e-3 and abs(hi - 1) < 1e-3):
        raise IndexFormatError(
            f"embedding index {path} holds embeddings that are not L2-normalized (norms "
            f"{lo:.4g} .. {hi:.4g})"
        )
