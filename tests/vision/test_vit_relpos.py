"""timm's relative-position ViTs (``vit_relpos_*``, ``VisionTransformerRelPos``) through the
ViT: timm parity.

No absolute position embedding; every block adds timm's ``RelPosMlp`` bias (an MLP over
log-spaced (dy, dx) offsets, 0 for the class token) to its attention scores, computed for
the grid at hand. Real widths, depth shrunk; the res-post-norm ``*_rpn_*`` blocks too.
"""

from __future__ import annotations

import pytest
import torch
from attn_core import fast_inference
from attn_vision import create_model, get_model_config, list_models
from attn_vision.vit import RelPosMlp
from safetensors.torch import save_file

CASES = [
    # (name, timm overrides): class token, token pool, a 256-wide bias MLP, no qkv bias
    ("vit_relpos_medium_patch16_cls_224", dict(depth=2)),
    # GAP with fc_norm; res-post-norm blocks (timm's ResPostRelPosBlock), at 128 px
    ("vit_relpos_small_patch16_224", dict(depth=1, img_size=128)),
    ("vit_relpos_small_patch16_rpn_224", dict(depth=2, img_size=128)),
]


@torch.no_grad()
def _strong(ref: torch.nn.Module, path) -> torch.nn.Module:
    """Layer scales near 1 and biases of a few units (timm's 1e-6 LayerScale init, and the
    fixture's small weights, would let a missing bias pass at 1e-4), saved again."""
    for name, p in ref.named_parameters():
        if name.endswith("gamma"):
            p.normal_(1.0, 0.1)
        elif ".rel_pos.mlp.fc2." in name:
            p.normal_(0.0, 0.5)
    save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, str(path))
    return ref


@pytest.mark.parametrize(("name", "overrides"), CASES)
def test_relpos_vit_matches_timm(name, overrides, timm_checkpoint, assert_parity):
    ref, path = timm_checkpoint(name, num_classes=5, **overrides)
    ref = _strong(ref, path)
    ours = create_model(name, pretrained=path, num_classes=5, **overrides)
    assert ours.pos_embed is None and isinstance(ours.blocks[0].attn.rel_pos, RelPosMlp)
    size = ours.patch_embed.img_size
    x = torch.randn(2, 3, *size)
    assert_parity(ref, ours, x)  # (eval, no autograd: the fast path, block by block)
    fast_inference.disable(ours)  # the plain modules give the same
    with torch.no_grad():
        torch.testing.assert_close(ours(x), ref(x), atol=1e-4, rtol=1e-4)
        for blk in ours.blocks:  # and the bias matters
            torch.nn.init.zeros_(blk.attn.rel_pos.mlp.fc2.weight)
            torch.nn.init.zeros_(blk.attn.rel_pos.mlp.fc2.bias)
        assert not torch.allclose(ours(x), ref(x), atol=1e-3)


def test_other_grids_match_timms_set_input_size(timm_checkpoint):
    """timm regenerates its offsets for a new input size; ours computes them for the grid
    it is given: the same at a non-square 160 x 192."""
    name = "vit_relpos_medium_patch16_cls_224"
    ref, path = timm_checkpoint(name, depth=1, num_classes=0)
    ref = _strong(ref, path)
    ours = create_model(name, pretrained=path, depth=1, num_classes=0)
    ref.set_input_size(img_size=(160, 192))
    x = torch.randn(2, 3, 160, 192)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), ref(x), atol=1e-4, rtol=1e-4)
    (maps,) = ours.get_attention_maps(x)  # the bias is in the attention weights too
    assert maps.shape == (2, 8, 1 + 10 * 12, 1 + 10 * 12)


def test_presets_and_config():
    names = list_models("vit_*relpos*")
    assert (
        "vit_relpos_medium_patch16_cls_224" in names
        and "vit_srelpos_small_patch16_224" not in names
    )
    c = get_model_config("vit_relpos_medium_patch16_cls_224")
    assert (c.pos_embed, c.rel_pos, c.rel_pos_dim, c.qkv_bias, c.init_values) == (
        "none", "mlp", 256, False, 1e-6,
    )  # fmt: skip
    assert get_model_config("vit_relpos_small_patch16_rpn_224").post_norm
    with pytest.raises(ValueError, match="rel_pos must be one of"):
        get_model_config("vit_relpos_small_patch16_224", rel_pos="bias")
    with pytest.raises(ValueError, match="not built by attn_vision.*shared_rel_pos=True"):
        get_model_config("vit_srelpos_small_patch16_224")
