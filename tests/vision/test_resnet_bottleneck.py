"""The ResNet-50 family (Bottleneck, deep stem, average-pool shortcut, SE / ECA): timm parity.

Shrunk depth (one block per stage) keeps the tests fast; widths are timm's.
"""

from __future__ import annotations

import pytest
import torch
from attn_vision import ResNet, ResNetConfig
from attn_vision.convert import convert_timm_resnet
from safetensors.torch import load_file

FAMILY = {  # timm name -> our config fields
    "resnet50": dict(block="bottleneck"),
    "resnet50d": dict(block="bottleneck", stem_type="deep", avg_down=True),
    "seresnet50": dict(block="bottleneck", attn_layer="se"),
    "ecaresnet50d": dict(block="bottleneck", stem_type="deep", avg_down=True, attn_layer="eca"),
}


@pytest.mark.parametrize("name", sorted(FAMILY))
def test_bottleneck_family_matches_timm(name, timm_checkpoint, assert_parity):
    ref, path = timm_checkpoint(name, layers=(1, 1, 1, 1), num_classes=7)
    config = ResNetConfig(layers=(1, 1, 1, 1), num_classes=7, **FAMILY[name])
    ours = ResNet(config, weight_init=False)
    ours.load_state_dict(convert_timm_resnet(load_file(str(path)), config))
    assert_parity(ref, ours.eval(), torch.randn(2, 3, 64, 64))


def test_deep_stem_avg_down_layout_and_bad_fields():
    ours = ResNet(ResNetConfig(layers=(1, 1, 1, 1), **FAMILY["resnet50d"]))
    names = dict(ours.named_parameters())
    assert names["conv1.6.weight"].shape == (64, 32, 3, 3)  # 32 inside, 64 out
    assert names["layer2.0.downsample.1.weight"].shape == (512, 256, 1, 1)  # after the pool
    assert ours.num_features == 2048
    with pytest.raises(ValueError, match="bottleneck"):
        ResNetConfig(block="wide")
    with pytest.raises(ValueError, match="deep"):
        ResNetConfig(stem_type="tiered")
