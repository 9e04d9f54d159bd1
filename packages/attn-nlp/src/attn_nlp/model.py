"""Encoder-decoder Transformer ("Attention Is All You Need") on attn_core blocks.

Shape legend: ``B`` batch, ``S`` source tokens, ``T`` target tokens, ``D`` model width,
``V`` target vocabulary, ``K`` beams.

* :class:`TransformerEncoder` / :class:`TransformerDecoder` -- stacks of
  ``attn_core.TransformerBlock`` on embeddings ``(B, L, D)``, like ``nn.TransformerEncoder``
  / ``nn.TransformerDecoder`` (batch first). The decoder block is causal self-attention,
  cross-attention to the encoder output and an MLP, with a KV cache for both attentions.
* :class:`Transformer` -- token embeddings (optionally scaled by ``sqrt(D)`` and shared
  between encoder and decoder), sinusoidal or learned positions, both stacks, an output
  projection (optionally tied to the decoder embedding) and Marian's ``final_logits_bias``.

Masks follow attn_core: ``key_padding_mask`` bool ``(B, L)``, True = padding.
"""

from __future__ import annotations

import torch
from attn_core import KVCache
from torch import nn

from .config import TransformerConfig
from .generation import GenerationConfig, generate
from .layers import embed_scale, make_block, make_positions

__all__ = ["LayerCache", "Transformer", "TransformerDecoder", "TransformerEncoder"]

LayerCache = tuple[KVCache, KVCache]  # (self-attention, cross-attention) of one decoder block


class _BlockStack(nn.Module):
    """``depth`` attn_core blocks (+ optional final LayerNorm); subclasses set ``cross``."""

    cross = False  # the decoder's blocks add cross-attention to the encoder output

    def __init__(
        self,
        dim: int,
        depth: int,
        num_heads: int,
        mlp_dim: int,
        *,
        act: str = "relu",
        norm_first: bool = False,
        final_norm: bool = False,
        dropout: float = 0.0,
        attn_dropout: float = 0.0,
        mlp_dropout: float | None = None,
        norm_eps: float = 1e-5,
    ) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            make_block(
                dim,
                num_heads,
                mlp_dim,
                act=act,
                norm_first=norm_first,
                cross_attention=self.cross,
                dropout=dropout,
                attn_dropout=attn_dropout,
                mlp_dropout=mlp_dropout,
                norm_eps=norm_eps,
            )
            for _ in range(depth)
        )
        self.norm = nn.LayerNorm(dim, eps=norm_eps) if final_norm else nn.Identity()


