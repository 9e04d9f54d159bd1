"""GPT-style decoder-only language model, e.g. for character-level text generation.

Shape legend: ``B`` batch, ``T`` tokens, ``D`` width, ``V`` vocabulary, ``H`` heads.

Pre-norm causal ``attn_core.TransformerBlock`` s, a final LayerNorm and an output
projection tied to the token embedding. Positions are rotary (RoPE, applied to queries and
keys inside attention) or a learned table added to the embeddings. ``generate`` uses the
same decoding loop as the translation model (greedy, sampling, beam search; KV cache).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from attn_core import KVCache, RotaryEmbedding
from torch import nn

from .config import config_from_dict
from .generation import GenerationConfig, generate
from .layers import make_block, make_positions

__all__ = ["DecoderOnlyLM", "LMConfig"]


@dataclass
class LMConfig:
    """Hyper-parameters of :class:`DecoderOnlyLM`."""

    vocab_size: int = 256  # tokens (characters for the char-level LM)
    embed_dim: int = 256  # width D
    depth: int = 4  # blocks
    num_heads: int = 4
    mlp_ratio: float = 4.0  # MLP hidden width = mlp_ratio * D
    max_positions: int = 256  # context length
    pos_embed: str = "rope"  # "rope" or "learned"
    act: str = "gelu"
    dropout: float = 0.1
    attn_dropout: float = 0.0
    norm_eps: float = 1e-5
    tie_embeddings: bool = True  # output projection = token embedding
    eos_id: int | None = None  # stops generation when set
    pad_id: int | None = None
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)  # e.g. the character set

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LMConfig:
        """Build from a dict (e.g. ``config.json``); unknown keys raise ``ValueError``."""
        return config_from_dict(cls, data, "attn_nlp.lm")


class DecoderOnlyLM(nn.Module):
    """Causal language model: ids ``(B, T)`` -> next-token logits ``(B, T, V)``."""

    def __init__(self, config: LMConfig) -> None:
        super().__init__()
        c = self.config = config
        if c.pos_embed not in ("rope", "learned"):
            raise ValueError(f"pos_embed must be 'rope' or 'learned', got {c.pos_embed!r}")
        self.tok_embed = nn.Embedding(c.vocab_size, c.embed_dim)
        self.pos_embed = make_positions(c.pos_embed, c.max_positions, c.embed_dim)
        rope = RotaryEmbedding(c.embed_dim // c.num_heads) if c.pos_embed == "rope" else None
        self.drop = nn.Dropout(c.dropout)
        self.blocks = nn.ModuleList(
            make_block(
                c.embed_dim,
                c.num_heads,
                int(c.embed_dim * c.mlp_ratio),
                act=c.act,
                norm_first=True,
                dropout=c.dropout,
                attn_dropout=c.attn_dropout,
                norm_eps=c.norm_eps,
                rope=rope,
            )
            for _ in range(c.depth)
        )
        self.norm = nn.LayerNorm(c.embed_dim, eps=c.norm_eps)
        self.head = nn.Linear(c.embed_dim, c.vocab_size, bias=False)
        self.apply(self._init)
        if c.tie_embeddings:
            self.head.weight = self.tok_embed.weight
        self.generation_config = GenerationConfig(
            eos_token_id=c.eos_id, pad_token_id=c.pad_id, do_sample=True, top_k=None
        )

    @staticmethod
    def _init(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)

    def new_caches(self) -> list[KVCache]:
        return [KVCache() for _ in self.blocks]

    def forward(
        self,
        ids: torch.Tensor,
        *,
        start_pos: int = 0,
        caches: list[KVCache] | None = None,
    ) -> torch.Tensor:
        """``ids`` ``(B, T)`` at positions ``start_pos ..`` -> logits ``(B, T, V)``."""
        if ids.ndim != 2:
            raise ValueError(f"ids must be (B, T), got {tuple(ids.shape)}")
        T = ids.shape[1]
        if start_pos + T > self.config.max_positions:
            raise ValueError(
                f"sequence of {start_pos + T} tokens exceeds max_positions="
                f"{self.config.max_positions}"
            )
        x = self.tok_embed(ids)  # (B, T, D)
        if self.pos_embed is not None:
            x = x + self.pos_embed(start_pos, T)
        x = self.drop(x)
        for i, block in enumerate(self.blocks):
            x = block(x, is_causal=True, kv_cache=None if caches is None else caches[i])
        return self.head(self.norm(x))

    @torch.no_grad()
    def generate(
        self,
        prompt: torch.Tensor,
        *,
        generation_config: GenerationConfig | None = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        """Continue ``prompt`` ``(B, T0)`` (same length per row) -> ``(B * n, L)`` ids.

        Defaults to sampling (``do_sample=True``, no top-k); pass ``max_new_tokens``,
        ``temperature``, ``top_k``, ``top_p``, ``num_beams`` ... as in transformers.
        """
        cfg = (generation_config or self.generation_config).update(**kwargs)
        step = _LMDecoder(self, self.new_caches() if cfg.use_cache else None)
        return generate(step, prompt, cfg, max_positions=self.config.max_positions)


class _LMDecoder:
    """The decoding-loop view of a :class:`DecoderOnlyLM`."""

    def __init__(self, model: DecoderOnlyLM, caches: list[KVCache] | None) -> None:
        self.model, self.caches = model, caches
        self.seen = 0

    def __call__(self, tokens: torch.Tensor) -> torch.Tensor:
        if self.caches is None:
            return self.model(tokens)[:, -1]
        logits = self.model(tokens[:, self.seen :], start_pos=self.seen, caches=self.caches)
        self.seen = tokens.shape[1]
        return logits[:, -1]

    def reorder(self, index: torch.Tensor) -> None:
        if self.caches is not None:
            for cache in self.caches:
                cache.reorder(index)
