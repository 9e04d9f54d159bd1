"""CLIP text tower: token + learned position embedding, causal attn_core blocks, EOT pooling.

Shape legend: ``B`` batch, ``L`` tokens (``<= context_length``), ``D`` width,
``E`` joint embedding width, ``V`` vocabulary.

Tokens come from the BPE tokenizer: ``[SOT] ... [EOT] 0 0 ...``. With causal attention
the ``EOT`` position has seen the whole caption; OpenAI's CLIP pools there, finding it
as the *largest* id in the row (``argmax``: EOT = 49407 is the last vocabulary entry).
"""

from __future__ import annotations

from functools import partial

import torch
import torch.utils.checkpoint
from attn_core import TransformerBlock
from torch import nn

from .config import CLIPTextConfig

__all__ = ["TextTransformer", "text_global_pool"]


def text_global_pool(
    x: torch.Tensor, tokens: torch.Tensor, pool_type: str = "argmax", eos_id: int | None = None
) -> torch.Tensor:
    """Pick one feature per caption: ``x`` ``(B, L, D)``, ``tokens`` ``(B, L)`` -> ``(B, D)``.

    ``argmax``: the position of the largest token id (OpenAI / open_clip EOT pooling);
    ``eos``: the first ``eos_id``; ``first`` / ``last``: a fixed position.
    """
    if pool_type == "first":
        return x[:, 0]
    if pool_type == "last":
        return x[:, -1]
    if pool_type == "argmax":
        idx = tokens.argmax(dim=-1)
    elif pool_type == "eos":
        if eos_id is None:
            raise ValueError("pool_type='eos' needs eos_id")
        idx = (tokens == eos_id).int().argmax(dim=-1)
    else:
        raise ValueError(f"unknown pool_type {pool_type!r}")
    return x[torch.arange(x.shape[0], device=x.device), idx]


class TextTransformer(nn.Module):
    """Causal Transformer text encoder ``(B, L)`` token ids -> ``(B, E)`` embeddings."""

    def __init__(self, config: CLIPTextConfig, embed_dim: int) -> None:
        super().__init__()
        self.config = c = config
        self.context_length = c.context_length
        self.grad_checkpointing = False
        norm_layer = partial(nn.LayerNorm, eps=c.norm_eps)
        self.token_embedding = nn.Embedding(c.vocab_size, c.width)  # (V, D)
        self.positional_embedding = nn.Parameter(torch.empty(c.context_length, c.width))
        self.blocks = nn.ModuleList(
            TransformerBlock(
                c.width,
                c.heads,
                c.mlp_ratio,
                act=c.act,
                layer_scale=c.ls_init_value,
                norm_layer=norm_layer,
            )
            for _ in range(c.layers)
        )
        self.ln_final = norm_layer(c.width)
        self.proj = (
            nn.Linear(c.width, embed_dim, bias=c.proj_bias) if c.proj_type == "linear" else None
        )
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """open_clip's init: small embeddings, depth-scaled residual projections."""
        c = self.config
        nn.init.normal_(self.token_embedding.weight, std=0.02)
        nn.init.normal_(self.positional_embedding, std=0.01)
        proj_std = c.width**-0.5 * (2 * c.layers) ** -0.5
        for blk in self.blocks:
            nn.init.normal_(blk.attn.qkv.weight, std=c.width**-0.5)
            nn.init.normal_(blk.attn.proj.weight, std=proj_std)
            nn.init.normal_(blk.mlp.fc1.weight, std=(2 * c.width) ** -0.5)
            nn.init.normal_(blk.mlp.fc2.weight, std=proj_std)
        if self.proj is not None:
            nn.init.normal_(self.proj.weight, std=c.width**-0.5)
            if self.proj.bias is not None:
                nn.init.zeros_(self.proj.bias)

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        self.grad_checkpointing = enable

    def forward_features(self, tokens: torch.Tensor) -> torch.Tensor:
        """``(B, L)`` token ids -> ``(B, L, D)`` final-normed token features."""
        if tokens.ndim != 2 or tokens.dtype not in (torch.int64, torch.int32):
            raise ValueError(
                f"tokens must be an integer (B, L) tensor, got {tuple(tokens.shape)} {tokens.dtype}"
            )
        L = tokens.shape[1]
        if L > self.context_length:
            raise ValueError(
                f"{L} tokens exceed the context length {self.context_length}; tokenize with "
                f"context_length={self.context_length} (longer captions are truncated)"
            )
        x = self.token_embedding(tokens)  # (B, L, D)
        x = x + self.positional_embedding[:L].to(x.dtype)
        causal = self.config.causal
        for blk in self.blocks:
            if self.grad_checkpointing and torch.is_grad_enabled():
                x = torch.utils.checkpoint.checkpoint(
                    partial(blk, is_causal=causal), x, use_reentrant=False
                )
            else:
                x = blk(x, is_causal=causal)
        return self.ln_final(x)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """``(B, L)`` token ids -> ``(B, E)`` caption embeddings (not normalized)."""
        x = self.forward_features(tokens)
        x = text_global_pool(x, tokens, self.config.pool_type, self.config.eos_id)  # (B, D)
        return self.proj(x) if self.proj is not None else x
