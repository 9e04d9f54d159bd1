"""Embedding for an index: the model bundle, the image loop over a folder, text queries.

:class:`IndexModel` is a CLIP with its transforms, or an image-only attn_vision backbone
(``kind="vision"``, :mod:`.backbone`: DINOv2, a ViT, ...; no tokenizer, no text queries),
and what identifies its weights (the name and tag recorded in the manifest). Both embed
images through :meth:`IndexModel.encode_images` in the one loop below.
:func:`embed_images` reads and embeds image files in batches: ``workers`` threads decode
(JPEGs in Pillow's draft mode, at the smallest scale that still covers the model's input)
and preprocess up to two batches ahead of the model, so decoding goes on while the model
runs and memory stays bounded.
"""

from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from attn_vision.images import ImageError, iter_images

from .backbone import load_backbone, model_kind, pooled
from .errors import RetrievalError
from .fingerprint import KINDS, PROBE_TEXT, ModelRecord, describe_model, probe_image

__all__ = ["IndexModel", "draft_size", "embed_files", "embed_images", "embed_stream", "read_ahead"]


@dataclass
class IndexModel:
    """A model ready to embed for an index (the fields of the apps' ``LoadedModel``, and
    its kind): a CLIP, or an image-only attn_vision backbone (``kind="vision"``, whose
    ``tokenizer`` is None)."""

    model: Any  # attn_clip.CLIP, or an attn_vision model; in eval mode
    preprocess: Any  # PIL image -> (3, H, W)
    tokenizer: Any  # list[str] -> (n, L); None for an image-only model
    name: str  # what identifies the weights: the model name (or absolute folder)
    pretrained: str | None  # tag or absolute path
    device: torch.device
    precision: str = "fp32"
    kind: str = "clip"  # one of fingerprint.KINDS

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")

    @classmethod
    def load(
        cls,
        name: str,
        pretrained: str | None = None,
        *,
        device: str | torch.device | None = None,
        precision: str = "fp32",
        kind: str | None = None,
    ) -> IndexModel:
        """Build ``name`` with ``pretrained`` weights: a CLIP
        (``attn_clip.create_model_and_transforms``) or an image-only attn_vision model
        (:func:`.backbone.load_backbone`: a folder or ``hf-hub:`` name's own weights, a timm
        name's for its tag); their errors as they are. ``kind``: which (default: by
        :func:`.backbone.model_kind`'s rule). ``device``: default cuda when available."""
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        device = torch.device(device)
        kind = kind or model_kind(name)
        if kind == "vision":
            model, preprocess = load_backbone(name, pretrained, device=device,
                                              precision=precision)  # fmt: skip
            return cls(model, preprocess, None, name, pretrained, device, precision, kind)
        from ..factory import create_model_and_transforms

        model, preprocess, tokenizer = create_model_and_transforms(
            name, pretrained, device=device, precision=precision
        )
        return cls(model.eval(), preprocess, tokenizer, name, pretrained, device, precision)

    @classmethod
    def from_record(
        cls,
        record: ModelRecord,
        *,
        device: str | torch.device | None = None,
        precision: str | None = None,
    ) -> IndexModel:
        """The model an index was built with (:class:`~.errors.ModelMismatchError` when its
        weights no longer give the recorded embeddings)."""
        precision = precision or record.precision or "fp32"
        loaded = cls.load(record.name, record.pretrained, device=device, precision=precision,
                          kind=record.kind)  # fmt: skip
        record.check(loaded)
        return loaded

    @property
    def has_text(self) -> bool:
        """Whether texts can be embedded (a CLIP; an image-only model has no text tower)."""
        return self.kind == "clip"

    def describe(self) -> str:
        return describe_model(self.name, self.pretrained)

    def record(self) -> ModelRecord:
        """What a manifest records about this model."""
        return ModelRecord.of(self)

    def probe_embedding(self) -> torch.Tensor:
        """``(E,)``: the normalized embedding the manifest keeps to recognise these weights
        (a CLIP's of :data:`~.fingerprint.PROBE_TEXT`, an image-only model's of
        :func:`~.fingerprint.probe_image`)."""
        if self.has_text:
            return self.embed_texts([PROBE_TEXT])[0]
        return self.embed_pil([probe_image()])[0]

    def encode_images(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, 3, H, W)`` preprocessed images (on the model's device) -> ``(B, E)``
        normalized embeddings: a CLIP's image embedding, a backbone's pooled features."""
        if self.has_text:
            return self.model.encode_image(x, normalize=True)
        return pooled(self.model, x)

    @property
    def can_caption(self) -> bool:
        """Whether the model writes captions (a CoCa: :meth:`encode_and_caption`)."""
        from ..coca import CoCa

        return isinstance(self.model, CoCa)

    @torch.no_grad()
    def encode_and_caption(self, x: torch.Tensor) -> tuple[torch.Tensor, list[str]]:
        """A CoCa: ``(B, 3, H, W)`` preprocessed images -> ``(B, E)`` normalized embeddings
        (:meth:`encode_images`') and each image's greedy caption (``CoCa.caption``'s),
        the image tower run once for both."""
        emb, tokens = self.model.encode_image_tokens(x)
        captions = self.model.decode(self.model.generate_from_tokens(tokens))
        return torch.nn.functional.normalize(emb, dim=-1), captions

    @torch.no_grad()
    def embed_texts(self, texts: list[str], batch_size: int = 32) -> torch.Tensor:
        """Normalized float32 text embeddings ``(len(texts), E)`` on the CPU
        (:class:`~.errors.RetrievalError` for an image-only model)."""
        if not self.has_text:
            raise RetrievalError(
                f"{self.describe()} has no text tower: it embeds images only (query by image)"
            )
        out = []
        for start in range(0, len(texts), batch_size):
            tokens = self.tokenizer(texts[start : start + batch_size]).to(self.device)
            out.append(self.model.encode_text(tokens, normalize=True).float().cpu())
        return torch.cat(out)

    @torch.no_grad()
    def embed_pil(self, images: list) -> torch.Tensor:
        """Normalized float32 embeddings ``(len(images), E)`` of PIL images, on the CPU."""
        x = torch.stack([self.preprocess(im) for im in images]).to(self.device)
        return self.encode_images(x).float().cpu()


def embed_images(
    model: IndexModel,
    paths: list[Path],
    *,
    batch_size: int = 32,
    workers: int = 4,
    desc: str = "embedding",
    progress: bool = True,
    captions: dict[Path, str] | None = None,
) -> Iterator[tuple[Path, torch.Tensor | None, str | None, str | None]]:
    """Yield ``(path, embedding (E,) or None, sha256, error)`` for each path in order, with
    a tqdm progress bar (``progress=False``: none). An unreadable file gets ``error`` (the
    image decoder's message) and no embedding. ``captions`` (a CoCa model): each embedded
    path's greedy caption is put there, before the path is yielded."""
    from tqdm import tqdm

    bar = tqdm(total=len(paths), unit="img", desc=desc, disable=None if progress else True)
    stream = iter_images(paths, workers, transform=model.preprocess, draft=draft_size(model))
    try:
        yield from embed_stream(model, stream, batch_size=batch_size, workers=workers, bar=bar,
                                captions=captions)  # fmt: skip
    finally:
        bar.close()


def draft_size(model: IndexModel) -> int | None:
    """The smallest side a JPEG may be decoded at for ``model``'s input (None: full size)."""
    return max(getattr(model.preprocess, "size", None) or (0,)) or None


def embed_stream(
    model: IndexModel,
    stream: Iterator[tuple],
    *,
    batch_size: int,
    workers: int,
    bar: Any,
    captions: dict | None = None,
) -> Iterator[tuple[Any, torch.Tensor | None, Any, str | None]]:
    """Embed ``(item, model input or None, extra, error or None)`` tuples in batches (read
    ``2 * batch_size`` ahead by a thread when ``workers``) and yield ``(item, embedding (E,)
    or None, extra, error)`` in order, counting them on the tqdm ``bar``. ``captions``: each
    embedded item's caption is put there too (:meth:`IndexModel.encode_and_caption`)."""
    if workers > 0:
        stream = read_ahead(stream, 2 * batch_size)
    try:
        while batch := list(itertools.islice(stream, batch_size)):
            good = [x for _, x, _, err in batch if err is None]
            embs = []
            if good:
                with torch.no_grad():
                    x = torch.stack(good).to(model.device)
                    if captions is None:
                        embs = model.encode_images(x).float().cpu()
                    else:
                        embs, texts = model.encode_and_caption(x)
                        embs = embs.float().cpu()
                        items = [item for item, _, _, err in batch if err is None]
                        captions.update(zip(items, texts, strict=True))
            it = iter(embs)
            for p, _, h, err in batch:
                yield (p, None, None, err) if err is not None else (p, next(it), h, None)
            bar.update(len(batch))
    finally:
        stream.close()


def embed_files(
    model: IndexModel,
    paths: list[Path],
    known: dict[Path, torch.Tensor] | None = None,
    *,
    batch_size: int = 32,
    workers: int = 4,
    progress: bool = True,
) -> torch.Tensor:
    """``(len(paths), E)`` embeddings of image files, those in ``known`` (e.g.
    :meth:`RetrievalIndex.unchanged_embeddings`) taken from it; an unreadable file is an
    ``ImageError``."""
    known = known or {}
    fresh = {}
    todo = [p for p in paths if p not in known]
    stream = embed_images(model, todo, batch_size=batch_size, workers=workers, desc="images",
                          progress=progress)  # fmt: skip
    for path, emb, _, error in stream:
        if error is not None:
            stream.close()
            raise ImageError(error)
        fresh[path] = emb
    return torch.stack([known[p] if p in known else fresh[p] for p in paths])


def read_ahead(items: Iterable, ahead: int) -> Iterator:
    """``items``, produced by a background thread at most ``ahead`` items ahead of the
    consumer (whose exceptions, Ctrl-C included, stop the producer)."""
    box: queue.Queue = queue.Queue(maxsize=ahead)
    stop, end = threading.Event(), object()

    def put(item) -> bool:
        while not stop.is_set():
            try:
                box.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for item in items:
                if not put(item):
                    return
            put(end)
        except BaseException as e:  # handed to the consumer, raised there
            put((end, e))
        finally:
            if hasattr(items, "close"):
                items.close()

    thread = threading.Thread(target=produce, daemon=True, name="read-ahead")
    thread.start()
    try:
        while (item := box.get()) is not end:
            if isinstance(item, tuple) and len(item) == 2 and item[0] is end:
                raise item[1]
            yield item
    finally:
        stop.set()
