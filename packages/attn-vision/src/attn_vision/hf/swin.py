"""transformers' Swin checkpoints -> :class:`~attn_vision.swin.SwinTransformer`.

Reads the ``config.json`` + weights that ``save_pretrained`` writes for ``SwinModel`` /
``SwinForImageClassification`` (``model_type`` ``"swin"``). The layouts, transformers' names
on the left (the bare ``SwinModel``'s, with or without the prefix ``swin.``)::

    embeddings.patch_embeddings.projection      patch_embed.proj
    embeddings.norm                             patch_embed.norm
    encoder.layers.{i}.blocks.{j}.layernorm_before / _after     layers.{i}.blocks.{j}.norm1 / norm2
    ....attention.self.query / key / value      ....attn.qkv (fused)
    ....attention.self.relative_position_bias_table   ....attn.relative_position_bias_table
    ....attention.self.relative_position_index  (dropped: the model rebuilds it)
    ....attention.output.dense                  ....attn.proj
    ....intermediate.dense / output.dense       ....mlp.fc1 / mlp.fc2
    encoder.layers.{i}.downsample               layers.{i + 1}.downsample
    layernorm                                   norm
    classifier                                  head

transformers merges patches at the END of stage ``i``, timm (and we) at the start of
``i + 1``. The pooled features are the mean of the final normed map (transformers'
``pooler``, an ``AdaptiveAvgPool1d``); the logits ``classifier`` of those. transformers 5's
in-memory names (``attention.q_proj``, ``attention.relative_position_bias.*``,
``attention.o_proj``, ``mlp.fc1``) are read too.

Read from the config: ``image_size``, ``patch_size``, ``num_channels``, ``embed_dim``,
``depths``, ``num_heads``, ``window_size``, ``mlp_ratio``, ``qkv_bias``, the dropouts and
``drop_path_rate`` (training only). Refused by name, with the reason: ``hidden_act`` other
than ``"gelu"``, ``layer_norm_eps`` other than 1e-5 (transformers uses it in the blocks and
the final norm but 1e-5 in the patch-embedding and merging norms; our Swin has one eps),
``use_absolute_embeddings`` (no absolute position embedding here), and image sizes at which
transformers' windows differ from timm's: a map padded to the window in a shifted stage
(transformers pads, then shifts; timm shifts, then pads), a non-square map no larger than
the window, or a map smaller than the window (transformers' bias table is for the full
window, so its model cannot run there either).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from typing import Any

import torch
from attn_core.activations import hf_activation
from attn_core.hub import CheckpointError

from ..convert import check_state_dict, expected_state_dict_shapes
from ..patch_embed import to_2tuple
from ..swin import SwinConfig, SwinTransformer
from ._keys import check_architectures
from .vit import _BACKBONE, _MIM, _field, _num_labels

__all__ = ["ARCHITECTURES", "MODEL_TYPES", "REFUSED_ARCHITECTURES", "config_from_hf", "convert_hf"]

MODEL_TYPES = ("swin",)
ARCHITECTURES = {"swin": ("SwinModel", "SwinForImageClassification")}
REFUSED_ARCHITECTURES = {"SwinForMaskedImageModeling": _MIM, "SwinBackbone": _BACKBONE}
_PREFIX = "swin."


def _stage_windows(grid: tuple[int, int], depths: tuple[int, ...], window: int) -> None:
    """``ValueError`` for a stage where transformers' window / shift / padding is not timm's."""
    h, w = grid
    for i, depth in enumerate(depths):
        if i:
            h, w = (h + 1) // 2, (w + 1) // 2
        where = f"stage {i}'s {h}x{w} feature map"
        if min(h, w) < window:
            raise ValueError(
                f"{where} is smaller than window_size={window}: transformers' Swin cannot run "
                "it at this image_size (its bias table is for the full window)"
            )
        if min(h, w) == window and h != w:
            raise ValueError(
                f"{where} is non-square and no larger than window_size={window}: transformers "
                "clamps the window to a square there, timm per side"
            )
        if min(h, w) > window and depth > 1 and (h % window or w % window):
            raise ValueError(
                f"{where} is not divisible by window_size={window} in a shifted stage: "
                "transformers pads before the cyclic shift, timm after it"
            )


def config_from_hf(hf: Mapping[str, Any], state_dict_keys: Collection[str]) -> tuple[str, Any]:
    """``config.json`` of a Swin checkpoint (and its weights' keys) -> ``("swin", SwinConfig)``.
    ``ValueError`` names a field we cannot build."""
    check_architectures(hf, MODEL_TYPES, REFUSED_ARCHITECTURES)
    hf_activation(_field(hf, "hidden_act", "gelu"), "hidden_act", ("gelu",))  # our Swin's MLP
    eps = float(_field(hf, "layer_norm_eps", 1e-5))
    if eps != 1e-5:
        raise ValueError(
            f"layer_norm_eps={eps} is not supported: transformers' Swin uses it in the blocks "
            "but 1e-5 in the patch-embedding and merging norms; ours has one eps (1e-5)"
        )
    if hf.get("use_absolute_embeddings"):
        raise ValueError(
            "use_absolute_embeddings=True is not supported: attn_vision's Swin has no "
            "absolute position embedding"
        )
    patch = to_2tuple(_field(hf, "patch_size", 4))
    if patch[0] != patch[1]:
        raise ValueError(f"patch_size={list(patch)} is not supported: expected square patches")
    img_size = to_2tuple(_field(hf, "image_size", 224))
    if img_size[0] % patch[0] or img_size[1] % patch[1]:
        raise ValueError(
            f"image_size={list(img_size)} is not divisible by patch_size={patch[0]}: "
            "transformers pads the image, attn_vision's Swin needs whole patches"
        )
    depths = tuple(int(d) for d in _field(hf, "depths", (2, 2, 6, 2)))
    window = int(_field(hf, "window_size", 7))
    _stage_windows((img_size[0] // patch[0], img_size[1] // patch[0]), depths, window)
    keys = {k.removeprefix(_PREFIX) for k in state_dict_keys}
    config = SwinConfig(
        img_size=img_size,
        patch_size=patch[0],
        in_chans=int(_field(hf, "num_channels", 3)),
        num_classes=_num_labels(hf) if "classifier.weight" in keys else 0,
        global_pool="avg",
        embed_dim=int(_field(hf, "embed_dim", 96)),
        depths=depths,
        num_heads=tuple(int(h) for h in _field(hf, "num_heads", (3, 6, 12, 24))),
        window_size=window,
        mlp_ratio=float(_field(hf, "mlp_ratio", 4.0)),
        qkv_bias=bool(_field(hf, "qkv_bias", True)),
        norm_eps=eps,
        # training only (identity in eval)
        proj_drop_rate=float(_field(hf, "hidden_dropout_prob", 0.0)),
        attn_drop_rate=float(_field(hf, "attention_probs_dropout_prob", 0.0)),
        drop_path_rate=float(_field(hf, "drop_path_rate", 0.1)),
    )
    return "swin", config


_QKV = {
    "attention.self.query": "q",
    "attention.self.key": "k",
    "attention.self.value": "v",
    "attention.q_proj": "q",  # transformers 5's in-memory names
    "attention.k_proj": "k",
    "attention.v_proj": "v",
}
_BLOCK = {  # per-block names (legacy, then transformers 5's) -> ours
    "layernorm_before": "norm1",
    "layernorm_after": "norm2",
    "attention.self.relative_position_bias_table": "attn.relative_position_bias_table",
    "attention.relative_position_bias.relative_position_bias_table": (
        "attn.relative_position_bias_table"
    ),
    "attention.output.dense": "attn.proj",
    "attention.o_proj": "attn.proj",
    "intermediate.dense": "mlp.fc1",
    "output.dense": "mlp.fc2",
    "mlp.fc1": "mlp.fc1",
    "mlp.fc2": "mlp.fc2",
}
_TOP = {
    "embeddings.patch_embeddings.projection": "patch_embed.proj",
    "embeddings.norm": "patch_embed.norm",
    "layernorm": "norm",
    "classifier": "head",
}
_BLOCK_KEY = re.compile(r"encoder\.layers\.(\d+)\.blocks\.(\d+)\.(.+)\.(weight|bias)$")
_TABLE_KEY = re.compile(
    r"encoder\.layers\.(\d+)\.blocks\.(\d+)\.(.+\.relative_position_bias_table)$"
)


def convert_hf(
    state_dict: Mapping[str, torch.Tensor], hf: Mapping[str, Any]
) -> dict[str, torch.Tensor]:
    """A transformers Swin state dict (``config.json`` ``hf``) -> ours for the model
    :func:`config_from_hf` builds (strict: a :class:`~attn_core.hub.CheckpointError` lists
    every missing, unexpected or mis-shaped key)."""
    config = config_from_hf(hf, state_dict.keys())[1]
    sd: dict[str, torch.Tensor] = {}
    qkv: dict[tuple[str, str], dict[str, torch.Tensor]] = {}
    for key, value in state_dict.items():
        key = key.removeprefix(_PREFIX)
        if key.endswith("relative_position_index") or key == "embeddings.mask_token":
            continue  # a buffer the model rebuilds; masked-image pretraining's token
        top, _, kind = key.rpartition(".")
        if top in _TOP:
            sd[f"{_TOP[top]}.{kind}"] = value
        elif m := re.match(r"encoder\.layers\.(\d+)\.downsample\.(.+)$", key):
            sd[f"layers.{int(m[1]) + 1}.downsample.{m[2]}"] = value
        elif (m := _BLOCK_KEY.match(key)) and m[3] in _QKV:
            qkv.setdefault((f"layers.{m[1]}.blocks.{m[2]}", m[4]), {})[_QKV[m[3]]] = value
        elif (m := _BLOCK_KEY.match(key) or _TABLE_KEY.match(key)) and m[3] in _BLOCK:
            suffix = f".{m[4]}" if m.re is _BLOCK_KEY else ""
            sd[f"layers.{m[1]}.blocks.{m[2]}.{_BLOCK[m[3]]}{suffix}"] = value
        else:
            sd[key] = value  # unknown: named by the strict check
    for (block, kind), parts in qkv.items():
        missing = [n for n in "qkv" if n not in parts]
        if missing:
            raise CheckpointError(
                f"transformers Swin checkpoint: {block} has no attention {'/'.join(missing)} {kind}"
            )
        sd[f"{block}.attn.qkv.{kind}"] = torch.cat([parts[n] for n in "qkv"])
    check_state_dict(sd, expected_state_dict_shapes(SwinTransformer, config), "transformers swin")
    return sd
