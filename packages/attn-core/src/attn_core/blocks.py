"""Transformer building blocks: ``FeedForward``, ``LayerScale``, ``DropPath``, ``TransformerBlock``,
``CrossAttentionBlock``.

Shape legend: ``B`` batch, ``L`` tokens, ``S`` context (encoder) tokens, ``D`` width,
``H`` / ``Hkv`` query / key-value heads, ``hd`` head width, ``P`` earlier (prefix) tokens.

``TransformerBlock`` is the one block ViT, the CLIP text tower and the NLP encoder /
decoder stacks are built from. Names follow timm's ``Block`` (``norm1``, ``attn``,
``ls1``, ``norm2``, ``mlp.fc1``, ``mlp.fc2``, ``ls2``) so converted weights line up.
It owns both of its paths: ``forward`` (module calls: training, autograd, every option) and,
next to it, ``forward_fused`` (the inference fast path of :mod:`attn_core.fast_inference`:
oneDNN products on pre-packed weights, for the blocks ``fused_supported`` accepts).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from .activations import ACTIVATIONS, GATED_ACTIVATIONS, QuickGELU
from .attention import attention
from .kv_cache import KVCache
from .mha import MultiHeadAttention
from .onednn import fused_linear
from .rope import RotaryEmbedding

__all__ = [
    "ACTIVATIONS",
    "CrossAttentionBlock",
    "DropPath",
    "FeedForward",
    "LayerScale",
    "QuickGELU",
    "TransformerBlock",
]

KV = tuple[torch.Tensor, torch.Tensor]  # one block's (k, v), each (B, Hkv, N, hd)


class FeedForward(nn.Module):
    """Position-wise MLP: ``fc2(drop(act(fc1(x))))`` ``(..., D) -> (..., out_dim)``.

    ``act="swiglu"`` makes it gated (Shazeer 2020): ``fc1`` produces ``[x, gate]`` and
    the hidden activation is ``x * silu(gate)`` (``gate_last=False``: ``[gate, x]``, timm's
    ``GluMlp(gate_last=False)`` of EVA02 / DINOv2-giant); ``act="geglu_tanh"`` is the same
    with ``gelu_tanh(gate)`` (T5 v1.1 / mT5's ``gated-gelu``: ``gelu_tanh(wi_0 x) * wi_1 x``
    is ``gate_last=False`` with ``fc1 = [wi_0; wi_1]``). ``inner_norm`` (a norm
    constructor) normalises the hidden activation before ``fc2`` (EVA02's ``scale_mlp``).
    """

    def __init__(
        self,
        dim: int,
        hidden_dim: int | None = None,
        out_dim: int | None = None,
        *,
        act: str = "gelu",
        dropout: float = 0.0,
        bias: bool = True,
        inner_norm: Callable[[int], nn.Module] | None = None,
        gate_last: bool = True,
    ) -> None:
        super().__init__()
        if act not in ACTIVATIONS:
            raise ValueError(f"unknown activation {act!r}; expected one of {sorted(ACTIVATIONS)}")
        hidden_dim = 4 * dim if hidden_dim is None else hidden_dim
        self.gated, self.gate_last = act in GATED_ACTIVATIONS, gate_last
        self.fc1 = nn.Linear(dim, hidden_dim * (2 if self.gated else 1), bias=bias)
        self.act = ACTIVATIONS[act]()
        self.drop = nn.Dropout(dropout)
        self.norm = inner_norm(hidden_dim) if inner_norm is not None else nn.Identity()
        self.fc2 = nn.Linear(hidden_dim, dim if out_dim is None else out_dim, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.fc1(x)
        if self.gated:
            x, gate = x.chunk(2, dim=-1) if self.gate_last else x.chunk(2, dim=-1)[::-1]
            x = x * self.act(gate)
        else:
            x = self.act(x)
        return self.fc2(self.norm(self.drop(x)))


class LayerScale(nn.Module):
    """Per-channel learnable residual scale (CaiT): ``x * gamma``."""

    def __init__(self, dim: int, init_values: float = 1e-5) -> None:
        super().__init__()
        self.gamma = nn.Parameter(init_values * torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gamma


class DropPath(nn.Module):
    """Stochastic depth: drop a whole residual branch per sample while training."""

    def __init__(self, drop_prob: float = 0.0) -> None:
        super().__init__()
        self.drop_prob = drop_prob

    def extra_repr(self) -> str:
        return f"drop_prob={self.drop_prob}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.drop_prob == 0.0 or not self.training:
            return x
        keep = 1.0 - self.drop_prob
        mask = x.new_empty((x.shape[0],) + (1,) * (x.ndim - 1)).bernoulli_(keep)
        return x * mask / keep


class TransformerBlock(nn.Module):
    """Self-attention, optional cross-attention and an MLP, each a residual branch.

    Pre-norm (``norm_first=True``, ViT / GPT / CLIP): ``x + branch(norm(x))``.
    Post-norm (``norm_first=False``, the original Transformer / BERT / Marian):
    ``norm(x + branch(x))``. Each branch output goes through dropout, layer scale and
    drop path before the residual add.

    Args:
        dim: width ``D``.
        num_heads: attention heads.
        mlp_ratio: MLP hidden width as a multiple of ``dim`` (or give ``mlp_hidden_dim``).
        num_kv_heads: key/value heads for GQA/MQA in self-attention.
        bias: biases in the attention projections (``proj_bias``: the output projection's,
            default ``bias``); ``mlp_bias`` in the MLP.
        act: MLP activation: ``gelu``, ``gelu_tanh``, ``quick_gelu``, ``relu``, ``silu``,
            or gated: ``swiglu``, ``geglu_tanh``.
        norm_first: pre-norm (True) or post-norm (False).
        cross_attention: add a cross-attention branch over ``context``.
        context_dim: width of ``context`` (default ``dim``).
        dropout: dropout on each branch output (and inside the MLP).
        attn_dropout: dropout on the attention weights.
        drop_path: stochastic depth rate.
        layer_scale: LayerScale init value, or None for no layer scale.
        norm_layer: norm constructor taking the width (e.g. ``partial(nn.LayerNorm, eps=1e-6)``).
        qk_norm: normalise queries and keys per head with ``norm_layer`` (as timm).
        attn_inner_norm, mlp_inner_norm: ``norm_layer`` on the attention output before its
            projection / on the MLP's hidden activation (EVA02's ``scale_attn_inner`` /
            ``scale_mlp``).
        mlp_gate_last: with a gated ``act``, ``fc1`` gives ``[x, gate]`` (else ``[gate, x]``).
        attn_head_dim: self-attention head width (default ``dim // num_heads``; the heads'
            inner width may then differ from ``dim``, as T5's ``d_kv``).
        attn_scale: self-attention score scale (default ``1 / sqrt(head width)``; T5: 1.0).
        rope, backend: passed to :class:`MultiHeadAttention` (self-attention).
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        mlp_ratio: float = 4.0,
        *,
        mlp_hidden_dim: int | None = None,
        num_kv_heads: int | None = None,
        bias: bool = True,
        proj_bias: bool | None = None,
        mlp_bias: bool = True,
        act: str = "gelu",
        norm_first: bool = True,
        cross_attention: bool = False,
        context_dim: int | None = None,
        dropout: float = 0.0,
        attn_dropout: float = 0.0,
        drop_path: float = 0.0,
        layer_scale: float | None = None,
        norm_layer: Callable[[int], nn.Module] = nn.LayerNorm,
        qk_norm: bool = False,
        attn_inner_norm: bool = False,
        mlp_inner_norm: bool = False,
        mlp_gate_last: bool = True,
        attn_head_dim: int | None = None,
        attn_scale: float | None = None,
        rope: RotaryEmbedding | bool | None = None,
        backend: str | None = None,
    ) -> None:
        super().__init__()
        self.norm_first = norm_first

        def scale() -> nn.Module:
            return LayerScale(dim, layer_scale) if layer_scale is not None else nn.Identity()

        def drop() -> nn.Module:
            return DropPath(drop_path) if drop_path > 0.0 else nn.Identity()

        self.norm1 = norm_layer(dim)
        self.attn = MultiHeadAttention(
            dim,
            num_heads,
            num_kv_heads=num_kv_heads,
            dropout=attn_dropout,
            bias=bias,
            proj_bias=proj_bias,
            qk_norm=norm_layer if qk_norm else False,
            inner_norm=norm_layer if attn_inner_norm else None,
            rope=rope,
            head_dim=attn_head_dim,
            scale=attn_scale,
            backend=backend,
        )
        self.ls1, self.drop_path1 = scale(), drop()
        if cross_attention:
            self.norm_cross = norm_layer(dim)
            self.cross_attn = MultiHeadAttention(
                dim,
                num_heads,
                dropout=attn_dropout,
                bias=bias,
                kdim=context_dim,
                vdim=context_dim,
                backend=backend,
            )
            self.ls_cross, self.drop_path_cross = scale(), drop()
        else:
            self.cross_attn = None
        self.norm2 = norm_layer(dim)
        hidden = mlp_hidden_dim if mlp_hidden_dim is not None else int(dim * mlp_ratio)
        self.mlp = FeedForward(
            dim,
            hidden,
            act=act,
            dropout=dropout,
            bias=mlp_bias,
            inner_norm=norm_layer if mlp_inner_norm else None,
            gate_last=mlp_gate_last,
        )
        self.ls2, self.drop_path2 = scale(), drop()
        self.dropout = dropout

    def _residual(self, x, branch, norm, ls, drop_path):
        if self.norm_first:
            return x + drop_path(ls(F.dropout(branch(norm(x)), self.dropout, self.training)))
        return norm(x + drop_path(ls(F.dropout(branch(x), self.dropout, self.training))))

    def forward(
        self,
        x: torch.Tensor,
        context: torch.Tensor | None = None,
        *,
        attn_mask: torch.Tensor | None = None,
        key_padding_mask: torch.Tensor | None = None,
        is_causal: bool = False,
        context_key_padding_mask: torch.Tensor | None = None,
        kv_cache: KVCache | None = None,
        cross_kv_cache: KVCache | None = None,
        need_weights: bool = False,
        rotary: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """``x`` ``(B, L, D)`` (and ``context`` ``(B, S, context_dim)``) -> ``(B, L, D)``.

        ``attn_mask`` / ``key_padding_mask`` / ``is_causal`` apply to self-attention,
        ``context_key_padding_mask`` to cross-attention (True = padding); ``rotary`` rotates
        the self-attention queries and keys (e.g. a 2D RoPE for this input's patch grid).
        ``need_weights=True`` returns ``(x, weights)`` with the self-attention weights
        ``(B, H, L, L)`` (computed by the ``math`` backend).
        """

        weights = []

        def self_attn(h: torch.Tensor) -> torch.Tensor:
            out, w = self.attn(
                h,
                attn_mask=attn_mask,
                key_padding_mask=key_padding_mask,
                is_causal=is_causal,
                need_weights=need_weights,
                kv_cache=kv_cache,
                rotary=rotary,
            )
            weights.append(w)
            return out

        x = self._residual(x, self_attn, self.norm1, self.ls1, self.drop_path1)
        if self.cross_attn is not None:
            if context is None:
                raise ValueError("this block has cross-attention: pass context (B, S, D)")

            def cross_attn(h: torch.Tensor) -> torch.Tensor:
                return self.cross_attn(
                    h,
                    context,
                    key_padding_mask=context_key_padding_mask,
                    kv_cache=cross_kv_cache,
                )[0]

            x = self._residual(x, cross_attn, self.norm_cross, self.ls_cross, self.drop_path_cross)
        x = self._residual(x, self.mlp, self.norm2, self.ls2, self.drop_path2)
        return (x, weights[0]) if need_weights else x

    # -- the inference fast path (attn_core.fast_inference runs it; exact up to rounding) --

    def fused_supported(self) -> bool:
        """Whether :meth:`forward_fused` can run this block: pre-norm self-attention in
        eval mode with plain ``nn.Linear`` layers (not, e.g., quantized ones), a fused
        ``qkv``, no RoPE, no inner norms and no gated MLP (nor a model's own MLP)."""
        if self.training or type(self.mlp) is not FeedForward:  # e.g. ViTamin's GeGLU
            return False
        attn = self.attn
        linears = (getattr(attn, "qkv", None), attn.proj, self.mlp.fc1, self.mlp.fc2)
        return (
            all(type(m) is nn.Linear for m in linears)
            and self.norm_first
            and self.cross_attn is None
            and attn.fused_qkv
            and attn.rope is None
            and not self.mlp.gated
            and type(attn.norm) is nn.Identity
            and type(self.mlp.norm) is nn.Identity
            and isinstance(self.ls1, (nn.Identity, LayerScale))
            and isinstance(self.ls2, (nn.Identity, LayerScale))
        )

    def forward_fused(
        self,
        x: torch.Tensor,
        *,
        is_causal: bool = False,
        attn_mask: torch.Tensor | None = None,
        rows: torch.Tensor | None = None,
        prefix: KV | None = None,
        keep_kv: list[KV] | None = None,
    ) -> torch.Tensor:
        """``self(x, attn_mask=attn_mask, is_causal=is_causal)`` with every Linear one oneDNN
        product (:func:`attn_core.onednn.fused_linear`), for a :meth:`fused_supported` block
        where :func:`attn_core.onednn.fast_path_available` (the caller checks both).

        ``x`` ``(B, N, D)``; ``rows`` ``(B,)`` keeps only token ``rows[b]`` -> ``(B, 1, D)``
        (its keys and values still come from every token). ``prefix``: ``(k, v)`` of ``P``
        earlier tokens attended before ``x``'s own (``attn_mask`` then covers ``P + N``
        keys); ``keep_kv`` receives this block's own ``(k, v)``.
        """
        attn = self.attn
        B, N, D = x.shape
        H, Hkv, hd = attn.num_heads, attn.num_kv_heads, attn.head_dim
        qkv = fused_linear(self.norm1(x), attn.qkv.weight, attn.qkv.bias)  # (B, N, (H + 2 Hkv) hd)
        q, k, v = qkv.split((H * hd, Hkv * hd, Hkv * hd), dim=-1)
        k = attn.k_norm(k.view(B, N, Hkv, hd).transpose(1, 2))  # (B, Hkv, N, hd)
        v = v.view(B, N, Hkv, hd).transpose(1, 2)
        if keep_kv is not None:
            keep_kv.append((k, v))
        if prefix is not None:
            k, v = torch.cat((prefix[0], k), dim=2), torch.cat((prefix[1], v), dim=2)
        mask = attn_mask
        if mask is not None:
            is_causal = False
        if rows is not None:  # one query per sequence: q (B, 1, H hd), x (B, 1, D)
            batch = torch.arange(B, device=x.device)
            q, x = q[batch, rows][:, None], x[batch, rows][:, None]
            Nk = k.shape[2]
            if mask is not None:  # any broadcastable mask -> (B, 1 or H, 1, P + N)
                mask = mask.reshape((1,) * (4 - mask.ndim) + mask.shape)
                mask = mask.expand(B, mask.shape[1], N, Nk)[batch, :, rows][:, :, None]
            elif is_causal:  # query rows[b] (own position) sees keys <= rows[b] + P
                mask = torch.arange(Nk, device=x.device) <= rows[:, None] + (Nk - N)
                mask = mask[:, None, None, :]  # (B, 1, 1, P + N)
            is_causal = False
        Lq = q.shape[1]
        q = attn.q_norm(q.view(B, Lq, H, hd).transpose(1, 2))  # (B, H, Lq, hd)
        o = attention(
            q, k, v, attn_mask=mask, is_causal=is_causal, scale=attn.scale, backend=attn.backend
        )
        o = o.transpose(1, 2).reshape(B, Lq, H * hd)  # (B, Lq, H hd)
        if isinstance(self.ls1, LayerScale):
            x = x + self.ls1(fused_linear(o, attn.proj.weight, attn.proj.bias))
        else:
            x = fused_linear(o, attn.proj.weight, attn.proj.bias, residual=x)

        mlp = self.mlp
        h = fused_linear(self.norm2(x), mlp.fc1.weight, mlp.fc1.bias, act=mlp.act)
        if isinstance(self.ls2, LayerScale):
            return x + self.ls2(fused_linear(h, mlp.fc2.weight, mlp.fc2.bias))
        return fused_linear(h, mlp.fc2.weight, mlp.fc2.bias, residual=x)


class CrossAttentionBlock(nn.Module):
    """Cross-attention and an MLP, each a pre-norm residual branch (no self-attention):
    ``x + ls1(attn(norm1(x), norm_context(context)))``, then ``x + ls2(mlp(norm2(x)))``.

    open_clip's ``ResidualAttentionBlock(is_cross_attention=True)`` (CoCa's multimodal
    decoder; ``ln_1_kv`` is ``norm_context``), a Perceiver's cross block. The keys and
    values of a context can be computed once (:meth:`context_kv`) and reused on every
    decoding step. ``x`` may hold ``R`` rows per context row (``x`` ``(B R, L, D)``, rows of
    one context adjacent: beams or samples of one image): the ``R`` rows' queries are then
    attended together against their one context's keys, which are never copied.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        mlp_ratio: float = 4.0,
        *,
        context_dim: int | None = None,
        act: str = "gelu",
        layer_scale: float | None = None,
        norm_layer: Callable[[int], nn.Module] = nn.LayerNorm,
        backend: str | None = None,
    ) -> None:
        super().__init__()
        context_dim = dim if context_dim is None else context_dim
        self.norm1 = norm_layer(dim)
        self.norm_context = norm_layer(context_dim)
        self.attn = MultiHeadAttention(
            dim, num_heads, kdim=context_dim, vdim=context_dim, backend=backend
        )
        self.ls1 = LayerScale(dim, layer_scale) if layer_scale is not None else nn.Identity()
        self.norm2 = norm_layer(dim)
        self.mlp = FeedForward(dim, int(dim * mlp_ratio), act=act)
        self.ls2 = LayerScale(dim, layer_scale) if layer_scale is not None else nn.Identity()

    def context_kv(self, context: torch.Tensor) -> KV:
        """``(B, S, context_dim)`` -> this block's keys and values, each ``(B, H, S, hd)``."""
        attn = self.attn
        k, v = attn._in_proj(self.norm_context(context), "kv").chunk(2, dim=-1)
        return attn.k_norm(attn._heads(k, attn.num_kv_heads)), attn._heads(v, attn.num_kv_heads)

    def forward(
        self,
        x: torch.Tensor,
        context: torch.Tensor | None = None,
        *,
        context_kv: KV | None = None,
    ) -> torch.Tensor:
        """``x`` ``(B R, L, D)`` attends over ``context`` ``(B, S, context_dim)`` (or its
        precomputed ``context_kv``) -> ``(B R, L, D)``."""
        if context_kv is None:
            if context is None:
                raise ValueError("pass context (B, S, context_dim) or context_kv")
            context_kv = self.context_kv(context)
        k, v = context_kv
        attn = self.attn
        N, L, D = x.shape
        B, H, hd = k.shape[0], attn.num_heads, attn.head_dim
        if B == 0 or N % B:
            raise ValueError(
                f"x has {N} rows, not a multiple of the context's {B} (R rows per context)"
            )
        R = N // B
        q = attn._in_proj(self.norm1(x), "q")  # (B R, L, D)
        q = q.view(B, R * L, H, hd).transpose(1, 2)  # (B, H, R L, hd): a context's rows together
        o = attention(attn.q_norm(q), k, v, backend=attn.backend)  # (B, H, R L, hd)
        o = o.transpose(1, 2).reshape(N, L, D)
        x = x + self.ls1(attn.proj(attn.norm(o)))
        return x + self.ls2(self.mlp(self.norm2(x)))