class TransformerEncoder(_BlockStack):
    """``depth`` self-attention blocks (+ optional final LayerNorm): ``(B, S, D) -> (B, S, D)``."""

    def forward(
        self,
        x: torch.Tensor,
        key_padding_mask: torch.Tensor | None = None,
        *,
        return_layers: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
        """``return_layers``: also each block's output ``(B, S, D)`` and its self-attention
        weights ``(B, H, S, S)`` (the ``math`` backend's; the output is unchanged), for
        distillation: ``(x, hidden_states, attentions)``."""
        hidden, attentions = [], []
        for block in self.blocks:
            if return_layers:
                x, weights = block(x, key_padding_mask=key_padding_mask, need_weights=True)
                hidden.append(x)
                attentions.append(weights)
            else:
                x = block(x, key_padding_mask=key_padding_mask)
        return (self.norm(x), hidden, attentions) if return_layers else self.norm(x)


class TransformerDecoder(_BlockStack):
    """``depth`` blocks of causal self-attn + cross-attn + MLP: ``(B, T, D) -> (B, T, D)``."""

    cross = True

    def new_caches(self) -> list[LayerCache]:
        """Empty KV caches, one (self, cross) pair per block."""
        return [(KVCache(), KVCache()) for _ in self.blocks]

    def forward(
        self,
        x: torch.Tensor,
        memory: torch.Tensor,
        *,
        memory_key_padding_mask: torch.Tensor | None = None,
        key_padding_mask: torch.Tensor | None = None,
        caches: list[LayerCache] | None = None,
    ) -> torch.Tensor:
        """``x`` ``(B, T, D)`` new target positions, ``memory`` ``(B, S, D)`` encoder output.

        With ``caches`` the self-attention sees the cached positions plus ``x`` (causal,
        bottom-right aligned) and the cross-attention keys/values are computed once.
        """
        if caches is not None and len(caches) != len(self.blocks):
            raise ValueError(f"expected {len(self.blocks)} layer caches, got {len(caches)}")
        for i, block in enumerate(self.blocks):
            self_cache, cross_cache = caches[i] if caches is not None else (None, None)
            x = block(
                x,
                memory,
                is_causal=True,
                key_padding_mask=key_padding_mask,
                context_key_padding_mask=memory_key_padding_mask,
                kv_cache=self_cache,
                cross_kv_cache=cross_cache,
            )
        return self.norm(x)


def _check_ids(ids: torch.Tensor, vocab_size: int, name: str) -> None:
    if ids.ndim != 2 or ids.dtype != torch.long:
        raise ValueError(f"{name} must be a (B, L) long tensor, got {ids.dtype} {tuple(ids.shape)}")
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
        raise ValueError(f"{name} has token ids outside [0, {vocab_size})")


class Transformer(nn.Module):
    """Encoder-decoder Transformer for sequence-to-sequence tasks (translation).

    ``forward(src_ids, tgt_ids)`` gives teacher-forced logits ``(B, T, V)``; ``generate``
    decodes with greedy, beam search or sampling. Marian / opus-mt checkpoints load through
    :func:`attn_nlp.create_model`.
    """

    final_logits_bias: torch.Tensor | None

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        c = self.config = config
        D = c.embed_dim
        self.embed_scale = embed_scale(D, c.scale_embedding)
        self.src_embed = nn.Embedding(c.src_vocab_size, D, padding_idx=c.pad_id)
        if c.share_embeddings:
            self.tgt_embed = self.src_embed
        else:
            self.tgt_embed = nn.Embedding(c.tgt_vocab_size, D, padding_idx=c.pad_id)
        self.src_pos = make_positions(c.pos_embed, c.max_positions, D)
        self.tgt_pos = make_positions(c.pos_embed, c.max_positions, D)
        if self.src_pos is None:
            raise ValueError("the encoder-decoder needs sinusoidal or learned positions")
        self.drop = nn.Dropout(c.dropout)
        stack = dict(
            act=c.act,
            norm_first=c.norm_first,
            final_norm=bool(c.final_norm),
            dropout=c.dropout,
            attn_dropout=c.attn_dropout,
            mlp_dropout=c.activation_dropout,  # None = dropout
            norm_eps=c.norm_eps,
        )
        # the decoder may have its own heads and MLP width (None = the encoder's), as Marian
        self.encoder = TransformerEncoder(D, c.encoder_depth, c.num_heads, c.mlp_dim, **stack)
        dec_heads = c.num_heads if c.decoder_num_heads is None else c.decoder_num_heads
        dec_mlp = c.mlp_dim if c.decoder_mlp_dim is None else c.decoder_mlp_dim
        self.decoder = TransformerDecoder(D, c.decoder_depth, dec_heads, dec_mlp, **stack)
        self.head = nn.Linear(D, c.tgt_vocab_size, bias=False)
        if c.final_logits_bias:
            self.register_buffer("final_logits_bias", torch.zeros(1, c.tgt_vocab_size))
        else:
            self.final_logits_bias = None
        self._init_weights()
        if c.tie_output:
            self.head.weight = self.tgt_embed.weight
        self.generation_config = GenerationConfig(
            eos_token_id=c.eos_id,
            pad_token_id=c.pad_id,
            decoder_start_token_id=c.decoder_start_id,
            bos_token_id=c.bos_id,
        )

    def _init_weights(self) -> None:
        std = self.config.embed_dim**-0.5 if self.config.scale_embedding else 0.02
        for emb in {self.src_embed, self.tgt_embed}:
            nn.init.normal_(emb.weight, std=std)
            with torch.no_grad():
                emb.weight[self.config.pad_id].zero_()

    # -- the two halves -----------------------------------------------------------------

    def padding_mask(self, src_ids: torch.Tensor) -> torch.Tensor | None:
        """Key-padding mask ``(B, S)`` (True = pad) from ``pad_id``, or None if no padding."""
        mask = src_ids == self.config.pad_id
        return mask if bool(mask.any()) else None

    def encode(
        self, src_ids: torch.Tensor, src_key_padding_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``src_ids`` ``(B, S)`` -> encoder output ``(B, S, D)``.

        ``src_key_padding_mask`` defaults to ``src_ids == pad_id``.
        """
        _check_ids(src_ids, self.config.src_vocab_size, "src_ids")
        if src_key_padding_mask is None:
            src_key_padding_mask = self.padding_mask(src_ids)
        x = self.src_embed(src_ids) * self.embed_scale + self.src_pos(0, src_ids.shape[1])
        return self.encoder(self.drop(x), src_key_padding_mask)

    def decode(
        self,
        tgt_ids: torch.Tensor,
        memory: torch.Tensor,
        memory_key_padding_mask: torch.Tensor | None = None,
        *,
        start_pos: int = 0,
        caches: list[LayerCache] | None = None,
    ) -> torch.Tensor:
        """Target tokens ``(B, T)`` at positions ``start_pos ..`` -> logits ``(B, T, V)``."""
        _check_ids(tgt_ids, self.config.tgt_vocab_size, "tgt_ids")
        pos = self.tgt_pos(start_pos, tgt_ids.shape[1])
        x = self.drop(self.tgt_embed(tgt_ids) * self.embed_scale + pos)
        x = self.decoder(x, memory, memory_key_padding_mask=memory_key_padding_mask, caches=caches)
        logits = self.head(x)  # (B, T, V)
        if self.final_logits_bias is not None:
            logits = logits + self.final_logits_bias
        return logits

    def forward(
        self,
        src_ids: torch.Tensor,
        tgt_ids: torch.Tensor,
        src_key_padding_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Teacher forcing: ``(B, S)`` source and ``(B, T)`` decoder inputs -> ``(B, T, V)``."""
        if src_key_padding_mask is None:
            src_key_padding_mask = self.padding_mask(src_ids)
        memory = self.encode(src_ids, src_key_padding_mask)
        return self.decode(tgt_ids, memory, src_key_padding_mask)

    # -- generation ---------------------------------------------------------------------

    @torch.no_grad()
    def generate(
        self,
        src_ids: torch.Tensor,
        src_key_padding_mask: torch.Tensor | None = None,
        *,
        generation_config: GenerationConfig | None = None,
        **kwargs,
    ) -> torch.Tensor:
        """Translate ``src_ids`` ``(B, S)`` -> ``(B * num_return_sequences, L)`` target ids.

        Settings come from ``generation_config`` (default: ``self.generation_config``,
        read from the checkpoint) updated with ``kwargs`` (``num_beams=4``,
        ``max_new_tokens=50``, ``do_sample=True``, ``use_cache=False`` ...). Rows start with
        ``decoder_start_token_id`` as in transformers.
        """
        cfg = (generation_config or self.generation_config).update(**kwargs)
        if cfg.decoder_start_token_id is None:
            raise ValueError("generation needs decoder_start_token_id")
        if src_key_padding_mask is None:
            src_key_padding_mask = self.padding_mask(src_ids)
        memory = self.encode(src_ids, src_key_padding_mask)
        rows = cfg.num_beams if cfg.num_beams > 1 else cfg.num_return_sequences
        memory = memory.repeat_interleave(rows, dim=0)
        if src_key_padding_mask is not None:
            src_key_padding_mask = src_key_padding_mask.repeat_interleave(rows, dim=0)
        caches = self.decoder.new_caches() if cfg.use_cache else None
        step = _Seq2SeqDecoder(self, memory, src_key_padding_mask, caches)
        prompt = torch.full(
            (src_ids.shape[0], 1),
            cfg.decoder_start_token_id,
            dtype=torch.long,
            device=src_ids.device,
        )
        return generate(step, prompt, cfg, max_positions=self.config.max_positions)


class _Seq2SeqDecoder:
    """The decoding-loop view of a :class:`Transformer` with a fixed encoder output."""

    def __init__(
        self,
        model: Transformer,
        memory: torch.Tensor,
        memory_mask: torch.Tensor | None,
        caches: list[LayerCache] | None,
    ) -> None:
        self.model, self.memory, self.memory_mask, self.caches = model, memory, memory_mask, caches
        self.seen = 0  # target positions already in the caches

    def __call__(self, tokens: torch.Tensor) -> torch.Tensor:
        if self.caches is None:  # recompute the whole prefix
            return self.model.decode(tokens, self.memory, self.memory_mask)[:, -1]
        new = tokens[:, self.seen :]
        logits = self.model.decode(
            new, self.memory, self.memory_mask, start_pos=self.seen, caches=self.caches
        )
        self.seen = tokens.shape[1]
        return logits[:, -1]

    def reorder(self, index: torch.Tensor) -> None:
        # beams of one sentence share the encoder output, so only self-attention moves
        if self.caches is not None:
            for self_cache, _ in self.caches:
                self_cache.reorder(index)
