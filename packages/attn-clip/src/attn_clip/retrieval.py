"""Embedding search and retrieval metrics.

Shape legend: ``N`` indexed vectors, ``Q`` queries, ``D`` embedding width, ``B`` images,
``T`` captions.

``EmbeddingIndex`` keeps L2-normalized embeddings with string ids (file paths,
captions, ...), answers exact cosine top-k in chunks so memory stays at
``O(Q * chunk_size)``, uses faiss (``IndexFlatIP``, exact as well) for large indexes when
it is installed, and saves as ``<name>.safetensors`` + a ``<name>.json`` sidecar holding the
ids and a SHA-256 of the tensor file, so a corrupt or truncated index is detected on load.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import importlib.util
import json
import os
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from attn_core import hub

if TYPE_CHECKING:
    from .model import CLIP

__all__ = [
    "EmbeddingIndex",
    "IndexBusyError",
    "SearchResult",
    "evaluate_retrieval",
    "index_lock",
    "load_index_set",
    "retrieval_metrics",
    "save_index_set",
]

FORMAT = "attn_clip.EmbeddingIndex"
VERSION = 1


@dataclass
class SearchResult:
    """Top-k hits per query, best first."""

    scores: torch.Tensor  # (Q, k) cosine similarities
    indices: torch.Tensor  # (Q, k) row numbers in the index
    ids: list[list[str]]  # (Q, k) ids of those rows


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


class EmbeddingIndex:
    """Exact cosine-similarity index over ``(N, D)`` embeddings with string ids."""

    def __init__(self, dim: int, *, faiss_threshold: int = 200_000) -> None:
        if dim <= 0:
            raise ValueError(f"dim must be positive, got {dim}")
        self.dim = dim
        self.faiss_threshold = faiss_threshold
        self.ids: list[str] = []
        self._chunks: list[torch.Tensor] = []
        self._faiss = None

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def embeddings(self) -> torch.Tensor:
        """All stored (normalized, float32) embeddings ``(N, D)``."""
        if len(self._chunks) != 1:
            empty = torch.empty(0, self.dim)
            self._chunks = [torch.cat(self._chunks) if self._chunks else empty]
        return self._chunks[0]

    def add(self, embeddings: torch.Tensor, ids: Sequence[str] | None = None) -> None:
        """Append ``(n, D)`` embeddings (normalized here) with their ids (default: row numbers)."""
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
        self._faiss = None

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
    ) -> SearchResult:
        """Top-``k`` rows by cosine similarity for ``(Q, D)`` (or ``(D,)``) queries.

        Exact either way: chunked matrix products (peak memory ``Q * chunk_size``) or,
        for indexes of at least ``faiss_threshold`` rows when faiss is installed, faiss's
        flat inner-product index. ``use_faiss`` forces the choice.
        """
        if len(self) == 0:
            raise ValueError("the index is empty: add() embeddings first")
        q = queries.reshape(1, -1) if queries.ndim == 1 else queries
        if q.ndim != 2 or q.shape[1] != self.dim:
            raise ValueError(f"queries must be (Q, {self.dim}), got {tuple(queries.shape)}")
        if k <= 0:
            raise ValueError(f"k must be positive, got {k}")
        q = F.normalize(q.detach().to("cpu", torch.float32), dim=-1)
        k = min(k, len(self))
        if self._use_faiss(use_faiss):
            scores, idx = self._faiss_search(q, k)
        else:
            scores, idx = self._exact_search(q, k, chunk_size)
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
        import faiss

        if self._faiss is None:
            self._faiss = faiss.IndexFlatIP(self.dim)
            self._faiss.add(self.embeddings.numpy())
        scores, idx = self._faiss.search(q.numpy(), k)
        return torch.from_numpy(scores), torch.from_numpy(idx).long()

    def save(self, path: str | os.PathLike) -> tuple[Path, Path]:
        """Write ``<path>.safetensors`` and the ``<path>.json`` sidecar (atomically)."""
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
        with hub.atomic_write(meta_path, "w") as f:
            json.dump(meta, f)
        return tensor_path, meta_path

    @classmethod
    def load(cls, path: str | os.PathLike, *, verify: bool = True) -> EmbeddingIndex:
        """Read an index written by :meth:`save`.

        Raises ``FileNotFoundError`` for a missing file and ``ValueError`` (saying which
        file and what is wrong) for a corrupt, truncated or mismatched one.
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
        from safetensors.torch import load_file

        try:
            emb = load_file(str(tensor_path))["embeddings"]
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
        return index


def _check_embeddings(emb: torch.Tensor, path: Path) -> None:
    """Stored embeddings must be finite, floating point and L2-normalized (a file that
    passes its checksum can still hold anything)."""
    if not emb.is_floating_point():
        raise ValueError(f"embedding index {path} holds {emb.dtype} embeddings, not floats")
    if not bool(torch.isfinite(emb).all()):
        raise ValueError(f"embedding index {path} holds NaN or infinite embeddings")
    norms = emb.float().norm(dim=-1)
    if emb.shape[0] and not bool(((norms - 1).abs() < 1e-3).all()):
        raise ValueError(
            f"embedding index {path} holds embeddings that are not L2-normalized (norms "
            f"{norms.min().item():.4g} .. {norms.max().item():.4g})"
        )


# -- an index on disk, replaced as a set ------------------------------------------------------


def _generation_base(base: Path, generation: int | None) -> Path:
    """Where generation ``generation`` keeps its EmbeddingIndex files (None: ``base``)."""
    return base if generation is None else base.with_name(f"{base.name}.g{generation}")


def _generations_on_disk(base: Path) -> set[int]:
    pattern = re.compile(re.escape(base.name) + r"\.g(\d+)\.(?:safetensors|json)$")
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

    The embeddings go to ``<base>.g<N>.safetensors`` / ``.json`` (a generation no manifest
    names yet); then ``manifest`` (with ``"generation": N``) replaces ``manifest_path`` in
    one rename -- the switch; then older generations and temporary files of earlier crashed
    runs are removed. Killed at any point, the index on disk is the old one or the new one.
    Call it holding :func:`index_lock`. Returns ``N``.
    """
    base = Path(base)
    generation = max(_generations_on_disk(base), default=0) + 1
    index.save(_generation_base(base, generation))
    with hub.atomic_write(manifest_path, "w") as f:
        json.dump({**manifest, "generation": generation}, f, indent=1, ensure_ascii=False)
    stale = [_generation_base(base, g) for g in _generations_on_disk(base) - {generation}]
    for old in [base, *stale]:  # older generations, and the unversioned files of version 1
        for path in _paths(old):
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
