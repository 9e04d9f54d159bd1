"""CLIP text tower: token + learned position embedding, causal attn_core blocks, EOT pooling.

Shape legend: ``B`` batch, ``L`` tokens (``<= context_length``), ``D`` width,
``E`` joint embedding width, ``V`` vocabulary.

Tokens come from the BPE tokenizer: ``[SOT] ... [EOT] 0 0 ...``. With causal attention
the ``EOT`` position has seen the whole caption; OpenAI's CLIP pools there, finding it
as the *largest* id in the row (``argmax``: EOT = 49407 is the last vocabulary entry).

Speed: with causal attention nothing after the pooled token can change it, so
:meth:`TextTransformer.forward` drops every column after the longest caption's pooled
token (``truncate=True``, the default; exact, not an approximation). On the inference fast
path (``fast_inference``, on by default; :func:`attn_core.fast_inference.enable` /
``disable`` switch a whole model) it goes further, through
:func:`attn_core.fast_inference.run_causal_pooled`: each caption is encoded only up to its
own pooled token, shared prefixes (``"a photo of a"`` + class name) are encoded once, and
captions run in groups of similar length -- all exact for the same reason. Without a causal
mask (MobileCLIP) every column is encoded, and the fast path's last block computes only the
pooled row (its keys and values still from every token; exact too).

CoCa's text tower (``embed_cls=True``) appends a learned CLS embedding after the tokens
(position ``L``) and pools it (then ``ln_final``); :meth:`TextTransformer.forward_tokens`
also returns the token features before ``ln_final``, which the captioning decoder reads.
Its keys are masked as open_clip's pretrained CoCa weights were trained: key ``0`` always
visible, key ``j`` visible when token ``j - 1`` is not ``pad_id`` (open_clip's default,
``correct_cls_mask=False``, shifted by one against the tokens), on top of the causal mask.
"""

from __future__ import annotations

from functools import partial

import torch
import torch.utils.checkpoint
from attn_core import TransformerBlock
from attn_core.fast_inference import fast_path_available, run_blocks, run_causal_pooled
from torch import nn

from .config import CLIPTextConfig

__all__ = ["TextTransformer", "pool_positions", "text_global_pool"]


def pool_positions(tokens: torch.Tensor, pool_type: str = "argmax", eos_id: int | None = None):
    """``(B,)`` index of the token :func:`text_global_pool` picks in each row of ``tokens``
    ``(B, L)``, or None for ``pool_type="last"`` (which depends on the padded length)."""
    if pool_type == "first":
        return torch.zeros(tokens.shape[0], dtype=torch.long, device=tokens.device)
    if pool_type == "argmax":
        return tokens.argmax(dim=-1)
    if pool_type == "eos":
        if eos_id is None:
            raise ValueError("pool_type='eos' needs eos_id")
        return (tokens == eos_id).int().argmax(dim=-1)
    if pool_type == "last":
        return None
    raise ValueError(f"unknown pool_type {pool_type!r}")


def text_global_pool(
    x: torch.Tensor, tokens: torch.Tensor, pool_type: str = "argmax", eos_id: int | None = None
) -> torch.Tensor:
    """Pick one feature per caption: ``x`` ``(B, L, D)``, ``tokens`` ``(B, L)`` -> ``(B, D)``.

    ``argmax``: the position of the largest token id (OpenAI / open_clip EOT pooling);
    ``eos``: the first ``eos_id``; ``first`` / ``last``: a fixed position.
    """
    if pool_type == "first":
        return x[:, 0]
    idx = pool_positions(tokens, pool_type, eos_id)
    if idx is None:  # "last"
        return x[:, -1]
    return x[torch.arange(x.shape[0], device=x.device), idx]


