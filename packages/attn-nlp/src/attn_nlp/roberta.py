"""RoBERTa / XLM-RoBERTa encoder (Liu et al. 2019; Conneau et al. 2020) on attn_core blocks.

Shape legend: ``B`` batch, ``L`` tokens, ``D`` width (``embed_dim``), ``V`` vocabulary.

What transformers' ``RobertaModel`` / ``XLMRobertaModel`` computes (eval mode), from scratch:

* embeddings: ``word[ids] + token_type[types] + position[pos]``, then LayerNorm and dropout.
  Positions follow fairseq / transformers' ``create_position_ids_from_input_ids``: a token
  that is not ``pad_id`` gets ``pad_id + (its rank among the row's non-pad tokens)``, a pad
  token gets ``pad_id``. They depend on the ids, not on ``key_padding_mask``; the first real
  token of xlm-roberta-base (pad 1) sits at position 2, so 514 positions hold 512 tokens.
  Token types are all 0 unless given (the hub models have one type);
* ``depth`` post-norm blocks (``attn_core.TransformerBlock(norm_first=False)``, BERT's
  ``LayerNorm(x + branch(x))``), biases everywhere, GELU (erf) MLP;
* optionally (``add_pooling_layer=True``) BERT's pooler, :meth:`Encoder.pool`:
  ``tanh(dense(hidden[:, 0]))`` -- transformers' ``pooler_output``, which open_clip's
  ``cls_pooler`` returns for a RoBERTa tower.

Loading: :func:`config_from_hf` reads a Hugging Face ``config.json`` (every key mapped,
pinned to the value this encoder computes with, ignored as not changing the output, or
refused by name); :func:`convert_hf` maps ``RobertaModel`` / ``XLMRobertaModel`` weights
(bare, or ``roberta.`` + ``lm_head.*`` of the ``*ForMaskedLM`` hub checkpoints) onto ours.
``attn_nlp.create_model(folder)`` does both; ``create_model(folder, add_pooling_layer=True)``
keeps the checkpoint's ``pooler.*`` (dropped otherwise, as the mean-pooling towers and the
masked-LM checkpoints have no use for it).

Example::

    enc = attn_nlp.create_model("xlm-roberta-base", pretrained=False)  # shipped architecture
    ids = torch.tensor([[0, 35378, 2, 1, 1]])  # <s> hello </s> <pad> <pad>
    hidden = enc(ids, key_padding_mask=ids == enc.config.pad_id)  # (1, 5, 768)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from attn_core import TransformerBlock
from attn_core.activations import HF_ACTIVATIONS, hf_activation
from torch import nn

from .config import config_from_dict
from .convert import _Source

__all__ = ["MODEL_TYPE", "Config", "Encoder", "config_from_hf", "convert_hf", "position_ids"]

MODEL_TYPE = "attn_nlp.roberta"

ACTS = frozenset(HF_ACTIVATIONS.values())


@dataclass
class Config:
    """Hyper-parameters of :class:`Encoder` (defaults: roberta-base)."""

    vocab_size: int = 50265  # V
    embed_dim: int = 768  # width D (hidden_size)
    depth: int = 12  # blocks (num_hidden_layers)
    num_heads: int = 12  # attention heads
    mlp_dim: int = 3072  # MLP hidden width (intermediate_size)
    act: str = "gelu"  # MLP activation: gelu (erf), gelu_tanh, quick_gelu, relu, silu
    max_positions: int = 514  # position table rows (max_position_embeddings), pad_id included
    type_vocab_size: int = 1  # token types
    pad_id: int = 1  # padding token: its positions and the offset of everyone else's
    norm_eps: float = 1e-5  # LayerNorm epsilon (layer_norm_eps)
    dropout: float = 0.1  # on embeddings and branch outputs, training only (hidden_dropout_prob)
    attn_dropout: float = 0.1  # on attention weights, training only
    add_pooling_layer: bool = False  # BERT's pooler (dense + tanh on position 0): Encoder.pool

    def __post_init__(self) -> None:
        if self.embed_dim % self.num_heads:
            raise ValueError(
                f"embed_dim ({self.embed_dim}) must be divisible by num_heads ({self.num_heads})"
            )
        if self.act not in ACTS:
            raise ValueError(f"act {self.act!r} is not supported; expected one of {sorted(ACTS)}")
        if not 0 <= self.pad_id < min(self.vocab_size, self.max_positions):
            raise ValueError(
                f"pad_id ({self.pad_id}) must index both the vocabulary ({self.vocab_size}) "
                f"and the position table ({self.max_positions})"
            )

    @property
    def max_length(self) -> int:
        """Most tokens a row may hold: the positions after ``pad_id``'s."""
        return self.max_positions - self.pad_id - 1

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Config:
        """Build from a dict (our ``config.json``); unknown keys raise ``ValueError``."""
        return config_from_dict(cls, data, MODEL_TYPE)


