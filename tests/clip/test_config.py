"""Configs: open_clip / transformers configs read exactly; unsupported features refused."""

from __future__ import annotations

import math

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
    ("name", "offending"),
    [
        ("RN50", "ResNet"),
        ("coca_ViT-B-32", "multimodal_cfg"),
        ("ViT-B-16-SigLIP", "timm_model_name"),
        ("EVA02-B-16", "timm_model_name"),
        ("roberta-ViT-B-32", "hf_model_name"),
    ],
)
def test_unsupported_open_clip_features_are_named(name, offending):
    with pytest.raises(ValueError, match=offending):
        CLIPConfig.from_open_clip(open_clip.get_model_config(name))


def test_attentional_pool_and_custom_blocks_are_refused():
    base = open_clip.get_model_config("ViT-B-32")
    base["vision_cfg"].update(attentional_pool=True, qk_norm=True)
    with pytest.raises(ValueError, match=r"vision_cfg\.attentional_pool, vision_cfg\.qk_norm"):
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
    with pytest.raises(ValueError, match="model_type"):
        CLIPConfig.from_hf({"model_type": "siglip"})


def test_invalid_values():
    with pytest.raises(ValueError, match="pool_type"):
        CLIPVisionConfig(pool_type="max")
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
