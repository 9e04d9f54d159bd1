"""OpenAI's ModifiedResNet image tower against open_clip's (random init, its state dict)."""

from __future__ import annotations

import pytest
import torch
from attn_clip.modified_resnet import ModifiedResNet

modified_resnet = pytest.importorskip("open_clip.modified_resnet")


@torch.no_grad()
def _perturb(model: torch.nn.Module) -> torch.nn.Module:
    """Non-default BN statistics and weights, so a swapped tensor changes the output."""
    for p in model.parameters():
        p.add_(torch.randn_like(p) * 0.05)
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.normal_(0, 0.1)
            m.running_var.uniform_(0.5, 1.5)
    return model.eval()


@pytest.mark.parametrize(
    "layers, width, heads, image_size",
    [((1, 1, 1, 1), 64, 32, 64), ((2, 1, 2, 1), 80, 40, 96)],  # RN50 / RN50x4 widths
)
def test_matches_open_clip(layers, width, heads, image_size):
    torch.manual_seed(0)
    ref = _perturb(modified_resnet.ModifiedResNet(list(layers), 48, heads, image_size, width))
    ours = ModifiedResNet(layers, 48, heads, image_size, width).eval()
    ours.load_state_dict(ref.state_dict())  # the same names and shapes
    x = torch.randn(2, 3, image_size, image_size)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), ref(x), atol=1e-4, rtol=1e-4)


def test_wrong_image_size_is_a_value_error():
    model = ModifiedResNet((1, 1, 1, 1), 16, 2, image_size=64, width=16).eval()
    assert model(torch.randn(1, 3, 64, 64)).shape == (1, 16)
    with pytest.raises(ValueError, match="2x2 feature map"):
        model(torch.randn(1, 3, 96, 96))
