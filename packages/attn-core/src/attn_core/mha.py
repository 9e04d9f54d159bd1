"""Multi-head attention (self and cross, MHA / GQA / MQA) on top of ``attention()``.

Shape legend: ``B`` batch, ``Lq`` / ``Lk`` query / key length, ``E`` embed dim,
``H`` query heads, ``Hkv`` key/value heads, ``hd`` head width (``E // H`` unless given),
``I = H * hd`` inner (all heads) width.

Inputs are batch-first ``(B, L, E)``. The projections follow timm's names: one fused
``qkv`` Linear (``E -> (H + 2 * Hkv) * hd``) and an output ``proj`` (``I -> E``); when
``kdim``/``vdim`` differ from ``embed_dim`` there are separate ``q_proj``, ``k_proj``,
``v_proj`` instead (as ``nn.MultiheadAttention`` does).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from .attention import attention
from .kv_cache import KVCache
from .rope import RotaryEmbedding

__all__ = ["MultiHeadAttention"]


class MultiHeadAttention(nn.Module):
    """Multi-head attention with fused projections, GQA/MQA, QK-norm, RoPE and a KV cache.

    Args:
        embed_dim: model width ``E``.
        num_heads: query heads ``H``; ``E`` must be divisible by it unless ``head_dim`` is given.
        head_dim: per-head width ``hd`` of queries, keys and values (default ``E // H``);
            the inner width ``H * hd`` may differ from ``E`` (T5's ``d_kv``).
        num_kv_heads: key/value heads (default ``H``; ``1`` = multi-query attention).
        dropout: dropout on the attention weights (training mode only).
        bias: biases in the input and output projections (``proj_bias``: the output
            projection's, default ``bias``).
        kdim, vdim: widths of key / value inputs for cross-attention (default ``E``).
        qk_norm: normalise queries and keys over the head width (ViT-22B style): ``True``
            for ``nn.LayerNorm``, or a norm constructor such as ``partial(nn.LayerNorm, eps=1e-6)``.
        inner_norm: a norm constructor applied to the attention output (all heads) before
            ``proj`` (EVA02's ``scale_attn_inner``; timm names it ``attn.norm``).
        rope: a :class:`RotaryEmbedding` (or ``True`` for one over the full head width)
            applied to queries and keys in self-attention.
        scale: the score scale passed to ``attention()`` (default ``1 / sqrt(hd)``; T5 uses
            ``1.0``, its scaling folded into the weights).
        backend: force an ``attention()`` backend for this layer.
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        *,
        num_kv_heads: int | None = None,
        dropout: float = 0.0,
        bias: bool = True,
        proj_bias: bool | None = None,
        kdim: int | None = None,
        vdim: int | None = None,
        qk_norm: bool | Callable[[int], nn.Module] = False,
        inner_norm: Callable[[int], nn.Module] | None = None,
        rope: RotaryEmbedding | bool | None = None,
        head_dim: int | None = None,
        scale: float | None = None,
        backend: str | None = None,
    ) -> None:
        super().__init__()
        if num_heads <= 0 or (head_dim is None and embed_dim % num_heads):
            raise ValueError(
                f"embed_dim ({embed_dim}) must be divisible by num_heads ({num_heads})"
            )
        if head_dim is not None and head_dim <= 0:
            raise ValueError(f"head_dim must be a positive int, got {head_dim}")
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        if num_kv_heads <= 0 or num_heads % num_kv_heads:
            raise ValueError(
                f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})"
            )
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = embed_dim // num_heads if head_dim is None else head_dim
        self.inner_dim = num_heads * self.head_dim  # I: width of all query heads
        self.scale = scale
        self.kdim = embed_dim if kdim is None else kdim
        self.vdim = embed_dim if vdim is None else vdim
        self.dropout = dropout
        self.backend = backend
        kv_dim = num_kv_heads * self.head_dim

        self.fused_qkv = self.kdim == embed_dim and self.vdim == embed_dim
        if self.fused_qkv:
            self.qkv = nn.Linear(embed_dim, self.inner_dim + 2 * kv_dim, bias=bias)
        else:
            self.q_proj = nn.Linear(embed_dim, self.inner_dim, bias=bias)
            self.k_proj = nn.Linear(self.kdim, kv_dim, bias=bias)
            self.v_proj = nn.Linear(self.vdim, kv_dim, bias=bias)
        norm = nn.LayerNorm if qk_norm is True else qk_norm
        self.q_norm = norm(self.head_dim) if norm else nn.Identity()
        self.k_norm = norm(self.head_dim) if norm else nn.Identity()
        self.rope = RotaryEmbedding(self.head_dim) if rope is True else (rope or None)
        self.norm = inner_norm(self.inner_dim) if inner_norm is not None else nn.Identity()
        proj_bias = bias if proj_bias is None else proj_bias
        self.proj = nn.Linear(self.inner_dim, embed_dim, bias=proj_bias)

    def extra_repr(self) -> str:
        extra = ""
        if self.inner_dim != self.embed_dim:
            extra += f", head_dim={self.head_dim}"
        if self.scale is not None:
            extra += f", scale={self.scale}"
        return (
            f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, "
            f"num_kv_heads={self.num_kv_heads}, dropout={self.dropout}{extra}"
        )

    @classmethod
    def from_torch(cls, module: nn.MultiheadAttention) -> MultiHeadAttention:
        """Copy an ``nn.MultiheadAttention``'s weights into a new (batch-first) module."""
        if module.bias_k is not None or module.add_zero_attn:
            raise ValueError("add_bias_kv and add_zero_attn are not supported")
        bias = module.in_proj_bias is not None
        ref = module.out_proj.weight
        new = cls(
            module.embed_dim,
            module.num_heads,
            dropout=module.dropout,
            bias=bias,
            kdim=module.kdim,
            vdim=module.vdim,
        ).to(device=ref.device, dtype=ref.dtype)
        with torch.no_grad():
            if new.fused_qkv:
                new.qkv.weight.copy_(module.in_proj_weight)
                if bias:
                    new.qkv.bias.copy_(module.in_proj_bias)
            else:
                for name, proj in (("q", new.q_proj), ("k", new.k_proj), ("v", new.v_proj)):
                    proj.weight.copy_(getattr(module, f"{name}_proj_weight"))
                if bias:
                    for proj, b in zip(
                        (new.q_proj, new.k_proj, new.v_proj),
                        module.in_proj_bias.chunk(3),
                        strict=True,
                    ):
                        proj.bias.copy_(b)
            new.proj.weight.copy_(module.out_proj.weight)
            if bias:
                new.proj.bias.copy_(module.out_proj.bias)
        return new

    def _in_proj(self, x: torch.Tensor, part: str) -> torch.Tensor:
        """Project ``x`` with the query (``"q"``), key+value (``"kv"``), ``"k"`` or ``"v"`` rows."""
        if not self.fused_qkv:
            if part == "kv":
                return torch.cat((self.k_proj(x), self.v_proj(x)), dim=-1)
            return getattr(self, f"{part}_proj")(x)
        inner, kv = self.inner_dim, self.num_kv_heads * self.head_dim
        rows = {
            "q": (0, inner),
            "kv": (inner, inner + 2 * kv),
            "k": (inner, inner + kv),
            "v": (inner + kv, inner + 2 * kv),
        }
        start, end = rows[part]
        bias = None if self.qkv.bias is None else self.qkv.bias[start:end]
        return F.linear(x, self.qkv.weight[start:end], bias)

    def _heads(self, x: torch.Tensor, heads: int) -> torch.Tensor:
        B, L, _ = x.shape
        return x.view(B, L, heads, self.head_dim).transpose(1, 2)  # (B, heads, L, hd)

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor | None = None,
        value: torch.Tensor | None = None,
        *,
        attn_mask: torch.Tensor | None = None,
        key_padding_mask: torch.Tensor | None = None,
        is_causal: bool = False,
        need_weights: bool = False,
        kv_cache: KVCache | None = None,
        rotary: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Attend from ``query`` ``(B, Lq, E)`` to ``key``/``value`` ``(B, Lk, kdim/vdim)``.

        ``key=None`` (or ``key`` and ``value`` being ``query`` itself) means
        self-attention; ``value=None`` means ``value = key``.
        Masks follow the attn_core convention (attn_mask bool True = may attend,
        key_padding_mask bool True = padding) and cover every key, cached ones included.
        With ``kv_cache``, self-attention appends this step's keys/values (RoPE
        continues from the cached length) and cross-attention computes the keys/values
        once and reuses them afterwards. ``rotary`` (self-attention) rotates queries and
        keys ``(B, heads, L, hd)`` for this call, e.g. a 2D RoPE bound to the patch grid.

        Returns ``(out (B, Lq, E), weights (B, H, Lq, Lk) or None)``; weights are per head.
        """
        if query.ndim != 3 or query.shape[-1] != self.embed_dim:
            raise ValueError(
                f"query must be (B, Lq, embed_dim) = (B, Lq, {self.embed_dim}), "
                f"got {tuple(query.shape)}"
            )
        # mha(x), mha(x, x) and mha(x, x, x) are all self-attention (RoPE, cache appends)
        self_attn = key is None or (key is query and (value is None or value is query))
        if self_attn:
            key = value = None
        if self_attn and not self.fused_qkv:
            raise ValueError("kdim/vdim differ from embed_dim: pass key and value explicitly")
        value = key if value is None else value
        H, Hkv = self.num_heads, self.num_kv_heads
        B, Lq, _ = query.shape

        if self_attn and self.fused_qkv:
            kv_dim = Hkv * self.head_dim
            q, k, v = self.qkv(query).split((self.inner_dim, kv_dim, kv_dim), dim=-1)
        else:
            q = self._in_proj(query, "q")
            k = v = None
            if kv_cache is None or kv_cache.is_empty:  # cross-attention keys, not yet cached
                if key is value:
                    k, v = self._in_proj(key, "kv").chunk(2, dim=-1)
                else:
                    k, v = self._in_proj(key, "k"), self._in_proj(value, "v")
        q = self.q_norm(self._heads(q, H))  # (B, H, Lq, hd)
        if k is not None:
            k = self.k_norm(self._heads(k, Hkv))  # (B, Hkv, Lk, hd)
            v = self._heads(v, Hkv)

        if self_attn:
            offset = 0 if kv_cache is None else kv_cache.seq_len
            if self.rope is not None:
                q, k = self.rope(q, offset), self.rope(k, offset)
            if rotary is not None:
                q, k = rotary(q), rotary(k)
            if kv_cache is not None:
                k, v = kv_cache.update(k, v)
        elif kv_cache is not None:
            k, v = kv_cache.update(k, v) if kv_cache.is_empty else (kv_cache.key, kv_cache.value)

        result = attention(
            q,
            k,
            v,
            attn_mask=attn_mask,
            key_padding_mask=key_padding_mask,
            is_causal=is_causal,
            dropout_p=self.dropout if self.training else 0.0,
            scale=self.scale,
            need_weights=need_weights,
            backend=self.backend,
        )
        out, weights = result if need_weights else (result, None)
        out = out.transpose(1, 2).reshape(B, Lq, self.inner_dim)  # (B, Lq, I)
        return self.proj(self.norm(out)), weights
