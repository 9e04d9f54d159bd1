"""``TransformerConfig`` for the encoder-decoder and its named presets.

Presets follow "Attention Is All You Need" (Vaswani et al. 2017, Table 3): ``transformer-base``
and ``transformer-big``; ``transformer-tiny`` is a small pre-norm variant for tests and demos
that trains in minutes on a laptop CPU.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

__all__ = ["PRESETS", "TransformerConfig", "get_config", "list_models"]


@dataclass
class TransformerConfig:
    """Hyper-parameters of :class:`attn_nlp.Transformer` (one encoder, one decoder)."""

    src_vocab_size: int = 32000  # encoder vocabulary
    tgt_vocab_size: int | None = None  # decoder vocabulary; None = same as the source
    embed_dim: int = 512  # model width D
    encoder_depth: int = 6  # encoder blocks
    decoder_depth: int = 6  # decoder blocks
    num_heads: int = 8  # attention heads (self and cross)
    mlp_dim: int = 2048  # hidden width of the position-wise MLP
    act: str = "relu"  # MLP activation: relu, gelu, gelu_tanh, silu (= swish)
    norm_first: bool = False  # pre-norm (True) or the paper's post-norm (False)
    final_norm: bool | None = None  # LayerNorm after each stack; None = norm_first
    norm_eps: float = 1e-5  # LayerNorm epsilon
    dropout: float = 0.1  # on embeddings, branch outputs and inside the MLP
    attn_dropout: float = 0.0  # on attention weights
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
        if self.embed_dim % self.num_heads:
            raise ValueError(
                f"embed_dim ({self.embed_dim}) must be divisible by num_heads ({self.num_heads})"
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
    def from_dict(cls, data: dict[str, Any]) -> TransformerConfig:
        """Build from a dict, ignoring keys this version does not know."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


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


def list_models() -> list[str]:
    """Names of the registered presets."""
    return sorted(PRESETS)


def get_config(name: str, **overrides: Any) -> TransformerConfig:
    """The preset ``name`` with keyword overrides (e.g. ``src_vocab_size=8000``)."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; available: {', '.join(list_models())}")
    return TransformerConfig(**{**PRESETS[name], **overrides})
