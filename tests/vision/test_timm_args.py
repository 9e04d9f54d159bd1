"""attn_vision.timm_args: timm's keyword arguments -> our config fields and back, checked
against timm (its recorded entrypoints, and its models built on the meta device)."""

from __future__ import annotations

import dataclasses

import pytest
import timm
import torch
from attn_vision import create_model, get_model_config, list_models
from attn_vision.registry import FAMILIES, get_model_spec, timm_model_config
from attn_vision.timm_args import TIMM_TRANSLATORS, convnext_args, timm_kwargs
from attn_vision.timm_table import timm_convnext_args, timm_swin_args
from timm.models.vitamin import VitCfg


def test_convnext_presets_are_timms_architectures() -> None:
    """The hand-written ConvNeXt presets are what timm's entrypoints pass their builder."""
    table = timm_convnext_args()
    presets = [n for n in list_models("convnext_*") if get_model_spec(n).family == "convnext"]
    assert len(presets) == 12
    for name in presets:
        args, unsupported = table[name]
        assert not unsupported, name
        config = get_model_config(name)
        assert {k: getattr(config, k) for k in args} == args, name
    assert "use_grn=True" in table["convnextv2_tiny"][1]  # ConvNeXt-V2: named, not built


def test_swin_presets_are_timms_architectures() -> None:
    """The hand-written Swin presets are what timm's entrypoints pass their builder."""
    table = timm_swin_args()
    presets = list_models("swin_*")
    assert len(presets) == 6
    for name in presets:
        args, unsupported = table[name]
        assert not unsupported, name
        config = get_model_config(name)
        assert {k: getattr(config, k) for k in args} == args, name


def test_timm_kwargs_override_a_preset_as_timm_create_model_does() -> None:
    vit = timm_model_config("vit_base_patch16_siglip_224", {"depth": 2, "act_layer": "gelu_tanh"})
    assert (vit.depth, vit.act, vit.global_pool, vit.class_token) == (2, "gelu_tanh", "map", False)
    eva = timm_model_config("eva02_base_patch16_clip_224", {"depth": 2})
    assert (eva.depth, eva.act, eva.mlp_gate_last, eva.rope) == (2, "swiglu", True, True)
    # swiglu_mlp / scale_mlp choose the MLP together: one given, the other is the preset's
    packed = timm_model_config("eva02_base_patch16_clip_224", {"scale_mlp": False})
    assert (packed.act, packed.mlp_gate_last, packed.mlp_inner_norm) == ("swiglu", False, False)
    plain = timm_model_config("eva02_base_patch16_clip_224", {"swiglu_mlp": False})
    assert (plain.act, plain.mlp_inner_norm) == ("gelu", True)
    cx = timm_model_config(
        "convnext_tiny", {"kernel_sizes": 5, "norm_eps": None, "drop_path_rate": 0.1}
    )
    assert (cx.kernel_size, cx.norm_eps, cx.drop_path_rate) == (5, 1e-6, 0.1)
    assert timm_model_config("convnext_tiny", {}, num_classes=3).num_classes == 3


