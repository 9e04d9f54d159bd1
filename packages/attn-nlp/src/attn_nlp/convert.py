"""Weight converters: pure ``state_dict -> state_dict`` functions, loud on any mismatch.

* :func:`convert_hf_marian` -- a Hugging Face ``MarianMTModel`` checkpoint (opus-mt) into
  :class:`attn_nlp.Transformer`: separate ``q_proj``/``k_proj``/``v_proj`` are fused into
  one ``qkv``; Marian's static sinusoidal ``embed_positions`` are dropped (we rebuild the same
  table); tied copies of the shared embedding are accepted and checked.
* :func:`config_from_hf_marian` -- ``config.json`` of a Marian checkpoint -> ``TransformerConfig``;
  encoder and decoder may differ in depth, heads and MLP width; every key is mapped, pinned to
  the value transformers computes with, ignored for a stated reason, or refused by name.
* :func:`convert_torch_transformer` -- ``torch.nn.Transformer`` weights into our
  ``encoder.*`` / ``decoder.*`` stacks (``in_proj_weight`` is already fused).
"""

from __future__ import annotations

import dataclasses
import re
import warnings
from collections.abc import Mapping
from typing import Any

import torch
from attn_core.activations import hf_activation

from .config import TransformerConfig
from .generation import GenerationConfig
from .layers import sinusoidal_table

__all__ = [
    "config_from_hf_marian",
    "convert_hf_marian",
    "convert_torch_transformer",
]

_TORCH_LAYER = re.compile(r"(encoder|decoder)\.layers\.(\d+)\.")

# Marian layer name -> ours, per encoder ("enc") / decoder ("dec") layer.
_MARIAN_NORMS = {
    "enc": {"self_attn_layer_norm": "norm1", "final_layer_norm": "norm2"},
    "dec": {
        "self_attn_layer_norm": "norm1",
        "encoder_attn_layer_norm": "norm_cross",
        "final_layer_norm": "norm2",
    },
}
_MARIAN_ATTN = {
    "enc": {"self_attn": "attn"},
    "dec": {"self_attn": "attn", "encoder_attn": "cross_attn"},
}


class _Source:
    """Takes keys out of a state dict and reports what was missing or left over."""

    def __init__(self, state_dict: Mapping[str, torch.Tensor], what: str) -> None:
        self.sd = dict(state_dict)
        self.what = what
        self.missing: list[str] = []

    def take(self, key: str) -> torch.Tensor:
        if key not in self.sd:
            self.missing.append(key)
            return torch.empty(0)
        return self.sd.pop(key)

    def take_optional(self, key: str) -> torch.Tensor | None:
        return self.sd.pop(key, None)

    def finish(self) -> None:
        problems = []
        if self.missing:
            problems.append(f"missing keys: {sorted(self.missing)}")
        if self.sd:
            problems.append(f"unexpected keys: {sorted(self.sd)}")
        if problems:
            raise ValueError(f"cannot convert this {self.what} checkpoint; " + "; ".join(problems))


