"""CLIP text tower: token + learned position embedding, causal attn_core blocks, EOT pooling.

Shape legend: ``B`` batch, ``L`` tokens (``<= context_length``), ``D`` width,
``E`` joint embedding width, ``V`` vocabulary.

Tokens come from the BPE tokenizer: ``[SOT] ... [EOT] 0 0 ...``. With causal attention
the ``EOT`` position has seen the whole caption; OpenAI's CLIP pools there, finding it
as the *largest* id in the row (``argmax``: EOT = 49407 is the last vocabulary entry).

Speed: with causal attention nothing after the pooled token can change it, so
:meth:`TextTransformer.forward` drops every column after the longest caption's pooled
token (``truncate=True``, the default; exact, not an approximation): the 80 ImageNet
prompts are ~10 tokens long, not 77. Under ``torch.no_grad()`` in eval mode on CPU the
inference path goes further, all of it exact for the same reason:

* captions that start with the same tokens (``"a photo of a"`` + class name) share
  them: each shared prefix is encoded once, and the rest of each caption attends to the
  prefix's cached keys / values (a KV cache, as in decoding);
* rows are sorted by (remaining) length and encoded in groups of similar length;
* blocks run through attn_vision's oneDNN path, and the last block computes only the
  pooled row (:func:`attn_vision.vit.inference_block_forward`).
"""

from __future__ import annotations

from functools import partial

import torch
import torch.utils.checkpoint
from attn_core import TransformerBlock
from attn_vision.vit import (
    fast_block_supported,
    fast_inference_available,
    inference_block_forward,
)
from torch import nn

from .config import CLIPTextConfig

__all__ = ["TextTransformer", "pool_positions", "text_global_pool"]

_GROUP_COST = 64  # a separate length group costs about as much as this many extra tokens
_MIN_PREFIX = 3  # shortest shared prefix worth caching (tokens)
_MIN_SAVING = 0.15  # share prefixes only when that saves at least this fraction of tokens


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


def _length_groups(lengths: list[int]) -> list[int]:
    """Split sorted ``lengths`` into runs encoded separately: the end index of each run,
    minimising ``sum(run rows * run max length) + _GROUP_COST * runs`` (exact DP over the
    distinct lengths)."""
    ends = [
        i + 1 for i in range(len(lengths)) if i + 1 == len(lengths) or lengths[i + 1] > lengths[i]
    ]
    best = [0.0] + [float("inf")] * len(ends)  # best[j]: cost of the first ends[j - 1] rows
    cut = [0] * (len(ends) + 1)
    for j in range(1, len(ends) + 1):
        for i in range(j):  # rows ends[i - 1] .. ends[j - 1] form one run
            start = ends[i - 1] if i else 0
            cost = best[i] + (ends[j - 1] - start) * lengths[ends[j - 1] - 1] + _GROUP_COST
            if cost < best[j]:
                best[j], cut[j] = cost, i
    runs, j = [], len(ends)
    while j:
        runs.append(ends[j - 1])
        j = cut[j]
    return runs[::-1]


