"""The T5 / mT5 encoder (Raffel et al. 2020; Xue et al. 2021), loading Hugging Face weights.

Shape legend: ``B`` batch, ``L`` tokens, ``D`` width (``d_model``), ``H`` heads, ``hd`` head
width (``d_kv``, free: ``H * hd`` need not be ``D``), ``F`` feed-forward width (``d_ff``),
``NB`` relative-position buckets.

The encoder of transformers' ``T5EncoderModel`` / ``MT5EncoderModel`` (``T5Stack``), which
open_clip's ``mt5-base-ViT-B-32`` / ``mt5-xl-ViT-H-14`` text towers are built on::

    x = embed_tokens(input_ids)                    # (B, L, D), not scaled
    bias = relative_position_bias(L, L)            # (1, H, L, L), computed once
    for block in blocks:                           # pre-norm, RMSNorm, no biases anywhere
        x = x + attn(rms_norm(x), bias + padding)  # scores q k^T, no 1 / sqrt(hd)
        x = x + ffn(rms_norm(x))                   # gelu_tanh(wi_0 x) * wi_1 x, or relu(wi x)
    return rms_norm(x)                             # (B, L, D)

Positions enter only through the bias: each (query, key) offset ``key - query`` falls into one
of ``NB`` buckets (half per direction; half of those exact offsets, the rest logarithmically
wider up to ``max_distance``), and each bucket holds one learned score per head. transformers
keeps that table in the first block (``block.0...relative_attention_bias``) and adds the
same bias in every layer; here it is :class:`RelativePositionBias`, owned by the encoder,
and every block gets it as an additive attention mask next to the padding mask.

* :class:`Config`, :func:`config_from_hf` (``config.json`` -> :class:`Config`),
  :class:`Encoder`, :func:`convert_hf` (Hugging Face keys -> ours), :data:`MODEL_TYPE`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from attn_core import TransformerBlock
from torch import nn

from .config import config_from_dict

__all__ = [
    "MODEL_TYPE",
    "Config",
    "Encoder",
    "RelativePositionBias",
    "config_from_hf",
    "convert_hf",
    "relative_position_bucket",
]

MODEL_TYPE = "attn_nlp.t5"

# our feed_forward name -> the TransformerBlock MLP activation (FeedForward: gated ones take
# fc1 = [wi_0; wi_1] with gate_last=False, i.e. hidden = act(wi_0 x) * wi_1 x)
FEED_FORWARDS = {"gated-gelu": "geglu_tanh", "relu": "relu"}


@dataclass
class Config:
    """Hyper-parameters of :class:`Encoder` (defaults: ``google/mt5-base``'s encoder)."""

    vocab_size: int = 250112
    embed_dim: int = 768  # d_model, D
    depth: int = 12  # num_layers
    num_heads: int = 12  # num_heads, H
    head_dim: int = 64  # d_kv, hd (H * hd need not equal D)
    mlp_dim: int = 2048  # d_ff, F
    feed_forward: str = "gated-gelu"  # "gated-gelu" (mT5, T5 v1.1) or "relu" (original T5)
    relative_buckets: int = 32  # relative_attention_num_buckets, NB
    relative_max_distance: int = 128  # relative_attention_max_distance
    norm_eps: float = 1e-6  # layer_norm_epsilon (RMSNorm)
    pad_id: int = 0  # pad_token_id: the tokenizer's padding id (for callers building masks)
    dropout: float = 0.0  # training only (where T5 drops); config_from_hf leaves it 0

    def __post_init__(self) -> None:
        for name in ("vocab_size", "embed_dim", "depth", "num_heads", "head_dim", "mlp_dim"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.feed_forward not in FEED_FORWARDS:
            raise ValueError(
                f"feed_forward must be one of {sorted(FEED_FORWARDS)}, got {self.feed_forward!r}"
            )
        max_exact = self.relative_buckets // 4  # exact offsets per direction
        if self.relative_buckets < 4 or self.relative_max_distance <= max_exact:
            raise ValueError(
                "relative_buckets must be >= 4 and relative_max_distance > relative_buckets // 4 "
                f"(the exact offsets); got {self.relative_buckets} and "
                f"{self.relative_max_distance}"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")

    @property
    def inner_dim(self) -> int:
        """``H * hd``: the width of all heads' queries, keys and values."""
        return self.num_heads * self.head_dim

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Config:
        """Build from a dict (e.g. ``config.json``); unknown keys raise ``ValueError``."""
        return config_from_dict(cls, data, MODEL_TYPE)


# -- Hugging Face config.json ------------------------------------------------------------

# transformers' T5Config / MT5Config defaults for the keys read, when config.json omits them
_HF_DEFAULTS: dict[str, dict[str, Any]] = {
    "t5": dict(
        vocab_size=32128,
        d_model=512,
        d_kv=64,
        d_ff=2048,
        num_layers=6,
        num_heads=8,
        feed_forward_proj="relu",
    ),
    "mt5": dict(
        vocab_size=250112,
        d_model=512,
        d_kv=64,
        d_ff=1024,
        num_layers=8,
        num_heads=6,
        feed_forward_proj="gated-gelu",
    ),
}
_HF_COMMON = dict(
    relative_attention_num_buckets=32,
    relative_attention_max_distance=128,
    layer_norm_epsilon=1e-6,
    pad_token_id=0,
)
# T5Config.attribute_map: the other names transformers accepts for these keys
_HF_ALIASES = {
    "hidden_size": "d_model",
    "num_attention_heads": "num_heads",
    "num_hidden_layers": "num_layers",
    "head_dim": "d_kv",
}


def _feed_forward(hf: Mapping[str, Any], default: str) -> str:
    """Our ``feed_forward`` for a config.json, read as transformers reads it: the kind from
    ``feed_forward_proj`` (``gated-gelu`` computes with ``gelu_new``, the tanh GELU), then
    ``dense_act_fn`` / ``is_gated_act`` where the file has them (they win in transformers)."""
    proj = hf.get("feed_forward_proj", default)
    parts = str(proj).split("-")
    gated, act = parts[0] == "gated", parts[-1]
    if proj == "gated-gelu":
        act = "gelu_new"
    act = hf.get("dense_act_fn", act)
    gated = hf.get("is_gated_act", gated)
    if gated and act == "gelu_new":
        return "gated-gelu"
    if not gated and act == "relu":
        return "relu"
    raise ValueError(
        f"feed_forward_proj {proj!r} (dense_act_fn {act!r}, is_gated_act {gated}) is not "
        "supported; expected 'gated-gelu' (mT5, T5 v1.1: gelu_new, gated) or 'relu' "
        "(original T5)"
    )


def config_from_hf(hf: Mapping[str, Any]) -> Config:
    """A T5 / mT5 ``config.json`` dict -> :class:`Config` of its encoder.

    Read: sizes (``vocab_size``, ``d_model``, ``d_kv``, ``d_ff``, ``num_layers``,
    ``num_heads``), ``feed_forward_proj`` (with ``dense_act_fn`` / ``is_gated_act``),
    the relative-attention buckets and distance, ``layer_norm_epsilon``, ``pad_token_id``;
    missing ones take transformers' defaults for the ``model_type``. Refused by name: a
    feed-forward other than ``gated-gelu`` / ``relu``, ``is_decoder: true`` (a causal stack),
    ``pruned_heads``. Ignored (no effect on the encoder's inference): dropouts, init
    factors, the decoder's sizes, embedding tying, token ids other than padding, dtypes, ...
    """
    hf = dict(hf)
    model_type = hf.get("model_type", "t5")
    if model_type not in _HF_DEFAULTS:
        raise ValueError(f"model_type {model_type!r} is not a T5 config; expected 't5' or 'mt5'")
    for alias, key in _HF_ALIASES.items():
        if alias in hf:
            if key in hf and hf[key] != hf[alias]:
                raise ValueError(f"config.json gives {key}={hf[key]} and {alias}={hf[alias]}")
            hf[key] = hf.pop(alias)
    defaults = {**_HF_DEFAULTS[model_type], **_HF_COMMON}

    def get(key: str) -> Any:
        value = hf.get(key)
        return defaults[key] if value is None else value

    if hf.get("is_decoder"):
        raise ValueError("is_decoder: true is a causal decoder stack, not the T5 encoder")
    if hf.get("pruned_heads"):
        raise ValueError(f"pruned_heads {hf['pruned_heads']!r} is not supported")
    return Config(
        vocab_size=get("vocab_size"),
        embed_dim=get("d_model"),
        depth=get("num_layers"),
        num_heads=get("num_heads"),
        head_dim=get("d_kv"),
        mlp_dim=get("d_ff"),
        feed_forward=_feed_forward(hf, defaults["feed_forward_proj"]),
        relative_buckets=get("relative_attention_num_buckets"),
        relative_max_distance=get("relative_attention_max_distance"),
        norm_eps=float(get("layer_norm_epsilon")),
        pad_id=get("pad_token_id"),
    )


# -- the model ---------------------------------------------------------------------------


def relative_position_bucket(
    relative_position: torch.Tensor,
    *,
    bidirectional: bool = True,
    num_buckets: int = 32,
    max_distance: int = 128,
) -> torch.Tensor:
    """T5's bucket of each offset ``key - query`` (an integer tensor, any shape).

    Bidirectional: buckets ``[0, NB/2)`` for offsets <= 0, ``[NB/2, NB)`` for offsets > 0.
    In each half, the first ``NB/4`` buckets are the exact distances ``0 .. NB/4 - 1``; the
    others cover distances up to ``max_distance`` in logarithmically growing bins, and every
    longer distance shares the last bucket. (Unidirectional, a decoder's: offsets > 0 are
    all bucket 0 and the ``NB`` buckets cover distances looking back.)
    """
    bucket = torch.zeros_like(relative_position)
    if bidirectional:
        num_buckets //= 2
        bucket = bucket + (relative_position > 0).long() * num_buckets
        distance = relative_position.abs()
    else:
        distance = (-relative_position).clamp(min=0)
    max_exact = num_buckets // 2
    # the same float32 expression as transformers / Mesh TensorFlow, so each bin edge agrees;
    # distances below max_exact (log of <= 0) are clamped: they take the exact bucket anyway
    far = distance.clamp(min=max_exact).float()
    log_bucket = (
        max_exact
        + (
            torch.log(far / max_exact)
            / math.log(max_distance / max_exact)
            * (num_buckets - max_exact)
        ).long()
    )
    log_bucket = log_bucket.clamp(max=num_buckets - 1)
    return bucket + torch.where(distance < max_exact, distance, log_bucket)


class RelativePositionBias(nn.Module):
    """A learned score per (bucket of ``key - query``, head): ``(Lq, Lk) -> (1, H, Lq, Lk)``.

    transformers' ``T5Attention.relative_attention_bias`` (``nn.Embedding(NB, H)``) with its
    ``compute_bias``; the encoder's is bidirectional.
    """

    def __init__(
        self, num_buckets: int, max_distance: int, num_heads: int, *, bidirectional: bool = True
    ) -> None:
        super().__init__()
        self.num_buckets, self.max_distance = num_buckets, max_distance
        self.bidirectional = bidirectional
        self.embed = nn.Embedding(num_buckets, num_heads)  # (NB, H)

    def extra_repr(self) -> str:
        return f"max_distance={self.max_distance}, bidirectional={self.bidirectional}"

    def forward(self, query_len: int, key_len: int) -> torch.Tensor:
        device = self.embed.weight.device
        query = torch.arange(query_len, device=device)[:, None]
        key = torch.arange(key_len, device=device)[None, :]
        buckets = relative_position_bucket(
            key - query,  # (Lq, Lk)
            bidirectional=self.bidirectional,
            num_buckets=self.num_buckets,
            max_distance=self.max_distance,
        )
        return self.embed(buckets).permute(2, 0, 1)[None]  # (1, H, Lq, Lk)


class Encoder(nn.Module):
    """T5 / mT5 encoder: token ids ``(B, L)`` -> last hidden states ``(B, L, D)``.

    ``embed_tokens`` (no scaling), ``relative_position_bias`` (computed once per call, added to
    every block's attention scores), ``blocks`` (pre-norm :class:`attn_core.TransformerBlock`:
    ``nn.RMSNorm``, no biases, attention scores unscaled, ``H * hd`` inner width, gated-GELU
    or ReLU MLP), final ``norm`` (RMSNorm). Equal to transformers' ``last_hidden_state`` in
    fp32 for ``attention_mask = ~key_padding_mask``, at every position of a sequence with at
    least one real token (T5 masks keys only, so padding positions get hidden states too).
    """

    model_type = MODEL_TYPE

    def __init__(self, config: Config) -> None:
        super().__init__()
        c = self.config = config
        self.width = c.embed_dim
        self.embed_tokens = nn.Embedding(c.vocab_size, c.embed_dim)
        self.relative_position_bias = RelativePositionBias(
            c.relative_buckets, c.relative_max_distance, c.num_heads
        )
        self.drop = nn.Dropout(c.dropout)
        norm = partial(nn.RMSNorm, eps=c.norm_eps)
        self.blocks = nn.ModuleList(
            TransformerBlock(
                c.embed_dim,
                c.num_heads,
                mlp_hidden_dim=c.mlp_dim,
                bias=False,
                mlp_bias=False,
                act=FEED_FORWARDS[c.feed_forward],
                mlp_gate_last=False,  # fc1 = [wi_0 (gate); wi_1]
                norm_first=True,
                norm_layer=norm,
                attn_head_dim=c.head_dim,
                attn_scale=1.0,  # T5 does not scale q k^T (folded into its initialisation)
                dropout=c.dropout,
                attn_dropout=c.dropout,
            )
            for _ in range(c.depth)
        )
        self.norm = norm(c.embed_dim)

    def forward(
        self, input_ids: torch.Tensor, key_padding_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``input_ids`` ``(B, L)`` integer, ``key_padding_mask`` ``(B, L)`` bool (True =
        padding; None = attend to every token) -> ``(B, L, D)``.

        A sequence that is all padding has no key to attend to: its rows come out of
        attention as zeros (transformers spreads them evenly over the padding instead).
        """
        if input_ids.ndim != 2 or input_ids.is_floating_point() or input_ids.is_complex():
            raise ValueError(
                f"input_ids must be integer token ids (B, L), got {input_ids.dtype} of shape "
                f"{tuple(input_ids.shape)}"
            )
        if key_padding_mask is not None and (
            key_padding_mask.dtype != torch.bool or key_padding_mask.shape != input_ids.shape
        ):
            raise ValueError(
                f"key_padding_mask must be bool (B, L) = {tuple(input_ids.shape)} (True = "
                f"padding), got {key_padding_mask.dtype} of shape {tuple(key_padding_mask.shape)}"
            )
        L = input_ids.shape[1]
        x = self.drop(self.embed_tokens(input_ids))  # (B, L, D)
        bias = self.relative_position_bias(L, L).to(x.dtype)  # (1, H, L, L), additive
        for block in self.blocks:
            x = block(x, attn_mask=bias, key_padding_mask=key_padding_mask)
        return self.drop(self.norm(x))


# -- Hugging Face weights ----------------------------------------------------------------


def _tied(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a is b or (a.shape == b.shape and (a.is_meta or torch.equal(a, b)))


def convert_hf(state_dict: Mapping[str, torch.Tensor], config: Config) -> dict[str, torch.Tensor]:
    """transformers' T5 / mT5 weights -> :class:`Encoder` keys; strict.

    Accepts ``T5EncoderModel`` / ``MT5EncoderModel`` and the hub's
    ``(M)T5ForConditionalGeneration`` / ``(M)T5Model`` checkpoints (``shared.weight`` and /
    or ``encoder.embed_tokens.weight``, equal when both are there, and ``encoder.*``; the
    ``decoder.*`` and ``lm_head.*`` keys are dropped), and the bare encoder stack
    (``T5Stack.state_dict()``: ``embed_tokens.weight``, ``block.N.*``,
    ``final_layer_norm.weight``; open_clip's ``text.transformer.*`` with that prefix
    stripped). Each block's ``q``, ``k``, ``v`` are fused into one ``qkv``; the gated MLP's
    ``wi_0`` (gate) and ``wi_1`` into one ``fc1``.

    Raises ``ValueError`` listing every missing or unexpected key (and a tied embedding
    that differs from ``shared.weight``).
    """
    sd = dict(state_dict)
    full = "shared.weight" in sd or any(k.startswith("encoder.") for k in sd)
    if full:  # a whole (M)T5 model: keep the encoder, drop the decoder and LM head by name
        shared = sd.pop("shared.weight", None)
        sd = {k: v for k, v in sd.items() if not k.startswith(("decoder.", "lm_head."))}
        prefix = "encoder."
        if shared is not None:
            tied = sd.pop("encoder.embed_tokens.weight", None)
            if tied is not None and not _tied(tied, shared):
                raise ValueError(
                    "encoder.embed_tokens.weight should be tied to shared.weight but differs"
                )
            sd["encoder.embed_tokens.weight"] = shared
    else:
        prefix = ""
    missing: list[str] = []

    def take(key: str) -> torch.Tensor:
        if f"{prefix}{key}" not in sd:
            full_embed = full and key == "embed_tokens.weight"
            missing.append("shared.weight" if full_embed else f"{prefix}{key}")
            return torch.empty(0)
        return sd.pop(f"{prefix}{key}")

    out = {
        "embed_tokens.weight": take("embed_tokens.weight"),
        "relative_position_bias.embed.weight": take(
            "block.0.layer.0.SelfAttention.relative_attention_bias.weight"
        ),
    }
    for i in range(config.depth):
        hf, ours = f"block.{i}.layer", f"blocks.{i}"
        attn = {p: take(f"{hf}.0.SelfAttention.{p}.weight") for p in "qkvo"}
        out[f"{ours}.norm1.weight"] = take(f"{hf}.0.layer_norm.weight")
        out[f"{ours}.attn.qkv.weight"] = torch.cat((attn["q"], attn["k"], attn["v"]))
        out[f"{ours}.attn.proj.weight"] = attn["o"]
        out[f"{ours}.norm2.weight"] = take(f"{hf}.1.layer_norm.weight")
        mlp = f"{hf}.1.DenseReluDense"
        if config.feed_forward == "gated-gelu":
            fc1 = torch.cat((take(f"{mlp}.wi_0.weight"), take(f"{mlp}.wi_1.weight")))
        else:
            fc1 = take(f"{mlp}.wi.weight")
        out[f"{ours}.mlp.fc1.weight"] = fc1
        out[f"{ours}.mlp.fc2.weight"] = take(f"{mlp}.wo.weight")
    out["norm.weight"] = take("final_layer_norm.weight")

    problems = []
    if missing:
        problems.append(f"missing keys: {sorted(missing)}")
    if sd:
        problems.append(f"unexpected keys: {sorted(sd)}")
    if problems:
        raise ValueError("cannot convert this T5 checkpoint; " + "; ".join(problems))
    return out
