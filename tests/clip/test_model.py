"""CLIP model: parity with open_clip on tiny configs, forward outputs, training behaviour."""

from __future__ import annotations

import math

import pytest
import torch
from attn_clip import CLIP, CLIPConfig, Tokenizer, load_checkpoint
from attn_clip.model import LOGIT_SCALE_MAX
from attn_core import fast_inference
from torch.testing import assert_close

TOL = {"atol": 1e-4, "rtol": 1e-4}

VARIANTS = {
    "default": {},
    "quickgelu_layerscale": {
        "quick_gelu": True,
        "vision_cfg": {"ls_init_value": 0.5},
        "text_cfg": {"ls_init_value": 0.5},
    },
    # CLIPA-style towers: no ln_pre, mean pooling with ln_post after the pool,
    # bidirectional text attention pooled at the last token, biased text projection.
    "clipa_style": {
        "vision_cfg": {"no_ln_pre": True, "pool_type": "avg", "final_ln_after_pool": True},
        "text_cfg": {"no_causal_mask": True, "pool_type": "last", "proj_bias": True},
    },
    "avg_pool_eos": {
        "vision_cfg": {"pool_type": "avg"},
        "text_cfg": {"pool_type": "eos", "eos_id": 49407},
        "init_logit_bias": -10.0,
    },
    "no_text_proj": {"embed_dim": 48, "text_cfg": {"proj_type": "none"}},
}


def load_ours(ref: torch.nn.Module, cfg: dict) -> CLIP:
    return load_checkpoint(CLIP(CLIPConfig.from_open_clip(cfg)).eval(), ref.state_dict())


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_parity_with_open_clip(h, variant, tiny_images, tiny_tokens):
    cfg = h.oc_cfg(**VARIANTS[variant])
    ref = h.make_open_clip(cfg)
    ours = load_ours(ref, cfg)
    with torch.no_grad():
        assert_close(ours.encode_image(tiny_images), ref.encode_image(tiny_images), **TOL)
        assert_close(ours.encode_text(tiny_tokens), ref.encode_text(tiny_tokens), **TOL)
        ref_img, ref_txt = ref.get_logits(tiny_images, tiny_tokens)
        out = ours(tiny_images, tiny_tokens)
    assert_close(out.logits_per_image, ref_img, **TOL)
    assert_close(out.logits_per_text, ref_txt, **TOL)
    assert (out.logit_bias is None) == (ref.logit_bias is None)


def test_forward_outputs(h, tiny_images, tiny_tokens):
    model = CLIP(CLIPConfig.from_open_clip(h.oc_cfg())).eval()
    out = model(tiny_images, tiny_tokens[:2])
    assert out.logits_per_image.shape == (3, 2) and out.logits_per_text.shape == (2, 3)
    assert_close(out.image_embeds.norm(dim=-1), torch.ones(3))
    assert_close(out.logits_per_text, out.logits_per_image.T)
    assert_close(out.logit_scale, torch.tensor(1 / 0.07))
    raw = model.encode_text(tiny_tokens[:2])
    assert not torch.allclose(raw.norm(dim=-1), torch.ones(2))
    assert_close(
        model.encode_text(tiny_tokens[:2], normalize=True), raw / raw.norm(dim=-1)[:, None]
    )
    only_images = model(images=tiny_images)
    assert only_images.text_embeds is None and only_images.logits_per_image is None


def test_shorter_token_rows_give_the_same_embedding(h):
    model = CLIP(CLIPConfig.from_open_clip(h.oc_cfg())).eval()
    tokens = Tokenizer(20)(["a red square", "two blue circles"])
    with torch.no_grad():
        assert_close(model.encode_text(tokens[:, :8]), model.encode_text(tokens))
    with pytest.raises(ValueError, match="context length 20"):
        model.encode_text(Tokenizer(30)(["x"]))
    with pytest.raises(ValueError, match="integer"):
        model.encode_text(tokens.float())


def test_every_parameter_gets_a_gradient(h, tiny_images, tiny_tokens):
    model = CLIP(CLIPConfig.from_open_clip(h.oc_cfg(init_logit_bias=-5.0))).train()
    out = model(tiny_images, tiny_tokens[:3])
    loss = out.logits_per_image.logsumexp(1).mean() - out.logits_per_image.diagonal().mean()
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        if name != "logit_bias":  # the softmax loss does not depend on a constant bias
            assert p.grad.abs().sum() > 0, name


def test_grad_checkpointing_matches(h, tiny_images, tiny_tokens):
    model = CLIP(CLIPConfig.from_open_clip(h.oc_cfg())).train()
    out = model(tiny_images, tiny_tokens[:3]).logits_per_image.sum()
    grads = torch.autograd.grad(out, list(model.parameters()))
    model.set_grad_checkpointing(True)
    out2 = model(tiny_images, tiny_tokens[:3]).logits_per_image.sum()
    grads2 = torch.autograd.grad(out2, list(model.parameters()))
    assert_close(out2, out)
    for g, g2 in zip(grads, grads2, strict=True):
        assert_close(g2, g, atol=1e-5, rtol=1e-4)


