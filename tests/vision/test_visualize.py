"""Attention rollout maths and the heatmap PNG written over the model's input image."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from attn_vision import (
    VisionTransformer,
    ViTConfig,
    attention_heatmap,
    attention_rollout,
    cls_attention,
    create_model,
    save_attention_heatmap,
)
from attn_vision.visualize import apply_colormap
from PIL import Image
from skimage.data import chelsea
from torchvision import transforms


@pytest.fixture(scope="module")
def vit():
    return create_model("vit_tiny_patch16_224", depth=2, num_classes=10).eval()


def test_rollout_formula() -> None:
    torch.manual_seed(0)
    maps = [torch.softmax(torch.randn(2, 3, 5, 5), -1) for _ in range(3)]
    expected = torch.eye(5).expand(2, 5, 5)
    for a in maps:  # Abnar & Zuidema: (A + I) / 2, row-normalised, multiplied layer by layer
        a = 0.5 * a.mean(1) + 0.5 * torch.eye(5)
        expected = (a / a.sum(-1, keepdim=True)) @ expected
    out = attention_rollout(maps)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(out.sum(-1), torch.ones(2, 5))  # still a distribution
    # self-attention only -> the identity: every token comes from itself
    torch.testing.assert_close(
        attention_rollout([torch.eye(4).expand(1, 2, 4, 4)] * 3), torch.eye(4)[None]
    )
    with pytest.raises(ValueError, match="at least one"):
        attention_rollout([])


def test_cls_attention_and_heatmap_shapes(vit) -> None:
    x = torch.randn(2, 3, 224, 224)
    maps = vit.get_attention_maps(x)
    assert cls_attention(maps).shape == (2, 197)
    torch.testing.assert_close(cls_attention(maps, layer=0), maps[0][:, :, 0].mean(1))
    for method in ("rollout", "cls"):
        heat = attention_heatmap(vit, x, method)
        assert heat.shape == (2, 14, 14)
        assert heat.amin() == 0 and heat.amax() == 1
    with pytest.raises(ValueError, match="method"):
        attention_heatmap(vit, x, "grad-cam")


def test_colormap_ends() -> None:
    rgb = apply_colormap(np.array([[0.0, 0.5, 1.0]]))
    assert rgb.dtype == np.uint8 and rgb.shape == (1, 3, 3)
    assert tuple(rgb[0, 0]) == (0, 0, 128) and tuple(rgb[0, 2]) == (128, 0, 0)  # jet: blue -> red


def test_png_over_the_image(vit, tmp_path) -> None:
    image = Image.fromarray(chelsea())
    path = tmp_path / "attn.png"
    out = save_attention_heatmap(vit, image, path)
    saved = Image.open(path)
    assert saved.format == "PNG" and saved.size == (224, 224) and saved.mode == "RGB"
    assert np.array_equal(np.asarray(saved), np.asarray(out))
    # alpha=0 is the model's (center-cropped, de-normalised) input: the cat, not a heatmap
    plain = np.asarray(save_attention_heatmap(vit, image, tmp_path / "a0.png", alpha=0.0))
    geometry = transforms.Compose(  # vit_tiny's eval geometry: 224 / 0.9 = 248, bicubic
        [transforms.Resize(248, transforms.InterpolationMode.BICUBIC), transforms.CenterCrop(224)]
    )
    crop = np.asarray(geometry(image)).astype(int)
    assert np.abs(plain.astype(int) - crop).max() <= 1  # only rounding from the round trip


def test_heatmap_marks_the_attended_patch(vit, tmp_path, monkeypatch) -> None:
    """[CLS] attends only to patch (row 3, col 10): the hot spot lands on that 16 x 16 cell."""
    N, target = 197, 1 + 3 * 14 + 10
    focused = torch.full((1, 3, N, N), 1e-4)
    focused[:, :, 0, target] = 1.0
    focused = focused / focused.sum(-1, keepdim=True)
    monkeypatch.setattr(vit, "get_attention_maps", lambda x: [focused, focused])
    out = np.asarray(
        save_attention_heatmap(
            vit, Image.fromarray(chelsea()), tmp_path / "h.png", method="cls", alpha=1.0
        )
    )
    redness = out[..., 0].astype(int) - out[..., 2].astype(int)
    y, x = np.unravel_index(redness.argmax(), redness.shape)
    assert 3 * 16 <= y < 4 * 16 and 10 * 16 <= x < 11 * 16


def test_only_vits_have_attention_maps(tmp_path) -> None:
    swin = create_model("swin_tiny_patch4_window7_224", depths=(1, 1, 1, 1))
    with pytest.raises(TypeError, match="get_attention_maps"):
        save_attention_heatmap(swin, Image.fromarray(chelsea()), tmp_path / "x.png")
    with pytest.raises(ValueError, match="alpha"):
        save_attention_heatmap(swin, Image.fromarray(chelsea()), tmp_path / "x.png", alpha=2)


def _small_vit(**kwargs) -> VisionTransformer:
    cfg = dict(img_size=64, patch_size=16, embed_dim=32, depth=2, num_heads=2, num_classes=3)
    return VisionTransformer(ViTConfig(**{**cfg, **kwargs})).eval()


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(dist_token=True),  # DeiT: [CLS], [DIST]
        dict(reg_tokens=4),  # [CLS] + registers (DINOv2-reg)
        dict(class_token=False, reg_tokens=4, global_pool="avg"),  # registers only
        dict(class_token=False, global_pool="map"),  # SigLIP: no prefix at all
    ],
)
def test_heatmap_with_register_and_distillation_tokens(kwargs) -> None:
    model = _small_vit(**kwargs)
    x = torch.randn(2, 3, 64, 64)
    N = model.num_prefix_tokens + 16
    assert model.get_attention_maps(x)[0].shape == (2, 2, N, N)
    for method in ("rollout", "cls"):
        heat = attention_heatmap(model, x, method)
        assert heat.shape == (2, 4, 4) and heat.amin() == 0 and heat.amax() == 1


def test_registers_are_dropped_from_the_heatmap(monkeypatch) -> None:
    """Registers only: the map comes from the patch queries (not a register's row) and
    leaves out the register keys, however much attention they draw."""
    model = _small_vit(class_token=False, reg_tokens=4, global_pool="avg")
    P, target, decoy = 4, 4 + 9, 4 + 2
    maps = torch.full((1, 2, P + 16, P + 16), 1e-3)
    maps[:, :, P:, 1] = 5.0  # the patches' attention sink: register 1
    maps[:, :, P:, target] = 1.0  # patches look at patch 9 (row 2, col 1)
    maps[:, :, :P, decoy] = 1.0  # registers look at patch 2
    maps = maps / maps.sum(-1, keepdim=True)
    # one layer: rollout's flow through a register into patch 2 would be real information flow
    monkeypatch.setattr(model, "get_attention_maps", lambda x: [maps])
    for method in ("cls", "rollout"):
        heat = attention_heatmap(model, torch.zeros(1, 3, 64, 64), method)
        assert heat.shape == (1, 4, 4)
        assert divmod(int(heat.flatten().argmax()), 4) == (2, 1), method
