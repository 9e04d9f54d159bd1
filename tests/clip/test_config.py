"""Configs: open_clip / transformers configs read exactly; unsupported features refused."""

from __future__ import annotations

import math
from dataclasses import replace

import open_clip
import pytest
from attn_clip import CLIPConfig, CLIPTextConfig, CLIPVisionConfig, list_models


def test_every_listed_open_clip_config_round_trips():
    for name in [n for n in list_models() if n in open_clip.list_models()]:
        cfg = CLIPConfig.from_open_clip(open_clip.get_model_config(name))
        assert CLIPConfig.from_open_clip(cfg.to_open_clip()) == cfg
        assert CLIPConfig.from_dict(cfg.to_dict()) == cfg


def test_fields_from_open_clip():
    cfg = CLIPConfig.from_open_clip(open_clip.get_model_config("ViT-H-14-quickgelu"))
    assert cfg.quick_gelu and cfg.embed_dim == 1024
    v, t = cfg.vision, cfg.text
    assert (v.width, v.layers, v.heads, v.patch_size) == (1280, 32, 16, 14)
    assert (t.width, t.heads, t.layers, t.pool_type) == (1024, 16, 24, "argmax")
    assert cfg.init_logit_scale == pytest.approx(math.log(1 / 0.07))
    clipa = CLIPConfig.from_open_clip(open_clip.get_model_config("ViT-L-14-CLIPA"))
    assert clipa.vision.no_ln_pre and clipa.vision.pool_type == "avg" and not clipa.text.causal
    assert clipa.text.hf_tokenizer_name == "bert-base-uncased"


@pytest.mark.parametrize(
    ("name", "tower", "change", "offending"),
    [  # (every open_clip config is built: features open_clip has that none of them uses)
        ("coca_roberta-ViT-B-32", "multimodal_cfg", {"mlp_ratio": 2}, "multimodal_cfg.mlp_ratio"),
        ("coca_roberta-ViT-B-32", "text_cfg", {"layers": 2}, r"text_cfg\.layers \(a Hugging"),
    ],
)
def test_unsupported_open_clip_features_are_named(name, tower, change, offending):
    cfg = open_clip.get_model_config(name)
    cfg[tower].update(change)
    with pytest.raises(ValueError, match=offending):
        CLIPConfig.from_open_clip(cfg)


def test_attentional_pool_and_custom_blocks_are_refused():
    base = open_clip.get_model_config("ViT-B-32")
    base["vision_cfg"].update(attentional_pool="parallel", qk_norm=True)
    with pytest.raises(ValueError, match=r"vision_cfg\.qk_norm.*attentional_pool='parallel'"):
        CLIPConfig.from_open_clip(base)


def test_from_hf_dict():
    hf = {
        "model_type": "clip",
        "projection_dim": 512,
        "logit_scale_init_value": 2.6592,
        "text_config": {"hidden_size": 512, "intermediate_size": 2048, "num_attention_heads": 8,
                        "num_hidden_layers": 12, "max_position_embeddings": 77,
                        "eos_token_id": 49407, "hidden_act": "quick_gelu"},
        "vision_config": {"hidden_size": 768, "intermediate_size": 3072, "num_attention_heads": 12,
                          "num_hidden_layers": 12, "image_size": 224, "patch_size": 32,
                          "hidden_act": "quick_gelu"},
    }  # fmt: skip
    cfg = CLIPConfig.from_hf(hf)
    assert cfg.vision.head_width == 64 and cfg.vision.mlp_ratio == 4.0
    assert cfg.text.pool_type == "eos" and cfg.text.eos_id == 49407 and cfg.quick_gelu
    hf["text_config"]["hidden_act"] = "gelu_new"
    with pytest.raises(ValueError, match="gelu_new"):
        CLIPConfig.from_hf(hf)
    with pytest.raises(ValueError, match="model_type.*'clip', 'siglip' or 'siglip2'.*'flava'"):
        CLIPConfig.from_hf({"model_type": "flava"})


