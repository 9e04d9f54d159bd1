"""The M2M100 / NLLB text encoder (fairseq's multilingual translation encoder) on attn_core.

Shape legend: ``B`` batch, ``L`` tokens, ``D`` width, ``V`` vocabulary, ``P`` table rows.

Computes what transformers' ``M2M100Encoder`` (``facebook/m2m100_*``,
``facebook/nllb-200-*``; open_clip's ``nllb-clip-*`` text towers) computes in eval mode:

* token embeddings times ``embed_scale`` (``sqrt(D)`` when ``scale_embedding``, else 1);
* plus fairseq's sinusoidal positions (:func:`sinusoidal_table`: frequencies
  ``exp(-i log(10000) / (D/2 - 1))``, every sine then every cosine, the padding row zero)
  at position ids counted over the non-pad tokens from ``pad_token_id + 1``
  (:func:`position_ids`) -- a fixed table, rebuilt here and never stored;
* pre-norm blocks (``attn_core.TransformerBlock``, ``norm_first=True``: LayerNorm,
  self-attention with biases, LayerNorm, ``fc1`` -> ReLU -> ``fc2``), each a residual branch;
* a final LayerNorm (transformers' ``encoder.layer_norm``).

``config_from_hf`` reads an ``m2m_100`` ``config.json``; ``convert_hf`` takes the bare
encoder's keys (``M2M100Model().encoder``, what open_clip keeps as ``text.transformer``),
``M2M100Model``'s (``shared`` / ``encoder`` / ``decoder``) and
``M2M100ForConditionalGeneration``'s (``model.*`` + ``lm_head``); the decoder and LM head
are dropped by name. NLLB-MoE (``model_type`` ``nllb-moe``) is a different architecture
and is refused.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from attn_core.activations import HF_ACTIVATIONS, hf_activation
from torch import nn

from .config import config_from_dict
from .convert import _fuse_attention, _Source, hf_fields
from .layers import embed_scale, make_block

__all__ = [
    "MODEL_TYPE",
    "Config",
    "Encoder",
    "config_from_hf",
    "convert_hf",
    "position_ids",
    "sinusoidal_table",
]

MODEL_TYPE = "attn_nlp.m2m100"
POSITION_OFFSET = 2  # fairseq's: rows 0 .. pad_token_id are never a real token's position

_OURS = sorted(set(HF_ACTIVATIONS.values()))


@dataclass
class Config:
    """The fields of an M2M100 / NLLB encoder that change what it computes."""

    vocab_size: int = 128112  # V
    embed_dim: int = 1024  # D (d_model)
    depth: int = 12  # encoder_layers
    num_heads: int = 16  # encoder_attention_heads
    mlp_dim: int = 4096  # encoder_ffn_dim
    act: str = "relu"  # ours: relu, gelu, gelu_tanh, quick_gelu, silu
    norm_eps: float = 1e-5  # every LayerNorm (transformers uses nn.LayerNorm's default)
    pad_id: int = 1  # padding token (pad_token_id): no position, and the positions start after it
    max_positions: int = 1024  # max_position_embeddings (the table has 2 more rows)
    scale_embedding: bool = True  # token embeddings times sqrt(D)
    dropout: float = 0.0  # on the embeddings and each branch output (training only)
    attn_dropout: float = 0.0  # on the attention weights (training only)
    activation_dropout: float = 0.0  # inside the MLP, after the activation (training only)

    def __post_init__(self) -> None:
        if self.num_heads <= 0 or self.embed_dim % self.num_heads:
            raise ValueError(
                f"embed_dim ({self.embed_dim}) must be divisible by num_heads ({self.num_heads})"
            )
        if self.embed_dim < 4:  # the frequency formula divides by D/2 - 1
            raise ValueError(
                f"embed_dim must be at least 4 for the sinusoidal table, got {self.embed_dim}"
            )
        if self.act not in _OURS:
            raise ValueError(f"act must be one of {_OURS}, got {self.act!r}")
        if not 0 <= self.pad_id < self.vocab_size:
            raise ValueError(f"pad_id ({self.pad_id}) must be a token id in [0, {self.vocab_size})")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Config:
        """Build from a dict (our ``config.json``); unknown keys raise ``ValueError``."""
        return config_from_dict(cls, data, MODEL_TYPE)


# -- config.json ------------------------------------------------------------------------
# transformers' M2M100Encoder reads only these fields of M2M100Config (with its defaults);
# every other key of an m2m_100 config.json (decoder sizes, token ids of generation,
# init_std, architectures, ...) cannot change what it computes.
_HF_DEFAULTS: dict[str, Any] = {
    "vocab_size": 128112,
    "d_model": 1024,
    "encoder_layers": 12,
    "encoder_attention_heads": 16,
    "encoder_ffn_dim": 4096,
    "activation_function": "relu",
    "max_position_embeddings": 1024,
    "scale_embedding": True,
    "pad_token_id": 1,
    "dropout": 0.1,
    "attention_dropout": 0.1,
    "activation_dropout": 0.0,
}
_HF_ALIASES = {  # M2M100Config.attribute_map: alias -> field
    "hidden_size": "d_model",
    "num_hidden_layers": "encoder_layers",
    "num_attention_heads": "encoder_attention_heads",
}
# fairseq / BART-era switches transformers' M2M100 no longer reads: it computes with these
# values, so another value asks for a model it (and we) would compute wrongly.
_HF_PINNED: dict[str, tuple[Any, str]] = {
    "normalize_before": (True, "post-norm layers"),
    "add_final_layer_norm": (True, "no final LayerNorm"),
    "normalize_embedding": (False, "a LayerNorm on the embeddings"),
    "static_position_embeddings": (True, "learned positions"),
    "pruned_heads": ({}, "pruned attention heads"),
}
# NLLB-MoE's fields: its encoder routes every few layers' MLP through experts
_MOE_KEYS = ("num_experts", "encoder_sparse_step", "expert_capacity", "moe_token_dropout")


def config_from_hf(hf: Mapping[str, Any]) -> Config:
    """An M2M100 / NLLB ``config.json`` (as a dict) -> :class:`Config`.

    A field that would change the encoder's output and is not supported raises
    ``ValueError`` naming it; ``encoder_layerdrop`` (training only, not implemented) warns.
    """
    kind = hf.get("model_type", "m2m_100")
    if kind == "nllb-moe":
        raise ValueError(
            "model_type 'nllb-moe' (NLLB-MoE, mixture-of-experts MLPs) is not supported; "
            "only the dense M2M100 / NLLB encoders (model_type 'm2m_100')"
        )
    if kind != "m2m_100":
        raise ValueError(f"not an M2M100 config: model_type={kind!r}; expected 'm2m_100'")
    moe = [k for k in _MOE_KEYS if k in hf]
    if moe:
        raise ValueError(
            f"M2M100 config: {moe} are NLLB-MoE fields (mixture-of-experts MLPs), which are "
            "not supported"
        )
    f = hf_fields(hf, "M2M100 config", _HF_DEFAULTS, _HF_ALIASES, _HF_PINNED)
    act = hf_activation(f["activation_function"], "M2M100 config: activation_function")
    pad = f["pad_token_id"]
    if not isinstance(pad, int) or isinstance(pad, bool):
        raise ValueError(f"M2M100 config: pad_token_id={pad!r} is not supported; expected an id")
    layerdrop = hf.get("encoder_layerdrop", 0.05)  # M2M100Config's default
    if layerdrop:
        warnings.warn(
            f"M2M100 config: encoder_layerdrop={layerdrop!r} is ignored (LayerDrop is not "
            "implemented); it only acts while training",
            stacklevel=2,
        )
    return Config(
        vocab_size=f["vocab_size"],
        embed_dim=f["d_model"],
        depth=f["encoder_layers"],
        num_heads=f["encoder_attention_heads"],
        mlp_dim=f["encoder_ffn_dim"],
        act=act,
        pad_id=pad,
        max_positions=f["max_position_embeddings"],
        scale_embedding=bool(f["scale_embedding"]),
        dropout=float(f["dropout"]),
        attn_dropout=float(f["attention_dropout"]),
        activation_dropout=float(f["activation_dropout"]),
    )


# -- positions ----------------------------------------------------------------------------


def sinusoidal_table(num_rows: int, dim: int, padding_idx: int) -> torch.Tensor:
    """``(P, D)`` fairseq / M2M100 sinusoids, row ``padding_idx`` zero.

    Row ``p`` holds ``sin(p w_i)`` for ``i < D/2`` then ``cos(p w_i)`` (a zero column when
    ``D`` is odd), ``w_i = exp(-i log(10000) / (D/2 - 1))``. Computed with the same float32
    torch operations as transformers' ``M2M100SinusoidalPositionalEmbedding.get_embedding``,
    so the values are identical, then cast to the default dtype.
    """
    half = dim // 2
    step = math.log(10000) / (half - 1)
    freq = torch.exp(torch.arange(half, dtype=torch.int64).float() * -step)  # (D/2,)
    angles = torch.arange(num_rows, dtype=torch.int64).float()[:, None] * freq[None]  # (P, D/2)
    table = torch.cat([torch.sin(angles), torch.cos(angles)], dim=1)  # (P, 2 (D/2))
    if dim % 2:
        table = torch.cat([table, torch.zeros(num_rows, 1)], dim=1)
    table[padding_idx] = 0
    return table.to(torch.get_default_dtype())


def position_ids(input_ids: torch.Tensor, padding_idx: int) -> torch.Tensor:
    """``(B, L)`` ids -> ``(B, L)`` positions: ``padding_idx + 1, + 2, ...`` over the
    non-pad tokens, ``padding_idx`` at pad tokens (fairseq's ``make_positions``)."""
    mask = input_ids.ne(padding_idx).int()
    return (torch.cumsum(mask, dim=1).type_as(mask) * mask).long() + padding_idx


class SinusoidalPositions(nn.Module):
    """Fixed positions of ``input_ids`` ``(B, L)`` -> ``(B, L, D)``; not in the state dict.

    The table holds ``max_positions + 2`` rows; a longer input gets a longer table built for
    that call (as transformers grows its own; the model was trained on ``max_positions``).
    """

    table: torch.Tensor

    def __init__(self, max_positions: int, dim: int, padding_idx: int) -> None:
        super().__init__()
        self.dim, self.padding_idx = dim, padding_idx
        rows = max_positions + POSITION_OFFSET
        self.register_buffer("table", sinusoidal_table(rows, dim, padding_idx), persistent=False)

    def extra_repr(self) -> str:
        return f"rows={self.table.shape[0]}, dim={self.dim}, padding_idx={self.padding_idx}"

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        table = self.table
        needed = self.padding_idx + 1 + input_ids.shape[1]  # largest position id + 1
        if needed > table.shape[0]:
            rows = needed + POSITION_OFFSET
            table = sinusoidal_table(rows, self.dim, self.padding_idx).to(table)
        return table[position_ids(input_ids, self.padding_idx)]  # (B, L, D)


# -- the encoder ----------------------------------------------------------------------------


class Encoder(nn.Module):
    """M2M100 / NLLB encoder: ``input_ids`` ``(B, L)`` -> last hidden states ``(B, L, D)``.

    Keys: ``embed_tokens`` ``(V, D)``, ``blocks.N`` (``norm1``, ``attn.qkv``, ``attn.proj``,
    ``norm2``, ``mlp.fc1``, ``mlp.fc2``), ``norm`` (the final LayerNorm).
    """

    model_type = MODEL_TYPE

    def __init__(self, config: Config) -> None:
        super().__init__()
        c = self.config = config
        self.width = c.embed_dim
        self.embed_scale = embed_scale(c.embed_dim, c.scale_embedding)
        self.embed_tokens = nn.Embedding(c.vocab_size, c.embed_dim, padding_idx=c.pad_id)
        self.embed_positions = SinusoidalPositions(c.max_positions, c.embed_dim, c.pad_id)
        self.drop = nn.Dropout(c.dropout)
        self.blocks = nn.ModuleList(
            make_block(
                c.embed_dim,
                c.num_heads,
                c.mlp_dim,
                act=c.act,
                norm_first=True,
                dropout=c.dropout,
                attn_dropout=c.attn_dropout,
                mlp_dropout=c.activation_dropout,
                norm_eps=c.norm_eps,
            )
            for _ in range(c.depth)
        )
        self.norm = nn.LayerNorm(c.embed_dim, eps=c.norm_eps)
        self._init_weights()

    def _init_weights(self) -> None:
        """transformers' M2M100 init (std 0.02, zero biases and padding row)."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        with torch.no_grad():
            self.embed_tokens.weight[self.config.pad_id].zero_()

    def forward(
        self, input_ids: torch.Tensor, key_padding_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``input_ids`` ``(B, L)`` long, ``key_padding_mask`` ``(B, L)`` bool (True =
        padding, not attended to; None = attend to every token) -> ``(B, L, D)``.

        Positions always come from ``input_ids`` (pad tokens get none, as in transformers);
        the mask only hides keys (transformers' ``attention_mask = ~key_padding_mask``).
        """
        if input_ids.ndim != 2 or input_ids.dtype != torch.long:
            raise ValueError(
                f"input_ids must be a (B, L) long tensor, got {input_ids.dtype} "
                f"{tuple(input_ids.shape)}"
            )
        V = self.config.vocab_size
        if input_ids.numel() and (int(input_ids.min()) < 0 or int(input_ids.max()) >= V):
            raise ValueError(f"input_ids has token ids outside [0, {V})")
        if key_padding_mask is not None and (
            key_padding_mask.dtype != torch.bool or key_padding_mask.shape != input_ids.shape
        ):
            raise ValueError(
                f"key_padding_mask must be a bool tensor of shape {tuple(input_ids.shape)} "
                f"(B, L; True = padding), got {key_padding_mask.dtype} "
                f"{tuple(key_padding_mask.shape)}"
            )
        x = self.embed_tokens(input_ids) * self.embed_scale  # (B, L, D)
        x = self.drop(x + self.embed_positions(input_ids))
        for block in self.blocks:
            x = block(x, key_padding_mask=key_padding_mask)
        return self.norm(x)


# -- weights ------------------------------------------------------------------------------

# checkpoint form -> (prefix of the encoder's keys, the shared embedding, what is dropped:
# prefixes and whole keys of the parts an encoder does not use)
_FORMS: dict[str, tuple[str, str | None, tuple[str, ...], frozenset[str]]] = {
    "M2M100ForConditionalGeneration": (
        "model.encoder.",
        "model.shared.weight",
        ("model.decoder.",),
        frozenset({"lm_head.weight"}),  # the LM head (tied to the shared embedding)
    ),
    "M2M100Model": ("encoder.", "shared.weight", ("decoder.",), frozenset()),
    "M2M100Encoder": ("", None, (), frozenset()),
}
_NORMS = {"self_attn_layer_norm": "norm1", "final_layer_norm": "norm2"}


def _form(keys: set[str]) -> str:
    if any(k.startswith("model.") for k in keys):
        return "M2M100ForConditionalGeneration"
    if "shared.weight" in keys or any(k.startswith(("encoder.", "decoder.")) for k in keys):
        return "M2M100Model"
    return "M2M100Encoder"


def convert_hf(state_dict: Mapping[str, torch.Tensor], config: Config) -> dict[str, torch.Tensor]:
    """transformers' M2M100 / NLLB weights -> :class:`Encoder` keys (pure, strict).

    Accepts the bare encoder's keys (``embed_tokens.weight``, ``layers.N.*``,
    ``layer_norm.*``), ``M2M100Model``'s (``shared.weight`` + ``encoder.*``) and
    ``M2M100ForConditionalGeneration``'s (``model.shared.weight`` + ``model.encoder.*``);
    ``decoder.*`` and ``lm_head.weight`` are dropped, a saved ``embed_positions.weights``
    table is checked against ours and dropped. ``q_proj`` / ``k_proj`` / ``v_proj`` are
    fused into ``qkv``. Raises ``ValueError`` listing every missing or unexpected key.
    """
    form = _form(set(state_dict))
    enc, shared_key, dropped_prefixes, dropped_keys = _FORMS[form]
    kept = {
        k: v
        for k, v in state_dict.items()
        if k not in dropped_keys and not (dropped_prefixes and k.startswith(dropped_prefixes))
    }
    src = _Source(kept, f"M2M100 ({form})")
    out: dict[str, torch.Tensor] = {}

    # the encoder's own embedding is a tied copy of the shared one unless untied
    own = src.take_optional(f"{enc}embed_tokens.weight")
    shared = src.take_optional(shared_key) if shared_key else None
    if own is not None and shared is not None and not torch.equal(own, shared):
        raise ValueError(
            f"{enc}embed_tokens.weight differs from {shared_key}; which one the encoder uses "
            "depends on tie_word_embeddings: keep only the one it uses"
        )
    if own is None and shared is None:
        src.missing.append(shared_key or "embed_tokens.weight")
    else:
        out["embed_tokens.weight"] = own if own is not None else shared

    saved = src.take_optional(f"{enc}embed_positions.weights")  # older transformers kept it
    if saved is not None:
        table = sinusoidal_table(saved.shape[0], config.embed_dim, config.pad_id)
        if saved.shape != table.shape or not torch.allclose(saved.float(), table, atol=1e-3):
            raise ValueError(
                f"{enc}embed_positions.weights {tuple(saved.shape)} is not M2M100's sinusoidal "
                f"table for width {config.embed_dim} and pad_token_id {config.pad_id}"
            )

    for i in range(config.depth):
        prefix, ours = f"{enc}layers.{i}", f"blocks.{i}"
        _fuse_attention(src, f"{prefix}.self_attn", out, f"{ours}.attn")
        for name, new in _NORMS.items():
            for part in ("weight", "bias"):
                out[f"{ours}.{new}.{part}"] = src.take(f"{prefix}.{name}.{part}")
        for fc in ("fc1", "fc2"):
            for part in ("weight", "bias"):
                out[f"{ours}.mlp.{fc}.{part}"] = src.take(f"{prefix}.{fc}.{part}")
    for part in ("weight", "bias"):
        out[f"norm.{part}"] = src.take(f"{enc}layer_norm.{part}")
    src.finish()
    return out
