"""The model an index was built with: its name, weights and a fingerprint of its embeddings.

An index's embeddings only make sense with the model that made them. The manifest records
the model's name and pretrained tag (or weights path), its kind (a CLIP, or an image-only
``"vision"`` backbone: see :mod:`.backbone`) and the embedding of one fixed probe: a CLIP's
text embedding of :data:`PROBE_TEXT`, an image-only backbone's embedding of
:func:`probe_image` (a generated pattern, through the model's own preprocessing). A model
loaded later under the same name must give (nearly) the same embedding of it, else its
weights changed and the index is refused.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from .errors import IndexFormatError, ModelMismatchError

__all__ = [
    "KINDS",
    "PROBE_MIN_COSINE",
    "PROBE_TEXT",
    "ModelRecord",
    "describe_model",
    "probe_image",
]

PROBE_TEXT = "a photo of a dog."  # its embedding is stored to recognise the same weights
PROBE_MIN_COSINE = 0.99  # bf16 / fp16 / another device stay far above this
KINDS = ("clip", "vision")  # a CLIP (image and text towers), an image-only backbone
_REQUIRED = ("name", "pretrained", "embed_dim", "probe")


def probe_image(size: int = 64):
    """The probe of an image-only model: a fixed ``size`` x ``size`` RGB pattern (red and
    green ramps across and down, a blue 8-pixel checkerboard), made, not read or drawn at
    random, so every machine gets the same pixels."""
    import numpy as np
    from PIL import Image

    y, x = np.meshgrid(np.arange(size), np.arange(size), indexing="ij")
    ramp = 255 // max(size - 1, 1)
    rgb = np.stack([x * ramp, y * ramp, ((x // 8 + y // 8) % 2) * 255], axis=-1)
    return Image.fromarray(rgb.astype(np.uint8), "RGB")


def describe_model(name: str, pretrained: str | None) -> str:
    """``"ViT-B-32 (openai)"``; a model without a tag is its name alone."""
    return name + (f" ({pretrained})" if pretrained else "")


@dataclass(frozen=True)
class ModelRecord:
    """What the manifest says about the model (its ``"model"`` entry)."""

    name: str  # model name, hf-hub:ID or absolute folder
    pretrained: str | None  # tag or absolute weights path (None: the name's / folder's own)
    embed_dim: int
    probe: list[float] = field(repr=False)  # normalized embedding of the probe (see above)
    precision: str | None = None  # fp32 / bf16 / fp16 (absent in early manifests)
    kind: str = "clip"  # one of KINDS (absent in the JSON of a CLIP's record)

    @classmethod
    def of(cls, loaded) -> ModelRecord:
        """The record of a loaded model (an :class:`~.embed.IndexModel`: its name, weights,
        precision, kind and :meth:`~.embed.IndexModel.probe_embedding`)."""
        probe = loaded.probe_embedding()
        return cls(loaded.name, loaded.pretrained, int(probe.shape[0]),
                   [round(v, 6) for v in probe.tolist()], loaded.precision,
                   loaded.kind)  # fmt: skip

    @classmethod
    def from_json(cls, data: Any, where: str) -> ModelRecord:
        if not isinstance(data, dict):
            raise IndexFormatError(f"{where}: a broken manifest (missing or malformed model)")
        if not all(k in data for k in _REQUIRED):
            raise IndexFormatError(
                f"{where}: a broken manifest (missing or malformed "
                "model.name / pretrained / embed_dim / probe)"
            )
        kind = data.get("kind", "clip")
        if kind not in KINDS:
            raise IndexFormatError(
                f"{where}: a broken manifest (model.kind {kind!r}, expected one of {KINDS})"
            )
        return cls(data["name"], data["pretrained"], data["embed_dim"], list(data["probe"]),
                   data.get("precision"), kind)  # fmt: skip

    def to_json(self) -> dict[str, Any]:
        """The manifest's ``"model"`` entry (key order as written since version 1; ``kind``
        only for an image-only model, so a CLIP's entry is what it always was)."""
        data = asdict(self)
        order = ("name", "pretrained", "kind", "precision", "embed_dim", "probe")
        optional = {"precision": None, "kind": "clip"}  # left out at these values
        return {k: data[k] for k in order if k not in optional or data[k] != optional[k]}

    @property
    def has_text(self) -> bool:
        """Whether the model has a text tower (a CLIP): texts can be searched for."""
        return self.kind == "clip"

    def describe(self) -> str:
        return describe_model(self.name, self.pretrained)

    def same_weights(self, other: ModelRecord) -> bool:
        """Whether ``other``'s probe embedding is this one's (cosine >= PROBE_MIN_COSINE)."""
        import torch

        now, then = torch.tensor(other.probe), torch.tensor(self.probe)
        return now.shape == then.shape and float(now @ then) >= PROBE_MIN_COSINE

    def check(self, loaded) -> None:
        """:class:`ModelMismatchError` unless ``loaded`` (an :class:`~.embed.IndexModel`) is
        a model of this record's kind that gives its embeddings."""
        if loaded.kind != self.kind:
            raise ModelMismatchError(
                f"{self.describe()} built this index as a {self.kind} model, now it loads as "
                f"a {loaded.kind} model; rebuild the index"
            )
        if not self.same_weights(ModelRecord.of(loaded)):
            raise ModelMismatchError(
                f"the weights of {self.describe()} are not the ones this index was built "
                "with (their embeddings differ); rebuild the index"
            )