def position_ids(input_ids: torch.Tensor, pad_id: int) -> torch.Tensor:
    """``(B, L)`` positions: ``pad_id + k`` for a row's k-th (1-based) non-pad token,
    ``pad_id`` for pads (fairseq's ``make_positions``; left padding shifts nothing)."""
    real = input_ids.ne(pad_id).long()
    return torch.cumsum(real, dim=1) * real + pad_id


class Encoder(nn.Module):
    """RoBERTa / XLM-R: token ids ``(B, L)`` -> last hidden states ``(B, L, D)``.

    ``forward(input_ids, key_padding_mask=None, token_type_ids=None)``: ``key_padding_mask``
    bool ``(B, L)``, True = padding (keys no one attends to; None = attend to every token, as
    transformers without an ``attention_mask``); ``token_type_ids`` ``(B, L)`` long (None = 0).
    :meth:`pool` maps the hidden states to the pooler output ``(B, D)``.
    """

    model_type = MODEL_TYPE

    def __init__(self, config: Config) -> None:
        super().__init__()
        self.config = config
        self.width = D = config.embed_dim
        pad = config.pad_id
        # padding_idx: the pad rows get no gradient, as in transformers (fine-tuning parity)
        self.word_embeddings = nn.Embedding(config.vocab_size, D, padding_idx=pad)
        self.position_embeddings = nn.Embedding(config.max_positions, D, padding_idx=pad)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, D)
        self.embed_norm = nn.LayerNorm(D, eps=config.norm_eps)
        self.blocks = nn.ModuleList(
            TransformerBlock(
                D,
                config.num_heads,
                mlp_hidden_dim=config.mlp_dim,
                act=config.act,
                norm_first=False,
                dropout=config.dropout,
                attn_dropout=config.attn_dropout,
                norm_layer=partial(nn.LayerNorm, eps=config.norm_eps),
            )
            for _ in range(config.depth)
        )
        self.pooler = nn.Linear(D, D) if config.add_pooling_layer else None

    def embed(
        self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Word + position + token-type embeddings, normalised: ``(B, L)`` -> ``(B, L, D)``."""
        cfg = self.config
        if input_ids.ndim != 2 or input_ids.dtype != torch.long:
            raise ValueError(
                f"input_ids must be a (B, L) long tensor, got {input_ids.dtype} "
                f"{tuple(input_ids.shape)}"
            )
        if input_ids.numel() and (
            int(input_ids.min()) < 0 or int(input_ids.max()) >= cfg.vocab_size
        ):
            raise ValueError(f"input_ids has token ids outside [0, {cfg.vocab_size})")
        pos = position_ids(input_ids, cfg.pad_id)  # (B, L)
        if pos.numel() and int(pos.max()) >= cfg.max_positions:
            raise ValueError(
                f"a row has {int(pos.max()) - cfg.pad_id} non-pad tokens; this model takes at "
                f"most {cfg.max_length} (max_positions {cfg.max_positions} - pad_id - 1)"
            )
        if token_type_ids is None:
            types = torch.zeros_like(input_ids)
        else:
            if token_type_ids.shape != input_ids.shape or token_type_ids.dtype != torch.long:
                raise ValueError(
                    f"token_type_ids must be a long tensor of input_ids' shape "
                    f"{tuple(input_ids.shape)}, got {token_type_ids.dtype} "
                    f"{tuple(token_type_ids.shape)}"
                )
            if token_type_ids.numel() and (
                int(token_type_ids.min()) < 0 or int(token_type_ids.max()) >= cfg.type_vocab_size
            ):
                raise ValueError(f"token_type_ids outside [0, {cfg.type_vocab_size})")
            types = token_type_ids
        x = (
            self.word_embeddings(input_ids)
            + self.token_type_embeddings(types)
            + self.position_embeddings(pos)
        )  # (B, L, D)
        return F.dropout(self.embed_norm(x), cfg.dropout, self.training)

    def forward(
        self,
        input_ids: torch.Tensor,
        key_padding_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``input_ids`` ``(B, L)`` -> last hidden states ``(B, L, D)``."""
        x = self.embed(input_ids, token_type_ids)
        for block in self.blocks:
            x = block(x, key_padding_mask=key_padding_mask)
        return x

    def pool(self, hidden: torch.Tensor) -> torch.Tensor:
        """Pooler output ``tanh(dense(hidden[:, 0]))``: ``(B, L, D)`` -> ``(B, D)``."""
        if self.pooler is None:
            raise ValueError(
                "this encoder has no pooler; build it with add_pooling_layer=True (e.g. "
                "create_model(folder, add_pooling_layer=True)) from a checkpoint with pooler.*"
            )
        if hidden.ndim != 3 or hidden.shape[-1] != self.width:
            raise ValueError(f"hidden must be (B, L, {self.width}), got {tuple(hidden.shape)}")
        return torch.tanh(self.pooler(hidden[:, 0]))


# -- config.json ---------------------------------------------------------------------------

# config.json key -> (Config field, transformers' default when the key is absent).
_MAPPED: dict[str, tuple[str, Any]] = {
    "hidden_size": ("embed_dim", 768),
    "num_hidden_layers": ("depth", 12),
    "num_attention_heads": ("num_heads", 12),
    "intermediate_size": ("mlp_dim", 3072),
    "max_position_embeddings": ("max_positions", 512),
    "type_vocab_size": ("type_vocab_size", 2),
    "pad_token_id": ("pad_id", 1),
    "layer_norm_eps": ("norm_eps", 1e-12),
    "hidden_dropout_prob": ("dropout", 0.1),
    "attention_probs_dropout_prob": ("attn_dropout", 0.1),
}
_VOCAB_DEFAULTS = {"roberta": 50265, "xlm-roberta": 30522}  # RobertaConfig / XLMRobertaConfig

# Supported with one value only: (that value, what another value would ask for).
_PINNED: dict[str, tuple[Any, str]] = {
    "position_embedding_type": ("absolute", "relative position embeddings"),
    "is_decoder": (False, "a causal decoder (RobertaForCausalLM)"),
    "add_cross_attention": (False, "cross-attention layers"),
    "is_encoder_decoder": (False, "an encoder-decoder model"),
    "pruned_heads": ({}, "pruned attention heads"),
}

# No effect on the hidden states of the encoder.
_IGNORED = frozenset(
    {
        # metadata (model_type is checked first)
        "model_type",
        "architectures",
        "transformers_version",
        "_name_or_path",
        "name_or_path",
        "_commit_hash",
        "tokenizer_class",
        "prefix",
        "task_specific_params",
        "finetuning_task",
        # other special tokens (only pad_token_id changes the math)
        "bos_token_id",
        "eos_token_id",
        "sep_token_id",
        "decoder_start_token_id",
        # outputs, caching, kernels, memory, precision (our weights load as float32)
        "use_cache",
        "output_past",
        "output_attentions",
        "output_hidden_states",
        "return_dict",
        "torchscript",
        "dtype",
        "torch_dtype",
        "use_bfloat16",
        "attn_implementation",
        "_attn_implementation",
        "_attn_implementation_autoset",
        "gradient_checkpointing",
        "chunk_size_feed_forward",  # chunking the MLP over positions gives the same numbers
        # initialisation only: the checkpoint's weights replace it
        "initializer_range",
        # heads this encoder does not have (masked-LM, classifiers)
        "tie_word_embeddings",
        "id2label",
        "label2id",
        "num_labels",
        "_num_labels",
        "problem_type",
        "classifier_dropout",
        "tf_legacy_loss",
        # generation settings old config.json files carry (no generation in an encoder)
        "max_length",
        "min_length",
        "do_sample",
        "early_stopping",
        "num_beams",
        "num_beam_groups",
        "diversity_penalty",
        "temperature",
        "top_k",
        "top_p",
        "typical_p",
        "repetition_penalty",
        "length_penalty",
        "no_repeat_ngram_size",
        "encoder_no_repeat_ngram_size",
        "bad_words_ids",
        "num_return_sequences",
        "output_scores",
        "return_dict_in_generate",
        "forced_bos_token_id",
        "forced_eos_token_id",
        "remove_invalid_values",
        "exponential_decay_length_penalty",
        "suppress_tokens",
        "begin_suppress_tokens",
    }
)


def config_from_hf(hf: Mapping[str, Any]) -> Config:
    """A Hugging Face ``config.json`` (``model_type`` ``roberta`` / ``xlm-roberta``) -> Config.

    Absent keys take transformers' ``RobertaConfig`` / ``XLMRobertaConfig`` defaults (what it
    would compute with). ``add_pooling_layer`` is not in ``config.json`` (it is an argument of
    ``RobertaModel``) and stays False; set it with ``dataclasses.replace`` or as an override of
    ``create_model``. Raises ``ValueError`` naming any key that asks for something else
    (relative positions, a decoder, an unsupported ``hidden_act``) or is unknown.
    """
    kind = hf.get("model_type")
    if kind not in _VOCAB_DEFAULTS:
        raise ValueError(
            f"model_type {kind!r} is not a RoBERTa config; "
            f"expected one of {sorted(_VOCAB_DEFAULTS)}"
        )
    refused = []
    for key, (value, meaning) in _PINNED.items():
        if key in hf and hf[key] != value:
            refused.append(f"{key}={hf[key]!r} ({meaning}; only {value!r} is supported)")
    try:
        act = hf_activation(hf.get("hidden_act", "gelu"), "hidden_act")
    except ValueError as e:
        refused.append(str(e))
    if hf.get("pad_token_id", 1) is None:
        refused.append("pad_token_id=None (positions are counted from the pad id)")
    known = {"vocab_size", "hidden_act", *_MAPPED, *_PINNED, *_IGNORED}
    unknown = sorted(set(hf) - known)
    if unknown:
        refused.append(f"unknown key(s) {unknown} (not known to leave the output unchanged)")
    if refused:
        raise ValueError(f"cannot build this {kind} config.json: " + "; ".join(refused))
    fields = {field: hf.get(key, default) for key, (field, default) in _MAPPED.items()}
    return Config(
        vocab_size=hf.get("vocab_size", _VOCAB_DEFAULTS[kind]),
        act=act,
        **fields,
    )


# -- weights -------------------------------------------------------------------------------

# Hugging Face layer key (under encoder.layer.N.) -> ours (under blocks.N.).
_LAYER = {
    "attention.output.dense": "attn.proj",
    "attention.output.LayerNorm": "norm1",
    "intermediate.dense": "mlp.fc1",
    "output.dense": "mlp.fc2",
    "output.LayerNorm": "norm2",
}
_EMBED = {
    "embeddings.word_embeddings.weight": "word_embeddings.weight",
    "embeddings.position_embeddings.weight": "position_embeddings.weight",
    "embeddings.token_type_embeddings.weight": "token_type_embeddings.weight",
    "embeddings.LayerNorm.weight": "embed_norm.weight",
    "embeddings.LayerNorm.bias": "embed_norm.bias",
}
# Buffers old checkpoints saved (arange / zeros we recompute): dropped by name.
_BUFFERS = ("embeddings.position_ids", "embeddings.token_type_ids")


def _strip_prefix(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Bare ``RobertaModel`` keys: ``roberta.`` (``*ForMaskedLM``) stripped, ``lm_head.*``
    (the masked-LM head) dropped."""
    out: dict[str, torch.Tensor] = {}
    for key, value in state_dict.items():
        if key.startswith("lm_head."):
            continue
        bare = key.removeprefix("roberta.")
        if bare in out:
            raise ValueError(f"{bare!r} appears both with and without the 'roberta.' prefix")
        out[bare] = value
    return out


def convert_hf(state_dict: Mapping[str, torch.Tensor], config: Config) -> dict[str, torch.Tensor]:
    """Hugging Face ``RobertaModel`` / ``XLMRobertaModel`` weights -> :class:`Encoder`'s.

    Accepts the bare model's keys (``embeddings.*``, ``encoder.layer.N.*``, ``pooler.*``) and
    the ``*ForMaskedLM`` form (``roberta.`` prefix; ``lm_head.*`` dropped). Each layer's
    ``query`` / ``key`` / ``value`` are fused into ``attn.qkv``. ``pooler.*`` is kept when
    ``config.add_pooling_layer`` and dropped otherwise; the ``position_ids`` /
    ``token_type_ids`` buffers of old checkpoints are dropped. Any other key left over, or one
    missing, is a ``ValueError`` naming them (shapes are checked when the result is loaded).
    """
    src = _Source(_strip_prefix(state_dict), "RoBERTa")
    for key in _BUFFERS:
        src.take_optional(key)
    out = {ours: src.take(theirs) for theirs, ours in _EMBED.items()}
    D = config.embed_dim
    for i in range(config.depth):
        hf, ours = f"encoder.layer.{i}.", f"blocks.{i}."
        for kind in ("weight", "bias"):
            parts = [src.take(f"{hf}attention.self.{n}.{kind}") for n in ("query", "key", "value")]
            if all(p.numel() for p in parts):
                want = (D, D) if kind == "weight" else (D,)
                for name, part in zip(("query", "key", "value"), parts, strict=True):
                    if part.shape != want:
                        raise ValueError(
                            f"{hf}attention.self.{name}.{kind} has shape {tuple(part.shape)}; "
                            f"expected {want} for embed_dim {D}"
                        )
                out[f"{ours}attn.qkv.{kind}"] = torch.cat(parts, dim=0)
            for theirs, mine in _LAYER.items():
                out[f"{ours}{mine}.{kind}"] = src.take(f"{hf}{theirs}.{kind}")
    if config.add_pooling_layer:
        out["pooler.weight"] = src.take("pooler.dense.weight")
        out["pooler.bias"] = src.take("pooler.dense.bias")
    else:
        src.take_optional("pooler.dense.weight")
        src.take_optional("pooler.dense.bias")
    src.finish()
    return out
