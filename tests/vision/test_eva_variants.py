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


# Perception Encoder (PE-Core): 2D RoPE on a 1-offset grid with column-first bands, a MAP
# head of 8 heads over every token ([CLS] included), norm_pre, LayerNorm eps 1e-5. The
# grids are not square, so a swapped row / column could not hide.
PE_CASES = [
    # (name, timm overrides): the tiny one's widths; the gigantic one (no [CLS], offset 0)
    # narrowed to 4 heads of 64
    ("vit_pe_core_tiny_patch16_384", dict(depth=2, img_size=(256, 384))),
    ("vit_pe_core_gigantic_patch14_448", dict(depth=1, embed_dim=256, num_heads=4,
                                              img_size=(112, 140))),
]  # fmt: skip


@pytest.mark.parametrize(("name", "overrides"), PE_CASES)
def test_perception_encoder_matches_timm(name, overrides, timm_checkpoint, assert_parity):
    ref, path = timm_checkpoint(name, num_classes=5, **overrides)
    assert type(ref.blocks[0].attn).__name__ == "AttentionRope"
    ours = create_model(name, pretrained=path, num_classes=5, **overrides)
    c = ours.config
    assert (c.rope_grid_indexing, c.pool_include_prefix, c.attn_pool_num_heads) == ("xy", True, 8)
    assert ours.attn_pool.num_heads == 8 != c.num_heads
    assert_parity(ref, ours, torch.randn(2, 3, *overrides["img_size"]))


def test_xy_rope_is_the_transposed_ij_table():
    """Column-first bands for a (3, 5) grid = the row-first bands of the (5, 3) grid, read
    in the other order (and the reference grid swapped with it)."""
    from attn_core import AxialRotaryEmbedding
    from attn_vision.vit import XYAxialRotaryEmbedding

    xy = XYAxialRotaryEmbedding(16, ref_grid=(4, 6), grid_offset=1.0)
    ij = AxialRotaryEmbedding(16, ref_grid=(6, 4), grid_offset=1.0)
    cos, sin = xy.cos_sin((3, 5))
    ij_cos, ij_sin = (t.view(5, 3, 16).transpose(0, 1).reshape(15, 16) for t in ij.cos_sin((5, 3)))
    torch.testing.assert_close((cos, sin), (ij_cos, ij_sin))
    assert not torch.allclose(cos, ij.cos_sin((3, 5))[0][:15])
    with pytest.raises(ValueError, match="rope_grid_indexing must be one of"):
        get_model_config("vit_pe_core_tiny_patch16_384", rope_grid_indexing="yx")
