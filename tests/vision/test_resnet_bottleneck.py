"""The ResNet-50 family (Bottleneck, deep stem, average-pool shortcut, SE / ECA, ResNeXt
groups, wide bottlenecks): timm parity through the registered presets.

Shrunk depth (one block per stage) keeps the tests fast; widths are timm's.
"""

from __future__ import annotations

import pytest
import torch
from attn_vision import ResNet, ResNetConfig, create_model

NAMES = ["resnet50", "resnet50c", "resnet50d", "resnet50s", "seresnet50", "ecaresnet50d"]
NAMES += ["ecaresnetlight", "resnext50_32x4d", "seresnext26d_32x4d", "wide_resnet50_2"]
NAMES += ["resnet18d"]


@pytest.mark.parametrize("name", NAMES)
def test_bottleneck_family_matches_timm(name, timm_checkpoint, assert_parity):
    ref, path = timm_checkpoint(name, layers=(1, 1, 1, 1), num_classes=7)
    ours = create_model(name, pretrained=path, layers=(1, 1, 1, 1), num_classes=7)
    assert_parity(ref, ours.eval(), torch.randn(2, 3, 64, 64))


def test_deep_stem_avg_down_layout_and_bad_fields():
    d = dict(block="bottleneck", stem_type="deep", avg_down=True)
    ours = ResNet(ResNetConfig(layers=(1, 1, 1, 1), **d))
    names = dict(ours.named_parameters())
    assert names["conv1.6.weight"].shape == (64, 32, 3, 3)  # 32 inside, 64 out
    assert names["layer2.0.downsample.1.weight"].shape == (512, 256, 1, 1)  # after the pool
    assert ours.num_features == 2048
    with pytest.raises(ValueError, match="bottleneck"):
        ResNetConfig(block="wide")
    with pytest.raises(ValueError, match="deep"):
        ResNetConfig(stem_type="tiered")
    with pytest.raises(ValueError, match="bottleneck"):
        ResNetConfig(cardinality=32)
