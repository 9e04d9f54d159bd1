"""Retrieval metrics: recall@k both ways for paired image / text embeddings.

Shape legend: ``B`` images, ``T`` captions, ``E`` embedding width.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from ..model import CLIP

__all__ = ["evaluate_captions", "evaluate_retrieval", "retrieval_metrics"]


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


def evaluate_captions(
    model,
    pairs: Iterable[tuple[Path, str]],
    known: dict[Path, torch.Tensor] | None = None,
    *,
    batch_size: int = 32,
    workers: int = 4,
    progress: bool = True,
) -> dict[str, float]:
    """:func:`retrieval_metrics` of ``(image path, caption)`` pairs (e.g.
    ``attn_vision.images.read_captions_csv``), the captions grouped by image in first-seen
    order, embedded by ``model`` (an ``IndexModel``); ``known``: embeddings to reuse (e.g.
    ``RetrievalIndex.unchanged_embeddings()``). Adds ``images`` and ``captions`` counts; an
    unreadable image is an ``ImageError``; an image-only model (no text tower) a
    ``RetrievalError``, before any image is read."""
    from .embed import embed_files
    from .errors import RetrievalError

    if not model.has_text:
        raise RetrievalError(
            f"{model.describe()} has no text tower: recall@k ranks captions, which need one"
        )

    groups: dict[Path, list[str]] = {}
    for path, caption in pairs:
        groups.setdefault(Path(path).resolve(), []).append(caption)
    paths, captions = list(groups), [c for caps in groups.values() for c in caps]
    image_emb = embed_files(model, paths, known, batch_size=batch_size, workers=workers,
                            progress=progress)  # fmt: skip
    text_emb = model.embed_texts(captions, batch_size)
    counts = [len(caps) for caps in groups.values()]
    metrics = retrieval_metrics(image_emb, text_emb, texts_per_image=counts)
    return {"images": len(paths), "captions": len(captions), **metrics}
