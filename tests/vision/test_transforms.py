"""create_transform reproduces timm's eval transform, pixel for pixel, on a real photo."""

from __future__ import annotations

import pytest
import timm
import torch
from attn_vision import create_model, create_transform, resolve_data_config
from PIL import Image
from skimage.data import chelsea
from timm.data import create_transform as timm_create_transform
from timm.data import resolve_data_config as timm_resolve_data_config
from timm.models import get_pretrained_cfg


@pytest.fixture(scope="module")
def cat() -> Image.Image:
    return Image.fromarray(chelsea())  # 451 x 300, not square


def _timm_transform(**data_cfg):
    return timm_create_transform(**data_cfg, is_training=False)


def test_matches_timm_for_a_timm_model(cat) -> None:
    """The exact recipe: timm's create_transform(**resolve_data_config({}, model=timm_model))."""
    ref_model = timm.create_model("vit_tiny_patch16_224", depth=1, weight_init="skip")
    ours = create_model("vit_tiny_patch16_224", depth=1)
    expected = _timm_transform(**timm_resolve_data_config({}, model=ref_model))(cat)
    got = create_transform(ours)(cat)
    assert got.shape == (3, 224, 224)
    torch.testing.assert_close(got, expected, atol=0, rtol=0)


@pytest.mark.parametrize(
    "name",
    [
        "vit_base_patch16_224.augreg2_in21k_ft_in1k",  # bicubic, crop 0.9, mean/std 0.5
        "vit_base_patch16_384.augreg_in21k_ft_in1k",  # 384, crop 1.0
        "vit_base_patch32_clip_224.openai",  # CLIP mean / std
        "swin_tiny_patch4_window7_224.ms_in1k",  # ImageNet mean / std
        "resnet18.a1_in1k",  # crop 0.95
        "resnet18.tv_in1k",  # bilinear, crop 0.875
    ],
)
def test_matches_timm_per_pretrained_tag(name, cat) -> None:
    timm_cfg = timm_resolve_data_config({}, pretrained_cfg=get_pretrained_cfg(name).to_dict())
    ours_cfg = resolve_data_config(name)
    assert ours_cfg == {k: timm_cfg[k] for k in ours_cfg}
    expected = _timm_transform(**timm_cfg)(cat)
    torch.testing.assert_close(create_transform(name)(cat), expected, atol=0, rtol=0)


def test_non_square_input_size_matches_timm(cat) -> None:
    model = create_model("vit_tiny_patch16_224", depth=1, img_size=(192, 256))
    cfg = resolve_data_config(model)
    assert cfg["input_size"] == (3, 192, 256)
    got = create_transform(model)(cat)
    assert got.shape == (3, 192, 256)
    torch.testing.assert_close(got, _timm_transform(**cfg)(cat), atol=0, rtol=0)


def test_overrides_and_defaults(cat) -> None:
    model = create_model("resnet18_coord")  # no timm cfg: timm's defaults
    cfg = resolve_data_config(model)
    assert cfg["crop_pct"] == 0.875 and cfg["interpolation"] == "bicubic"
    squash = create_transform(model, crop_mode="squash", crop_pct=1.0)
    torch.testing.assert_close(
        squash(cat), _timm_transform(**{**cfg, "crop_mode": "squash", "crop_pct": 1.0})(cat)
    )
    with pytest.raises(ValueError, match="unknown data config option"):
        create_transform(model, crop=0.9)
    with pytest.raises(ValueError, match="crop_mode"):
        create_transform(model, crop_mode="border")


def test_training_transform_is_timms_pipeline_from_torchvision(cat) -> None:
    from torchvision import transforms as T

    model = create_model("vit_tiny_patch16_224", depth=1, img_size=64)
    tf = create_transform(model, is_training=True, auto_augment="rand", re_prob=0.25)
    kinds = [type(t) for t in tf.transforms]
    assert kinds == [
        T.RandomResizedCrop,
        T.RandomHorizontalFlip,
        T.RandAugment,
        T.ToTensor,
        T.Normalize,
        T.RandomErasing,
    ]
    assert tf.transforms[0].size == (64, 64) and tf.transforms[0].scale == (0.08, 1.0)
    torch.manual_seed(0)
    x = tf(cat)
    torch.manual_seed(0)
    assert x.shape == (3, 64, 64) and torch.equal(x, tf(cat))  # seeded: reproducible
    plain = create_transform(model, True, hflip=0.0, auto_augment=None, color_jitter=0.0)
    assert [type(t) for t in plain.transforms] == [T.RandomResizedCrop, T.ToTensor, T.Normalize]
    jitter = create_transform(model, True, auto_augment="none", scale=(0.5, 1.0))
    assert type(jitter.transforms[2]) is T.ColorJitter and jitter.transforms[0].scale == (0.5, 1.0)
    assert type(create_transform(model, True, auto_augment="trivial").transforms[2]) is (
        T.TrivialAugmentWide
    )
    with pytest.raises(ValueError, match="auto_augment must be"):
        create_transform(model, True, auto_augment="augmix")