@pytest.mark.parametrize(
    ("name", "kwargs", "match"),
    [
        ("vit_base_patch16_siglip_224", {"qk_norm": True}, "qk_norm=True"),
        ("eva02_base_patch16_clip_224", {"qk_norm": True}, "qk_norm=True"),
        ("vitamin_small_224", {"patch_size": 8}, "patch_size=8"),
        (
            "convnext_tiny",
            {"use_grn": True, "stem_type": "overlap"},
            "use_grn=True, stem_type='overlap'",
        ),
        ("convnext_tiny", {"kernel_sizes": [7, 5, 5, 5]}, r"kernel_sizes=\[7, 5, 5, 5\]"),
        ("swin_tiny_patch4_window7_224", {"always_partition": True}, "always_partition=True"),
        ("resnet50", {"layers": [1, 1, 1, 1]}, "not translated"),
        ("beit3_base_patch16_224", {}, "not built by attn_vision.*scale_attn_norm=True"),
    ],
)
def test_what_we_cannot_build_is_named(name, kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        timm_model_config(name, kwargs)


def test_the_convnext_translator_keeps_timm_defaults_quiet() -> None:
    args, unsupported = convnext_args(
        {"use_grn": False, "stem_type": "patch", "head_init_scale": 2.0}
    )
    assert (args, unsupported) == ({}, [])


INVERSE_CASES = [
    ("vit_base_patch16_siglip_224", dict(depth=2, act="gelu", embed_dim=384, num_heads=6)),
    ("deit_small_distilled_patch16_224", dict(depth=1, init_values=1e-5, qkv_bias=False)),
    ("eva02_base_patch16_clip_224", dict(depth=1, rope=False, act="gelu", mlp_inner_norm=False)),
    ("eva02_base_patch16_clip_224", dict(depth=1, mlp_inner_norm=False, mlp_gate_last=False)),
    ("eva02_base_patch16_clip_224", dict(depth=1, post_norm=True)),
    ("eva02_enormous_patch14_clip_224", dict(depth=1, post_norm=False, embed_dim=224)),
    (
        "vit_pe_core_tiny_patch16_384",
        dict(
            depth=1,
            rope_grid_indexing="ij",
            pre_norm=False,
            rope_grid_offset=0.0,
            attn_pool_num_heads=3,
        ),
    ),
    ("vit_pe_core_tiny_patch16_384", dict(depth=1, global_pool="avg", pool_include_prefix=False)),
    ("vitamin_small_224", dict(depth=1, stem_width=32, conv_depths=(1, 1))),
    ("convnext_tiny", dict(depths=(1, 1, 2, 1), kernel_size=5, conv_mlp=True)),
    ("swin_base_patch4_window7_224", dict(depths=(1, 1, 2, 1), window_size=8, mlp_ratio=2.0)),
]


@pytest.mark.parametrize(("name", "changes"), INVERSE_CASES)
def test_timm_kwargs_is_the_translators_inverse_and_timm_builds_the_same(name, changes) -> None:
    """``timm_kwargs`` of a changed preset: translated back it gives the same config, and
    ``timm.create_model(name, **kwargs)`` (meta device) has our model's tensors."""
    spec = get_model_spec(name)
    base = get_model_config(name)
    want = dataclasses.replace(base, **changes)
    kwargs = timm_kwargs(spec.timm_module, want, base)
    assert timm_model_config(name, kwargs) == want
    args, unsupported = TIMM_TRANSLATORS[spec.timm_module](kwargs, base)
    assert not unsupported and dataclasses.replace(base, **args) == want
    timm_vit = spec.timm_module in ("vision_transformer", "deit")
    if "embed_cfg" in kwargs:  # (a dict here, as JSON has it; timm takes its VitCfg)
        kwargs["embed_cfg"] = VitCfg(**kwargs["embed_cfg"])
    with torch.device("meta"):
        ref = timm.create_model(name, **kwargs, **({"weight_init": "skip"} if timm_vit else {}))
        ours = create_model(name, **changes)
    expected = ref.state_dict()
    if not timm_vit:
        expected = FAMILIES[spec.family][2](expected, ours.config)
    shapes = {k: tuple(v.shape) for k, v in ours.state_dict().items()}
    assert shapes == {k: tuple(v.shape) for k, v in expected.items()}


def test_timm_kwargs_names_what_timm_cannot_say() -> None:
    base = get_model_config("vit_base_patch16_siglip_224")
    with pytest.raises(ValueError, match="norm_eps: no timm keyword argument"):
        timm_kwargs("vision_transformer", dataclasses.replace(base, norm_eps=1e-5), base)
    dino = get_model_config("vit_small_patch14_reg4_dinov2")
    with pytest.raises(ValueError, match="init_values: timm.create_model cannot set None"):
        timm_kwargs("vision_transformer", dataclasses.replace(dino, init_values=None), dino)
