"""``RetrievalIndex``: an index of a folder of images, driven from Python.

    from attn_clip.retrieval import RetrievalIndex

    index = RetrievalIndex.create("photos.idx", "ViT-B-32", "openai")
    index.update("photos/")                       # embeds every image, writes the index
    index = RetrievalIndex.open("photos.idx")     # later: the model comes with it
    index.update("photos/")                       # embeds only new and changed files
    for hit in index.search("a dog on a beach", k=5):
        print(f"{hit.score:.3f} {hit.path}")

An image-only backbone indexes as well (:mod:`.backbone`: DINOv2 and the other attn_vision
models), searched by image only::

    index = RetrievalIndex.create("photos.idx", "hf-hub:facebook/dinov2-small")
    index.update("photos/")
    hits = index.search(Path("query.jpg"), k=5)   # a text query: RetrievalError

Webdataset tar shards index as well (:mod:`.tars`: ids ``shard/key``, captions kept)::

    index.update("data/{00000..00009}.tar")
    hit = index.search("a red circle")[0]       # hit.id "00003/000030012", hit.caption,
                                                # hit.path the tar, hit.key its sample

A CoCa model can caption each image as it is indexed (a folder; kept in the manifest)::

    index = RetrievalIndex.create("photos.idx", "demo-shapes-coca", "shapes", caption=True)
    index.update("photos/")                     # later updates caption new files too
    hit = index.search("a red circle")[0]       # hit.caption: "a circle in red"

The files are the retrieval app's (``apps/retrieval.py index`` writes the same index).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from attn_vision.images import check_folder, open_image

from .embed import IndexModel
from .errors import ModelMismatchError, RetrievalError
from .fingerprint import ModelRecord
from .index import EmbeddingIndex
from .manifest import Manifest, index_base
from .options import AnnOptions, rank_device, torchrun_rank
from .shards import update_distributed
from .store import index_lock, load_index_set
from .tars import is_shard_list, list_tars, update_tars
from .update import UpdateResult, update_folder

__all__ = ["Hit", "RetrievalIndex"]

Query = str | os.PathLike | Any  # a text, an image file (a Path), or a PIL image


@dataclass
class Hit:
    """One search result."""

    id: str  # the file's path relative to the indexed folder (shards: "shard/key")
    path: Path  # where the file is (the folder + id; shards: the tar file)
    score: float  # cosine similarity
    prob: float | None = None  # SigLIP models, text queries: sigmoid p(match)
    caption: str | None = None  # shards: the sample's (txt); captioned folder index: generated
    key: str | None = None  # shards: the sample's key in the tar at ``path``


def _warn(message: str) -> None:
    warnings.warn(message, stacklevel=3)


class RetrievalIndex:
    """The index at ``base`` (``photos.idx``: files ``photos.idx.*``) and the model that made
    it. :meth:`open` an existing one or :meth:`create` a new one, then :meth:`update` it
    from a folder and :meth:`search` it by text or image."""

    def __init__(
        self,
        base: str | os.PathLike,
        manifest: Manifest | None = None,
        embeddings: EmbeddingIndex | None = None,
        model: IndexModel | None = None,
        *,
        device: str | torch.device | None = None,
        precision: str | None = None,
    ) -> None:
        self.base = index_base(base)
        self.manifest, self.embeddings = manifest, embeddings
        self._model = model
        self.device, self.precision = device, precision
        self._caption = False  # a new index: caption its images (create(caption=True))

    @classmethod
    def open(
        cls,
        path: str | os.PathLike,
        model: IndexModel | None = None,
        *,
        device: str | torch.device | None = None,
        precision: str | None = None,
    ) -> RetrievalIndex:
        """The index at ``path``; its model is built when first needed (or ``model`` is
        used, checked to be the recorded one). Errors: ``IndexNotFoundError``,
        ``IndexFormatError``, ``ModelMismatchError`` (all ``ValueError``)."""
        manifest, embeddings = load_index_set(path)
        index = cls(path, manifest, embeddings, device=device, precision=precision)
        if model is not None:
            index.model = model
        return index

    @classmethod
    def create(
        cls,
        path: str | os.PathLike,
        model: IndexModel | str,
        pretrained: str | None = None,
        *,
        device: str | torch.device | None = None,
        precision: str = "fp32",
        caption: bool = False,
    ) -> RetrievalIndex:
        """A new, empty index of ``model`` (an :class:`IndexModel`, or a model name built
        with ``pretrained`` weights: a CLIP or an image-only backbone, by
        :func:`.backbone.model_kind`'s rule); nothing is written before :meth:`update`, which then
        replaces any index at ``path``. ``caption``: a CoCa ``model`` also captions each
        image of a folder (greedy, ``CoCa.caption``'s; the image tower runs once for both),
        and every later update captions the new and changed ones (:attr:`Hit.caption`)."""
        if not Path(path).resolve().parent.is_dir():
            raise RetrievalError(f"folder {Path(path).parent} does not exist")
        if isinstance(model, str):
            model = IndexModel.load(model, pretrained, device=device, precision=precision)
        index = cls(path, model=model, device=device, precision=precision)
        if caption:
            index._check_caption(model)
        index._caption = caption
        return index

    @property
    def captions(self) -> bool:
        """Whether the index keeps a generated caption of each image."""
        return self.manifest.captions if self.manifest is not None else self._caption

    def _check_caption(self, model: IndexModel) -> None:
        if not model.can_caption:
            raise RetrievalError(f"captions need a CoCa model; {model.describe()} is not one")

    @property
    def record(self) -> ModelRecord | None:
        """The recorded model (None for a new index not written yet)."""
        return self.manifest.model if self.manifest is not None else None

    @property
    def root(self) -> Path | None:
        return Path(self.manifest.root) if self.manifest is not None else None

    def __len__(self) -> int:
        return len(self.embeddings) if self.embeddings is not None else 0

    @property
    def model(self) -> IndexModel:
        """The index's model (the recorded one is built on first use)."""
        if self._model is None:
            if self.record is None:
                raise RetrievalError(f"{self.base}: a new index needs a model (create())")
            self._model = IndexModel.from_record(self.record, device=self.device,
                                                 precision=self.precision)  # fmt: skip
        return self._model

    @model.setter
    def model(self, model: IndexModel) -> None:
        if self.record is not None:
            if (model.name, model.pretrained) != (self.record.name, self.record.pretrained):
                raise ModelMismatchError(
                    f"{self.base} was built with {self.record.describe()}, not "
                    f"{ModelRecord(model.name, model.pretrained, 0, []).describe()}: its "
                    "embeddings only make sense with that model"
                )
            self.record.check(model)
        self._model = model

    # -- update ------------------------------------------------------------------------------

    def update(
        self,
        folder: str | os.PathLike,
        *,
        batch_size: int = 32,
        workers: int = 4,
        ann: AnnOptions | None = None,
        shard_size: int = 1024,
        progress: bool = True,
        warn: Callable[[str], None] = _warn,
        load_model: Callable[[ModelRecord], IndexModel] | None = None,
        caption: bool = False,
    ) -> UpdateResult | None:
        """Bring the index up to date with ``folder`` (searched recursively; or webdataset
        tar shards, ``"data/{00000..00009}.tar"``: see :mod:`.tars`): keep the rows
        of unchanged files, embed new and changed ones, drop removed ones; write it as a new
        generation, holding the index's lock (``IndexBusyError`` when another process
        holds it). ``ann``: whether to add an approximate index (default: from 100,000
        images on, when faiss is installed). ``warn``: called with each unreadable file.

        Under ``torchrun`` every rank calls this: the work is split in shards of
        ``shard_size`` files, other ranks build the recorded model with ``load_model``
        (default :meth:`IndexModel.load` of its name and weights; its fingerprint is
        checked), and rank 0 alone gets the result (the others None).

        ``caption=True``: as :meth:`create`'s (a new index), or a check that the index
        keeps captions; an index that does captions its new and changed images anyway.
        Captioning needs a CoCa, a folder (shards keep their own captions) and one process
        (no torchrun), else a :class:`RetrievalError` before anything is written."""
        if caption and self.manifest is not None and not self.manifest.captions:
            raise RetrievalError(f"{self.base} was built without captions: rebuild it with "
                                 "captions (not an update) to caption every image")  # fmt: skip
        captions = caption or self.captions
        tars = None
        if is_shard_list(folder):
            root, tars = list_tars(folder)
        else:
            root = Path(folder)
            check_folder(root)
            root = root.resolve()
        if captions:
            if tars is not None:
                raise RetrievalError("captions are generated for a folder of images: "
                                     "webdataset shards keep their own (txt)")  # fmt: skip
            if torchrun_rank() is not None:
                raise RetrievalError("captions are generated in one process, not under torchrun")
            self._check_caption(self.model)
        ann = ann or AnnOptions()
        how = {"ann_options": ann, "batch_size": batch_size, "workers": workers, "warn": warn}
        if torchrun_rank() is not None:
            load = load_model or self._load_on_rank
            result = update_distributed(self.base, root, lambda: self.model, self._reload, load,
                                        shard_size=shard_size, tars=tars, **how)  # fmt: skip
        else:
            with index_lock(self.base):
                old = self._reload()
                if tars is not None:
                    result = update_tars(self.base, os.fspath(folder), self.model, old,
                                         progress=progress, **how)  # fmt: skip
                else:
                    result = update_folder(self.base, root, self.model, old, progress=progress,
                                           caption=captions, **how)  # fmt: skip
        if result is not None:
            self.manifest, self.embeddings = result.manifest, result.embeddings
        return result

    def _reload(self) -> tuple[Manifest, EmbeddingIndex] | None:
        """The index as it is on disk now (another process may have updated it), or None for
        a new one."""
        if self.manifest is None:
            return None
        manifest = Manifest.read(self.base)
        if self.embeddings is None or manifest.generation != self.manifest.generation:
            self.manifest, self.embeddings = load_index_set(self.base)
        return self.manifest, self.embeddings

    def _load_on_rank(self, record: ModelRecord) -> IndexModel:
        """The recorded model on another torchrun rank (on GPUs: its ``cuda:LOCAL_RANK``)."""
        device = self.device if self.device is not None else rank_device()
        precision = self.precision or record.precision or "fp32"
        return IndexModel.load(record.name, record.pretrained, device=device, precision=precision,
                               kind=record.kind)  # fmt: skip

    def unchanged_embeddings(self) -> dict[Path, torch.Tensor]:
        """``{absolute path: embedding}`` of the indexed files still as they were indexed
        (same size and mtime): what need not be embedded again."""
        out = {}
        if self.manifest is None or self.embeddings is None or self.manifest.shards is not None:
            return out  # (a shard index's samples are no files)
        for row, rel in enumerate(self.embeddings.ids):
            p, info = self.root / rel, self.manifest.files[rel]
            st = p.stat() if p.is_file() else None
            if st and (st.st_size, st.st_mtime_ns) == (info["size"], info["mtime_ns"]):
                out[p.resolve()] = self.embeddings.embeddings[row]
        return out

    # -- search ------------------------------------------------------------------------------

    def embed_queries(self, queries: Sequence[Query], batch_size: int = 32) -> torch.Tensor:
        """``(Q, E)`` normalized embeddings of text (``str``) and image (a path or a PIL
        image) queries, in order. A text query of an image-only model's index is a
        :class:`RetrievalError` (raised before any model is built)."""
        texts = [(i, q) for i, q in enumerate(queries) if isinstance(q, str)]
        record = self.record
        if texts and record is not None and not record.has_text:
            raise RetrievalError(
                f"this index's model {record.describe()} has no text tower: search it by image"
            )
        model = self.model
        images = [(i, q) for i, q in enumerate(queries) if not isinstance(q, str)]
        rows: list[torch.Tensor | None] = [None] * len(queries)
        if texts:
            for (i, _), emb in zip(texts, model.embed_texts([q for _, q in texts], batch_size),
                                   strict=True):  # fmt: skip
                rows[i] = emb
        if images:
            pil = [open_image(q) if isinstance(q, os.PathLike) else q for _, q in images]
            for (i, _), emb in zip(images, model.embed_pil(pil), strict=True):
                rows[i] = emb
        return torch.stack(rows)

    def search_many(
        self,
        queries: Sequence[Query],
        k: int = 10,
        *,
        exact: bool = False,
        nprobe: int | None = None,
        batch_size: int = 32,
    ) -> list[list[Hit]]:
        """The top-``k`` hits of each query (best first); see :meth:`search`."""
        if self.embeddings is None or not len(self.embeddings):
            raise RetrievalError(f"{self.base}: the index is empty: update() it from a folder")
        from ..zero_shot import match_probability

        q = self.embed_queries(queries, batch_size)
        found = self.embeddings.search(q, k=k, exact=exact, nprobe=nprobe)
        model = self.model
        probs = match_probability(model.model, found.scores) if model.has_text else None
        return [
            [
                self._hit(
                    rel,
                    float(found.scores[i, j]),
                    float(probs[i, j]) if probs is not None and isinstance(query, str) else None,
                )  # fmt: skip
                for j, rel in enumerate(ids)
            ]
            for i, (query, ids) in enumerate(zip(queries, found.ids, strict=True))
        ]

    def _hit(self, id: str, score: float, prob: float | None) -> Hit:
        """A hit on ``id``: a file below the folder, or a shard index's sample (its tar)."""
        tar = self.manifest.shard_file(id)
        if tar is None:
            return Hit(id, self.root / id, score, prob, self.manifest.caption(id))
        return Hit(id, tar, score, prob, self.manifest.caption(id), id.split("/", 1)[1])

    def search(self, query: Query, k: int = 10, **kwargs) -> list[Hit]:
        """The top-``k`` images for a text (``str``; not with an image-only model) or an image
        (a ``Path`` or a PIL image), best first, with cosine similarities (SigLIP models: text
        queries also get the sigmoid ``prob`` of a match). ``exact=True`` skips an
        approximate index; ``nprobe``: how much of it to scan (default: tuned when it was
        built)."""
        return self.search_many([query], k, **kwargs)[0]