def test_siglip_towers_from_open_clip():
    """A timm tower is built from timm's arguments for its name (the shipped table)."""
    cfg = CLIPConfig.from_open_clip(open_clip.get_model_config("ViT-SO400M-16-SigLIP2-384"))
    v, t = cfg.vision, cfg.text
    assert v.timm_model_name == "vit_so400m_patch16_siglip_384"
    assert (v.width, v.layers, v.heads, v.patch_size, v.image_size) == (1152, 27, 16, 16, 384)
    assert (v.pool_type, v.class_token, v.patch_bias, v.no_ln_pre, v.proj_type) == (
        "map",
        False,
        True,
        True,
        "none",
    )
    assert v.act == "gelu_tanh" and v.norm_eps == 1e-6 and v.mlp_ratio == 3.7362
    assert (t.pool_type, t.causal, t.proj_bias, t.act, t.norm_eps) == (
        "last",
        False,
        True,
        "gelu_tanh",
        1e-6,
    )  # SigLIP2 text: act_kwargs approximate="tanh"
    assert cfg.init_logit_bias == -10 and not cfg.quick_gelu
    siglip1 = CLIPConfig.from_open_clip(open_clip.get_model_config("ViT-B-16-SigLIP"))
    assert siglip1.vision.act == "gelu" and siglip1.text.act == "gelu"
    assert siglip1.text.hf_tokenizer_name == "timm/ViT-B-16-SigLIP"
    assert siglip1.text.tokenizer_kwargs == {"clean": "canonicalize"}
    # the quick_gelu flag leaves a timm tower's activation alone, as in open_clip
    assert siglip1.with_act(True).vision.act == "gelu"


def test_timm_tower_with_other_arguments_round_trips():
    cfg = CLIPConfig.from_open_clip(open_clip.get_model_config("ViT-B-16-SigLIP"))
    assert "timm_model_args" not in cfg.to_open_clip()["vision_cfg"]  # exactly its timm name's
    small = replace(cfg, vision=replace(cfg.vision, layers=2))
    vision_cfg = small.to_open_clip()["vision_cfg"]
    assert vision_cfg["timm_model_args"] == {"depth": 2}  # timm.create_model(name, depth=2)
    assert CLIPConfig.from_open_clip(small.to_open_clip()) == small
    with pytest.raises(TypeError, match="timm_model_args"):  # open_clip refuses it, loudly
        open_clip.model.CLIPVisionCfg(**vision_cfg)
    # folders written before listed timm's arguments in full: they read the same
    full = dict(img_size=[224, 224], patch_size=16, embed_dim=768, depth=2, num_heads=12,
                mlp_ratio=4.0, class_token=False, pre_norm=False, init_values=None,
                act_layer="gelu")  # fmt: skip
    old = small.to_open_clip()
    old["vision_cfg"]["timm_model_args"] = full
    assert CLIPConfig.from_open_clip(old) == small


def test_timm_tower_refusals_are_named():
    base = open_clip.get_model_config("ViT-B-16-SigLIP")
    for key, value, match in [
        ("timm_proj", "mlp", "timm_proj='mlp'"),
        ("timm_pool", "", "timm_pool=''"),
        ("timm_model_name", "convnext_base", "ConvNeXt 'convnext_base'.*timm_proj='none'"),
        ("timm_model_name", "resnet50d", "resnet50d.*resnet preset, not a ViT, Eva, ViTamin"),
        ("timm_model_args", {"depth": 2, "reg_tokens": 4}, "reg_tokens=4"),
        ("image_size", 256, "img_size=.224, 224. .vision_cfg.image_size is 256"),
        ("qk_layernorm", True, r"vision_cfg\.qk_layernorm"),
    ]:
        cfg = {**base, "vision_cfg": {**base["vision_cfg"], key: value}}
        with pytest.raises(ValueError, match=match):
            CLIPConfig.from_open_clip(cfg)


