"""transformers' ConvNeXt and ConvNeXt V2 checkpoints -> :class:`~attn_vision.convnext.ConvNeXt`.

Reads the ``config.json`` + weights that ``save_pretrained`` writes for ``ConvNextModel`` /
``ConvNextForImageClassification`` (``model_type`` ``"convnext"``, e.g.
``facebook/convnext-tiny-224``) and ``ConvNextV2Model`` / ``ConvNextV2ForImageClassification``
(``"convnextv2"``, e.g. ``facebook/convnextv2-tiny-1k-224``). The layout, transformers' names
on the left (the bare model with or without its prefix ``convnext.`` / ``convnextv2.``)::

    embeddings.patch_embeddings / layernorm         stem.0 / stem.1
    encoder.stages.{i}.downsampling_layer.{0,1}     stages.{i}.downsample.{0,1}
    encoder.stages.{i}.layers.{j}.dwconv            stages.{i}.blocks.{j}.conv_dw
        .layernorm / .pwconv1 / .pwconv2            .norm / .mlp.fc1 / .mlp.fc2
        .layer_scale_parameter                      .gamma         (V1)
        .grn (weight / bias (1, 1, 1, C))           .mlp.grn ((C,)) (V2)
    layernorm                                       head.norm
    classifier                                      head.fc

The math is timm's ConvNeXt (Linear-layer MLPs, 7x7 depthwise convs, ``4 C`` hidden width,
patch stem, LayerNorm + 2x2 stride-2 downsampling; V2: ``use_grn``, no layer scale) with the
stem's, the downsampling and the blocks' LayerNorms at epsilon 1e-6 (fixed in transformers'
code) and the final one, on the pooled features, at the config's ``layer_norm_eps`` (1e-12 by
default): ``head_norm_eps``. Read from the config: ``hidden_sizes``, ``depths``,
``num_channels``, ``patch_size``, ``layer_scale_init_value`` (V1; 0 = no layer scale),
``layer_norm_eps``, ``hidden_act`` (GELU only: refused by name otherwise), ``drop_path_rate``
(training only); ``image_size`` changes no weight (the preprocessing reads it). The
feature-map ``ConvNextBackbone`` / ``ConvNextV2Backbone`` are refused by name.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

import torch
from attn_core.activations import hf_activation

from ..convnext import ConvNeXt, ConvNeXtConfig
from ..patch_embed import to_2tuple
from ._keys import check_architectures, renamed_checked
from .vit import _BACKBONE, _field, _num_labels

__all__ = ["ARCHITECTURES", "MODEL_TYPES", "REFUSED_ARCHITECTURES", "config_from_hf", "convert_hf"]

MODEL_TYPES = ("convnext", "convnextv2")
ARCHITECTURES = {
    "convnext": ("ConvNextModel", "ConvNextForImageClassification"),
    "convnextv2": ("ConvNextV2Model", "ConvNextV2ForImageClassification"),
}
REFUSED_ARCHITECTURES = {"ConvNextBackbone": _BACKBONE, "ConvNextV2Backbone": _BACKBONE}


def config_from_hf(hf: Mapping[str, Any], state_dict_keys: Collection[str]) -> tuple[str, Any]:
    """``config.json`` of a ConvNeXt (V2) checkpoint (and its weights' keys) ->
    ``("convnext", ConvNeXtConfig)``. ``ValueError`` names a field we cannot build."""
    v2 = check_architectures(hf, MODEL_TYPES, REFUSED_ARCHITECTURES) == "convnextv2"
    depths = tuple(_field(hf, "depths", (3, 3, 9, 3)))
    dims = tuple(_field(hf, "hidden_sizes", (96, 192, 384, 768)))
    stages = int(_field(hf, "num_stages", len(depths)))
    if not stages == len(depths) == len(dims) == 4:
        raise ValueError(
            f"num_stages={stages}, depths={list(depths)}, hidden_sizes={list(dims)}: "
            "attn_vision's ConvNeXt has exactly 4 stages"
        )
    # our ConvNeXt's MLP: the exact (erf) GELU, transformers' "gelu" / "gelu_python"
    hf_activation(_field(hf, "hidden_act", "gelu"), "hidden_act", ("gelu", "gelu_python"))
    ph, pw = to_2tuple(_field(hf, "patch_size", 4))
    if ph != pw:
        raise ValueError(f"patch_size={[ph, pw]} is not supported: expected a square stem")
    # V1: a layer scale iff layer_scale_init_value > 0; V2 has none (its code reads no field)
    ls = 0.0 if v2 else float(_field(hf, "layer_scale_init_value", 1e-6))
    classifier = "classifier.weight" in state_dict_keys
    return "convnext", ConvNeXtConfig(
        depths=depths,
        dims=dims,
        in_chans=int(_field(hf, "num_channels", 3)),
        num_classes=_num_labels(hf) if classifier else 0,
        patch_size=ph,
        ls_init_value=ls if ls > 0 else None,
        use_grn=v2,
        norm_eps=1e-6,
        head_norm_eps=float(_field(hf, "layer_norm_eps", 1e-12)),
        drop_path_rate=float(_field(hf, "drop_path_rate", 0.0)),
    )


_RENAMES = (  # (pattern, replacement), in order
    (r"^convnext(v2)?\.", ""),  # ConvNextForImageClassification's ConvNextModel
    (r"^embeddings\.patch_embeddings\.", "stem.0."),
    (r"^embeddings\.layernorm\.", "stem.1."),
    (r"^encoder\.stages\.(\d+)\.downsampling_layer\.([01])\.", r"stages.\1.downsample.\2."),
    (r"^encoder\.stages\.(\d+)\.layers\.(\d+)\.", r"stages.\1.blocks.\2."),
    (r"\.dwconv\.", ".conv_dw."),
    (r"\.layernorm\.", ".norm."),
    (r"\.pwconv([12])\.", r".mlp.fc\1."),
    (r"\.grn\.", ".mlp.grn."),
    (r"\.layer_scale_parameter$", ".gamma"),
    (r"^layernorm\.", "head.norm."),
    (r"^classifier\.", "head.fc."),
)


def convert_hf(
    state_dict: Mapping[str, torch.Tensor],
    hf: Mapping[str, Any],
    config: ConvNeXtConfig | None = None,
) -> dict[str, torch.Tensor]:
    """A transformers ConvNeXt (V2) state dict -> ours for ``config`` (read from ``hf`` when
    not given). Strict: a :class:`~attn_core.hub.CheckpointError` lists every missing,
    unexpected or mis-shaped key. V2's GRN ``(1, 1, 1, C)`` weight / bias become ``(C,)``."""
    if config is None:
        config = config_from_hf(hf, state_dict.keys())[1]
    grn = (".grn.weight", ".grn.bias")
    sd = {k: v.flatten() if k.endswith(grn) else v for k, v in state_dict.items()}
    return renamed_checked(sd, _RENAMES, ConvNeXt, config, "transformers ConvNeXt")