def _same(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    if a.shape != b.shape or not torch.equal(a, b):
        raise ValueError(f"{what} should be tied to the shared embedding but differs from it")


# -- Marian config.json ------------------------------------------------------------------
# Every key of a Marian config.json (transformers' MarianConfig, its PreTrainedConfig base
# and the BART-era keys old opus-mt files still carry) is mapped, pinned to the one value
# transformers computes with, ignored for a stated reason, or refused by name.

# Mapped onto TransformerConfig, with transformers' MarianConfig defaults.
_MARIAN_DEFAULTS: dict[str, Any] = {
    "vocab_size": 58101,
    "decoder_vocab_size": None,  # None = vocab_size
    "d_model": 1024,
    "encoder_layers": 12,
    "decoder_layers": 12,
    "encoder_attention_heads": 16,
    "decoder_attention_heads": 16,
    "encoder_ffn_dim": 4096,
    "decoder_ffn_dim": 4096,
    "activation_function": "gelu",
    "dropout": 0.1,
    "attention_dropout": 0.0,
    "activation_dropout": 0.0,
    "max_position_embeddings": 1024,
    "scale_embedding": False,
    "share_encoder_decoder_embeddings": True,
    "tie_word_embeddings": True,
    "pad_token_id": 58100,
    "bos_token_id": None,
    "eos_token_id": 0,
    "decoder_start_token_id": 58100,
}

# MarianConfig.attribute_map: alias -> field (transformers lets the alias win).
_MARIAN_ALIASES = {
    "hidden_size": "d_model",
    "num_hidden_layers": "encoder_layers",
    "num_attention_heads": "encoder_attention_heads",
}

# Supported with one value only: (that value, what another value would ask for).
_MARIAN_PINNED: dict[str, tuple[Any, str]] = {
    "is_encoder_decoder": (True, "a decoder-only model; only MarianMTModel is supported"),
    "is_decoder": (False, "MarianForCausalLM; only MarianMTModel is supported"),
    # BART-era switches: transformers' MarianMTModel no longer reads them and computes
    # post-norm, static sinusoids, no extra LayerNorms, no logits bias layer.
    "normalize_before": (False, "pre-norm layers"),
    "add_final_layer_norm": (False, "a LayerNorm after each stack"),
    "normalize_embedding": (False, "a LayerNorm on the embeddings"),
    "static_position_embeddings": (True, "learned positions"),
    "add_bias_logits": (False, "a bias on the logits"),
    "tie_encoder_decoder": (False, "encoder weights tied to the decoder's"),
    "pruned_heads": ({}, "pruned attention heads"),
}

# Only act while training; a non-default value warns (LayerDrop is not implemented).
_MARIAN_TRAINING_ONLY = {"encoder_layerdrop": 0.0, "decoder_layerdrop": 0.0, "layerdrop": 0.0}

# No effect on what MarianMTModel computes.
_MARIAN_IGNORED = frozenset(
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
        "chunk_size_feed_forward",  # MarianMTModel never chunks its MLPs
        # initialisation only: the checkpoint's weights replace it
        "init_std",
        # heads and options MarianMTModel does not have
        "id2label",
        "label2id",
        "num_labels",
        "_num_labels",
        "problem_type",
        "classif_dropout",
        "classifier_dropout",
        "add_cross_attention",  # the decoder always has cross-attention
        "cross_attention_hidden_size",
        "sep_token_id",
        "tf_legacy_loss",
        "extra_pos_embeddings",  # BART-era offset of learned positions; Marian's are sinusoids
    }
)

# Decoding settings old config.json files hold: GenerationConfig.from_pretrained reads them
# (and warns about the ones it does not implement) when there is no generation_config.json.
_MARIAN_GENERATION = frozenset(f.name for f in dataclasses.fields(GenerationConfig)) | {
    "no_repeat_ngram_size",
    "encoder_no_repeat_ngram_size",
    "repetition_penalty",
    "encoder_repetition_penalty",
    "num_beam_groups",
    "diversity_penalty",
    "typical_p",
    "epsilon_cutoff",
    "eta_cutoff",
    "forced_bos_token_id",
    "suppress_tokens",
    "begin_suppress_tokens",
    "exponential_decay_length_penalty",
    "remove_invalid_values",
    "output_scores",
    "return_dict_in_generate",
    "max_time",
}


def hf_fields(
    hf: Mapping[str, Any],
    what: str,
    defaults: Mapping[str, Any],
    aliases: Mapping[str, str],
    pinned: Mapping[str, tuple[Any, str]],
) -> dict[str, Any]:
    """The ``defaults`` keys of a Hugging Face ``config.json`` dict (absent: the default),
    with each alias (``hidden_size`` for ``d_model``) resolved; an alias that contradicts
    its name, or a ``pinned`` key (``{key: (the only value computed, what it means)}``) set
    otherwise, is a ValueError naming it (``what``: e.g. ``"Marian config"``)."""
    fields = {k: hf.get(k, default) for k, default in defaults.items()}
    for alias, name in aliases.items():
        if alias in hf:
            if name in hf and hf[name] != hf[alias]:
                raise ValueError(f"{what}: {alias}={hf[alias]!r} contradicts {name}={hf[name]!r}")
            fields[name] = hf[alias]
    for key, (value, meaning) in pinned.items():
        if key in hf and hf[key] != value:
            raise ValueError(
                f"{what}: {key}={hf[key]!r} ({meaning}) is not supported; only {key}={value!r}"
            )
    return fields


def _marian_fields(hf: Mapping[str, Any]) -> dict[str, Any]:
    """The mapped fields of ``hf`` (aliases resolved, defaults filled); refuses the rest."""
    if hf.get("model_type", "marian") != "marian":
        raise ValueError(f"not a Marian config: model_type={hf.get('model_type')!r}")
    fields = hf_fields(hf, "Marian config", _MARIAN_DEFAULTS, _MARIAN_ALIASES, _MARIAN_PINNED)
    for key, default in _MARIAN_TRAINING_ONLY.items():
        if hf.get(key, default) != default:
            warnings.warn(
                f"Marian config: {key}={hf[key]!r} is ignored (LayerDrop is not implemented); "
                "it only acts while training",
                stacklevel=3,
            )
    known = (
        _MARIAN_DEFAULTS.keys()
        | _MARIAN_ALIASES.keys()
        | _MARIAN_PINNED.keys()
        | _MARIAN_TRAINING_ONLY.keys()
        | _MARIAN_IGNORED
        | _MARIAN_GENERATION
    )
    unknown = sorted(set(hf) - known)
    if unknown:  # transformers' MarianMTModel does not read them either
        warnings.warn(f"Marian config: ignoring unknown key(s) {unknown}", stacklevel=3)
    return fields


