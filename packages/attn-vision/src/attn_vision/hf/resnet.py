"""transformers' ResNet checkpoints -> :class:`~attn_vision.resnet.ResNet`.

Reads the ``config.json`` + weights that ``save_pretrained`` writes for ``ResNetModel`` /
``ResNetForImageClassification`` (``model_type`` ``"resnet"``, e.g. ``microsoft/resnet-50``).
The layout, transformers' names on the left (the bare ``ResNetModel`` with or without the
``resnet.`` prefix)::

    embedder.embedder.convolution / normalization          conv1 / bn1
    encoder.stages.{i}.layers.{j}.layer.{k}.convolution    layer{i+1}.{j}.conv{k+1}
        .layer.{k}.normalization                           .bn{k+1}
        .shortcut.convolution / .shortcut.normalization    .downsample.0 / .downsample.1
    classifier.1                                           fc

The math is timm's ResNet (7x7 stride-2 conv + BatchNorm + ReLU + 3x3 max-pool stem, basic
or bottleneck blocks, 1x1-conv + BatchNorm shortcuts, average pool, ``fc``). Read from the
config: ``layer_type`` (``"basic"`` / ``"bottleneck"``), ``depths``, ``embedding_size`` and
``hidden_sizes`` (the stem's width and each stage's output: ``embedding_size * 2**i`` times
1 (basic) or 4 (bottleneck), as every ResNet on the hub has them), ``num_channels``,
``downsample_in_bottleneck`` (the stride on the bottleneck's first 1x1 conv, ResNet v1:
``stride_in_1x1``; by default on the 3x3, v1.5, as timm). Refused by name:
``hidden_act`` other than ``"relu"``, ``downsample_in_first_stage=True`` and the
feature-map ``ResNetBackbone``.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

import torch
from attn_core.activations import hf_activation

from ..resnet import ResNet, ResNetConfig
from ._keys import check_architectures, renamed_checked
from .vit import _BACKBONE, _field, _num_labels

__all__ = ["ARCHITECTURES", "MODEL_TYPES", "REFUSED_ARCHITECTURES", "config_from_hf", "convert_hf"]

MODEL_TYPES = ("resnet",)
ARCHITECTURES = {"resnet": ("ResNetModel", "ResNetForImageClassification")}
REFUSED_ARCHITECTURES = {"ResNetBackbone": _BACKBONE}


def config_from_hf(hf: Mapping[str, Any], state_dict_keys: Collection[str]) -> tuple[str, Any]:
    """``config.json`` of a ResNet checkpoint (and its weights' keys) ->
    ``("resnet", ResNetConfig)``. ``ValueError`` names a field we cannot build."""
    check_architectures(hf, MODEL_TYPES, REFUSED_ARCHITECTURES)
    # transformers uses it in the stem and after each residual sum only; ours is ReLU
    hf_activation(_field(hf, "hidden_act", "relu"), "hidden_act", ("relu",))
    if _field(hf, "downsample_in_first_stage", False):
        raise ValueError(
            "downsample_in_first_stage=True (a stride-2 first stage) is not supported: "
            "attn_vision's ResNet keeps the stem's resolution in stage 1"
        )
    block = _field(hf, "layer_type", "bottleneck")
    if block not in ("basic", "bottleneck"):
        raise ValueError(f"layer_type={block!r} is not one of 'basic', 'bottleneck'")
    depths = tuple(_field(hf, "depths", (3, 4, 6, 3)))
    width = int(_field(hf, "embedding_size", 64))
    sizes = list(_field(hf, "hidden_sizes", (256, 512, 1024, 2048)))
    expansion = 4 if block == "bottleneck" else 1
    expected = [expansion * width * 2**i for i in range(4)]
    if len(depths) != 4 or sizes != expected:
        raise ValueError(
            f"depths={list(depths)}, hidden_sizes={sizes} with embedding_size={width} and "
            f"layer_type={block!r} are not supported: attn_vision's ResNet has 4 stages of "
            f"hidden_sizes={expected}"
        )
    classifier = "classifier.1.weight" in state_dict_keys
    bottleneck = dict(stride_in_1x1=bool(_field(hf, "downsample_in_bottleneck", False)))
    return "resnet", ResNetConfig(
        layers=depths,
        block=block,
        in_chans=int(_field(hf, "num_channels", 3)),
        num_classes=_num_labels(hf) if classifier else 0,
        width=width,
        **(bottleneck if block == "bottleneck" else {}),  # transformers' basic layer ignores it
    )


_RENAMES = (  # (pattern, replacement), in order
    (r"^resnet\.", ""),  # ResNetForImageClassification's ResNetModel
    (r"^embedder\.embedder\.convolution\.", "conv1."),
    (r"^embedder\.embedder\.normalization\.", "bn1."),
    (r"^encoder\.stages\.(\d+)\.layers\.(\d+)\.", lambda m: f"layer{int(m[1]) + 1}.{m[2]}."),
    (r"\.layer\.(\d)\.convolution\.", lambda m: f".conv{int(m[1]) + 1}."),
    (r"\.layer\.(\d)\.normalization\.", lambda m: f".bn{int(m[1]) + 1}."),
    (r"\.shortcut\.convolution\.", ".downsample.0."),
    (r"\.shortcut\.normalization\.", ".downsample.1."),
    (r"^classifier\.1\.", "fc."),
)


def convert_hf(
    state_dict: Mapping[str, torch.Tensor],
    hf: Mapping[str, Any],
    config: ResNetConfig | None = None,
) -> dict[str, torch.Tensor]:
    """A transformers ResNet state dict -> ours for ``config`` (read from ``hf`` when not
    given). Strict: a :class:`~attn_core.hub.CheckpointError` lists every missing,
    unexpected or mis-shaped key."""
    if config is None:
        config = config_from_hf(hf, state_dict.keys())[1]
    return renamed_checked(state_dict, _RENAMES, ResNet, config, "transformers ResNet")
