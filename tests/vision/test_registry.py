"""create_model / list_models: names, tags, timm-style defaults, overrides, errors."""

from __future__ import annotations

import pytest
from attn_vision import (
    ResNet,
    SwinTransformer,
    VisionTransformer,
    ViTConfig,
    create_model,
    get_model_config,
    list_models,
)

REQUIRED = [
    "vit_tiny_patch16_224",
    "vit_small_patch16_224",
    "vit_base_patch16_224",
    "vit_base_patch32_224",
    "vit_large_patch16_224",
    "vit_base_patch32_clip_224",
    "swin_tiny_patch4_window7_224",
    "swin_small_patch4_window7_224",
    "swin_base_patch4_window7_224",
]


def test_required_names_are_registered() -> None:
    names = list_models()
    assert names == sorted(names)
    assert set(REQUIRED) <= set(names)
    assert list_models("swin_*") == [n for n in names if n.startswith("swin_")]
    assert "resnet18_coord" in list_models("resnet18*")


def test_pretrained_listing_uses_timm_tags() -> None:
    tagged = list_models("vit_base_patch16_224*", pretrained=True)
    assert "vit_base_patch16_224.augreg2_in21k_ft_in1k" in tagged
    assert all(n.startswith("vit_base_patch16_224") and "." in n for n in tagged)
    assert list_models("resnet18_eca", pretrained=True) == []  # no published weights


def test_presets_build_the_right_family() -> None:
    assert isinstance(create_model("vit_tiny_patch16_224", depth=1), VisionTransformer)
    assert isinstance(
        create_model("swin_tiny_patch4_window7_224", depths=(1, 1, 1, 1)), SwinTransformer
    )
    assert isinstance(create_model("resnet18_se", num_classes=3), ResNet)


def test_configs_match_timm_architecture_arguments() -> None:
    cfg = get_model_config("vit_base_patch32_clip_224")
    assert (cfg.patch_size, cfg.embed_dim, cfg.depth, cfg.num_heads) == (32, 768, 12, 12)
    assert cfg.pre_norm and cfg.norm_eps == 1e-5
    assert get_model_config("vit_large_patch16_224").embed_dim == 1024
    swin_b = get_model_config("swin_base_patch4_window7_224")
    assert (swin_b.embed_dim, swin_b.depths, swin_b.num_heads) == (
        128,
        (2, 2, 18, 2),
        (4, 8, 16, 32),
    )


def test_tag_sets_num_classes_like_timm() -> None:
    """timm takes num_classes from the tag's pretrained cfg; an explicit override wins."""
    assert get_model_config("vit_base_patch16_224.augreg_in21k").num_classes == 21843
    assert get_model_config("vit_base_patch16_224.augreg2_in21k_ft_in1k").num_classes == 1000
    assert get_model_config("vit_base_patch32_clip_224.openai").num_classes == 512
    assert get_model_config("vit_base_patch16_224.augreg_in21k", num_classes=10).num_classes == 10
    model = create_model("vit_tiny_patch16_224.augreg_in21k", depth=1)
    assert model.head.out_features == 21843
    assert model.pretrained_cfg["tag"] == "augreg_in21k"


def test_overrides_reach_the_config_and_data_cfg() -> None:
    model = create_model("vit_tiny_patch16_224", img_size=288, depth=2, num_classes=7)
    assert isinstance(model.config, ViTConfig)
    assert len(model.blocks) == 2 and model.head.out_features == 7
    assert model.pos_embed.shape == (1, 1 + 18 * 18, 192)
    assert model.pretrained_cfg["input_size"] == (3, 288, 288)


def test_unknown_names_and_options_are_clear_errors() -> None:
    with pytest.raises(
        ValueError, match=r"unknown model 'vit_base_patch16_244'.*vit_base_patch16_224"
    ):
        create_model("vit_base_patch16_244")
    with pytest.raises(ValueError, match=r"unknown pretrained tag 'nope'.*augreg2_in21k_ft_in1k"):
        create_model("vit_base_patch16_224.nope")
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['depht'\]"):
        create_model("vit_tiny_patch16_224", depht=2)
    with pytest.raises(ValueError, match="without pretrained tags"):
        create_model("resnet18_eca.a1_in1k")
    with pytest.raises(ValueError, match="no published weights"):
        create_model("resnet18_coord", pretrained=True)