def _marian_token(f: Mapping[str, Any], key: str, *, optional: bool = False) -> int | None:
    """A token id field: an int (a one-element list is unwrapped), or None if ``optional``."""
    value = f[key]
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    if value is None and optional:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"Marian config: {key}={f[key]!r} is not supported; expected one id")
    return value


def config_from_hf_marian(hf: Mapping[str, Any]) -> TransformerConfig:
    """A Marian ``config.json`` (as a dict) -> :class:`TransformerConfig`.

    Encoder and decoder may differ in depth, heads and MLP width. A key that would change
    the computation and is not supported raises ``ValueError`` naming it and its value.
    """
    f = _marian_fields(hf)
    act = hf_activation(f["activation_function"], "Marian config: activation_function")
    vocab = f["vocab_size"]
    shared, tied = f["share_encoder_decoder_embeddings"], f["tie_word_embeddings"]
    if shared:
        if f["decoder_vocab_size"] not in (None, vocab):
            raise ValueError(
                f"Marian config: decoder_vocab_size={f['decoder_vocab_size']!r} with "
                f"share_encoder_decoder_embeddings=True needs vocab_size ({vocab})"
            )
        tgt_vocab = vocab
    else:
        tgt_vocab = f["decoder_vocab_size"] or vocab
    return TransformerConfig(
        src_vocab_size=vocab,
        tgt_vocab_size=tgt_vocab,
        embed_dim=f["d_model"],
        encoder_depth=f["encoder_layers"],
        decoder_depth=f["decoder_layers"],
        num_heads=f["encoder_attention_heads"],
        mlp_dim=f["encoder_ffn_dim"],
        decoder_num_heads=f["decoder_attention_heads"],
        decoder_mlp_dim=f["decoder_ffn_dim"],
        act=act,
        norm_first=False,  # post-norm (normalize_before is pinned to False above)
        final_norm=False,
        dropout=f["dropout"],
        attn_dropout=f["attention_dropout"],
        activation_dropout=f["activation_dropout"],
        max_positions=f["max_position_embeddings"],
        pos_embed="sinusoidal",  # sin in the first half, cos in the second
        scale_embedding=f["scale_embedding"],
        # transformers ties encoder and decoder embeddings only when it ties word embeddings
        share_embeddings=shared and tied,
        tie_output=tied,
        final_logits_bias=True,
        pad_id=_marian_token(f, "pad_token_id"),
        bos_id=_marian_token(f, "bos_token_id", optional=True),
        eos_id=_marian_token(f, "eos_token_id"),
        decoder_start_id=_marian_token(f, "decoder_start_token_id"),
        extra={"source": "marian"},
    )


def _fuse_attention(src: _Source, prefix: str, out: dict, ours: str) -> None:
    """``{prefix}.{q,k,v}_proj`` + ``out_proj`` -> ``{ours}.qkv`` + ``{ours}.proj``."""
    for part in ("weight", "bias"):
        q, k, v = (src.take(f"{prefix}.{n}_proj.{part}") for n in "qkv")
        out[f"{ours}.qkv.{part}"] = torch.cat((q, k, v), dim=0)
        out[f"{ours}.proj.{part}"] = src.take(f"{prefix}.out_proj.{part}")


def _marian_layer(src: _Source, prefix: str, kind: str, out: dict, ours: str) -> None:
    for name, new in _MARIAN_ATTN[kind].items():
        _fuse_attention(src, f"{prefix}.{name}", out, f"{ours}.{new}")
    for name, new in _MARIAN_NORMS[kind].items():
        for part in ("weight", "bias"):
            out[f"{ours}.{new}.{part}"] = src.take(f"{prefix}.{name}.{part}")
    for fc in ("fc1", "fc2"):
        for part in ("weight", "bias"):
            out[f"{ours}.mlp.{fc}.{part}"] = src.take(f"{prefix}.{fc}.{part}")


