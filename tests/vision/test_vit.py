"""ViT: parity with timm through real safetensors files (DeiT, DeiT-3, DINOv2 with and without
registers, SigLIP's MAP head, ...), prefix tokens, resizing, attention maps, errors.

The whole generated zoo (every preset's tensor names and shapes, one parity case per feature
combination, coverage) is tests/vision/test_vit_zoo.py."""

from __future__ import annotations

import attn_core
import pytest
import timm
import torch
from attn_core import fast_inference
from attn_vision import PatchEmbed, VisionTransformer, ViTConfig, create_model, list_models

TOL = dict(atol=1e-4, rtol=1e-4)

# Presets at full width, depth (and for fixed-size models img_size) cut where a full forward
# would cost seconds on 2 CPU cores. The same overrides go to timm and to us. Every preset's
# full-depth names and shapes are checked against timm in tests/vision/test_vit_zoo.py.
VIT_CASES = {
    "vit_tiny_patch16_224": {"depth": 2},
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
    # issue 15: LayerScale + pos-embed without prefix, distillation token, DINOv2 (patch 14,
    # 518 pos-embed resampled), registers, SigLIP's MAP head, proj bias without qkv bias
    "deit3_small_patch16_224": {"depth": 2},
    "deit_small_distilled_patch16_224": {"depth": 2},
    "vit_small_patch14_dinov2": {"depth": 2, "img_size": 112},
    "vit_small_patch14_reg4_dinov2": {"depth": 2, "img_size": 112},
    "vit_base_patch16_siglip_224": {"depth": 2, "img_size": 128},
    "vit_medium_patch16_gap_256": {"depth": 2, "img_size": 128},
}


def test_parity_cases_are_presets() -> None:
    assert set(VIT_CASES) <= set(list_models())


@pytest.mark.parametrize("name", list(VIT_CASES))
def test_vit_matches_timm(name, timm_checkpoint, assert_parity) -> None:
    overrides = VIT_CASES[name]
    ref, path = timm_checkpoint(name, **overrides)
    ours = create_model(name, pretrained=path, **overrides).eval()
    size = ours.patch_embed.img_size
    assert_parity(ref, ours, torch.randn(1, 3, *size))


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


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(global_pool="avg", init_values=1e-2),
        dict(dist_token=True, reg_tokens=2),
        dict(class_token=False, global_pool="map", reg_tokens=1, qkv_bias=False),
    ],
)
def test_every_parameter_gets_a_finite_gradient(kwargs) -> None:
    model = _tiny(**kwargs)
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
        {"dist_token": True, "no_embed_class": True, "init_values": 0.1},
        {"reg_tokens": 4, "class_token": False, "global_pool": "map", "act": "gelu_tanh"},
        {"reg_tokens": 2, "qkv_bias": False, "global_pool": "avg", "fc_norm": False},
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
        assert fast_inference.disable(model) is model and not model.fast_inference
        plain = model(x), model.forward_features(x), model.forward_pre_logits(x)
        fast_inference.enable(model)
    for a, b in zip(fast, plain, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    with torch.no_grad():  # forward_pre_logits == forward_head(forward_features, pre_logits)
        torch.testing.assert_close(
            fast[2], model.forward_head(model.forward_features(x), pre_logits=True)
        )


# -- prefix tokens, the MAP head, separate projection bias ------------------------------------


def test_prefix_tokens_come_in_timms_order() -> None:
    """[CLS], [DIST], registers, then the patches; the position embedding covers them
    unless no_embed_class."""
    model = _tiny(dist_token=True, reg_tokens=3).eval()
    assert model.num_prefix_tokens == model.config.num_prefix_tokens == 5
    assert model.pos_embed.shape == (1, 5 + 16, 32)
    assert model.reg_token.shape == (1, 3, 32) and model.dist_token.shape == (1, 1, 32)
    with torch.no_grad():
        tokens = model._embed(torch.zeros(2, 3, 32, 32))
    pos = model.pos_embed[0, :5]
    prefix = torch.cat([model.cls_token[0], model.dist_token[0], model.reg_token[0]])
    torch.testing.assert_close(tokens[0, :5], prefix + pos)
    assert model.forward_features(torch.zeros(2, 3, 32, 32)).shape == (2, 21, 32)
    assert _tiny(reg_tokens=4, no_embed_class=True).pos_embed.shape == (1, 16, 32)


def test_distilled_logits_are_the_mean_of_both_heads() -> None:
    model = _tiny(dist_token=True).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        feats = model.forward_features(x)
        expected = (model.head(feats[:, 0]) + model.head_dist(feats[:, 1])) / 2
        torch.testing.assert_close(model(x), expected)
        pre = model.forward_pre_logits(x)
        torch.testing.assert_close(pre, (feats[:, 0] + feats[:, 1]) / 2)
    model.reset_classifier(3)
    assert model.head.out_features == model.head_dist.out_features == 3
    model.reset_classifier(0)
    assert isinstance(model.head_dist, torch.nn.Identity)


def test_map_head_pools_with_attn_cores_attention(monkeypatch) -> None:
    import attn_vision.attention_pool as pool_module

    model = _tiny(class_token=False, global_pool="map", reg_tokens=2).eval()
    names = {n for n, _ in model.named_parameters() if n.startswith("attn_pool.")}
    assert names == {
        f"attn_pool.{n}"
        for n in ("latent", "q.weight", "q.bias", "kv.weight", "kv.bias", "proj.weight")
        + ("proj.bias", "norm.weight", "norm.bias", "mlp.fc1.weight", "mlp.fc1.bias")
        + ("mlp.fc2.weight", "mlp.fc2.bias")
    }
    calls = []
    real = pool_module.attention
    monkeypatch.setattr(pool_module, "attention", lambda *a, **k: calls.append(1) or real(*a, **k))
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        out = model(x)
        feats = model.forward_features(x)
        # the registers are left out of the pool, as timm does
        torch.testing.assert_close(out, model.head(model.attn_pool(feats[:, 2:])))
    assert out.shape == (2, 5) and len(calls) == 2
    model.reset_classifier(4, global_pool="avg")  # dropping the MAP head is allowed ...
    assert model.attn_pool is None and model(x).shape == (2, 4)
    with pytest.raises(ValueError, match="cannot add a MAP head"):  # ... adding one is not
        model.reset_classifier(4, global_pool="map")


def test_proj_bias_is_separate_from_qkv_bias() -> None:
    attn = _tiny(qkv_bias=False).blocks[0].attn  # timm's vit_medium_*: proj bias, no qkv bias
    assert attn.qkv.bias is None and attn.proj.bias is not None
    attn = _tiny(qkv_bias=False, proj_bias=False).blocks[0].attn
    assert attn.qkv.bias is None and attn.proj.bias is None


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(global_pool="max"), r"global_pool must be one of \('token', 'avg', 'map', ''\)"),
        (dict(class_token=False), "global_pool='token' needs class_token=True"),
        (dict(dist_token=True, global_pool="avg"), "dist_token=True .* needs global_pool='token'"),
        (dict(dist_token=True, fc_norm=True), "expected fc_norm None/False"),
        (dict(reg_tokens=-1), "reg_tokens must be an int >= 0"),
        (dict(embed_dim=30), r"embed_dim \(30\) must be divisible by num_heads \(4\)"),
    ],
)
def test_bad_configs_name_what_is_expected(kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        _tiny(**kwargs)
