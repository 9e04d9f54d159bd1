"""The model an index was built with: its name, weights and a fingerprint of its embeddings.

An index's embeddings only make sense with the model that made them. The manifest records
the model's name and pretrained tag (or weights path), and the text embedding of one fixed
probe sentence: a model loaded later under the same name must give (nearly) the same
embedding of it, else its weights changed and the index is refused.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from .errors import IndexFormatError, ModelMismatchError

__all__ = ["PROBE_MIN_COSINE", "PROBE_TEXT", "ModelRecord", "describe_model"]

PROBE_TEXT = "a photo of a dog."  # its embedding is stored to recognise the same weights
PROBE_MIN_COSINE = 0.99  # bf16 / fp16 / another device stay far above this
_REQUIRED = ("name", "pretrained", "embed_dim", "probe")


def describe_model(name: str, pretrained: str | None) -> str:
    """``"ViT-B-32 (openai)"``; a model without a tag is its name alone."""
    return name + (f" ({pretrained})" if pretrained else "")


@dataclass(frozen=True)
class ModelRecord:
    """What the manifest says about the model (its ``"model"`` entry)."""

    name: str  # model name, hf-hub:ID or absolute folder
    pretrained: str | None  # tag or absolute weights path (None: the folder's own)
    embed_dim: int
    probe: list[float] = field(repr=False)  # normalized text embedding of PROBE_TEXT
    precision: str | None = None  # fp32 / bf16 / fp16 (absent in early manifests)

    @classmethod
    def of(cls, model, tokenizer, name: str, pretrained: str | None, precision: str = "fp32"):
        """The record of a loaded CLIP ``model`` (with its ``tokenizer``)."""
        import torch

        device = next(model.parameters()).device
        with torch.no_grad():
            tokens = tokenizer([PROBE_TEXT]).to(device)
            probe = model.encode_text(tokens, normalize=True)[0].float().cpu()
        return cls(name, pretrained, int(probe.shape[0]), [round(v, 6) for v in probe.tolist()],
                   precision)  # fmt: skip

    @classmethod
    def from_json(cls, data: Any, where: str) -> ModelRecord:
        if not isinstance(data, dict):
            raise IndexFormatError(f"{where}: a broken manifest (missing or malformed model)")
        if not all(k in data for k in _REQUIRED):
            raise IndexFormatError(
                f"{where}: a broken manifest (missing or malformed "
                "model.name / pretrained / embed_dim / probe)"
            )
        return cls(data["name"], data["pretrained"], data["embed_dim"], list(data["probe"]),
                   data.get("precision"))  # fmt: skip

    def to_json(self) -> dict[str, Any]:
        """The manifest's ``"model"`` entry (key order as written since version 1)."""
        data = asdict(self)
        order = ("name", "pretrained", "precision", "embed_dim", "probe")
        return {k: data[k] for k in order if k != "precision" or data[k] is not None}

    def describe(self) -> str:
        return describe_model(self.name, self.pretrained)

    def same_weights(self, other: ModelRecord) -> bool:
        """Whether ``other``'s probe embedding is this one's (cosine >= PROBE_MIN_COSINE)."""
        import torch

        now, then = torch.tensor(other.probe), torch.tensor(self.probe)
        return now.shape == then.shape and float(now @ then) >= PROBE_MIN_COSINE

    def check(self, model, tokenizer, precision: str = "fp32") -> None:
        """:class:`ModelMismatchError` unless ``model`` gives this record's embeddings."""
        if not self.same_weights(ModelRecord.of(model, tokenizer, self.name, None, precision)):
            raise ModelMismatchError(
                f"the weights of {self.describe()} are not the ones this index was built "
                "with (their embeddings differ); rebuild the index"
            )
