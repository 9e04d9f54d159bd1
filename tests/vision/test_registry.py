"""create_model / list_models / save_pretrained: names, tags, timm-style defaults, overrides,
saved folders, errors; the shipped table of timm's pretrained cfgs; light imports."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import timm
import torch
from attn_core.hub import CheckpointError, WeightsUnavailableError
from attn_vision import (
    ResNet,
    SwinTransformer,
    VisionTransformer,
    ViTConfig,
    create_model,
    get_model_config,
    get_pretrained_cfg,
    list_models,
    save_pretrained,
)
from attn_vision.pretrained import TABLE_PATH
from attn_vision.timm_table import format_table, timm_pretrained_table
from timm.models import get_pretrained_cfg as timm_get_pretrained_cfg

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
    assert list_models(None) == list_models("*") == names


def test_pretrained_listing_uses_timm_tags() -> None:
    tagged = list_models("vit_base_patch16_224*", pretrained=True)
    assert "vit_base_patch16_224.augreg2_in21k_ft_in1k" in tagged
    assert all(n.startswith("vit_base_patch16_224") and "." in n for n in tagged)
    assert list_models("resnet18_eca", pretrained=True) == []  # no published weights
    assert list_models("swin_tiny*", pretrained=True) == sorted(
        timm.list_pretrained("swin_tiny_patch4_window7_224.*")
    )
    everything = list_models(pretrained=True)
    assert (
        "resnet18.tv_in1k" in everything and "vit_base_patch16_gap_224.untrained" not in everything
    )


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
    dino = get_model_config("vit_small_patch14_reg4_dinov2")  # fixed size from the tag, as timm
    assert (dino.img_size, dino.patch_size, dino.reg_tokens, dino.num_classes) == (
        (518, 518),
        14,
        4,
        0,
    )
    assert dino.no_embed_class and dino.init_values == 1e-5
    siglip = get_model_config("vit_base_patch16_siglip_224")
    assert (siglip.global_pool, siglip.class_token) == ("map", False)
    assert get_model_config("deit_small_distilled_patch16_224").dist_token
    medium = get_model_config("vit_medium_patch16_gap_256")
    assert (medium.qkv_bias, medium.proj_bias) == (False, True)
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
    with pytest.raises(ValueError, match="'vit_giant_patch14_dinov2' is not built.*mlp_layer"):
        create_model("vit_giant_patch14_dinov2")  # timm has it: what we lack is named


def test_models_are_returned_in_eval_mode() -> None:
    assert not create_model("resnet18_se", num_classes=3).training
    assert not create_model("vit_tiny_patch16_224", depth=1).training


# -- the shipped copy of timm's pretrained cfgs --------------------------------------------


def test_shipped_timm_table_is_up_to_date() -> None:
    """Drift check: regenerate with `python -m attn_vision.timm_table --write-table`."""
    shipped = json.loads(TABLE_PATH.read_text(encoding="utf-8"))
    assert shipped == timm_pretrained_table(), (
        f"{TABLE_PATH.name} differs from timm {timm.__version__}'s pretrained cfgs; run "
        "`python -m attn_vision.timm_table --write-table`"
    )
    assert TABLE_PATH.read_text(encoding="utf-8") == format_table(shipped)


@pytest.mark.parametrize(
    "name",
    [
        "vit_base_patch16_224",  # a bare arch: timm's default tag
        "vit_base_patch16_224.augreg_in21k",
        "vit_base_patch32_clip_224.openai",
        "swin_base_patch4_window12_384.ms_in22k",
        "resnet18.tv_in1k",
        "vit_base_patch16_gap_224",  # timm's default tag has no weights
        "deit_small_distilled_patch16_224.fb_in1k",
        "vit_small_patch14_reg4_dinov2",
        "vit_base_patch16_siglip_224.v2_webli",
    ],
)
def test_pretrained_cfg_equals_timms(name) -> None:
    ours = get_pretrained_cfg(name)
    timm_cfg = timm_get_pretrained_cfg(name).to_dict()
    assert ours == {k: timm_cfg[k] for k in ours}
    assert (ours["architecture"], ours["tag"]) == (timm_cfg["architecture"], timm_cfg["tag"])


def test_no_heavy_imports(tmp_path) -> None:
    """Building, saving and loading a model never imports timm, torchvision & co."""
    code = """
