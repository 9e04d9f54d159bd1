"""Weight converters: pure ``state_dict -> state_dict`` functions, loud on any mismatch.

* :func:`marian_to_ours` -- a Hugging Face ``MarianMTModel`` checkpoint (opus-mt) into
  :class:`attn_nlp.Transformer`: separate ``q_proj``/``k_proj``/``v_proj`` are fused into
  one ``qkv``; Marian's static sinusoidal ``embed_positions`` are dropped (we rebuild the same
  table); tied copies of the shared embedding are accepted and checked.
* :func:`marian_config_to_ours` -- ``config.json`` of a Marian checkpoint -> ``TransformerConfig``.
* :func:`torch_transformer_to_ours` -- ``torch.nn.Transformer`` weights into our
  ``encoder.*`` / ``decoder.*`` stacks (``in_proj_weight`` is already fused).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import torch

from .config import TransformerConfig
from .layers import resolve_activation, sinusoidal_table

__all__ = ["marian_config_to_ours", "marian_to_ours", "torch_transformer_to_ours"]

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


def marian_config_to_ours(hf: Mapping[str, Any]) -> TransformerConfig:
    """A Marian ``config.json`` (as a dict) -> :class:`TransformerConfig`."""
    if hf.get("model_type", "marian") != "marian":
        raise ValueError(f"not a Marian config: model_type={hf.get('model_type')!r}")
    for a, b in (
        ("encoder_attention_heads", "decoder_attention_heads"),
        ("encoder_ffn_dim", "decoder_ffn_dim"),
    ):
        if a in hf and b in hf and hf[a] != hf[b]:
            raise ValueError(f"different {a} ({hf[a]}) and {b} ({hf[b]}) are not supported")
    vocab = hf.get("vocab_size", 58101)
    shared = hf.get("share_encoder_decoder_embeddings", True)
    pad = hf.get("pad_token_id", 58100)
    return TransformerConfig(
        src_vocab_size=vocab,
        tgt_vocab_size=vocab if shared else hf.get("decoder_vocab_size") or vocab,
        embed_dim=hf.get("d_model", 1024),
        encoder_depth=hf.get("encoder_layers", 12),
        decoder_depth=hf.get("decoder_layers", 12),
        num_heads=hf.get("encoder_attention_heads", 16),
        mlp_dim=hf.get("encoder_ffn_dim", 4096),
        act=resolve_activation(hf.get("activation_function", "gelu")),
        norm_first=False,  # transformers' Marian is post-norm whatever normalize_before says
        final_norm=False,
        dropout=hf.get("dropout", 0.1),
        attn_dropout=hf.get("attention_dropout", 0.0),
        max_positions=hf.get("max_position_embeddings", 1024),
        pos_embed="sinusoidal",  # sin in the first half, cos in the second
        scale_embedding=hf.get("scale_embedding", False),
        share_embeddings=shared,
        tie_output=hf.get("tie_word_embeddings", True),
        final_logits_bias=True,
        pad_id=pad,
        bos_id=hf.get("bos_token_id"),
        eos_id=hf.get("eos_token_id", 0),
        decoder_start_id=hf.get("decoder_start_token_id", pad),
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


def marian_to_ours(
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
        src.take_optional("model.shared.weight")  # an unused copy of the encoder embedding
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


def torch_transformer_to_ours(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
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