class TextTransformer(nn.Module):
    """Causal Transformer text encoder ``(B, L)`` token ids -> ``(B, E)`` embeddings."""

    fast_inference = True  # the inference fast path (attn_core.fast_inference.enable)

    def __init__(self, config: CLIPTextConfig, embed_dim: int, weight_init: bool = True) -> None:
        super().__init__()
        self.config = c = config
        self.context_length = c.context_length
        self.grad_checkpointing = False
        norm_layer = partial(nn.LayerNorm, eps=c.norm_eps)
        # weight_init=False (weights about to be loaded, built on the meta device): no random
        # init -- nothing to initialize, and a meta normal_ would import torch._dynamo (~1 s)
        token_dim = c.token_dim or c.width
        if weight_init:
            self.token_embedding = nn.Embedding(c.vocab_size, token_dim)  # (V, D) or (V, T)
        else:
            empty = torch.empty(c.vocab_size, token_dim)
            self.token_embedding = nn.Embedding.from_pretrained(empty, freeze=False)
        # ALBERT's factorized embedding (token_dim set): (V, T) table, then T -> D
        self.token_proj = None if c.token_dim is None else nn.Linear(token_dim, c.width, False)
        positions = c.context_length + (1 if c.embed_cls else 0)  # CoCa: + the CLS position
        self.positional_embedding = nn.Parameter(torch.empty(positions, c.width))
        self.cls_emb = nn.Parameter(torch.empty(c.width)) if c.embed_cls else None
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
        if weight_init:
            self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """open_clip's init: small embeddings, depth-scaled residual projections."""
        c = self.config
        nn.init.normal_(self.token_embedding.weight, std=0.02)
        if self.token_proj is not None:  # keeps the embeddings' std at 0.02
            nn.init.normal_(self.token_proj.weight, std=self.token_proj.in_features**-0.5)
        nn.init.normal_(self.positional_embedding, std=0.01)
        if self.cls_emb is not None:
            nn.init.normal_(self.cls_emb, std=0.01)
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

    def lock(self, unlocked_layers: int = 0, freeze_layer_norm: bool = True) -> None:
        """Freeze the tower as open_clip's ``lock_text_tower`` does (``--lock-text``): every
        parameter, then the last ``unlocked_layers`` of the groups ``[embeddings, block 0,
        ..., block n-2, [last block, ln_final], projection]`` trainable again.
        LayerNorms are frozen with the rest (``freeze_layer_norm=False`` is refused, as in
        open_clip)."""
        if unlocked_layers < 0:
            raise ValueError(f"unlocked_layers must be >= 0, got {unlocked_layers}")
        if not freeze_layer_norm:
            raise ValueError(
                "freeze_layer_norm=False is not supported for this text tower: its LayerNorms "
                "are locked like the other weights (as in open_clip)"
            )
        self.requires_grad_(False)
        embeddings = [self.token_embedding, self.token_proj, self.positional_embedding]
        groups = [[*embeddings, self.cls_emb], *([b] for b in self.blocks[:-1])]
        groups += [[*self.blocks[-1:], self.ln_final], [self.proj]]
        for group in groups[len(groups) - min(unlocked_layers, len(groups)) :]:
            for part in group:
                if part is not None:
                    part.requires_grad_(True)

    def _check(self, tokens: torch.Tensor) -> None:
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

    def _embed(self, tokens: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """``(B, L)`` token ids (at ``positions`` ``(B, L)``, default ``0 .. L - 1``) ->
        ``(B, L, D)`` block inputs."""
        x = self.token_embedding(tokens)  # (B, L, D), or (B, L, T) before token_proj
        if self.token_proj is not None:
            x = self.token_proj(x)
        pos = self.positional_embedding
        pos = pos[: tokens.shape[1]] if positions is None else pos[positions]  # (L | B L, D)
        return x + pos.to(x.dtype)

    def _fast(self, x: torch.Tensor) -> bool:
        return self.fast_inference and not self.training and fast_path_available(x)

    def key_mask(self, tokens: torch.Tensor) -> torch.Tensor:
        """CoCa: ``(B, L)`` ids -> ``(B, L + 1)`` bool, True where a key may be attended
        (key 0 always; key ``j`` when token ``j - 1`` is not ``pad_id``: open_clip's mask)."""
        keep = tokens != self.config.pad_id
        return torch.cat((keep.new_ones(keep.shape[0], 1), keep), dim=1)

    def forward_tokens(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """CoCa (``embed_cls``): ``(B, L)`` ids -> ``(pooled (B, E), tokens (B, L, D))``:
        the CLS row after ``ln_final`` and the projection, and the token rows as the last
        block left them (no ``ln_final``), as open_clip's ``output_tokens=True`` returns."""
        if self.cls_emb is None:
            raise ValueError("forward_tokens is for a CoCa text tower (embed_cls=True)")
        self._check(tokens)
        B, L = tokens.shape
        x = self.token_embedding(tokens)
        if self.token_proj is not None:
            x = self.token_proj(x)
        x = torch.cat((x, self.cls_emb.to(x.dtype).expand(B, 1, -1)), dim=1)  # (B, L + 1, D)
        x = x + self.positional_embedding[: L + 1].to(x.dtype)
        causal = torch.ones(L + 1, L + 1, dtype=torch.bool, device=x.device).tril()
        mask = causal & self.key_mask(tokens)[:, None, :]  # (B, L + 1, L + 1)
        mask = mask[:, None]  # (B, 1, L + 1, L + 1): every head
        for blk in self.blocks:
            if self.grad_checkpointing and torch.is_grad_enabled():
                x = torch.utils.checkpoint.checkpoint(
                    partial(blk, attn_mask=mask), x, use_reentrant=False
                )
            else:
                x = blk(x, attn_mask=mask)
        return self._project(self.ln_final(x[:, -1])), x[:, :-1]

    def forward_features(self, tokens: torch.Tensor) -> torch.Tensor:
        """``(B, L)`` token ids -> ``(B, L, D)`` final-normed token features."""
        if self.cls_emb is not None:
            raise ValueError("a CoCa text tower (embed_cls=True): use forward_tokens")
        self._check(tokens)
        x = self._embed(tokens)
        causal = self.config.causal
        if self._fast(x):
            return self.ln_final(run_blocks(self.blocks, x, is_causal=causal))
        for blk in self.blocks:
            if self.grad_checkpointing and torch.is_grad_enabled():
                x = torch.utils.checkpoint.checkpoint(
                    partial(blk, is_causal=causal), x, use_reentrant=False
                )
            else:
                x = blk(x, is_causal=causal)
        return self.ln_final(x)

    def forward(self, tokens: torch.Tensor, *, truncate: bool = True) -> torch.Tensor:
        """``(B, L)`` token ids -> ``(B, E)`` caption embeddings (not normalized).

        ``truncate=True`` (exact with causal attention) encodes only up to the last pooled
        token of the batch; ``False`` encodes all ``L`` columns (the reference result).
        """
        self._check(tokens)
        if self.cls_emb is not None:  # CoCa: the appended CLS row, which sees every token
            return self.forward_tokens(tokens)[0]
        c = self.config
        idx = pool_positions(tokens, c.pool_type, c.eos_id) if c.causal else None
        if not c.causal and tokens.shape[0] > 0 and self._fast(self.positional_embedding):
            idx = pool_positions(tokens, c.pool_type, c.eos_id)
            if idx is not None:  # every token is a key of the last block; one query row each
                x = run_blocks(self.blocks, self._embed(tokens), rows=idx)[:, 0]  # (B, D)
                return self._project(self.ln_final(x))
        if truncate and idx is not None and tokens.shape[0] > 0:
            tokens = tokens[:, : int(idx.max()) + 1]  # nothing after it reaches a pooled row
            if self._fast(self.positional_embedding):  # each row up to its own pooled token
                x = run_causal_pooled(self.blocks, tokens, idx, self._embed)  # (B, D)
                return self._project(self.ln_final(x))
        x = self.forward_features(tokens)
        return self._project(text_global_pool(x, tokens, c.pool_type, c.eos_id))  # (B, D)

    def _project(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x) if self.proj is not None else x
