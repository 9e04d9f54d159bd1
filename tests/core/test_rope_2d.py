"""2D axial RoPE (EVA02's) against timm's RotaryEmbeddingCat + apply_rot_embed_cat."""

import pytest
import torch
from attn_core import AxialRotaryEmbedding
from torch.testing import assert_close

pos_embed_sincos = pytest.importorskip("timm.layers.pos_embed_sincos")


def timm_rotate(x, grid, head_dim, prefix, ref=None, half=False, offset=0.0):
    """How timm's Eva applies its rope to q / k: patch tokens only, prefix kept."""
    rope = pos_embed_sincos.RotaryEmbeddingCat(
        head_dim, in_pixels=False, feat_shape=None, ref_feat_shape=ref, rotate_half=half,
        grid_offset=offset,
    )  # fmt: skip
    emb = rope.get_embed(list(grid))
    rotated = pos_embed_sincos.apply_rot_embed_cat(x[:, :, prefix:], emb, half=half)
    return torch.cat((x[:, :, :prefix], rotated), dim=2)


@pytest.mark.parametrize(
    "grid, ref, prefix, half, offset",
    [
        ((4, 4), None, 1, False, 0.0),
        ((4, 6), (16, 16), 1, False, 0.0),  # EVA02: scaled onto the 224 / 14 reference grid
        ((3, 5), (4, 4), 5, False, 0.0),  # class + 4 registers, non-square grid
        ((4, 4), None, 0, True, 0.5),  # half-split pairs, offset grid
    ],
)
def test_matches_timm_rotary_embedding_cat(grid, ref, prefix, half, offset):
    torch.manual_seed(0)
    head_dim = 32
    x = torch.randn(2, 3, prefix + grid[0] * grid[1], head_dim)
    rope = AxialRotaryEmbedding(head_dim, ref_grid=ref, interleaved=not half, grid_offset=offset)
    ours = rope(x, grid, num_prefix_tokens=prefix)
    assert_close(ours, timm_rotate(x, grid, head_dim, prefix, ref, half, offset))
    assert torch.equal(ours[:, :, :prefix], x[:, :, :prefix])  # prefix tokens untouched


def test_relative_positions_only():
    """Without a reference grid, q.k depends only on the 2D offset between two patches."""
    rope = AxialRotaryEmbedding(16).double()
    q, k = torch.randn(16, dtype=torch.float64), torch.randn(16, dtype=torch.float64)
    grid = (6, 6)

    def score(a, b):  # patches a, b as (row, col)
        xq = torch.zeros(1, 36, 16, dtype=torch.float64)
        xk = torch.zeros_like(xq)
        xq[0, a[0] * 6 + a[1]], xk[0, b[0] * 6 + b[1]] = q, k
        return (rope(xq, grid)[0, a[0] * 6 + a[1]] @ rope(xk, grid)[0, b[0] * 6 + b[1]]).item()

    assert score((1, 2), (3, 1)) == pytest.approx(
        score((2, 4), (4, 3)), rel=1e-6
    )  # angles are fp32
    assert score((1, 2), (3, 1)) != pytest.approx(score((1, 2), (1, 3)), rel=1e-3)


def test_bf16_rotates_in_fp32_and_partial_dim_passes_the_rest():
    rope = AxialRotaryEmbedding(8)
    x = torch.randn(1, 2, 1 + 9, 16)
    out = rope(x.bfloat16(), (3, 3), num_prefix_tokens=1)
    assert out.dtype == torch.bfloat16
    assert_close(out.float(), rope(x, (3, 3), 1), atol=0.05, rtol=0.02)
    assert torch.equal(rope(x, (3, 3), 1)[..., 8:], x[..., 8:])


def test_bad_shapes_are_value_errors():
    with pytest.raises(ValueError, match="multiple of 4"):
        AxialRotaryEmbedding(6)
    with pytest.raises(ValueError, match=r"1 \+ 3 \* 3 tokens"):
        AxialRotaryEmbedding(8)(torch.randn(1, 9, 8), (3, 3), num_prefix_tokens=1)


def test_block_with_inner_norms_and_2d_rope_runs_off_the_fast_path():
    """EVA02's block: inner norms (timm ``attn.norm`` / ``mlp.norm``), SwiGLU, a per-call 2D
    rope; ``run_blocks`` gives the block's own forward for it."""
    from attn_core import TransformerBlock
    from attn_core.fast_inference import block_supported, run_blocks

    blk = TransformerBlock(32, 2, act="swiglu", attn_inner_norm=True, mlp_inner_norm=True).eval()
    names = set(blk.state_dict())
    assert {"attn.norm.weight", "mlp.norm.weight", "mlp.fc1.weight"} <= names
    assert not block_supported(blk)
    rope = AxialRotaryEmbedding(16)
    x = torch.randn(2, 1 + 9, 32)

    def rotary(t):
        return rope(t, (3, 3), 1)

    with torch.no_grad():
        assert_close(run_blocks([blk], x, rotary=rotary), blk(x, rotary=rotary))
        assert not torch.allclose(blk(x, rotary=rotary), blk(x))
