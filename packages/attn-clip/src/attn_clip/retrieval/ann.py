"""The approximate (faiss) index of an EmbeddingIndex: chosen, built, tuned, searched, read.

IVF-PQ with 4-bit fast-scan codes, or HNSW when the memory budget holds the vectors (the
choice follows the size and the budget, as autofaiss does), trained on a sample and tuned
to a recall@10 target against exact search. Candidates are re-ranked with the exact
(memory-mapped) embeddings, so the scores returned are exact cosines. faiss is imported
only here, and only when used.

The functions take the ``EmbeddingIndex`` they work on as their first argument (its
``ann`` / ``ann_info`` attributes, ``_matrix()`` and ``_exact_search``).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import math
import time
import warnings
from pathlib import Path

import numpy as np
import torch

from .errors import IndexFormatError

__all__ = ["build", "check_factory", "choose_factory", "file_of", "ivf_lists", "load", "search"]

SUFFIX = ".faiss"
_ADD_ROWS = 65_536  # rows per faiss add() call


def file_of(tensor_path: Path) -> Path:
    """Where the approximate index of ``<name>.safetensors`` lives: ``<name>.faiss``."""
    return tensor_path.with_suffix(SUFFIX)


def search(
    index, q: torch.Tensor, k: int, nprobe: int | None, rerank: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Candidates from ``index.ann`` (an EmbeddingIndex's approximate index) for normalized
    ``(Q, D)`` queries, scored exactly against the stored rows: ``(scores, rows)``."""
    import faiss

    info = index.ann_info or {}
    nprobe = nprobe or info.get("nprobe")
    rerank = rerank or info.get("rerank", 100)
    xb, qn = index._matrix(), np.ascontiguousarray(q.numpy())
    n_cand = min(len(index), max(rerank, 2 * k))
    with _faiss_threads(1 if len(qn) <= 8 else None):
        _, cand = index.ann.search(qn, n_cand, params=_search_params(index.ann, nprobe))
    ip = np.empty(cand.shape, dtype=np.float32)  # exact <q, x> of each candidate
    faiss.fvec_inner_products_by_idx(
        faiss.swig_ptr(ip), faiss.swig_ptr(qn), faiss.swig_ptr(xb), faiss.swig_ptr(cand),
        index.dim, qn.shape[0], n_cand,
    )  # fmt: skip
    ip[cand < 0] = -np.inf  # fewer candidates than asked for
    top = np.argsort(-ip, axis=1, kind="stable")[:, :k]
    scores, idx = np.take_along_axis(ip, top, 1), np.take_along_axis(cand, top, 1)
    short = np.flatnonzero((idx < 0).any(axis=1))
    if short.size:  # too few candidates (tiny lists): exact search for those queries
        s, i = index._exact_search(q[torch.from_numpy(short)], k, 65_536)
        scores[short], idx[short] = s.numpy(), i.numpy()
    return torch.from_numpy(scores), torch.from_numpy(idx).long()


@torch.no_grad()
def build(
    embeddings,
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
    """Build and tune the approximate index of ``embeddings`` (an EmbeddingIndex), attach
    it as its ``ann`` / ``ann_info`` and return the info: see ``EmbeddingIndex.build_ann``."""
    import faiss

    n, d = len(embeddings), embeddings.dim
    if n == 0:
        raise ValueError("the index is empty: add() embeddings first")
    budget = memory_budget if memory_budget is not None else n * d * 4 // 8
    factory = factory or choose_factory(n, d, budget)
    xb = embeddings._matrix()
    started = time.perf_counter()
    reused = trained is not None and getattr(trained, "d", None) == d
    if reused:
        index = faiss.clone_index(trained)
        index.reset()  # keeps the training (centroids, codebooks), drops the vectors
    else:
        try:
            index = faiss.index_factory(d, factory, faiss.METRIC_INNER_PRODUCT)
        except RuntimeError as e:
            raise ValueError(f"bad faiss index factory {factory!r}: {_faiss_message(e)}") from None
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
    for start in range(0, n, _ADD_ROWS):
        index.add(xb[start : start + _ADD_ROWS])
    build_s = time.perf_counter() - started
    info = {
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
    embeddings.ann, embeddings.ann_info = index, info
    info.update(_tune(embeddings, target_recall, check_queries, seed))
    return info


def _tune(embeddings, target: float, check_queries: int, seed: int, k: int = 10) -> dict:
    """The smallest power-of-two nprobe (efSearch) whose recall@k reaches ``target`` on
    stored rows used as queries (their own row left out), and that recall."""
    import faiss

    n = len(embeddings)
    k = min(k, n - 1)
    if k < 1:
        return {"nprobe": 1, "recall_at_10": 1.0, "check_queries": 0}
    rng = np.random.default_rng(seed + 1)
    rows = np.sort(rng.choice(n, min(check_queries, n), replace=False))
    xb = embeddings._matrix()
    q = np.ascontiguousarray(xb[rows])
    exact_s, exact_i = faiss.knn(q, xb, k + 1, metric=faiss.METRIC_INNER_PRODUCT)
    kth = np.array([s[i != r][k - 1] for s, i, r in zip(exact_s, exact_i, rows, strict=True)])
    kind = _ann_kind(embeddings.ann)
    if kind == "ivf":
        top = faiss.try_extract_index_ivf(embeddings.ann).nlist
        values = [v for v in (2**i for i in range(20)) if v < top] + [top]
    elif kind == "hnsw":
        values = [16, 32, 64, 128, 256, 512, 1024]
    else:
        values = [None]
    best = (-1.0, None)
    for value in values:
        s, i = search(embeddings, torch.from_numpy(q), k + 1, value)
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


def check_factory(dim: int, factory: str) -> None:
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


def load(info: dict, tensor_path: Path, meta_path: Path, verify: bool):
    """The approximate index named in a sidecar: its bytes checked against the recorded
    SHA-256, then handed to faiss's reader (a native format: no code is run)."""
    ann_path = file_of(tensor_path)
    if not isinstance(info, dict) or info.get("file") != ann_path.name:
        raise IndexFormatError(
            f"{meta_path}: a malformed 'ann' entry (expected file {ann_path.name})"
        )
    if not ann_path.is_file():
        raise FileNotFoundError(f"approximate index file missing: {ann_path}")
    data = ann_path.read_bytes()
    if verify and hashlib.sha256(data).hexdigest() != info.get("sha256"):
        raise IndexFormatError(
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
        raise IndexFormatError(f"corrupt approximate index {ann_path}: {e}") from None
    if index.metric_type != faiss.METRIC_INNER_PRODUCT:
        raise IndexFormatError(f"approximate index {ann_path} does not use inner products")
    return index, {k: v for k, v in info.items() if k not in ("file", "sha256")}


def ivf_lists(n: int) -> int:
    """IVF lists for ``n`` vectors: the power of two nearest ``4 * sqrt(n)``, with at least 39
    training points per list (faiss's k-means minimum)."""
    lists = 2 ** round(math.log2(max(1.0, 4 * math.sqrt(n))))
    while lists > 1 and n < 39 * lists:
        lists //= 2
    return lists


def choose_factory(n: int, dim: int, memory_budget: int) -> str:
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