def convert_hf_marian(
    state_dict: Mapping[str, torch.Tensor], config: TransformerConfig
) -> dict[str, torch.Tensor]:
    """Convert a ``MarianMTModel`` state dict into :class:`attn_nlp.Transformer` keys.

    Raises ``ValueError`` listing every missing or unexpected key.
    """
    sd = dict(state_dict)
    if not any(k.startswith("model.") for k in sd):  # a bare MarianModel checkpoint
        sd = {
            (k if k in ("final_logits_bias", "lm_head.weight") else f"model.{k}"): v
            for k, v in sd.items()
        }
    src = _Source(sd, "Marian")
    table = sinusoidal_table(config.max_positions, config.embed_dim, "concat")
    for side in ("encoder", "decoder"):  # static sinusoids: our model rebuilds the same table
        saved = src.take_optional(f"model.{side}.embed_positions.weight")
        if saved is not None and not torch.allclose(saved.float(), table, atol=1e-4):
            raise ValueError(
                f"model.{side}.embed_positions.weight is not Marian's sinusoidal table; "
                "learned positions are not supported for Marian checkpoints"
            )
    out: dict[str, torch.Tensor] = {}

    if config.share_embeddings:
        shared = src.take("model.shared.weight")
        for name in ("model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight"):
            tied = src.take_optional(name)
            if tied is not None:
                _same(tied, shared, name)
        out["src_embed.weight"] = out["tgt_embed.weight"] = shared
    else:
        src.take_optional("model.shared.weight")  # not used by the forward pass when untied
        out["src_embed.weight"] = src.take("model.encoder.embed_tokens.weight")
        out["tgt_embed.weight"] = src.take("model.decoder.embed_tokens.weight")

    head = src.take_optional("lm_head.weight")
    if config.tie_output:
        if head is not None:
            _same(head, out["tgt_embed.weight"], "lm_head.weight")
        out["head.weight"] = out["tgt_embed.weight"]
    elif head is None:
        src.missing.append("lm_head.weight")
    else:
        out["head.weight"] = head

    bias = src.take_optional("final_logits_bias")
    if bias is None:  # transformers also treats it as optional (zeros)
        bias = torch.zeros(1, config.tgt_vocab_size)
    out["final_logits_bias"] = bias

    for side, kind, depth in (
        ("encoder", "enc", config.encoder_depth),
        ("decoder", "dec", config.decoder_depth),
    ):
        for i in range(depth):
            _marian_layer(src, f"model.{side}.layers.{i}", kind, out, f"{side}.blocks.{i}")
    src.finish()
    return out


def convert_torch_transformer(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``nn.Transformer`` (or its encoder/decoder) weights -> ``encoder.*`` / ``decoder.*``.

    Load the result into a module holding our :class:`TransformerEncoder` as ``encoder``
    and :class:`TransformerDecoder` as ``decoder`` (both with ``final_norm=True``, as
    ``nn.Transformer`` always adds ``encoder.norm`` / ``decoder.norm``).
    """
    src = _Source(state_dict, "torch.nn.Transformer")
    out: dict[str, torch.Tensor] = {}
    layers = sorted({m.groups() for k in state_dict if (m := _TORCH_LAYER.match(k))})
    names = {
        "encoder": {"self_attn": "attn", "norm1": "norm1", "norm2": "norm2"},
        "decoder": {
            "self_attn": "attn",
            "multihead_attn": "cross_attn",
            "norm1": "norm1",
            "norm2": "norm_cross",
            "norm3": "norm2",
        },
    }
    for side, i in layers:
        theirs, ours = f"{side}.layers.{i}", f"{side}.blocks.{i}"
        for old, new in names[side].items():
            if old.startswith("norm"):
                for part in ("weight", "bias"):
                    out[f"{ours}.{new}.{part}"] = src.take(f"{theirs}.{old}.{part}")
                continue
            for part in ("weight", "bias"):
                out[f"{ours}.{new}.qkv.{part}"] = src.take(f"{theirs}.{old}.in_proj_{part}")
                out[f"{ours}.{new}.proj.{part}"] = src.take(f"{theirs}.{old}.out_proj.{part}")
        for old, new in (("linear1", "fc1"), ("linear2", "fc2")):
            for part in ("weight", "bias"):
                out[f"{ours}.mlp.{new}.{part}"] = src.take(f"{theirs}.{old}.{part}")
    for side in ("encoder", "decoder"):
        for part in ("weight", "bias"):
            norm = src.take_optional(f"{side}.norm.{part}")
            if norm is not None:
                out[f"{side}.norm.{part}"] = norm
    src.finish()
    return out
