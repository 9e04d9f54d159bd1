"""transformers' BEiT checkpoints -> :class:`~attn_vision.vit.VisionTransformer`.

Reads the ``config.json`` + weights that ``save_pretrained`` writes for ``BeitModel`` /
``BeitForImageClassification`` (``model_type`` ``"beit"``) and their copies
``Data2VecVisionModel`` / ``...ForImageClassification`` (``"data2vec-vision"``). BEiT is a
ViT with, per block, a query and a value bias but no key bias (fused into ``qkv`` with a
zero key bias), layer scale (``lambda_1`` / ``lambda_2``) and a learned relative position
bias (:class:`~attn_vision.rel_pos.BeitRelPosBias`, ``rel_pos="beit"``). (A key bias
adds the same ``q . b`` to every score of a query's row: softmax ignores it and its
gradient is zero, so the zero key bias stays zero in fine-tuning too.) The layouts,
transformers' names on the left (the bare ``*Model``'s, with or without the prefix
``beit.`` / ``data2vec_vision.``; the names shared with ViT are read by
:mod:`attn_vision.hf.vit`)::

    embeddings.cls_token / position_embeddings  cls_token / pos_embed
    embeddings.patch_embeddings.projection      patch_embed.proj
    embeddings.mask_token                       (dropped: masked-image pretraining only)
    encoder.layer.{i}.attention.attention.query / key / value   blocks.{i}.attn.qkv (fused)
    encoder.layer.{i}.attention.attention.relative_position_bias.relative_position_bias_table
                                                blocks.{i}.attn.rel_pos.relative_position_bias_table
    encoder.relative_position_bias.relative_position_bias_table   (shared: added to each block's)
    ....relative_position_index                 (dropped: the model rebuilds it)
    encoder.layer.{i}.lambda_1 / lambda_2       blocks.{i}.ls1 / ls2.gamma
    encoder.layer.{i}.layernorm_before / _after, attention.output.dense, intermediate.dense,
    output.dense                                blocks.{i}.norm1 / norm2, attn.proj, mlp.fc1 / fc2
    layernorm                                   norm     (use_mean_pooling=False: [CLS])
    pooler.layernorm                            fc_norm  (use_mean_pooling: patch mean)
    classifier                                  head

Read from the config: ``image_size``, ``patch_size``, ``num_channels``, ``hidden_size``,
``num_hidden_layers``, ``num_attention_heads``, ``intermediate_size``, ``hidden_act``,
``layer_norm_eps`` (1e-12), ``layer_scale_init_value`` (<= 0: no layer scale),
``use_absolute_position_embeddings``, ``use_relative_position_bias``,
``use_shared_relative_position_bias`` (a bias shared by all blocks is added to each block's
table: the same sums), ``use_mean_pooling`` and the dropouts (training only).

At another image size, as transformers does on every forward: the absolute position
embedding resampled bicubic without antialiasing, the relative bias tables bilinearly.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from typing import Any

import torch
from attn_core.hub import CheckpointError

from ..patch_embed import to_2tuple
from ..vit import VisionTransformer, ViTConfig
from ._keys import check_architectures
from .vit import (
    _BACKBONE,
    _DROPPED,
    _MIM,
    _act,
    _checked,
    _field,
    _legacy,
    _num_labels,
    _rename,
    _square_patch,
)

__all__ = ["ARCHITECTURES", "MODEL_TYPES", "REFUSED_ARCHITECTURES", "config_from_hf", "convert_hf"]

MODEL_TYPES = ("beit", "data2vec-vision")
ARCHITECTURES = {
    "beit": ("BeitModel", "BeitForImageClassification"),
    "data2vec-vision": ("Data2VecVisionModel", "Data2VecVisionForImageClassification"),
}
_SEGMENTATION = "a semantic-segmentation head (UperNet decoder over FPN feature maps)"
REFUSED_ARCHITECTURES = {
    "BeitForMaskedImageModeling": _MIM,
    "BeitForSemanticSegmentation": _SEGMENTATION,
    "BeitBackbone": _BACKBONE,
    "Data2VecVisionForSemanticSegmentation": _SEGMENTATION,
}
_PREFIXES = ("beit.", "data2vec_vision.")
# the bias table of block i (legacy and transformers 5's names, after _legacy) / the shared one
_TABLE = re.compile(
    r"encoder\.layer\.(\d+)\.(?:attention\.attention\.)?relative_position_bias\."
    r"relative_position_bias_table$"
)
_QKV = re.compile(r"encoder\.layer\.(\d+)\.attention\.attention\.(query|key|value)\.(weight|bias)$")
_SHARED = (
    "encoder.relative_position_bias.relative_position_bias_table",
    "shared_position_bias.relative_position_bias_table",
)


def _strip(key: str) -> str:
    for prefix in _PREFIXES:
        if key.startswith(prefix):
            return key[len(prefix) :]
    return key


def config_from_hf(hf: Mapping[str, Any], state_dict_keys: Collection[str]) -> tuple[str, Any]:
    """``config.json`` of a BEiT checkpoint (and its weights' keys) -> ``("vit", ViTConfig)``.
    ``ValueError`` names a field we cannot build."""
    check_architectures(hf, MODEL_TYPES, REFUSED_ARCHITECTURES)
    D = int(_field(hf, "hidden_size", 768))
    heads = int(_field(hf, "num_attention_heads", 12))
    if D % heads or int(_field(hf, "head_dim", D // heads)) != D // heads:
        raise ValueError(
            f"hidden_size={D} / num_attention_heads={heads} / head_dim={hf.get('head_dim')}: "
            "expected head_dim = hidden_size / num_attention_heads"
        )
    hidden = int(_field(hf, "intermediate_size", 3072))
    if int(D * (hidden / D)) != hidden:
        raise ValueError(f"intermediate_size={hidden} is not expressible as a ratio of {D}")
    keys = {_strip(k) for k in state_dict_keys}
    mean_pool = bool(_field(hf, "use_mean_pooling", True))
    layer_scale = float(_field(hf, "layer_scale_init_value", 0.1))
    rel_pos = hf.get("use_relative_position_bias") or hf.get("use_shared_relative_position_bias")
    config = ViTConfig(
        img_size=to_2tuple(_field(hf, "image_size", 224)),
        patch_size=_square_patch(hf),
        in_chans=int(_field(hf, "num_channels", 3)),
        num_classes=_num_labels(hf) if "classifier.weight" in keys else 0,
        global_pool="avg" if mean_pool else "token",
        embed_dim=D,
        depth=int(_field(hf, "num_hidden_layers", 12)),
        num_heads=heads,
        mlp_ratio=hidden / D,
        qkv_bias=True,  # query and value bias; the key's is zero
        patch_bias=True,
        # mean pooling: no norm before the pool, a pooler layernorm after it (none in a
        # BeitModel saved without its pooler)
        fc_norm=mean_pool,
        final_norm=not mean_pool or "pooler.layernorm.weight" in keys,
        norm_eps=float(_field(hf, "layer_norm_eps", 1e-12)),
        act=_act(hf),
        init_values=layer_scale if layer_scale > 0 else None,
        pos_embed="learn" if hf.get("use_absolute_position_embeddings") else "none",
        pos_embed_antialias=False,
        rel_pos="beit" if rel_pos else "",
        # training only (identity in eval): transformers' dropouts and stochastic depth
        pos_drop_rate=float(_field(hf, "hidden_dropout_prob", 0.0)),
        proj_drop_rate=float(_field(hf, "hidden_dropout_prob", 0.0)),
        attn_drop_rate=float(_field(hf, "attention_probs_dropout_prob", 0.0)),
        drop_path_rate=float(_field(hf, "drop_path_rate", 0.1)),
    )
    return "vit", config


def convert_hf(
    state_dict: Mapping[str, torch.Tensor], hf: Mapping[str, Any]
) -> dict[str, torch.Tensor]:
    """A transformers BEiT state dict (``config.json`` ``hf``) -> ours for the model
    :func:`config_from_hf` builds (strict: a :class:`~attn_core.hub.CheckpointError` lists
    every missing, unexpected or mis-shaped key)."""
    config = config_from_hf(hf, state_dict.keys())[1]
    sd: dict[str, torch.Tensor] = {}
    qkv: dict[tuple[str, str], dict[str, torch.Tensor]] = {}
    tables: dict[int, torch.Tensor] = {}
    shared = None
    for key, value in state_dict.items():
        key = _legacy(_strip(key))
        if key in _DROPPED or key.endswith("relative_position_index"):
            continue  # the mask token (pretraining only); a buffer the model rebuilds
        if m := _QKV.match(key):
            qkv.setdefault((m[1], m[3]), {})[m[2]] = value
        elif m := _TABLE.match(key):
            tables[int(m[1])] = value
        elif key in _SHARED:
            shared = value
        elif m := re.match(r"encoder\.layer\.(\d+)\.lambda_([12])$", key):
            sd[f"blocks.{m[1]}.ls{m[2]}.gamma"] = value
        elif key.startswith("pooler.layernorm."):
            sd[f"fc_norm.{key.rsplit('.', 1)[1]}"] = value
        else:
            sd[_rename(key)] = value  # the names ViT shares; unknown keys kept for the check
    for (i, kind), parts in qkv.items():
        names = ("query", "value") if kind == "bias" else ("query", "key", "value")
        missing = [n for n in names if n not in parts]
        if missing:
            raise CheckpointError(
                f"transformers BEiT checkpoint: layer {i} has no attention {', '.join(missing)} "
                f"{kind}"
            )
        key_bias = parts.get("key", torch.zeros_like(parts["query"]))
        sd[f"blocks.{i}.attn.qkv.{kind}"] = torch.cat([parts["query"], key_bias, parts["value"]])
    if shared is not None:  # one table shared by every block: each block adds it to its own
        for i in range(config.depth):
            tables[i] = tables[i] + shared if i in tables else shared.clone()
    for i, table in tables.items():
        sd[f"blocks.{i}.attn.rel_pos.relative_position_bias_table"] = table
    return _checked(sd, config, VisionTransformer, f"transformers {hf.get('model_type')}")
