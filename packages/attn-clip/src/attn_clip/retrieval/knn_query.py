"""Reading a ``/knn-service`` body as clip-retrieval's ``clip back`` does (see
:mod:`.server` for the API): :func:`parse_knn_body` -> :class:`KnnQuery`, base64 images,
and clip back's ``deduplicate`` (:func:`duplicates`). No FastAPI, no torch."""

from __future__ import annotations

import base64
import binascii
import dataclasses
import math
from typing import Any

from .errors import RetrievalError

__all__ = ["DEDUP_THRESHOLD", "MAX_RESULTS", "KnnQuery", "QueryError", "duplicates",
           "parse_knn_body", "parse_metadata_body"]  # fmt: skip

MAX_RESULTS = 10_000  # num_images / num_result_ids / ids per request
DEDUP_THRESHOLD = 0.94  # clip back's: cosine above which two results are the same image
DEFAULT_NUM_IMAGES = 10  # as `apps/retrieval.py search --top-k`
# what clip back reads from a /knn-service body; the ones ignored here are named in a header
KNN_KEYS = {"text", "image", "image_url", "embedding_input", "modality", "num_images",
            "num_result_ids", "indice_name", "use_mclip", "deduplicate", "use_safety_model",
            "use_violence_detector", "aesthetic_score", "aesthetic_weight"}  # fmt: skip


class QueryError(RetrievalError):
    """A request the server cannot answer: ``status`` is the HTTP code (400, 404, 413)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclasses.dataclass
class KnnQuery:
    """A parsed ``/knn-service`` body: one of ``text`` / ``image`` (decoded bytes) /
    ``embedding``, and the options that apply."""

    text: str | None
    image: bytes | None
    embedding: list[float] | None
    num_images: int
    num_result_ids: int
    indice_name: str | None
    deduplicate: bool
    ignored: list[str]


def _given(body: dict, key: str) -> bool:
    return body.get(key) not in (None, "")


def _bool(body: dict, key: str, default: bool = False) -> bool:
    value = body.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise QueryError(f"{key} must be true or false, got {value!r}")
    return value


def _count(body: dict, key: str, default: int) -> int:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise QueryError(f"{key} must be an integer, got {value!r}")
    if not 1 <= value <= MAX_RESULTS:
        raise QueryError(f"{key} must be between 1 and {MAX_RESULTS}, got {value}")
    return value


def _string(body: dict, key: str) -> str | None:
    value = body.get(key)
    if value is not None and not isinstance(value, str):
        raise QueryError(f"{key} must be a string, got {type(value).__name__}")
    return value or None


def decode_base64_image(data: str) -> bytes:
    """The bytes of a base64 image (standard alphabet; line breaks and a ``data:...;base64,``
    prefix allowed); :class:`QueryError` for anything else."""
    if data.startswith("data:"):
        head, _, data = data.partition(",")
        if not head.endswith(";base64"):
            raise QueryError("image: a data: URL must be base64 (data:image/...;base64,...)")
    try:
        raw = base64.b64decode("".join(data.split()), validate=True)
    except (binascii.Error, ValueError) as e:
        raise QueryError(f"image is not valid base64 ({e})") from None
    if not raw:
        raise QueryError("image is empty")
    return raw


def parse_knn_body(body: Any) -> KnnQuery:
    """Read a ``/knn-service`` body the way clip back does (see the module docstring);
    :class:`QueryError` naming the field at fault."""
    if not isinstance(body, dict):
        raise QueryError(f"the body must be a JSON object, got {type(body).__name__}")
    text, image = _string(body, "text"), _string(body, "image")
    url = _string(body, "image_url")
    if url is not None:
        raise QueryError(
            "image_url: this server does not fetch URLs; send the image itself, "
            "base64-encoded, as 'image'"
        )
    embedding = body.get("embedding_input")
    if embedding is not None:
        ok = isinstance(embedding, list) and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in embedding
        )
        if not ok or not embedding:
            raise QueryError("embedding_input must be a non-empty list of numbers")
        if not all(math.isfinite(v) for v in embedding):
            raise QueryError("embedding_input holds a NaN or infinite value")
        if not any(embedding):
            raise QueryError("embedding_input is all zeros: it has no direction to search")
    if text is None and image is None and embedding is None:
        raise QueryError("nothing to search for: give text, image (base64) or embedding_input")
    modality = body.get("modality", "image")
    if modality == "text":
        raise QueryError(
            "modality 'text' searches captions, and this index holds image embeddings only: "
            "use modality 'image'"
        )
    if modality not in (None, "image"):
        raise QueryError(f"modality must be 'image' (or 'text'), got {modality!r}")
    if _bool(body, "use_mclip"):
        raise QueryError(
            "use_mclip: this server has no M-CLIP text model; the index's own text tower "
            "embeds the text (a multilingual CLIP index reads other languages itself)"
        )
    num_images = _count(body, "num_images", DEFAULT_NUM_IMAGES)
    num_result_ids = _count(body, "num_result_ids", num_images)
    ignored = sorted(k for k in body if k not in KNN_KEYS)
    ignored += [k for k in ("use_safety_model", "use_violence_detector") if _bool(body, k)]
    for key, kind in (("aesthetic_score", int), ("aesthetic_weight", float)):
        if _given(body, key):  # clip back: int(...) / float(...) of it
            value = body[key]
            try:
                if isinstance(value, bool) or not math.isfinite(kind(value)):
                    raise ValueError
            except (TypeError, ValueError):
                raise QueryError(f"{key} must be a number, got {value!r}") from None
            ignored.append(key)
    given = [k for k, v in (("text", text), ("image", image), ("embedding_input", embedding))
             if v is not None]  # fmt: skip
    ignored += given[1:]  # clip back uses the first one given
    return KnnQuery(
        text=text,
        image=decode_base64_image(image) if text is None and image is not None else None,
        embedding=embedding if text is None and image is None else None,
        num_images=num_images,
        num_result_ids=num_result_ids,
        indice_name=_string(body, "indice_name"),
        deduplicate=_bool(body, "deduplicate"),
        ignored=ignored,
    )


def duplicates(embeddings: Any, threshold: float = DEDUP_THRESHOLD) -> set[int]:
    """clip back's ``deduplicate``: results (rows of ``(k, D)`` normalized embeddings, best
    first) linked by cosine > ``threshold`` form groups; all but the best of each group."""
    group = list(range(embeddings.shape[0]))  # union-find: each group's best (smallest) row

    def top(i: int) -> int:
        while group[i] != i:
            group[i] = group[group[i]]
            i = group[i]
        return i

    for i, j in (embeddings @ embeddings.T > threshold).nonzero().tolist():
        a, b = top(i), top(j)
        if a != b:
            group[max(a, b)] = min(a, b)
    return {i for i in range(len(group)) if top(i) != i}


def parse_metadata_body(body: Any) -> tuple[list, str | None]:
    """``(ids, indice_name)`` of a ``/metadata`` body (the ids' range is the index's to
    check)."""
    if not isinstance(body, dict) or not isinstance(body.get("ids"), list):
        raise QueryError('the body must be {"ids": [...], "indice_name": ...}')
    if len(body["ids"]) > MAX_RESULTS:
        raise QueryError(f"at most {MAX_RESULTS} ids per request, got {len(body['ids'])}")
    return body["ids"], _string(body, "indice_name")