def test_from_hf_siglip_dicts():
    tc = {
        "hidden_size": 64,
        "intermediate_size": 256,
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "max_position_embeddings": 16,
        "vocab_size": 300,
    }
    vc = {"hidden_size": 64, "intermediate_size": 256, "num_attention_heads": 4,
          "num_hidden_layers": 2, "image_size": 32, "patch_size": 8}  # fmt: skip
    cfg = CLIPConfig.from_hf({"model_type": "siglip", "text_config": tc, "vision_config": vc})
    v, t = cfg.vision, cfg.text
    assert (v.pool_type, v.class_token, v.patch_bias, v.proj_type, v.act) == (
        "map",
        False,
        True,
        "none",
        "gelu_tanh",
    )
    assert (t.pool_type, t.causal, t.proj_bias, t.context_length, t.act) == (
        "last",
        False,
        True,
        16,
        "gelu_tanh",
    )
    assert cfg.embed_dim == 64 and v.image_size == 32 and cfg.init_logit_bias == -10
    assert CLIPConfig.from_open_clip(cfg.to_open_clip()) == cfg  # save_pretrained's config
    # SigLIP2 (NaFlex): built for the square grid of its num_patches position embeddings
    vc2 = {**{k: x for k, x in vc.items() if k != "image_size"}, "num_patches": 64}
    cfg2 = CLIPConfig.from_hf({"model_type": "siglip2", "text_config": tc, "vision_config": vc2})
    assert cfg2.vision.image_size == 64
    for bad_vc, match in [
        ({**vc2, "num_patches": 60}, "num_patches .60. is not a square"),
        ({**vc2, "vision_use_head": False}, "vision_use_head"),
        ({**vc2, "hidden_act": "relu"}, "hidden_act='relu'"),
        ({**vc2, "hidden_size": 96}, "projection_size .64. must equal the vision hidden_size"),
    ]:
        with pytest.raises(ValueError, match=match):
            CLIPConfig.from_hf(
                {"model_type": "siglip2", "text_config": tc, "vision_config": bad_vc}
            )


def test_invalid_values():
    with pytest.raises(ValueError, match="pool_type"):
        CLIPVisionConfig(pool_type="max")
    with pytest.raises(ValueError, match="pool_type='tok' needs class_token"):
        CLIPVisionConfig(class_token=False)
    with pytest.raises(ValueError, match="vision proj_type"):
        CLIPVisionConfig(proj_type="conv")
    with pytest.raises(ValueError, match="vision proj_type='none' needs vision width"):
        CLIPConfig(embed_dim=256, vision=CLIPVisionConfig(proj_type="none"))
    with pytest.raises(ValueError, match="head_width"):
        CLIPVisionConfig(width=100, head_width=64)
    with pytest.raises(ValueError, match="divisible"):
        CLIPTextConfig(width=100, heads=8)
    with pytest.raises(ValueError, match="act"):
        CLIPTextConfig(act="relu")
    with pytest.raises(ValueError, match="embed_dim"):
        CLIPConfig(embed_dim=256, text=CLIPTextConfig(proj_type="none"))


def test_from_dict_refuses_unknown_keys_by_name():
    d = CLIPConfig().to_dict()
    assert CLIPConfig.from_dict(d) == CLIPConfig()
    with pytest.raises(ValueError, match=r"unknown CLIPConfig key\(s\): extra, vision.patchsize"):
        CLIPConfig.from_dict({**d, "extra": 1, "vision": {**d["vision"], "patchsize": 8}})


