"""attn_train.optim: timm's weight-decay and layer-decay groups on our ViT / Swin."""

from __future__ import annotations

import pytest
from attn_train import param_groups


def test_layer_decay_and_weight_decay_groups():
    import attn_vision

    model = attn_vision.create_model(
        "vit_tiny_patch16_224", num_classes=3, img_size=32, depth=3, embed_dim=32, num_heads=2
    )
    groups = param_groups(model, 0.05, layer_decay=0.5)
    where = {id(p): g for g in groups for p in g["params"]}
    named = dict(model.named_parameters())
    # 3 blocks: embeddings 0.5 ** 4, block i 0.5 ** (3 - i), head 1
    assert where[id(named["pos_embed"])]["lr_scale"] == 0.5**4
    assert where[id(named["blocks.0.attn.qkv.weight"])]["lr_scale"] == 0.5**3
    assert where[id(named["blocks.2.mlp.fc1.weight"])]["lr_scale"] == 0.5
    assert where[id(named["head.weight"])]["lr_scale"] == 1.0
    for name in ("pos_embed", "cls_token", "blocks.1.norm1.weight", "head.bias"):
        assert where[id(named[name])]["weight_decay"] == 0.0, name
    assert where[id(named["blocks.1.attn.proj.weight"])]["weight_decay"] == 0.05
    assert sum(len(g["params"]) for g in groups) == len(named)
    with pytest.raises(ValueError, match="ViT and Swin"):
        param_groups(attn_vision.create_model("resnet18", num_classes=3), 0.05, layer_decay=0.75)


def test_plain_groups_and_no_weight_decay_patterns():
    import attn_vision

    model = attn_vision.create_model(
        "vit_tiny_patch16_224", num_classes=3, img_size=32, depth=1, embed_dim=32, num_heads=2
    )
    model.head.requires_grad_(False)  # frozen parameters are left out
    groups = param_groups(model, 0.1, no_weight_decay=["*cls_token"])
    decay = {n for n, p in model.named_parameters() if any(p is q for q in groups[1]["params"])}
    assert [g["weight_decay"] for g in groups] == [0.0, 0.1]
    assert (
        "pos_embed" in decay and "cls_token" not in decay and "blocks.0.norm1.weight" not in decay
    )
    assert sum(len(g["params"]) for g in groups) == len(list(model.parameters())) - 2


def test_swin_layer_decay():
    import attn_vision

    model = attn_vision.create_model(
        "swin_tiny_patch4_window7_224",
        num_classes=3,
        depths=(1, 1),
        num_heads=(1, 2),
        embed_dim=16,
    )
    groups = param_groups(model, 0.05, layer_decay=0.5)
    where = {id(p): g for g in groups for p in g["params"]}
    named = dict(model.named_parameters())
    # patch embed 0, stage-0 block 1, stage-1 downsample + block 2, head 3
    assert where[id(named["patch_embed.proj.weight"])]["lr_scale"] == 0.5**3
    assert where[id(named["layers.0.blocks.0.attn.qkv.weight"])]["lr_scale"] == 0.5**2
    assert where[id(named["layers.1.blocks.0.attn.qkv.weight"])]["lr_scale"] == 0.5
    assert where[id(named["head.weight"])]["lr_scale"] == 1.0
    table = "layers.0.blocks.0.attn.relative_position_bias_table"
    assert where[id(named[table])]["weight_decay"] == 0.0
