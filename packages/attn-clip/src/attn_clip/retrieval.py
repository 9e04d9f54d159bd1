"""Embedding search and retrieval metrics.

Shape legend: ``N`` indexed vectors, ``Q`` queries, ``D`` embedding width, ``B`` images,
``T`` captions.

``EmbeddingIndex`` keeps L2-normalized embeddings with string ids (file paths,
captions, ...), answers exact cosine top-k in chunks so memory stays at
``O(Q * chunk_size)``, uses faiss (``faiss.knn``, exact as well) for large indexes when
it is installed, and saves as ``<name>.safetensors`` + a ``<name>.json`` sidecar holding the
ids and a SHA-256 of the tensor file, so a corrupt or truncated index is detected on load.
Loading memory-maps float32 embeddings (searching them reads the file's pages from the page
cache; nothing is copied into the process).

For large collections :meth:`EmbeddingIndex.build_ann` adds an approximate faiss index
(IVF-PQ with 4-bit fast-scan codes, or HNSW when the memory budget holds the vectors; the
choice follows the size and the budget, as autofaiss does), trained on a sample, tuned to a
recall@10 target against exact search, and saved next to the embeddings as
``<name>.faiss`` (its SHA-256 in the sidecar). Its candidates are re-ranked with the exact
(memory-mapped) embeddings, so the scores returned are exact cosines.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import importlib.util
import json
import math
import os
import re
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F
from attn_core import hub

if TYPE_CHECKING:
    from .model import CLIP

__all__ = [
    "EmbeddingIndex",
    "IndexBusyError",
    "SearchResult",
    "choose_ann_factory",
    "evaluate_retrieval",
    "index_lock",
    "load_index_set",
    "retrieval_metrics",
    "save_index_set",
]

FORMAT = "attn_clip.EmbeddingIndex"
VERSION = 1
ANN_SUFFIX = ".faiss"
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
            scores, idx = self._ann_search(torch.from_numpy(qn), k, nprobe)
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

    # -- the approximate index ---------------------------------------------------------------

    def _ann_search(
        self, q: torch.Tensor, k: int, nprobe: int | None, rerank: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Candidates from the approximate index, scored exactly against the stored rows."""
        import faiss

        info = self.ann_info or {}
        nprobe = nprobe or info.get("nprobe")
        rerank = rerank or info.get("rerank", 100)
        xb, qn = self._matrix(), np.ascontiguousarray(q.numpy())
        n_cand = min(len(self), max(rerank, 2 * k))
        with _faiss_threads(1 if len(qn) <= 8 else None):
            _, cand = self.ann.search(qn, n_cand, params=_search_params(self.ann, nprobe))
        ip = np.empty(cand.shape, dtype=np.float32)  # exact <q, x> of each candidate
        faiss.fvec_inner_products_by_idx(
            faiss.swig_ptr(ip), faiss.swig_ptr(qn), faiss.swig_ptr(xb), faiss.swig_ptr(cand),
            self.dim, qn.shape[0], n_cand,
        )  # fmt: skip
        ip[cand < 0] = -np.inf  # fewer candidates than asked for
        top = np.argsort(-ip, axis=1, kind="stable")[:, :k]
        scores, idx = np.take_along_axis(ip, top, 1), np.take_along_axis(cand, top, 1)
        short = np.flatnonzero((idx < 0).any(axis=1))
        if short.size:  # too few candidates (tiny lists): exact search for those queries
            s, i = self._exact_search(q[torch.from_numpy(short)], k, 65_536)
            scores[short], idx[short] = s.numpy(), i.numpy()
        return torch.from_numpy(scores), torch.from_numpy(idx).long()

    @torch.no_grad()
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

        ``factory``: a ``faiss.index_factory`` string; default :func:`choose_ann_factory`
        for this size and ``memory_budget`` (bytes; default 1/8 of the float32 embeddings).
        It is trained on ``train_size`` rows drawn at random (default 50 per IVF list), or
        ``trained`` -- an index of the same factory and width trained before (``--update``)
        -- is emptied and refilled. Then ``check_queries`` stored rows are searched both
        ways (each query's own row left out) and ``nprobe`` (HNSW: ``efSearch``) is doubled
        from 1 until recall@10 against exact search reaches ``target_recall``; searches use
        that value unless told otherwise. ``rerank`` candidates are re-scored exactly.
        """
        import faiss

        n, d = len(self), self.dim
        if n == 0:
            raise ValueError("the index is empty: add() embeddings first")
        budget = memory_budget if memory_budget is not None else n * d * 4 // 8
        factory = factory or choose_ann_factory(n, d, budget)
        xb = self._matrix()
        started = time.perf_counter()
        reused = trained is not None and getattr(trained, "d", None) == d
        if reused:
            index = faiss.clone_index(trained)
            index.reset()  # keeps the training (centroids, codebooks), drops the vectors
        else:
            try:
                index = faiss.index_factory(d, factory, faiss.METRIC_INNER_PRODUCT)
            except RuntimeError as e:
                raise ValueError(
                    f"bad faiss index factory {factory!r}: {_faiss_message(e)}"
                ) from None
        train_rows = 0
        if not index.is_trained:
            ivf = faiss.try_extract_index_ivf(index)
            lists = ivf.nlist if ivf is not None else 256
            train_rows = min(n, train_size or max(50 * lists, 10_000))
            rng = np.random.default_rng(seed)
            rows = np.sort(rng.choice(n, train_rows, replace=False))
            try:
                index.train(np.ascontiguousarray(xb[rows]))
            except RuntimeError as e:  # e.g. fewer training rows than centroids
                raise ValueError(f"cannot train {factory!r} on {train_rows} rows: "
                                 f"{_faiss_message(e)}") from None  # fmt: skip
        for start in range(0, n, _CHECK_ROWS):
            index.add(xb[start : start + _CHECK_ROWS])
        build_s = time.perf_counter() - started
        self.ann = index
        self.ann_info = {
            "factory": factory,
            "kind": _ann_kind(index),
            "param": "efSearch" if _ann_kind(index) == "hnsw" else "nprobe",
            "bytes": int(faiss.serialize_index(index).nbytes),
            "memory_budget": int(budget),
            "train_rows": int(train_rows),
            "retrained": not reused,
            "rerank": int(rerank),
            "build_s": round(build_s, 3),
        }
        self.ann_info.update(self._tune_ann(target_recall, check_queries, seed))
        return self.ann_info

    def _tune_ann(self, target: float, check_queries: int, seed: int, k: int = 10) -> dict:
        """The smallest power-of-two nprobe (efSearch) whose recall@k reaches ``target`` on
        stored rows used as queries (their own row left out), and that recall."""
        import faiss

        n = len(self)
        k = min(k, n - 1)
        if k < 1:
            return {"nprobe": 1, "recall_at_10": 1.0, "check_queries": 0}
        rng = np.random.default_rng(seed + 1)
        rows = np.sort(rng.choice(n, min(check_queries, n), replace=False))
        xb = self._matrix()
        q = np.ascontiguousarray(xb[rows])
        exact_s, exact_i = faiss.knn(q, xb, k + 1, metric=faiss.METRIC_INNER_PRODUCT)
        kth = np.array([s[i != r][k - 1] for s, i, r in zip(exact_s, exact_i, rows, strict=True)])
        kind = _ann_kind(self.ann)
        if kind == "ivf":
            top = faiss.try_extract_index_ivf(self.ann).nlist
            values = [v for v in (2**i for i in range(20)) if v < top] + [top]
        elif kind == "hnsw":
            values = [16, 32, 64, 128, 256, 512, 1024]
        else:
            values = [None]
        best = (-1.0, None)
        for value in values:
            s, i = self._ann_search(torch.from_numpy(q), k + 1, value)
            s, i = s.numpy(), i.numpy()
            hits = [
                (si[ii != r][:k] >= t - 1e-6).sum()  # ties with the k-th count as found
                for si, ii, r, t in zip(s, i, rows, kth, strict=True)
            ]
            recall = float(np.mean(hits)) / k
            if recall > best[0] + 1e-9:
                best = (recall, value)
            if recall >= target:
                break
        return {
            "nprobe": best[1],
            "recall_at_10": round(best[0], 4),
            "target_recall": target,
            "check_queries": int(len(rows)),
        }

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

            ann_path = _ann_path(tensor_path)
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

        Raises ``FileNotFoundError`` for a missing file and ``ValueError`` (saying which
        file and what is wrong) for a corrupt, truncated or mismatched one. The approximate
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
            raise ValueError(f"corrupt embedding index sidecar {meta_path}: {e}") from None
        if not ok:
            raise ValueError(f"{meta_path} is not an attn_clip embedding index sidecar")
        if meta.get("version") != VERSION:
            raise ValueError(f"{meta_path}: unsupported index version {meta.get('version')!r}")
        if verify and _sha256(tensor_path) != meta.get("sha256"):
            raise ValueError(
                f"corrupt or truncated embedding index {tensor_path}: its SHA-256 does not "
                f"match the one recorded in {meta_path.name}; rebuild the index"
            )
        try:
            emb = _read_embeddings(tensor_path)
        except Exception as e:
            raise ValueError(f"corrupt or truncated embedding index {tensor_path}: {e}") from None
        dim, count, ids = meta.get("dim"), meta.get("count"), meta.get("ids")
        if tuple(emb.shape) != (count, dim) or not isinstance(ids, list) or len(ids) != count:
            raise ValueError(
                f"embedding index {tensor_path} does not match its sidecar: tensor "
                f"{tuple(emb.shape)}, sidecar count={count} dim={dim} ids={len(ids or [])}"
            )
        _check_embeddings(emb, tensor_path)
        index = cls(dim)
        index._chunks, index.ids = [emb.float()], [str(i) for i in ids]
        if meta.get("ann") is not None:
            index.ann, index.ann_info = _load_ann(meta["ann"], tensor_path, meta_path, verify)
            if index.ann is not None and (index.ann.d, index.ann.ntotal) != (dim, count):
                raise ValueError(
                    f"approximate index {_ann_path(tensor_path)} does not match its sidecar: "
                    f"{index.ann.ntotal} x {index.ann.d} vectors, expected {count} x {dim}"
                )
        return index


def _paths(path: str | os.PathLike) -> tuple[Path, Path]:
    p = Path(path)
    if p.suffix in (".safetensors", ".json"):
        p = p.with_suffix("")
    return p.with_name(p.name + ".safetensors"), p.with_name(p.name + ".json")


def _ann_path(tensor_path: Path) -> Path:
    return tensor_path.with_suffix(ANN_SUFFIX)


@contextlib.contextmanager
def _faiss_threads(n: int | None):
    """faiss's OpenMP threads for this thread's calls in the body (None: unchanged). A few
    queries are faster on one: waking (and spinning) a second thread costs more than the
    work, the more so when torch's own OpenMP threads compete for the same cores."""
    import faiss

    if n is None:
        yield
        return
    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(n)
    try:
        yield
    finally:
        faiss.omp_set_num_threads(before)


def _faiss_message(error: BaseException) -> str:
    """What a faiss exception says is wrong, without the C++ function and file."""
    text = " ".join(str(error).split()) or type(error).__name__
    for marker in ("failed: ", "Error: "):
        if marker in text:
            return text.rsplit(marker, 1)[1]
    return text


def check_ann_factory(dim: int, factory: str) -> None:
    """``ValueError`` (one clear line) unless faiss can build ``factory`` for ``dim``."""
    import faiss

    try:
        faiss.index_factory(dim, factory, faiss.METRIC_INNER_PRODUCT)
    except RuntimeError as e:
        raise ValueError(f"bad faiss index factory {factory!r}: {_faiss_message(e)}") from None


def _ann_kind(index) -> str:
    import faiss

    if faiss.try_extract_index_ivf(index) is not None:
        return "ivf"
    inner = index.index if isinstance(index, faiss.IndexPreTransform) else index
    return "hnsw" if isinstance(faiss.downcast_index(inner), faiss.IndexHNSW) else "other"


def _search_params(index, value: int | None):
    """Per-call search parameters (thread-safe, unlike setting them on the index)."""
    import faiss

    if value is None:
        return None
    kind = _ann_kind(index)
    if kind == "ivf":
        params = faiss.SearchParametersIVF(nprobe=int(value))
    elif kind == "hnsw":
        params = faiss.SearchParametersHNSW(efSearch=int(value))
    else:
        return None
    if isinstance(index, faiss.IndexPreTransform):
        params = faiss.SearchParametersPreTransform(index_params=params)
    return params


def _load_ann(info: dict, tensor_path: Path, meta_path: Path, verify: bool):
    """The approximate index named in a sidecar: its bytes checked against the recorded
    SHA-256, then handed to faiss's reader (a native format: no code is run)."""
    ann_path = _ann_path(tensor_path)
    if not isinstance(info, dict) or info.get("file") != ann_path.name:
        raise ValueError(f"{meta_path}: a malformed 'ann' entry (expected file {ann_path.name})")
    if not ann_path.is_file():
        raise FileNotFoundError(f"approximate index file missing: {ann_path}")
    data = ann_path.read_bytes()
    if verify and hashlib.sha256(data).hexdigest() != info.get("sha256"):
        raise ValueError(
            f"corrupt or truncated approximate index {ann_path}: its SHA-256 does not match "
            f"the one recorded in {meta_path.name}; rebuild the index"
        )
    if importlib.util.find_spec("faiss") is None:
        warnings.warn(
            f"{ann_path.name} holds an approximate index but faiss is not installed: "
            "searching exactly (pip install 'attn-clip[faiss]')",
            stacklevel=3,
        )
        return None, None
    import faiss

    try:
        index = faiss.deserialize_index(np.frombuffer(data, dtype=np.uint8))
    except RuntimeError as e:
        raise ValueError(f"corrupt approximate index {ann_path}: {e}") from None
    if index.metric_type != faiss.METRIC_INNER_PRODUCT:
        raise ValueError(f"approximate index {ann_path} does not use inner products")
    return index, {k: v for k, v in info.items() if k not in ("file", "sha256")}


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
        raise ValueError(f"embedding index {path} holds {emb.dtype} embeddings, not floats")
    lo, hi = float("inf"), float("-inf")
    for start in range(0, emb.shape[0], _CHECK_ROWS):
        block = emb[start : start + _CHECK_ROWS].float()
        if not bool(torch.isfinite(block).all()):
            raise ValueError(f"embedding index {path} holds NaN or infinite embeddings")
        norms = block.norm(dim=-1)
        lo, hi = min(lo, norms.min().item()), max(hi, norms.max().item())
    if emb.shape[0] and not (abs(lo - 1) < 1e-3 and abs(hi - 1) < 1e-3):
        raise ValueError(
            f"embedding index {path} holds embeddings that are not L2-normalized (norms "
            f"{lo:.4g} .. {hi:.4g})"
        )


def ivf_lists(n: int) -> int:
    """IVF lists for ``n`` vectors: the power of two nearest ``4 * sqrt(n)``, with at least 39
    training points per list (faiss's k-means minimum)."""
    lists = 2 ** round(math.log2(max(1.0, 4 * math.sqrt(n))))
    while lists > 1 and n < 39 * lists:
        lists //= 2
    return lists


def choose_ann_factory(n: int, dim: int, memory_budget: int) -> str:
    """The faiss index for ``n`` vectors of width ``dim`` in ``memory_budget`` bytes, the way
    autofaiss chooses: HNSW (graph + float32 vectors: best speed and recall) when the budget
    holds it, else IVF with 4-bit fast-scan product-quantization codes, using the largest
    code (up to ``dim / 8`` sub-quantizers: 4 bytes per 64 dimensions; more costs speed and
    hardly adds recall once candidates are re-ranked) that fits. ``ValueError`` when
    nothing does."""
    hnsw_bytes = n * (4 * dim + 2 * 32 * 4 + 32)  # vectors, level-0 links, upper levels
    if n < 1_000 or (n <= 5_000_000 and hnsw_bytes <= memory_budget):
        return "HNSW32"  # (under 1,000 vectors: too few to train quantizers; a few MB)
    lists = ivf_lists(n)
    fixed = lists * dim * 4 + 16 * dim * 4 + (1 << 16)  # centroids, codebooks, headers
    for m in (dim // 8, dim // 16, dim // 32, dim // 64):
        if m < 2 or m % 2 or dim % m:
            continue
        per_vector = m / 2 + 8  # 4-bit codes + an int64 id
        if fixed + n * per_vector + lists * 32 * m / 2 <= memory_budget:  # + block padding
            return f"IVF{lists},PQ{m}x4fs"
    raise ValueError(
        f"no approximate index of {n} x {dim} vectors fits in {memory_budget / 2**20:.2f} MiB "
        f"(IVF-PQ needs at least {(fixed + n * 9) / 2**20:.2f} MiB); raise the memory budget"
    )


# -- an index on disk, replaced as a set ------------------------------------------------------


def _generation_base(base: Path, generation: int | None) -> Path:
    """Where generation ``generation`` keeps its EmbeddingIndex files (None: ``base``)."""
    return base if generation is None else base.with_name(f"{base.name}.g{generation}")


def _generations_on_disk(base: Path) -> set[int]:
    pattern = re.compile(re.escape(base.name) + r"\.g(\d+)\.(?:safetensors|json|faiss)$")
    found = (pattern.match(p.name) for p in base.parent.iterdir())
    return {int(m[1]) for m in found if m}


class IndexBusyError(RuntimeError):
    """Another process holds the index's lock (it is being updated)."""


@contextlib.contextmanager
def index_lock(base: str | os.PathLike):
    """Hold ``<base>.lock`` (an exclusive ``flock``) for the body; raise
    :class:`IndexBusyError` naming the holder's PID if another process has it. The lock file
    exists only while it is held."""
    import fcntl

    path = Path(f"{base}.lock")
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise IndexBusyError(f"index {base} is being updated by PID {holder}") from None
        try:  # the file we locked may have been removed by the previous holder: retry
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield
    finally:
        path.unlink(missing_ok=True)  # still ours: removed before the lock is released
        os.close(fd)


def save_index_set(
    base: str | os.PathLike, index: EmbeddingIndex, manifest: dict, manifest_path: Path
) -> int:
    """Write ``index`` and ``manifest`` as one new generation, switched in atomically.

    The embeddings go to ``<base>.g<N>.safetensors`` / ``.json`` (and an approximate index
    to ``.faiss``: a generation no manifest names yet); then ``manifest`` (with
    ``"generation": N``) replaces ``manifest_path`` in one rename -- the switch; then older
    generations and temporary files of earlier crashed runs are removed. Killed at any
    point, the index on disk is the old one or the new one. Call it holding
    :func:`index_lock`. Returns ``N``.
    """
    base = Path(base)
    generation = max(_generations_on_disk(base), default=0) + 1
    index.save(_generation_base(base, generation))
    with hub.atomic_write(manifest_path, "w") as f:
        json.dump({**manifest, "generation": generation}, f, indent=1, ensure_ascii=False)
    stale = [_generation_base(base, g) for g in _generations_on_disk(base) - {generation}]
    for old in [base, *stale]:  # older generations, and the unversioned files of version 1
        tensor_path, meta_path = _paths(old)
        for path in (tensor_path, meta_path, _ann_path(tensor_path)):
            path.unlink(missing_ok=True)
    for tmp in base.parent.glob(f".{glob.escape(base.name)}*.tmp"):  # left by a kill -9
        tmp.unlink(missing_ok=True)
    return generation


def load_index_set(
    base: str | os.PathLike, read_manifest: Callable[[], dict]
) -> tuple[dict, EmbeddingIndex]:
    """``(manifest, index)`` of the generation the manifest names (written by
    :func:`save_index_set`; a manifest without ``generation`` names ``<base>`` itself).
    Read again once if a concurrent update switched generations in between."""
    base = Path(base)
    manifest = read_manifest()
    for _ in range(2):
        try:
            return manifest, EmbeddingIndex.load(_generation_base(base, manifest.get("generation")))
        except FileNotFoundError:
            manifest = read_manifest()  # switched (and the old files removed) meanwhile
    return manifest, EmbeddingIndex.load(_generation_base(base, manifest.get("generation")))


@torch.no_grad()
def retrieval_metrics(
    image_emb: torch.Tensor,
    text_emb: torch.Tensor,
    texts_per_image: int | Sequence[int] = 1,
    ks: Sequence[int] = (1, 5, 10),
    chunk_size: int = 1024,
) -> dict[str, float]:
    """Recall@k both ways for paired embeddings (cosine similarity).

    Captions are grouped by image: image ``i`` owns the next ``texts_per_image[i]`` rows of
    ``text_emb`` (an int means the same count for every image). ``image_to_text_R@k`` is
    the fraction of images with at least one of their captions in the top k;
    ``text_to_image_R@k`` the fraction of captions whose image is in the top k. Images
    are processed ``chunk_size`` at a time.
    """
    B, T = image_emb.shape[0], text_emb.shape[0]
    counts = [texts_per_image] * B if isinstance(texts_per_image, int) else list(texts_per_image)
    if len(counts) != B or sum(counts) != T or min(counts, default=1) < 1:
        raise ValueError(
            f"texts_per_image must give each of the {B} images >= 1 caption, summing to the "
            f"{T} captions; got {texts_per_image}"
        )
    owner = torch.repeat_interleave(torch.arange(B), torch.tensor(counts))  # (T,) image per text
    img = F.normalize(image_emb.float(), dim=-1)
    txt = F.normalize(text_emb.float(), dim=-1)
    i2t_rank = torch.empty(B, dtype=torch.long)
    t2i_rank = torch.zeros(T, dtype=torch.long)
    t_pos = (img[owner] * txt).sum(-1)  # (T,) similarity of each caption to its own image
    for start in range(0, B, chunk_size):
        sims = img[start : start + chunk_size] @ txt.T  # (c, T)
        rows = torch.arange(start, start + sims.shape[0])
        own = owner.unsqueeze(0) == rows.unsqueeze(1)  # (c, T) captions of each image
        best = sims.masked_fill(~own, float("-inf")).amax(dim=1, keepdim=True)  # (c, 1)
        i2t_rank[rows] = (sims > best).sum(dim=1)
        t2i_rank += ((sims > t_pos.unsqueeze(0)) & ~own).sum(dim=0)  # other images ranked above
    out = {}
    for k in ks:
        out[f"image_to_text_R@{k}"] = (i2t_rank < k).float().mean().item()
        out[f"text_to_image_R@{k}"] = (t2i_rank < k).float().mean().item()
    return out


@torch.no_grad()
def evaluate_retrieval(
    model: CLIP,
    batches: Iterable[Sequence[torch.Tensor]],
    ks: Sequence[int] = (1, 5, 10),
    device: str | torch.device | None = None,
) -> dict[str, float]:
    """:func:`retrieval_metrics` (one caption per image) of the embeddings of
    ``(images (B, C, H, W), tokens (B, L))`` batches; ``{}`` when there is no batch.

    Put the model in eval mode first. ``device``: where the inputs go (default: the model's).
    """
    if device is None:
        device = next(model.parameters()).device
    img, txt = [], []
    for images, tokens in batches:
        img.append(model.encode_image(images.to(device), normalize=True))  # (B, E)
        txt.append(model.encode_text(tokens.to(device), normalize=True))  # (B, E)
    return retrieval_metrics(torch.cat(img), torch.cat(txt), ks=ks) if img else {}