def test_convnext_towers_from_open_clip():
    """open_clip's ConvNeXt configs: timm's ConvNeXt arguments for the name (the shipped
    table), the projection head from timm_proj / timm_proj_bias."""
    base = CLIPConfig.from_open_clip(open_clip.get_model_config("convnext_base_w"))
    v = base.vision
    assert (v.tower, v.timm_model_name, v.image_size, v.width) == (
        "convnext", "convnext_base", 256, 1024
    )  # fmt: skip
    assert v.convnext["depths"] == (3, 3, 27, 3) and v.convnext["dims"][-1] == 1024
    assert (v.proj_type, v.proj_bias, base.embed_dim) == ("linear", False, 640)
    large_d = CLIPConfig.from_open_clip(open_clip.get_model_config("convnext_large_d_320"))
    assert large_d.vision.proj_type == "mlp" and large_d.vision.image_size == 320
    xxl = CLIPConfig.from_open_clip(open_clip.get_model_config("convnext_xxlarge"))
    assert xxl.vision.convnext["norm_eps"] == 1e-5  # timm's convnext_xxlarge
    assert base.vision.convnext["norm_eps"] == 1e-6
    # the quick_gelu flag leaves the ConvNeXt alone, as in open_clip
    assert base.with_act(True).vision == base.vision


def test_convnext_tower_refusals_and_timm_model_args():
    base = open_clip.get_model_config("convnext_base")
    for key, value, match in [
        ("timm_proj", "none", "timm_proj='none'"),
        ("timm_pool", "max", "timm_pool='max'"),
        ("timm_model_args", {"depths": [1, 1, 1, 1], "use_grn": True}, "use_grn=True"),
        ("timm_model_args", {"kernel_sizes": [7, 5, 5, 5]}, r"kernel_sizes=\[7, 5, 5, 5\]"),
        ("timm_model_args", {"stem_type": "overlap"}, "stem_type='overlap'"),
    ]:
        cfg = {**base, "vision_cfg": {**base["vision_cfg"], key: value}}
        with pytest.raises(ValueError, match=match):
            CLIPConfig.from_open_clip(cfg)
    cfg = CLIPConfig.from_open_clip(base)
    assert "timm_model_args" not in cfg.to_open_clip()["vision_cfg"]
    small = replace(cfg, vision=replace(cfg.vision, convnext={**cfg.vision.convnext,
                                                              "depths": (1, 1, 2, 1)}))  # fmt: skip
    vision_cfg = small.to_open_clip()["vision_cfg"]
    assert vision_cfg["timm_model_args"]["depths"] == [1, 1, 2, 1]
    assert vision_cfg["timm_proj"] == "linear" and vision_cfg["timm_proj_bias"] is False
    assert CLIPConfig.from_open_clip(small.to_open_clip()) == small
    with pytest.raises(ValueError, match="unknown ConvNeXt field.*depth"):
        CLIPVisionConfig(convnext={"depth": 2})
    with pytest.raises(ValueError, match="ConvNeXt towers only"):
        CLIPVisionConfig(proj_type="mlp")


def test_resnet_towers_from_open_clip():
    """OpenAI's ModifiedResNet: vision_cfg.layers a list; heads = width * 32 // head_width."""
    rn50 = CLIPConfig.from_open_clip(open_clip.get_model_config("RN50"))
    v = rn50.vision
    assert (v.tower, v.layers, v.width, v.heads, v.image_size) == ("resnet", (3, 4, 6, 3), 64,
                                                                   32, 224)  # fmt: skip
    assert rn50.embed_dim == 1024 and not rn50.quick_gelu
    x64 = CLIPConfig.from_open_clip(open_clip.get_model_config("RN50x64-quickgelu"))
    assert x64.quick_gelu and x64.vision.heads == 64 and x64.vision.image_size == 448
    assert rn50.with_act(True).quick_gelu
    assert rn50.to_open_clip()["vision_cfg"] == {
        "image_size": 224, "layers": [3, 4, 6, 3], "width": 64, "head_width": 64,
        "patch_size": None,
    }  # fmt: skip
    base = open_clip.get_model_config("RN50")
    bad = {**base, "vision_cfg": {**base["vision_cfg"], "ls_init_value": 0.1}}
    with pytest.raises(ValueError, match=r"vision_cfg\.ls_init_value \(ResNet tower\)"):
        CLIPConfig.from_open_clip(bad)
    with pytest.raises(ValueError, match="square"):
        CLIPVisionConfig(layers=(1, 1, 1, 1), image_size=(224, 256))
