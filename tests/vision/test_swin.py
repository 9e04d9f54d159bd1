"""Swin: parity with timm through real safetensors files, shifted-window masks, errors."""

from __future__ import annotations

import attn_core
import pytest
import timm
import torch
from attn_vision import SwinConfig, SwinTransformer, create_model, list_models
from attn_vision.swin import (
    MASK_VALUE,
    relative_position_index,
    shift_window_mask,
    window_partition,
    window_reverse,
)
from safetensors.torch import save_file

TOL = dict(atol=1e-4, rtol=1e-4)

# Every Swin preset at full width with two blocks per stage (one shifted; the widest one),
# and all but tiny and small (which keep the 224 px geometry: a 7 x 7 last stage) also half
# the input size, where the full model would cost seconds per forward on 2 CPU cores. timm
# gets the same overrides.
SWIN_CASES = {
    "swin_tiny_patch4_window7_224": {"depths": (2, 2, 2, 2)},
    "swin_small_patch4_window7_224": {"depths": (2, 2, 2, 2)},
    "swin_base_patch4_window7_224": {"depths": (2, 2, 2, 2), "img_size": 112},
    "swin_large_patch4_window7_224": {"depths": (2, 2, 2, 2), "img_size": 112},
    "swin_base_patch4_window12_384": {"depths": (2, 2, 2, 2), "img_size": 192},
    "swin_large_patch4_window12_384": {"depths": (1, 1, 1, 1), "img_size": 192},
}
SMALL = dict(embed_dim=32, num_heads=(1, 2, 4, 8))  # narrow variant for cheap structural tests


def test_every_swin_preset_has_a_parity_case() -> None:
    assert set(list_models("swin_*")) == set(SWIN_CASES)


@pytest.mark.parametrize("name", list(SWIN_CASES))
def test_swin_matches_timm(name, timm_checkpoint, assert_parity) -> None:
    overrides = SWIN_CASES[name]
    ref, path = timm_checkpoint(name, **overrides)
    ours = create_model(name, pretrained=path, **overrides).eval()
    size = ours.patch_embed.img_size
    assert_parity(ref, ours, torch.randn(1, 3, *size))


def test_swin_padding_path_matches_timm(timm_checkpoint, assert_parity) -> None:
    """img_size=256: maps of 64/32/16/8 tokens are not multiples of the 7-wide window."""
    kw = dict(img_size=256, depths=(2, 2, 2, 2), **SMALL)
    ref, path = timm_checkpoint("swin_tiny_patch4_window7_224", **kw)
    ours = create_model("swin_tiny_patch4_window7_224", pretrained=path, **kw).eval()
    last = ours.layers[3].blocks[1]
    assert last.window_size == (7, 7) and last.shift_size == (3, 3)  # 8 x 8 map: padded + shifted
    assert_parity(ref, ours, torch.randn(2, 3, 256, 256))


def test_original_microsoft_layout_converts(timm_checkpoint, tmp_path) -> None:
    """Original checkpoints: downsample at the end of stage i, 'head.*', persistent buffers."""
    kw = dict(img_size=112, depths=(2, 2, 2, 2), **SMALL)
    ref, _ = timm_checkpoint("swin_tiny_patch4_window7_224", **kw)
    ms = {"model": {}}
    for k, v in ref.state_dict().items():
        if k.startswith("layers.") and ".downsample." in k:
            i = int(k.split(".")[1])
            k = k.replace(f"layers.{i}.downsample", f"layers.{i - 1}.downsample", 1)
        ms["model"][k.replace("head.fc.", "head.")] = v
    ms["model"]["layers.0.blocks.0.attn.relative_position_index"] = relative_position_index((7, 7))
    ms["model"]["layers.0.blocks.1.attn_mask"] = shift_window_mask(28, 28, (7, 7), (3, 3))
    path = tmp_path / "swin_ms.pth"
    torch.save(ms, path)
    ours = create_model("swin_tiny_patch4_window7_224", pretrained=path, **kw).eval()
    x = torch.randn(1, 3, 112, 112)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), ref(x), **TOL)


def test_window_partition_roundtrip() -> None:
    x = torch.randn(2, 14, 21, 5)
    windows = window_partition(x, (7, 7))
    assert windows.shape == (2 * 2 * 3, 7, 7, 5)
    torch.testing.assert_close(windows[1], x[0, :7, 7:14])  # image-major, row-major windows
    torch.testing.assert_close(window_reverse(windows, (7, 7), 14, 21), x)


def test_relative_position_index_covers_every_offset() -> None:
    idx = relative_position_index((3, 4))
    assert idx.shape == (12, 12)
    assert set(idx.flatten().tolist()) == set(range((2 * 3 - 1) * (2 * 4 - 1)))
    assert (idx.diagonal() == idx[0, 0]).all()  # zero offset -> one shared entry


