"""ResNet backbone with pluggable channel attention: parity with timm's ResNet variants."""

from __future__ import annotations

import pytest
import timm
import torch
from attn_vision import CoordinateAttention, ResNet, ResNetConfig, create_model


@pytest.mark.parametrize(
    ("ours_name", "timm_name", "timm_kwargs"),
    [
        ("resnet18", "resnet18", {}),
        ("seresnet18", "seresnet18", {}),
        ("resnet18_eca", "resnet18", {"block_args": {"attn_layer": "eca"}}),
        ("resnet18_cbam", "resnet18", {"block_args": {"attn_layer": "cbam"}}),
    ],
)
def test_resnet_matches_timm(ours_name, timm_name, timm_kwargs, timm_checkpoint, assert_parity):
    """Full width, one BasicBlock per stage (stage 1 keeps the identity shortcut, the others
    the downsampling one); the full-depth layout is the resnet34 test below."""
    ref, path = timm_checkpoint(timm_name, layers=(1, 1, 1, 1), **timm_kwargs)
    ours = create_model(ours_name, pretrained=path, layers=(1, 1, 1, 1)).eval()
    assert_parity(ref, ours, torch.randn(1, 3, 64, 64))


def test_resnet34_layout_matches_timm() -> None:
    ref = timm.create_model("resnet34", num_classes=5)
    ours = create_model("resnet34_se", num_classes=5)
    expected = {k: v.shape for k, v in ref.state_dict().items()}
    got = {k: v.shape for k, v in ours.state_dict().items() if ".se." not in k}
    assert got == expected


def test_coord_resnet_trains() -> None:
    model = create_model("resnet18_coord", num_classes=4, layers=(1, 1, 1, 1), width=16)
    assert isinstance(model.layer3[0].se, CoordinateAttention)
    x = torch.randn(2, 3, 32, 32)
    model(x).logsumexp(-1).sum().backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name


def test_grad_checkpointing_gives_same_grads() -> None:
    model = create_model("resnet18_se", num_classes=3, layers=(1, 1, 1, 1), width=16).eval()
    x = torch.randn(2, 3, 32, 32)
    model(x).square().sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    model.set_grad_checkpointing(True)
    model(x).square().sum().backward()
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, grads[n], msg=n)


def test_resnet_shapes_and_errors() -> None:
    model = ResNet(ResNetConfig(num_classes=0)).eval()
    with torch.no_grad():
        feats = model.forward_features(torch.randn(1, 3, 64, 96))
        assert feats.shape == (1, 512, 2, 3)
        assert model.forward_head(feats).shape == (1, 512)
    with pytest.raises(
        ValueError, match=r"expected an image batch \(B, 3, H, W\), got \(1, 1, 64, 64\)"
    ):
        model(torch.randn(1, 1, 64, 64))
    with pytest.raises(ValueError, match="4 stages"):
        ResNetConfig(layers=(2, 2))
