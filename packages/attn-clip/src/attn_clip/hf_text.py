"""open_clip's Hugging Face text towers (``text_cfg.hf_model_name``: XLM-RoBERTa, RoBERTa,
mT5, NLLB) on attn_nlp's from-scratch encoders.

Shape legend: ``B`` captions, ``L`` tokens, ``D`` encoder width, ``E`` joint embedding width.

What open_clip's ``HFTextEncoder`` computes, as :class:`HFTextTower`:

* padding: the keys of tokens equal to the encoder's pad id are masked (open_clip:
  ``attention_mask = (x != config.pad_token_id)``), nothing else;
* the encoder (``encoder``): attn_nlp's RoBERTa / XLM-R (:mod:`attn_nlp.roberta`), T5 / mT5
  (:mod:`attn_nlp.t5`: the encoder stack of an encoder-decoder, as open_clip keeps
  ``model.encoder``) or M2M100 / NLLB (:mod:`attn_nlp.m2m100`) -> last hidden states
  ``(B, L, D)``;
* the pooler (``hf_pooler_type``): ``mean_pooler`` (mean over the non-pad tokens),
  ``cls_pooler`` (a RoBERTa's ``pooler_output``, ``tanh(dense(h[:, 0]))``, which open_clip
  builds with ``add_pooling_layer=True``; the T5 / M2M100 encoders have no pooler, so there it
  is ``h[:, 0]``), ``cls_last_hidden_state_pooler`` (``h[:, 0]`` always). open_clip's
  ``max_pooler`` fails on open_clip's own integer mask (``masked_fill`` needs a bool mask),
  so no open_clip model uses it: it is refused by name. The default (``hf_pooler_type``
  None) is open_clip's per architecture (``hf_configs.arch_dict``: mean for RoBERTa / mT5,
  cls for M2M100);
* the projection (``hf_proj_type``): ``"mlp"`` (``Linear(D, (D + E) // 2)``, GELU,
  ``Linear(.., E)``, no biases), ``"linear"`` (no bias), or None (none; needs ``D == E``).

The architecture of ``hf_model_name`` comes from attn_nlp's shipped table of published
``config.json`` files (:func:`attn_nlp.hf_configs.hf_config`), or from the ``config.json``
of a local folder of that name (what open_clip's ``AutoConfig.from_pretrained`` reads): no
network, no transformers. It is stored in the tower's config as the encoder's own config
dict (``hf_encoder``: ``{"model_type": "attn_nlp.roberta", ...}``), so a saved model needs
neither again.

Checkpoint keys: open_clip's ``text.transformer.<the bare HF encoder's keys>`` and
``text.proj.*`` (``text.proj.0`` / ``text.proj.2`` for the MLP) <-> ours,
``text.encoder.<attn_nlp encoder keys>`` and the same ``text.proj.*``:
:func:`convert_open_clip_text` (through each family's ``convert_hf``) and
:func:`to_open_clip_text`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.utils.checkpoint
from torch import nn

__all__ = [
    "DEFAULT_POOLERS",
    "POOLERS",
    "PROJ_TYPES",
    "HFTextTower",
    "convert_open_clip_text",
    "encoder_config",
    "encoder_dict",
    "encoder_from_hf_name",
    "to_open_clip_text",
]

# our encoder kinds (attn_nlp's MODEL_TYPE of each family) -> open_clip's default pooler
# (its hf_configs.arch_dict: roberta / xlm-roberta / mt5 "mean_pooler", m2m_100 "cls_pooler")
DEFAULT_POOLERS = {
    "attn_nlp.roberta": "mean_pooler",
    "attn_nlp.t5": "mean_pooler",
    "attn_nlp.m2m100": "cls_pooler",
}
POOLERS = ("mean_pooler", "cls_pooler", "cls_last_hidden_state_pooler")
PROJ_TYPES = ("mlp", "linear", None)
OPEN_CLIP_PREFIX = "text.transformer."  # open_clip's HFTextEncoder.transformer
PREFIX = "text.encoder."  # ours


# -- the encoder's architecture ------------------------------------------------------------


def _module(kind: Any):
    """The attn_nlp module of encoder kind ``kind`` (``"attn_nlp.roberta"``, ...)."""
    from attn_nlp.hf_configs import encoder_module

    if kind not in DEFAULT_POOLERS:
        raise ValueError(
            f"hf_encoder model_type {kind!r} is not an attn_nlp text encoder; expected one of "
            f"{sorted(DEFAULT_POOLERS)}"
        )
    return encoder_module(kind)


def encoder_config(d: Mapping[str, Any]) -> Any:
    """The attn_nlp encoder ``Config`` of an ``hf_encoder`` dict (``{"model_type": ...,
    **fields}``); unknown fields raise ``ValueError`` naming them."""
    return _module(d.get("model_type")).Config.from_dict(dict(d))


def encoder_dict(config: Any, kind: str) -> dict[str, Any]:
    """``{"model_type": kind, **config.to_dict()}``: what :func:`encoder_config` reads."""
    return {"model_type": kind, **config.to_dict()}


def _read_hf_config(name: str) -> dict[str, Any] | None:
    """``name``'s ``config.json``: a local folder's (as ``AutoConfig.from_pretrained``
    reads it), else the published one attn_nlp ships; None when neither has it."""
    path = Path(name).expanduser() / "config.json"
    if path.is_file():
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise ValueError(f"cannot read {path}: {e}") from None
        if not isinstance(data, dict):
            raise ValueError(f"{path} does not hold a JSON object")
        return data
    from attn_nlp.hf_configs import hf_config

    return hf_config(name)


def encoder_from_hf_name(name: str, pooler_type: str) -> dict[str, Any]:
    """The ``hf_encoder`` dict of open_clip's ``hf_model_name`` ``name`` (shipped table or
    a local folder's ``config.json``) for a tower pooled by ``pooler_type``: a RoBERTa gets
    its pooler layer exactly when ``cls_pooler`` reads it (open_clip's
    ``add_pooling_layer=uses_transformer_pooler``). ``ValueError`` says why not."""
    from attn_nlp.hf_configs import ENCODER_MODULES, encoder_module, known_hf_models

    hf = _read_hf_config(name)
    if hf is None:
        raise ValueError(
            f"no architecture for {name!r}: not a model attn_nlp ships the config.json of "
            f"({', '.join(known_hf_models())}) nor a local folder with a config.json"
        )
    kind = hf.get("model_type")
    if kind not in ENCODER_MODULES or str(kind).startswith("attn_nlp."):
        raise ValueError(
            f"{name!r} is a {kind!r} model; attn_nlp builds the text encoders "
            f"{sorted(k for k in ENCODER_MODULES if not k.startswith('attn_nlp.'))}"
        )
    module = encoder_module(kind)
    d = encoder_dict(module.config_from_hf(hf), module.MODEL_TYPE)
    return with_pooler_layer(d, pooler_type)


def with_pooler_layer(d: Mapping[str, Any], pooler_type: str) -> dict[str, Any]:
    """``d`` with a RoBERTa's ``add_pooling_layer`` set as open_clip sets it: True exactly
    for ``cls_pooler`` (its ``pooler_output``). Other encoders have no pooler layer."""
    d = dict(d)
    if d.get("model_type") == "attn_nlp.roberta":
        d["add_pooling_layer"] = pooler_type == "cls_pooler"
    return d


# -- the tower -----------------------------------------------------------------------------


def mean_pool(hidden: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """open_clip's ``MeanPooler``: ``hidden`` ``(B, L, D)`` averaged over the positions where
    ``keep`` ``(B, L)`` is True -> ``(B, D)``."""
    m = keep.unsqueeze(-1).to(hidden.dtype)  # (B, L, 1)
    return (hidden * m).sum(dim=1) / m.sum(dim=1)


def _checkpointed(forward: Callable[..., torch.Tensor], *args: Any, **kwargs: Any):
    """``forward(*args, **kwargs)``, recomputed in the backward pass when grads are on."""
    if torch.is_grad_enabled():
        return torch.utils.checkpoint.checkpoint(forward, *args, use_reentrant=False, **kwargs)
    return forward(*args, **kwargs)


class HFTextTower(nn.Module):
    """open_clip's ``HFTextEncoder`` on an attn_nlp encoder: ``(B, L)`` token ids ->
    ``(B, E)`` caption embeddings (see the module docstring).

    ``config``: a :class:`~attn_clip.config.CLIPTextConfig` with ``hf_encoder`` set.
    Submodules: ``encoder`` (attn_nlp's ``Encoder``; a RoBERTa's pooler layer inside it),
    ``proj`` (``nn.Linear``, ``nn.Sequential(Linear, GELU, Linear)`` or None).
    """

    def __init__(self, config: Any, embed_dim: int, weight_init: bool = True) -> None:
        """``weight_init`` is accepted for the tower interface; the encoder initialises
        itself (as transformers' ``from_config``) and the projection as ``nn.Linear``."""
        super().__init__()
        if config.hf_encoder is None:
            raise ValueError("HFTextTower needs a text config with hf_encoder set")
        self.config = config
        self.context_length = config.context_length
        enc_cfg = encoder_config(config.hf_encoder)
        self.encoder = _module(config.hf_encoder["model_type"]).Encoder(enc_cfg)
        self.pad_id = enc_cfg.pad_id  # the HF config's pad_token_id: these keys are masked
        self.pooler_type = config.hf_pooler_type
        self.uses_pooler_layer = getattr(self.encoder, "pooler", None) is not None
        D, E = self.encoder.width, embed_dim
        if config.hf_proj_type == "linear":
            self.proj = nn.Linear(D, E, bias=False)
        elif config.hf_proj_type == "mlp":
            hidden = (D + E) // 2
            self.proj = nn.Sequential(
                nn.Linear(D, hidden, bias=False), nn.GELU(), nn.Linear(hidden, E, bias=False)
            )
        elif D == E:  # None: no projection
            self.proj = None
        else:
            raise ValueError(f"hf_proj_type=None needs the encoder width ({D}) == embed_dim ({E})")

    @property
    def width(self) -> int:
        return self.encoder.width

    def _check(self, tokens: torch.Tensor) -> None:
        if tokens.ndim != 2 or tokens.dtype not in (torch.int64, torch.int32):
            raise ValueError(
                f"tokens must be an integer (B, L) tensor, got {tuple(tokens.shape)} {tokens.dtype}"
            )

    def forward_hidden(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(B, L)`` ids -> ``(hidden (B, L, D), keep (B, L) bool: the non-pad tokens)``."""
        self._check(tokens)
        tokens = tokens.long()
        pad = tokens == self.pad_id  # (B, L), True = padding
        return self.encoder(tokens, key_padding_mask=pad), ~pad

    def pool(self, hidden: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        """``(B, L, D)`` hidden states, ``(B, L)`` non-pad mask -> ``(B, D)`` (the pooler)."""
        if self.pooler_type == "mean_pooler":
            return mean_pool(hidden, keep)
        if self.pooler_type == "cls_pooler" and self.uses_pooler_layer:
            return self.encoder.pool(hidden)  # transformers' pooler_output
        return hidden[:, 0]  # cls_pooler without a pooler layer, cls_last_hidden_state_pooler

    def _project(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x) if self.proj is not None else x

    def forward(self, tokens: torch.Tensor, *, truncate: bool = True) -> torch.Tensor:
        """``(B, L)`` token ids -> ``(B, E)`` caption embeddings (not normalized).

        ``truncate=True`` first drops the trailing columns that are padding in every row:
        exact (their keys are masked, and positions count only non-pad tokens, or are
        relative), and fewer columns to encode when the tokenizer pads to 77.
        """
        self._check(tokens)
        if truncate and tokens.shape[1] > 1:
            used = (tokens != self.pad_id).any(dim=0).nonzero()
            tokens = tokens[:, : int(used.max()) + 1 if used.numel() else 1]
        hidden, keep = self.forward_hidden(tokens)
        return self._project(self.pool(hidden, keep))

    def forward_tokens(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(B, L)`` ids -> ``(pooled (B, E), tokens (B, L', D))``, what open_clip's tower
        returns with ``output_tokens=True``: every last hidden state (``L' = L``), without
        position 0 for ``cls_pooler`` (``L' = L - 1``)."""
        hidden, keep = self.forward_hidden(tokens)
        out = self._project(self.pool(hidden, keep))
        return out, hidden[:, 1:] if self.pooler_type == "cls_pooler" else hidden

    # -- training --------------------------------------------------------------------------

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Recompute each encoder block's activations in the backward pass (less memory);
        the keys and the outputs are unchanged."""
        for block in self.encoder.blocks:
            if enable:
                block.forward = partial(_checkpointed, type(block).forward.__get__(block))
            else:
                block.__dict__.pop("forward", None)

    def _groups(self) -> list[list[tuple[str, nn.Parameter]]]:
        """The encoder's parameters as open_clip's ``lock`` walks them: the embeddings, then
        one group per block (T5's relative position bias with block 0, where transformers
        keeps it); the final norm and a pooler layer are in none."""
        enc = self.encoder
        groups: list[list[tuple[str, nn.Parameter]]] = [[] for _ in range(len(enc.blocks) + 1)]
        for name, p in enc.named_parameters():
            m = re.match(r"blocks\.(\d+)\.", name)
            if m:
                groups[int(m.group(1)) + 1].append((name, p))
            elif name.startswith("relative_position_bias."):
                groups[1].append((name, p))
            elif not name.startswith(("norm.", "pooler.")):
                groups[0].append((name, p))
        return groups

    def _hf_layer_norms(self) -> set[str]:
        """Names of the encoder parameters open_clip's ``lock`` treats as ``LayerNorm``
        (``"LayerNorm" in name.split(".")`` of transformers' names): a RoBERTa's LayerNorms
        only; T5 and M2M100 name theirs ``layer_norm``, which that test does not match."""
        if self.config.hf_encoder["model_type"] != "attn_nlp.roberta":
            return set()
        return {
            f"{mod_name}.{p_name}"
            for mod_name, mod in self.encoder.named_modules()
            if isinstance(mod, nn.LayerNorm)
            for p_name, _ in mod.named_parameters(recurse=False)
        }

    def lock(self, unlocked_layers: int = 0, freeze_layer_norm: bool = True) -> None:
        """Freeze the encoder as open_clip's ``HFTextEncoder.lock`` does (the projection
        stays trainable): ``unlocked_layers=0`` freezes all of it; ``n > 0`` freezes the
        embeddings and all but the last ``n`` of ``[embeddings, *blocks]`` (the final norm
        and a pooler layer stay trainable). ``freeze_layer_norm=False`` leaves the frozen
        part's LayerNorms trainable -- a RoBERTa's only, as in open_clip, whose test is the
        transformers name ``LayerNorm``."""
        if unlocked_layers < 0:
            raise ValueError(f"unlocked_layers must be >= 0, got {unlocked_layers}")
        norms = self._hf_layer_norms()
        if unlocked_layers:
            frozen = [np for group in self._groups()[:-unlocked_layers] for np in group]
        else:
            frozen = list(self.encoder.named_parameters())
        for name, p in frozen:
            p.requires_grad = (not freeze_layer_norm) if name in norms else False


# -- checkpoint keys -----------------------------------------------------------------------

# per family: (ours -> transformers for the non-block keys, the block prefix in
# transformers, ours -> transformers per block module: a tuple = one fused tensor of ours
# split evenly along dim 0 into those)
_Names = tuple[dict[str, str], str, dict[str, str | tuple[str, ...]]]
_TO_HF: dict[str, _Names] = {
    "attn_nlp.roberta": (
        {
            "word_embeddings": "embeddings.word_embeddings",
            "position_embeddings": "embeddings.position_embeddings",
            "token_type_embeddings": "embeddings.token_type_embeddings",
            "embed_norm": "embeddings.LayerNorm",
            "pooler": "pooler.dense",
        },
        "encoder.layer.",
        {
            "attn.qkv": tuple(f"attention.self.{n}" for n in ("query", "key", "value")),
            "attn.proj": "attention.output.dense",
            "norm1": "attention.output.LayerNorm",
            "mlp.fc1": "intermediate.dense",
            "mlp.fc2": "output.dense",
            "norm2": "output.LayerNorm",
        },
    ),
    "attn_nlp.t5": (
        {
            "embed_tokens": "embed_tokens",
            "relative_position_bias.embed": "block.0.layer.0.SelfAttention.relative_attention_bias",
            "norm": "final_layer_norm",
        },
        "block.",
        {
            "norm1": "layer.0.layer_norm",
            "attn.qkv": tuple(f"layer.0.SelfAttention.{n}" for n in "qkv"),
            "attn.proj": "layer.0.SelfAttention.o",
            "norm2": "layer.1.layer_norm",
            # gated-gelu: fc1 = [wi_0 (the gate); wi_1]; relu: wi (see encoder_to_hf)
            "mlp.fc1": ("layer.1.DenseReluDense.wi_0", "layer.1.DenseReluDense.wi_1"),
            "mlp.fc2": "layer.1.DenseReluDense.wo",
        },
    ),
    "attn_nlp.m2m100": (
        {"embed_tokens": "embed_tokens", "norm": "layer_norm"},
        "layers.",
        {
            "attn.qkv": tuple(f"self_attn.{n}_proj" for n in "qkv"),
            "attn.proj": "self_attn.out_proj",
            "norm1": "self_attn_layer_norm",
            "norm2": "final_layer_norm",
            "mlp.fc1": "fc1",
            "mlp.fc2": "fc2",
        },
    ),
}


def encoder_to_hf(sd: Mapping[str, torch.Tensor], hf_encoder: Mapping[str, Any]) -> dict:
    """An attn_nlp encoder's state dict -> the bare transformers encoder's (``XLMRobertaModel``,
    the ``T5Stack`` / ``M2M100Encoder`` of open_clip's tower): the inverse of the family's
    ``convert_hf``, fused ``qkv`` (and T5's gated ``fc1``) split back. ``ValueError`` names
    a key with no transformers name."""
    kind = hf_encoder["model_type"]
    top, block_prefix, block = _TO_HF[kind]
    if kind == "attn_nlp.t5" and hf_encoder.get("feed_forward") != "gated-gelu":
        block = {**block, "mlp.fc1": "layer.1.DenseReluDense.wi"}
    out: dict[str, torch.Tensor] = {}
    for key, t in sd.items():
        m = re.fullmatch(r"blocks\.(\d+)\.(.+)\.(weight|bias)", key)
        module, kind_ = key.rsplit(".", 1) if "." in key else (key, "")
        if m:
            names, prefix = block.get(m.group(2)), f"{block_prefix}{m.group(1)}."
            module, kind_ = m.group(2), m.group(3)
        else:
            names, prefix = top.get(module), ""
        if names is None:
            raise ValueError(f"{kind} encoder key {key!r} has no transformers name")
        if isinstance(names, str):
            out[f"{prefix}{names}.{kind_}"] = t
        else:
            for name, part in zip(names, t.chunk(len(names)), strict=True):
                out[f"{prefix}{name}.{kind_}"] = part.contiguous()
    return out


def convert_open_clip_text(sd: Mapping[str, torch.Tensor], hf_encoder: Mapping[str, Any]) -> dict:
    """open_clip's ``text.transformer.*`` keys (the bare transformers encoder's) -> ours
    under ``text.encoder.``, through the family's ``convert_hf`` (strict: a missing or
    unknown key is a ``ValueError`` naming it). Other keys are returned unchanged; the
    ``position_ids`` buffer old transformers saved is dropped, as open_clip's loader does."""
    enc = {k[len(OPEN_CLIP_PREFIX) :]: v for k, v in sd.items() if k.startswith(OPEN_CLIP_PREFIX)}
    rest = {k: v for k, v in sd.items() if not k.startswith(OPEN_CLIP_PREFIX)}
    enc.pop("embeddings.position_ids", None)
    converted = _module(hf_encoder["model_type"]).convert_hf(enc, encoder_config(hf_encoder))
    return {**rest, **{PREFIX + k: v for k, v in converted.items()}}


def to_open_clip_text(sd: Mapping[str, torch.Tensor], hf_encoder: Mapping[str, Any]) -> dict:
    """Ours ``text.encoder.*`` -> open_clip's ``text.transformer.*`` (other keys unchanged)."""
    enc = {k[len(PREFIX) :]: v for k, v in sd.items() if k.startswith(PREFIX)}
    rest = {k: v for k, v in sd.items() if not k.startswith(PREFIX)}
    hf = encoder_to_hf(enc, hf_encoder)
    return {**rest, **{OPEN_CLIP_PREFIX + k: v for k, v in hf.items()}}


def check_pooler(pooler_type: Any) -> None:
    """``ValueError`` unless ``pooler_type`` is one of :data:`POOLERS`."""
    if pooler_type == "max_pooler":
        raise ValueError(
            "hf_pooler_type='max_pooler': open_clip's MaxPooler fails on its own integer mask "
            "(masked_fill needs a bool mask), so no open_clip model uses it"
        )
    if pooler_type not in POOLERS:
        raise ValueError(f"hf_pooler_type must be one of {POOLERS}, got {pooler_type!r}")
