"""ViTamin (timm ``vitamin_*``): random-init timm models saved as safetensors, loaded through
``create_model(pretrained=path)``, fp32 features / head / logits equal at 1e-4; open_clip's
checkpoint layout (what timm's Hub tags hold) read as timm reads it; the presets against
timm's entrypoints. Every preset's tensor names and shapes at full depth are checked on the
meta device in test_vit_zoo.py."""

from __future__ import annotations

import pytest
import torch
from attn_vision import Vitamin, VitaminConfig, create_model, get_model_config, save_pretrained
from attn_vision.convert import convert_timm_vitamin
from attn_vision.patch_embed import to_2tuple
from attn_vision.timm_table import timm_vitamin_args
from timm.models.vision_transformer import checkpoint_filter_fn

TOL = {"atol": 1e-4, "rtol": 1e-4}


@pytest.mark.parametrize(
    ("name", "overrides", "size"),
    [
        ("vitamin_small_224", dict(depth=2), 224),  # learned position embedding
        # no position embedding: any image size (here 64 px on a 384 px model)
        ("vitamin_xlarge_384", dict(depth=1, num_classes=10), 64),
    ],
)
def test_timm_checkpoint_parity(name, overrides, size, timm_checkpoint, assert_parity):
    ref, path = timm_checkpoint(name, **overrides)
    ours = create_model(name, pretrained=path, **overrides)
    assert isinstance(ours, Vitamin) and (ours.pos_embed is None) == ("xlarge" in name)
    assert_parity(ref, ours, torch.randn(2, 3, size, size))


def test_open_clip_layout_is_read_as_timm_reads_it(timm_checkpoint):
    """timm's Hub tags hold open_clip CLIP checkpoints: the image trunk under
    ``visual.trunk.``, the projection ``visual.head.proj`` (timm's head, zero bias)."""
    ref, _ = timm_checkpoint("vitamin_small_224", depth=1, num_classes=384)
    sd = {f"visual.trunk.{k}": v for k, v in ref.state_dict().items() if not k.startswith("head.")}
    sd["visual.head.proj.weight"] = ref.head.weight.detach().clone()
    sd["text.token_embedding.weight"] = torch.zeros(8, 4)  # the text tower: left out
    config = get_model_config("vitamin_small_224.datacomp1b_clip", depth=1)
    assert config.num_classes == 384  # the tag's: ViTamin-S's embedding width
    ours = convert_timm_vitamin(sd, config)
    timm_sd = checkpoint_filter_fn(sd, ref)
    assert ours.keys() == timm_sd.keys()
    assert all(torch.equal(ours[k], timm_sd[k]) for k in ours)
    assert not ours["head.bias"].any()


def test_save_pretrained_round_trips(tmp_path):
    model = create_model("vitamin_base_224", depth=1, img_size=64)
    save_pretrained(model, tmp_path)
    back = create_model(tmp_path)
    assert type(back) is Vitamin and back.config == model.config
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        assert torch.equal(back(x), model(x))


def test_presets_are_timms_architectures():
    table = timm_vitamin_args()
    assert len(table) == 13
    for name, (args, unsupported) in table.items():
        assert not unsupported, name
        config = get_model_config(name)
        args["img_size"] = to_2tuple(args.get("img_size", 224))
        assert {k: getattr(config, k) for k in args} == args, name


def test_config_refuses_what_vitamin_does_not_use():
    with pytest.raises(ValueError, match="stride 16"):
        VitaminConfig(patch_size=14)
    with pytest.raises(ValueError, match="pos_embed"):
        VitaminConfig(pos_embed="rope")
    with pytest.raises(ValueError, match="GeGLU"):
        VitaminConfig(act="swiglu")
    with pytest.raises(ValueError, match="patch_bias"):
        VitaminConfig(patch_bias=True)
