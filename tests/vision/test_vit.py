"""ViT: parity with timm through real safetensors files, resizing, attention maps, errors."""

from __future__ import annotations

import attn_core
import pytest
import timm
import torch
from attn_vision import PatchEmbed, VisionTransformer, ViTConfig, create_model, list_models

TOL = dict(atol=1e-4, rtol=1e-4)

# Every ViT preset, with depth cut where a full-depth forward would cost seconds on 2 CPU
# cores. The same overrides go to timm and to us. Full-depth vit_base_patch16_224 is the
# slow test.
VIT_CASES = {
    "vit_tiny_patch16_224": {},
    "vit_small_patch16_224": {"depth": 4},
    "vit_small_patch32_224": {"depth": 4},
    "vit_base_patch32_224": {"depth": 4},
    "vit_base_patch32_clip_224": {"depth": 4},
    "vit_base_patch16_224": {"depth": 2},
    "vit_base_patch16_384": {"depth": 1},
    "vit_large_patch16_224": {"depth": 2},
    "vit_base_patch16_clip_224": {"depth": 2},
    "vit_base_patch32_clip_quickgelu_224": {"depth": 2},
    "vit_base_patch16_gap_224": {"depth": 2},
}


def test_every_vit_preset_has_a_parity_case() -> None:
    assert set(list_models("vit_*")) == set(VIT_CASES)


@pytest.mark.parametrize("name", list(VIT_CASES))
def test_vit_matches_timm(name, timm_checkpoint, assert_parity) -> None:
    overrides = VIT_CASES[name]
    ref, path = timm_checkpoint(name, **overrides)
    ours = create_model(name, pretrained=path, **overrides).eval()
    size = ours.patch_embed.img_size
    assert_parity(ref, ours, torch.randn(1, 3, *size))


@pytest.mark.slow
def test_vit_base_full_depth_matches_timm(timm_checkpoint, assert_parity) -> None:
    ref, path = timm_checkpoint("vit_base_patch16_224")
    ours = create_model("vit_base_patch16_224", pretrained=path).eval()
    assert len(ours.blocks) == 12
    assert_parity(ref, ours, torch.randn(1, 3, 224, 224))


def test_img_size_override_resamples_pos_embed_like_timm(timm_checkpoint, assert_parity) -> None:
    """Built for another size: timm resamples the checkpoint's pos_embed when loading; so do we."""
    _, path = timm_checkpoint("vit_small_patch16_224", depth=2)  # trained at 224 (14 x 14)
    ref = timm.create_model(
        "vit_small_patch16_224",
        depth=2,
        img_size=(192, 256),
        pretrained=True,
        pretrained_cfg_overlay=dict(file=str(path)),
    ).eval()
    ours = create_model("vit_small_patch16_224", pretrained=path, depth=2, img_size=(192, 256))
    ours.eval()
    assert ours.pos_embed.shape == ref.pos_embed.shape == (1, 1 + 12 * 16, 384)
    assert_parity(ref, ours, torch.randn(1, 3, 192, 256))


@pytest.mark.parametrize("name", ["vit_small_patch16_224", "vit_base_patch16_gap_224"])
def test_dynamic_img_size_matches_timm(name, timm_checkpoint, assert_parity) -> None:
    """Any size divisible by the patch: pos_embed resampled per forward (timm dynamic_img_size)."""
    ref, path = timm_checkpoint(name, depth=2, dynamic_img_size=True)
    ours = create_model(name, pretrained=path, depth=2).eval()
    x = torch.randn(1, 3, 160, 256)  # 10 x 16 patches, not the trained 14 x 14
    assert_parity(ref, ours, x)


def _tiny(**kwargs) -> VisionTransformer:
    cfg = dict(img_size=32, patch_size=8, embed_dim=32, depth=3, num_heads=4, num_classes=5)
    return VisionTransformer(ViTConfig(**{**cfg, **kwargs}))


def test_strict_size_error_names_expected_and_got() -> None:
    model = _tiny(dynamic_img_size=False)
    with pytest.raises(ValueError, match=r"expected a 32x32 image, got 40x40"):
        model(torch.randn(1, 3, 40, 40))


def test_wrong_channel_count_is_a_value_error() -> None:
    with pytest.raises(ValueError, match=r"expected 3 input channels, got 1"):
        _tiny()(torch.randn(2, 1, 32, 32))


def test_size_not_divisible_by_patch_is_a_value_error() -> None:
    with pytest.raises(ValueError, match=r"33x32 is not divisible by the patch size 8x8"):
        _tiny()(torch.randn(1, 3, 33, 32))
    with pytest.raises(ValueError, match=r"\(B, C, H, W\)"):
        PatchEmbed(32, 8, 3, 16)(torch.randn(3, 32, 32))