def _shared_prefixes(seqs: list[list[int]]) -> tuple[list[int], list[int]] | None:
    """Plan prefix sharing for token sequences ``seqs`` (each up to its pooled token).

    Returns ``(cluster, prefix_len)``: ``cluster[i]`` is row ``i``'s cluster (-1: none) and
    ``prefix_len[c]`` the tokens every row of cluster ``c`` starts with (each row keeps at
    least its pooled token to itself). Clusters are runs of rows in lexicographic order whose
    neighbours share >= ``T`` tokens; ``T`` is chosen to minimise the tokens encoded,
    ``sum(len) - sum((rows_c - 1) * prefix_c)``. None when that saves < ``_MIN_SAVING``.
    """
    B = len(seqs)
    order = sorted(range(B), key=seqs.__getitem__)
    lcp = [0] * B  # shared tokens with the previous row in `order`
    for j in range(1, B):
        a, b = seqs[order[j - 1]], seqs[order[j]]
        limit, m = min(len(a), len(b)) - 1, 0
        while m < limit and a[m] == b[m]:
            m += 1
        lcp[j] = m
    total = sum(len(t) for t in seqs)
    best_cost, best = total, []
    for T in range(_MIN_PREFIX, max(lcp, default=0) + 1):
        runs, j = [], 0  # (start, end, prefix) in `order`
        while j < B:
            k, p = j + 1, 1 << 30
            while k < B and lcp[k] >= T:
                p, k = min(p, lcp[k]), k + 1
            if k - j > 1:
                runs.append((j, k, p))
            j = k
        cost = total - sum((e - s - 1) * p for s, e, p in runs)
        if cost < best_cost:
            best_cost, best = cost, runs
    if best_cost > (1 - _MIN_SAVING) * total:
        return None
    cluster = [-1] * B
    for c, (start, end, _) in enumerate(best):
        for j in range(start, end):
            cluster[order[j]] = c
    return cluster, [p for _, _, p in best]


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

    def __init__(self, config: CLIPTextConfig, embed_dim: int, weight_init: bool = True) -> None:
        super().__init__()
        self.config = c = config
        self.context_length = c.context_length
        self.grad_checkpointing = False
        self.fast_inference = True  # oneDNN blocks, length groups (see the module docstring)
        norm_layer = partial(nn.LayerNorm, eps=c.norm_eps)
        # weight_init=False (weights about to be loaded, built on the meta device): no random
        # init -- nothing to initialize, and a meta normal_ would import torch._dynamo (~1 s)
        if weight_init:
            self.token_embedding = nn.Embedding(c.vocab_size, c.width)  # (V, D)
        else:
            empty = torch.empty(c.vocab_size, c.width)
            self.token_embedding = nn.Embedding.from_pretrained(empty, freeze=False)
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
        if weight_init:
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

    def _embed(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.token_embedding(tokens)  # (B, L, D)
        return x + self.positional_embedding[: tokens.shape[1]].to(x.dtype)

    def _fast(self, x: torch.Tensor) -> bool:
        return (
            self.fast_inference
            and not self.training
            and fast_inference_available(x)
            and all(fast_block_supported(blk) for blk in self.blocks)
        )

    def forward_features(self, tokens: torch.Tensor) -> torch.Tensor:
        """``(B, L)`` token ids -> ``(B, L, D)`` final-normed token features."""
        self._check(tokens)
        x = self._embed(tokens)
        causal = self.config.causal
        fast = self._fast(x)
        for blk in self.blocks:
            if fast:
                x = inference_block_forward(blk, x, is_causal=causal)
            elif self.grad_checkpointing and torch.is_grad_enabled():
                x = torch.utils.checkpoint.checkpoint(
                    partial(blk, is_causal=causal), x, use_reentrant=False
                )
            else:
                x = blk(x, is_causal=causal)
        return self.ln_final(x)

    def _pooled_fast(self, tokens: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """Inference: ``(B, L)`` tokens, pooled positions ``idx`` ``(B,)`` -> ``(B, D)``.

        Shared prefixes are encoded once (their per-block keys / values are kept), then
        the rest of every caption, in groups of similar length, each group cut after its
        longest row; the last block computes only the pooled rows."""
        device, B = tokens.device, tokens.shape[0]
        lengths = (idx + 1).tolist()
        seqs = [row[:n] for row, n in zip(tokens.tolist(), lengths, strict=True)]
        plan = _shared_prefixes(seqs)
        cluster, prefix_len = plan if plan is not None else ([-1] * B, [])
        prefix_kv = None
        if prefix_len:  # one pass over every shared prefix: (C, P) tokens, padded at the end
            first = {c: i for i, c in reversed(list(enumerate(cluster))) if c >= 0}
            P = max(prefix_len)
            heads = [seqs[first[c]][:p] + [0] * (P - p) for c, p in enumerate(prefix_len)]
            prefix_kv = self._encode_prefixes(torch.tensor(heads, device=device))
        skip = [prefix_len[c] if c >= 0 else 0 for c in cluster]  # tokens taken from a prefix
        rest = [n - k for n, k in zip(lengths, skip, strict=True)]
        order = sorted(range(B), key=rest.__getitem__)
        out, start = None, 0
        for end in _length_groups([rest[i] for i in order]):
            rows = order[start:end]
            S = rest[rows[-1]]
            P = max(skip[i] for i in rows)
            tok = [seqs[i][skip[i] :] + [0] * (S - rest[i]) for i in rows]
            tok = torch.tensor(tok, dtype=tokens.dtype, device=device)  # (n, S)
            offset = torch.tensor([skip[i] for i in rows], device=device)  # (n,)
            positions = (offset[:, None] + torch.arange(S, device=device)).clamp(
                max=self.context_length - 1
            )  # (n, S); padding may run past the context, it is never read
            pooled = torch.tensor([rest[i] - 1 for i in rows], device=device)
            mask = prefix = None
            if P:  # keys: the row's prefix (P slots, the first skip[i] real), then its own
                own = torch.ones(S, S, dtype=torch.bool, device=device).tril()
                pre = torch.arange(P, device=device) < offset[:, None]  # (n, P)
                mask = torch.cat(
                    (pre[:, None, :].expand(-1, S, -1), own.expand(len(rows), -1, -1)), 2
                )
                mask = mask[:, None]  # (n, 1, S, P + S)
                sel = torch.tensor([max(cluster[i], 0) for i in rows], device=device)
                prefix = [(k[sel, :, :P], v[sel, :, :P]) for k, v in prefix_kv]
            x = self._encode_group(tok, positions, pooled, mask, prefix)  # (n, D)
            if out is None:
                out = x.new_empty(B, x.shape[-1])
            out[torch.tensor(rows, device=device)] = x
            start = end
        return out

    def _encode_prefixes(self, tokens: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Inference: ``(C, P)`` prefixes -> every block's ``(k, v)``, each ``(C, Hkv, P, hd)``."""
        x = self._embed(tokens)
        kv: list[tuple[torch.Tensor, torch.Tensor]] = []
        for blk in self.blocks:
            x = inference_block_forward(blk, x, is_causal=True, keep_kv=kv)
        return kv

    def _encode_group(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        pooled: torch.Tensor,
        mask: torch.Tensor | None = None,
        prefix: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
    ) -> torch.Tensor:
        """Inference: ``(n, S)`` tokens at ``positions`` -> ``(n, D)`` final-normed features
        of token ``pooled[i]`` of row ``i``; ``prefix``: per block ``(k, v)`` of earlier
        tokens, ``mask`` ``(n, 1, S, P + S)`` over prefix + own keys (default: causal)."""
        x = self.token_embedding(tokens)  # (n, S, D)
        x = x + self.positional_embedding[positions].to(x.dtype)
        last = len(self.blocks) - 1
        for i, blk in enumerate(self.blocks):
            x = inference_block_forward(
                blk,
                x,
                is_causal=True,
                rows=pooled if i == last else None,
                attn_mask=mask,
                prefix=None if prefix is None else prefix[i],
            )
        return self.ln_final(x[:, 0])

    def forward(self, tokens: torch.Tensor, *, truncate: bool = True) -> torch.Tensor:
        """``(B, L)`` token ids -> ``(B, E)`` caption embeddings (not normalized).

        ``truncate=True`` (exact with causal attention) encodes only up to the last pooled
        token of the batch; ``False`` encodes all ``L`` columns (the reference result).
        """
        self._check(tokens)
        c = self.config
        idx = pool_positions(tokens, c.pool_type, c.eos_id) if c.causal else None
        if truncate and idx is not None and tokens.shape[0] > 0:
            if len(self.blocks) and self._fast(self.positional_embedding):
                return self._project(self._pooled_fast(tokens, idx))
            tokens = tokens[:, : int(idx.max()) + 1]  # nothing after it reaches a pooled row
        x = self.forward_features(tokens)
        return self._project(text_global_pool(x, tokens, c.pool_type, c.eos_id))  # (B, D)

    def _project(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x) if self.proj is not None else x