import pathlib, sys
import attn_vision
from attn_vision.patch_embed import to_2tuple
name = "vit_tiny_patch16_224.augreg_in21k"
m = attn_vision.create_model(name, depth=1)
d = attn_vision.save_pretrained(m, pathlib.Path(sys.argv[1]))
attn_vision.create_model(d)
attn_vision.create_model(name, pretrained=d / "model.safetensors", depth=1)
attn_vision.list_models(pretrained=True)
attn_vision.create_transform(m)
heavy = {"timm", "open_clip", "transformers", "torchvision", "huggingface_hub"}
print(sorted({k.split(".")[0] for k in sys.modules} & heavy))
"""
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "tiny")], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


# -- save_pretrained / create_model(folder) --------------------------------------------------


@pytest.mark.parametrize(
    ("name", "overrides", "shape"),
    [
        ("vit_tiny_patch16_224.augreg_in21k", dict(depth=2, img_size=(96, 128)), (2, 3, 96, 128)),
        (
            "swin_tiny_patch4_window7_224",
            dict(depths=(1, 1, 2, 1), num_classes=5),
            (2, 3, 224, 224),
        ),
        ("resnet18_cbam", dict(num_classes=7, layers=(1, 1, 1, 1)), (2, 3, 64, 64)),
        ("resnet34.tv_in1k", dict(layers=(1, 1, 1, 1)), (2, 3, 64, 64)),
        ("deit_tiny_distilled_patch16_224", dict(depth=1), (2, 3, 224, 224)),
        ("vit_small_patch14_reg4_dinov2", dict(depth=1, img_size=56), (2, 3, 56, 56)),
        ("vit_base_patch16_siglip_224", dict(depth=1, img_size=64), (2, 3, 64, 64)),
    ],
)
def test_save_pretrained_round_trip(name, overrides, shape, tmp_path, randomize) -> None:
    model = randomize(create_model(name, **overrides), reinit=False)
    folder = save_pretrained(model, tmp_path / "saved")
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors"]
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["architecture"] == name.partition(".")[0]
    assert cfg["family"] in ("vit", "swin", "resnet")
    loaded = create_model(folder)
    assert not loaded.training and type(loaded) is type(model)
    assert loaded.config == model.config
    assert loaded.pretrained_cfg == model.pretrained_cfg
    x = torch.randn(shape)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), model(x), atol=0, rtol=0)
    # pretrained=False: the folder's architecture, random weights
    fresh = create_model(str(folder), pretrained=False)
    assert fresh.config == model.config and not fresh.training


def test_saved_folder_takes_overrides(tmp_path, randomize) -> None:
    model = randomize(create_model("vit_tiny_patch16_224", depth=1), reinit=False)
    folder = save_pretrained(model, tmp_path / "vit")
    bigger = create_model(folder, img_size=288)  # position embedding resampled, as for timm files
    assert bigger.pos_embed.shape == (1, 1 + 18 * 18, 192)
    assert bigger.pretrained_cfg["input_size"] == (3, 288, 288)
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['depht'\]"):
        create_model(folder, depht=2)
    with pytest.raises(ValueError, match="brings its own weights"):
        create_model(folder, pretrained="augreg_in21k")


def test_saved_config_is_read_strictly(tmp_path) -> None:
    folder = save_pretrained(create_model("resnet18_se", layers=(1, 1, 1, 1)), tmp_path / "r")
    path = folder / "config.json"
    good = json.loads(path.read_text())

    def write(cfg) -> None:
        path.write_text(json.dumps(cfg))

    write({**good, "extra_key": 1})
    with pytest.raises(CheckpointError, match=r"unknown key\(s\) \['extra_key'\]"):
        create_model(folder)
    write({**good, "model_args": {**good["model_args"], "bogus": 3}})
    with pytest.raises(CheckpointError, match=r"model_args: unknown option\(s\) \['bogus'\]"):
        create_model(folder)
    write({k: v for k, v in good.items() if k != "family"})
    with pytest.raises(CheckpointError, match=r"missing key\(s\) \['family'\]"):
        create_model(folder)
    write({**good, "family": "mobilenet"})
    with pytest.raises(CheckpointError, match="unknown family 'mobilenet'"):
        create_model(folder)
    path.write_text("{not json")
    with pytest.raises(CheckpointError, match="cannot read"):
        create_model(folder)
    write(good)
    assert isinstance(create_model(folder), ResNet)


def test_folder_errors(tmp_path) -> None:
    with pytest.raises(WeightsUnavailableError, match="no config.json"):
        create_model(tmp_path)
    with pytest.raises(WeightsUnavailableError, match="no such folder"):
        create_model(tmp_path / "missing")
    with pytest.raises(TypeError, match="attn_vision model"):
        save_pretrained(torch.nn.Linear(2, 2), tmp_path / "x")