def test_shift_mask_separates_wrapped_regions() -> None:
    mask = shift_window_mask(14, 14, (7, 7), (3, 3))  # 2 x 2 windows of 49 tokens
    assert mask.shape == (4, 49, 49)
    assert set(mask.unique().tolist()) == {0.0, MASK_VALUE}
    torch.testing.assert_close(mask, mask.transpose(1, 2))
    assert (mask.diagonal(dim1=1, dim2=2) == 0).all()  # a token always sees itself
    assert (mask[0] == 0).all()  # the top-left window holds one region only
    assert (mask[3] != 0).any()  # the corner window mixes four regions
    # in window 1 (top-right) the 3 wrapped columns are one region: 4 + 3 column split
    row_regions = (mask[1][0] == 0).view(7, 7)
    assert row_regions[:, :4].all() and not row_regions[:, 4:].any()


def test_shifted_blocks_only_where_the_map_is_larger_than_the_window() -> None:
    model = SwinTransformer(SwinConfig(depths=(2, 2, 2, 2), **SMALL))
    shifts = [[b.shift_size for b in stage.blocks] for stage in model.layers]
    assert shifts == [[(0, 0), (3, 3)]] * 3 + [[(0, 0), (0, 0)]]  # stage 4 is a single 7x7 window


def test_bad_inputs_are_value_errors() -> None:
    model = SwinTransformer(SwinConfig(depths=(2, 2, 2, 2), **SMALL))
    with pytest.raises(ValueError, match=r"expected a 224x224 image, got 256x256"):
        model(torch.randn(1, 3, 256, 256))
    with pytest.raises(ValueError, match=r"expected 3 input channels, got 4"):
        model(torch.randn(1, 4, 224, 224))
    with pytest.raises(ValueError, match=r"one entry per stage"):
        SwinConfig(depths=(2, 2), num_heads=(1, 2, 4))


def test_window_attention_runs_through_attn_core() -> None:
    model = SwinTransformer(SwinConfig(img_size=56, depths=(2, 2, 2, 2), window_size=7, **SMALL))
    model.eval()
    x = torch.randn(1, 3, 56, 56)
    with torch.no_grad():
        with attn_core.use_backend("math"):
            out_math = model(x)
            assert attn_core.last_backend() == "math"
        with attn_core.use_backend("sdpa"):
            out_sdpa = model(x)
            assert attn_core.last_backend() == "sdpa"
    torch.testing.assert_close(out_math, out_sdpa, **TOL)


def test_grad_checkpointing_and_gradients() -> None:
    torch.manual_seed(0)
    model = SwinTransformer(
        SwinConfig(img_size=56, depths=(2, 2, 2, 2), drop_path_rate=0.0, **SMALL)
    )
    x = torch.randn(2, 3, 56, 56)
    model(x).square().sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    for n, g in grads.items():
        assert torch.isfinite(g).all() and g.abs().sum() > 0, n
    model.zero_grad()
    model.set_grad_checkpointing(True)
    assert all(stage.grad_checkpointing for stage in model.layers)
    model(x).square().sum().backward()
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, grads[n], msg=n)


def test_converter_reports_depth_mismatch(timm_checkpoint) -> None:
    _, path = timm_checkpoint("swin_tiny_patch4_window7_224", depths=(2, 2, 2, 2), **SMALL)
    with pytest.raises(
        ValueError, match=r"(?s)missing keys \(52\): layers\.2\.blocks\.2.*and 32 more.*depth"
    ):
        create_model("swin_tiny_patch4_window7_224", pretrained=path, **SMALL)


def test_timm_format_file_loads_with_head_fc_renamed(tmp_path) -> None:
    ref = timm.create_model("swin_tiny_patch4_window7_224", depths=(2, 2, 2, 2), **SMALL)
    sd = ref.state_dict()
    assert "head.fc.weight" in sd
    save_file(sd, str(tmp_path / "m.safetensors"))
    ours = create_model(
        "swin_tiny_patch4_window7_224",
        pretrained=tmp_path / "m.safetensors",
        depths=(2, 2, 2, 2),
        **SMALL,
    )
    torch.testing.assert_close(ours.head.weight, sd["head.fc.weight"])


def test_bfloat16_with_shift_masks() -> None:
    """The float bias + shift mask follows the activations' dtype (attn_core casts it)."""
    model = SwinTransformer(SwinConfig(img_size=56, depths=(2, 2, 2, 2), **SMALL)).eval()
    x = torch.randn(1, 3, 56, 56)
    with torch.no_grad():
        ref = model(x)
        half = model.to(torch.bfloat16)(x.bfloat16())
    assert half.dtype == torch.bfloat16 and torch.isfinite(half).all()
    torch.testing.assert_close(half.float(), ref, atol=3e-2, rtol=3e-2)
