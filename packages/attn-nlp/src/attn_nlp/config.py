"""``TransformerConfig`` for the encoder-decoder and its named presets.

Presets follow "Attention Is All You Need" (Vaswani et al. 2017, Table 3): ``transformer-base``
and ``transformer-big``; ``transformer-tiny`` is a small pre-norm variant for tests and demos
that trains in minutes on a laptop CPU.
"""

from __future__ import annotations

import dataclasses
import fnmatch
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

__all__ = ["PRESETS", "TransformerConfig", "config_from_dict", "get_config", "list_models"]

T = TypeVar("T")


def config_from_dict(cls: type[T], data: Mapping[str, Any], model_type: str) -> T:
    """Build the dataclass ``cls`` from ``data``; unknown keys raise ``ValueError`` naming them.

    ``model_type`` (what :func:`attn_nlp.save_pretrained` writes next to the fields) is
    accepted when it equals ``model_type`` and refused otherwise.
    """
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names - {"model_type"})
    if unknown:
        raise ValueError(f"unknown {cls.__name__} key(s) {unknown}; known: {sorted(names)}")
    if data.get("model_type", model_type) != model_type:
        raise ValueError(
            f"model_type {data['model_type']!r} is not {model_type!r} ({cls.__name__})"
        )
    return cls(**{k: v for k, v in data.items() if k in names})


@dataclass
class TransformerConfig:
    """Hyper-parameters of :class:`attn_nlp.Transformer` (one encoder, one decoder)."""

    src_vocab_size: int = 32000  # encoder vocabulary
    tgt_vocab_size: int | None = None  # decoder vocabulary; None = same as the source
    embed_dim: int = 512  # model width D
    encoder_depth: int = 6  # encoder blocks
    decoder_depth: int = 6  # decoder blocks
    num_heads: int = 8  # encoder attention heads
    mlp_dim: int = 2048  # hidden width of the encoder's position-wise MLP
    decoder_num_heads: int | None = None  # decoder heads (self and cross); None = num_heads
    decoder_mlp_dim: int | None = None  # decoder MLP width; None = mlp_dim
    act: str = "relu"  # MLP activation: relu, gelu, gelu_tanh, silu (= swish)
    norm_first: bool = False  # pre-norm (True) or the paper's post-norm (False)
    final_norm: bool | None = None  # LayerNorm after each stack; None = norm_first
    norm_eps: float = 1e-5  # LayerNorm epsilon
    dropout: float = 0.1  # on embeddings and branch outputs
    attn_dropout: float = 0.0  # on attention weights
    activation_dropout: float | None = None  # inside the MLP, after the activation; None = dropout
    max_positions: int = 1024  # longest source / target sequence
    pos_embed: str = "sinusoidal"  # sinusoidal (sin|cos halves), sinusoidal_interleaved, learned
    scale_embedding: bool = True  # multiply token embeddings by sqrt(D)
    share_embeddings: bool = True  # one token embedding for encoder and decoder
    tie_output: bool = True  # output projection = decoder token embedding (transposed)
    final_logits_bias: bool = False  # a fixed (1, V) bias on the logits (Marian)
    pad_id: int = 0  # padding token
    bos_id: int | None = 2  # beginning of sentence (our tokenizers)
    eos_id: int = 3  # end of sentence
    decoder_start_id: int | None = None  # first decoder input; None = bos_id (Marian: pad_id)
    extra: dict[str, Any] = field(default_factory=dict)  # free-form metadata (source, langs)

    def __post_init__(self) -> None:
        for name in ("num_heads", "decoder_num_heads"):
            heads = getattr(self, name)
            if heads is not None and self.embed_dim % heads:
                raise ValueError(
                    f"embed_dim ({self.embed_dim}) must be divisible by {name} ({heads})"
                )
        if self.tgt_vocab_size is None:
            self.tgt_vocab_size = self.src_vocab_size
        if self.share_embeddings and self.tgt_vocab_size != self.src_vocab_size:
            raise ValueError(
                "share_embeddings=True needs src_vocab_size == tgt_vocab_size, got "
                f"{self.src_vocab_size} and {self.tgt_vocab_size}"
            )
        if self.final_norm is None:
            self.final_norm = self.norm_first
        if self.decoder_start_id is None:
            if self.bos_id is None:
                raise ValueError("set decoder_start_id or bos_id")
            self.decoder_start_id = self.bos_id

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TransformerConfig:
        """Build from a dict (e.g. ``config.json``); unknown keys raise ``ValueError``."""
        return config_from_dict(cls, data, "attn_nlp.transformer")


PRESETS: dict[str, dict[str, Any]] = {
    "transformer-base": dict(embed_dim=512, num_heads=8, mlp_dim=2048, dropout=0.1),
    "transformer-big": dict(embed_dim=1024, num_heads=16, mlp_dim=4096, dropout=0.3),
    "transformer-tiny": dict(
        src_vocab_size=1000,
        embed_dim=128,
        encoder_depth=2,
        decoder_depth=2,
        num_heads=4,
        mlp_dim=512,
        norm_first=True,
        dropout=0.1,
        max_positions=256,
    ),
}


def list_models(pattern: str | None = None, pretrained: bool = False) -> list[str]:
    """Preset names matching the glob ``pattern`` (all when None).

    attn_nlp has no table of pretrained weights: ``pretrained=True`` returns ``[]``; any
    Marian repo id on the Hub (``Helsinki-NLP/opus-mt-*``) or checkpoint folder loads with
    :func:`attn_nlp.create_model`.
    """
    if pretrained:
        return []
    return sorted(n for n in PRESETS if pattern is None or fnmatch.fnmatch(n, pattern))


def get_config(name: str, **overrides: Any) -> TransformerConfig:
    """The preset ``name`` with keyword overrides (e.g. ``src_vocab_size=8000``)."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; available: {', '.join(list_models())}")
    return TransformerConfig(**{**PRESETS[name], **overrides})
