"""EVA02 (2D RoPE, SwiGLU, inner norms) and EVA-01 through the ViT: timm parity.

Depth shrunk to 2 blocks; widths and image sizes are timm's presets' (the 336 px model
checks the RoPE grid scaled onto its 16 x 16 reference).
"""

from __future__ import annotations

import pytest
import torch
from attn_vision import create_model, get_model_config, list_models

CASES = [
    ("eva02_tiny_patch14_224", 224),  # packed GluMlp [gate, x], fused qkv + q/v biases
    ("eva02_small_patch14_336", 336),  # RoPE positions scaled 24 x 24 -> 16 x 16
    ("eva02_base_patch16_clip_224", 224),  # separate q/k/v, SwiGLU fc1_g/x, inner norms
]


@pytest.mark.parametrize("name, size", CASES)
def test_eva02_matches_timm(name, size, timm_checkpoint, assert_parity):
    ref, path = timm_checkpoint(name, depth=2, num_classes=5)
    ours = create_model(name, pretrained=path, depth=2, num_classes=5)
    assert ours.rope is not None
    assert_parity(ref, ours, torch.randn(1, 3, size, size))
    x = torch.ones(1, 3, size, size)
    with torch.no_grad():  # the fast path (eval, no grad) falls back for RoPE blocks
        torch.testing.assert_close(ours(x), ref(x), atol=1e-4, rtol=1e-4)


def test_eva_giant_is_a_plain_vit_and_attention_maps_work(timm_checkpoint, assert_parity):
    ref, path = timm_checkpoint("eva_giant_patch14_224", depth=1, num_classes=3)
    ours = create_model("eva_giant_patch14_224", pretrained=path, depth=1, num_classes=3)
    assert_parity(ref, ours, torch.randn(1, 3, 224, 224))
    eva02 = create_model("eva02_tiny_patch14_224", depth=1, num_classes=3).eval()
    (maps,) = eva02.get_attention_maps(torch.randn(1, 3, 224, 224))
    assert maps.shape == (1, 3, 257, 257)


def test_presets_and_config():
    names = list_models("eva02*")
    assert "eva02_large_patch14_448" in names and "eva02_enormous_patch14_clip_224" in names
    c = get_model_config("eva02_large_patch14_clip_224")
    assert (c.rope, c.rope_ref_grid, c.act, c.attn_inner_norm, c.mlp_inner_norm) == (
        True, (16, 16), "swiglu", True, True,
    )  # fmt: skip
    with pytest.raises(ValueError, match="divisible by 4"):
        get_model_config("eva02_tiny_patch14_224", embed_dim=198, num_heads=3)