def test_logit_scale_is_clamped_in_training(h):
    model = CLIP(CLIPConfig.from_open_clip(h.oc_cfg()))
    with torch.no_grad():
        model.logit_scale.fill_(6.0)
    assert_close(model.train().scale(), torch.tensor(100.0))
    assert_close(model.eval().scale(), torch.tensor(math.exp(6.0)))
    model.clamp_logit_scale_()
    assert model.logit_scale.item() == pytest.approx(LOGIT_SCALE_MAX)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_runs_close_to_fp32(h, tiny_images, tiny_tokens, dtype):
    model = CLIP(CLIPConfig.from_open_clip(h.oc_cfg())).eval()
    with torch.no_grad():
        ref = model(tiny_images, tiny_tokens)
        out = model.to(dtype)(tiny_images, tiny_tokens)  # float images are cast to the model dtype
    assert out.image_embeds.dtype == dtype
    assert_close(out.image_embeds.float(), ref.image_embeds, atol=0.05, rtol=0.05)
    assert_close(out.text_embeds.float(), ref.text_embeds, atol=0.05, rtol=0.05)


def test_siglip_towers_train_and_explain():
    """A SigLIP-style CLIP (no class token, MAP head, no image projection, last-token text
    pooling without causal mask): every parameter gets a gradient from the sigmoid loss, and
    the relevancy heatmap (mean of the token rows) works without a class token."""
    from dataclasses import replace

    import attn_clip
    from attn_clip import SigLipLoss, get_model_config

    cfg = get_model_config("ViT-B-16-SigLIP")
    v = replace(cfg.vision, image_size=32, patch_size=8, width=32, layers=2, head_width=16)
    t = replace(cfg.text, width=32, heads=2, layers=2, context_length=12, vocab_size=64)
    model = CLIP(replace(cfg, embed_dim=32, vision=v, text=t)).train()
    images, tokens = torch.randn(4, 3, 32, 32), torch.randint(0, 64, (4, 12))
    out = model(images, tokens)
    SigLipLoss()(out.image_embeds, out.text_embeds, out.logit_scale, out.logit_bias).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    model.eval()
    heat = attn_clip.image_relevancy(model, images[:2], torch.randn(32))
    assert heat.shape == (2, 4, 4) and heat.amax() == 1
    # an image size that is not a whole number of patches: the remainder is cut, as timm's
    # patch convolution does (ViT-SO400M-14-SigLIP-384)
    with torch.no_grad():
        assert_close(model.encode_image(torch.nn.functional.pad(images, (0, 5, 0, 5))),
                     model.encode_image(images))  # fmt: skip


def test_factorized_token_embedding(h, tmp_path, tiny_images, tiny_tokens):
    """``text.token_dim`` (ALBERT's factorized embedding): a (V, T) table and a T -> D map
    give exactly what open_clip gives with the (V, D) table ``E @ P.T``, train, pass
    through the inference fast path, and survive save_pretrained / load."""
    import json

    import attn_clip

    cfg = h.oc_cfg()
    ref = h.make_open_clip(cfg)
    ours = CLIP(CLIPConfig.from_open_clip(h.oc_cfg(text_cfg={"token_dim": 4}))).eval()
    width = cfg["text_cfg"]["width"]
    assert ours.text.token_embedding.weight.shape == (cfg["text_cfg"]["vocab_size"], 4)
    assert ours.text.token_proj.weight.shape == (width, 4)
    sd = {k: v for k, v in ref.state_dict().items() if k != "token_embedding.weight"}
    table, proj = torch.randn(cfg["text_cfg"]["vocab_size"], 4), torch.randn(width, 4) * 0.01
    load_checkpoint(ours, {**sd, "token_embedding.weight": table, "token_proj.weight": proj})
    with torch.no_grad():
        ref.token_embedding.weight.copy_(table @ proj.T)
        assert_close(ours.encode_text(tiny_tokens), ref.encode_text(tiny_tokens), **TOL)
        fast_inference.disable(ours.text)
        assert_close(ours.encode_text(tiny_tokens), ref.encode_text(tiny_tokens), **TOL)
    fast_inference.enable(ours.text)
    attn_clip.save_pretrained(ours, tmp_path)
    written = json.loads((tmp_path / "open_clip_config.json").read_text())
    assert written["model_cfg"]["text_cfg"]["token_dim"] == 4
    loaded = attn_clip.create_model(f"local-dir:{tmp_path}").eval()
    with torch.no_grad():
        assert_close(loaded.encode_text(tiny_tokens), ref.encode_text(tiny_tokens), **TOL)
    fresh = CLIP(ours.config).train()
    fresh(tiny_images, tiny_tokens).logits_per_image.logsumexp(1).mean().backward()
    for p in (fresh.text.token_embedding.weight, fresh.text.token_proj.weight):
        assert p.grad is not None and p.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="token_dim"):
        CLIPConfig.from_open_clip(h.oc_cfg(text_cfg={"token_dim": 0}))
