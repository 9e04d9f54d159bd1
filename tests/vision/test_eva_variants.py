"""timm ``Eva`` variants beyond EVA02 through the ViT: timm parity.

EVA02-E (``eva02_enormous_patch14_clip_224``): residual post-norm blocks
(``x + norm(branch(x))``, no layer scale). Depth shrunk to 2 blocks and the width to 2
heads of the real 112 channels; timm's image size.
"""

from __future__ import annotations

import pytest
import torch
from attn_vision import create_model, get_model_config
from attn_vision.registry import timm_model_config
from attn_vision.vit import ResPostNormBlock

ENORMOUS = "eva02_enormous_patch14_clip_224"
SHRUNK = dict(depth=2, embed_dim=224, num_heads=2, num_classes=5)


def test_post_norm_eva_matches_timm(timm_checkpoint, assert_parity):
    ref, path = timm_checkpoint(ENORMOUS, **SHRUNK)
    assert type(ref.blocks[0]).__name__ == "EvaBlockPostNorm"
    ours = create_model(ENORMOUS, pretrained=path, **SHRUNK)
    assert isinstance(ours.blocks[0], ResPostNormBlock)
    assert ours.config.global_pool == "token" and ours.config.init_values is None
    x = torch.randn(2, 3, 224, 224)
    assert_parity(ref, ours, x)  # (in eval without autograd: the fast path's fallback)
    ours.train()  # the plain forward, with autograd
    torch.testing.assert_close(ours(x), ref(x), atol=1e-4, rtol=1e-4)


def test_post_norm_config():
    c = get_model_config(ENORMOUS)
    assert (c.post_norm, c.embed_dim, c.depth, c.num_heads, c.global_pool) == (
        True, 1792, 64, 16, "token",
    )  # fmt: skip
    assert int(c.embed_dim * c.mlp_ratio) == 15360
    with pytest.raises(ValueError, match="post_norm=True blocks have no layer scale"):
        get_model_config(ENORMOUS, init_values=1e-5)
    # timm ignores init_values for its post-norm blocks: so does its translation
    assert timm_model_config(ENORMOUS, {"init_values": 1e-5}).init_values is None
    assert timm_model_config(ENORMOUS, {"use_post_norm": False, "init_values": 0.1}).init_values