def test_attention_maps_are_the_blocks_softmax_weights() -> None:
    model = _tiny().eval()
    x = torch.randn(2, 3, 32, 32)
    maps = model.get_attention_maps(x)
    assert len(maps) == 3
    N = 1 + 16
    for m in maps:
        assert m.shape == (2, 4, N, N)
        assert (m >= 0).all()
        torch.testing.assert_close(m.sum(-1), torch.ones(2, 4, N))
    # recompute layer 0 by hand from the block's own projections
    with torch.no_grad():
        tokens = model._embed(x)
        blk = model.blocks[0]
        q, k, _ = blk.attn.qkv(blk.norm1(tokens)).view(2, N, 3, 4, 8).permute(2, 0, 3, 1, 4)
        expected = torch.softmax(q @ k.transpose(-1, -2) / 8**0.5, dim=-1)
    torch.testing.assert_close(maps[0], expected, **TOL)
    with torch.no_grad():  # the hook-free read-out leaves the forward pass unchanged
        torch.testing.assert_close(model(x), model.forward_head(model.forward_features(x)))


def test_blocks_run_through_attn_core() -> None:
    model = _tiny().eval()
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        with attn_core.use_backend("math"):
            out_math = model(x)
            assert attn_core.last_backend() == "math"
        with attn_core.use_backend("sdpa"):
            out_sdpa = model(x)
            assert attn_core.last_backend() == "sdpa"
    torch.testing.assert_close(out_math, out_sdpa, **TOL)


def test_grad_checkpointing_gives_same_outputs_and_grads(monkeypatch) -> None:
    model = _tiny()
    x = torch.randn(2, 3, 32, 32)
    torch.manual_seed(1)
    model(x).square().sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()

    calls = []
    real = torch.utils.checkpoint.checkpoint
    monkeypatch.setattr(
        torch.utils.checkpoint, "checkpoint", lambda *a, **k: calls.append(1) or real(*a, **k)
    )
    model.set_grad_checkpointing(True)
    model(x).square().sum().backward()
    assert len(calls) == 3  # one per block
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, grads[n], msg=n)


def test_every_parameter_gets_a_finite_gradient() -> None:
    model = _tiny(global_pool="avg", init_values=1e-2)
    model(torch.randn(2, 3, 32, 32)).sum().backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, name


def test_heads_and_pooling() -> None:
    model = _tiny(num_classes=0).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        feats = model.forward_features(x)
        assert feats.shape == (2, 17, 32)
        torch.testing.assert_close(model(x), feats[:, 0])  # no head: pooled [CLS]
        model.reset_classifier(7, global_pool="avg")
        assert model(x).shape == (2, 7)
        assert model.forward_head(feats, pre_logits=True).shape == (2, 32)
    assert _tiny(pre_norm=True).patch_embed.proj.bias is None  # CLIP towers: no patch bias
    assert _tiny(pre_norm=True, patch_bias=True).patch_embed.proj.bias is not None
    gap = _tiny(class_token=False, global_pool="avg", fc_norm=False).eval()
    assert gap.forward_features(x).shape == (2, 16, 32)
    with pytest.raises(ValueError, match="class_token"):
        ViTConfig(class_token=False, global_pool="token")


def test_bfloat16_weights_and_autocast_stay_close_to_fp32() -> None:
    model = _tiny().eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        ref = model(x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            auto = model(x)
        half = model.to(torch.bfloat16)(x.bfloat16())
    assert auto.dtype == half.dtype == torch.bfloat16
    torch.testing.assert_close(auto.float(), ref, atol=3e-2, rtol=3e-2)
    torch.testing.assert_close(half.float(), ref, atol=3e-2, rtol=3e-2)


@pytest.mark.parametrize(
    "kwargs",
    [
        {},  # [CLS] pooling: the fast path computes only that row in the last block
        {"global_pool": "avg", "init_values": 0.1, "act": "quick_gelu"},
        {"pre_norm": True, "act": "gelu_tanh"},
    ],
)
def test_fast_inference_equals_the_plain_modules(kwargs) -> None:
    model = _tiny(**kwargs).eval()
    with torch.no_grad():
        for p in model.parameters():  # non-trivial biases and norms
            p.add_(0.05 * torch.randn_like(p))
    x = torch.randn(2, 3, 32, 48)  # another size than the position embedding's
    with torch.inference_mode():
        fast = model(x), model.forward_features(x), model.forward_pre_logits(x)
        assert model.set_fast_inference(False) is model and not model.fast_inference
        plain = model(x), model.forward_features(x), model.forward_pre_logits(x)
        model.set_fast_inference(True)
    for a, b in zip(fast, plain, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    with torch.no_grad():  # forward_pre_logits == forward_head(forward_features, pre_logits)
        torch.testing.assert_close(
            fast[2], model.forward_head(model.forward_features(x), pre_logits=True)
        )
