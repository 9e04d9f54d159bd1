"""EVA-CLIP parity: random-init open_clip EVA models (a timm ``Eva`` image tower whose
classifier ``head`` is the projection, open_clip's text tower under ``text.``) saved in
open_clip's on-disk formats, loaded through ``create_model``, fp32 image and text
embeddings and logits equal at 1e-4.

Full width, 2 blocks per tower (timm's ``depth`` passed through its ``create_model``), the
text vocabulary cut to ``SMALL_VOCAB`` rows (captions folded into it, end-of-text last);
each reference built once per module and only read. EVA02-B-16: 2D RoPE, SwiGLU with
separate ``fc1_x`` / ``fc1_g``, inner norms, separate ``q_proj`` / ``k_proj`` / ``v_proj``;
EVA01-g-14: a plain ViT with a fused ``qkv`` and ``q_bias`` / ``v_bias``, 1408 wide;
EVA02-L-14-336: the RoPE positions of its 24 x 24 grid scaled onto the 16 x 16 reference
grid; EVA02-E-14: timm's residual post-norm blocks (``x + norm(branch(x))``), 4 heads of its
real 112 channels. PE-Core (Meta's Perception Encoder, timm ``vit_pe_core_*``): 2D RoPE on
a 1-offset grid with column-first bands, ``norm_pre``, timm's ``AttentionRope`` (a plain
``qkv`` with its key bias), a MAP head of 8 heads over every token then timm's head as the
projection; T-16-384 at its real widths (bigG-14-448's tower, without class token, is
checked in tests/vision/test_eva_variants.py). The names and shapes of every config at
full depth are checked on the meta device in test_convert.py."""

from __future__ import annotations

import copy
import functools

import open_clip
import pytest
import timm
import torch
import torch.nn.functional as F
from _support.clip import SMALL_VOCAB
from _support.models import memoized
from attn_clip import CLIPConfig, create_model, get_model_config, save_pretrained, to_open_clip
from attn_core import fast_inference
from safetensors.torch import load_file
from torch.testing import assert_close

TOL = {"atol": 1e-4, "rtol": 1e-4}
DEPTH = 2

CASES = [
    ("EVA02-B-16", "open_clip_model.safetensors"),
    ("EVA01-g-14", "open_clip_pytorch_model.bin"),
    ("EVA02-L-14-336", "open_clip_model.safetensors"),
    ("EVA02-E-14", "open_clip_model.safetensors"),
    ("PE-Core-T-16-384", "open_clip_model.safetensors"),
]
ROPE = ("EVA02-B-16", "EVA02-L-14-336", "PE-Core-T-16-384")
SEPARATE_QKV = ("EVA02-B-16", "EVA02-L-14-336")  # (the others: one fused qkv)
PE = ("PE-Core-T-16-384",)
# timm arguments (and our vision overrides) that also cut a tower's width
NARROW = {
    "EVA02-E-14": ({"embed_dim": 448, "num_heads": 4}, {"width": 448, "head_width": 112}),
}


def _open_clip_config(name: str) -> dict:
    cfg = copy.deepcopy(open_clip.get_model_config(name))
    cfg.pop("custom_text")
    cfg["text_cfg"].update(layers=DEPTH, vocab_size=SMALL_VOCAB)
    return cfg


def _open_clip_eva(name: str, custom_text: bool = True) -> torch.nn.Module:
    """open_clip's model for ``name`` with DEPTH blocks per tower, norms and biases
    perturbed (so a swapped or missing one cannot hide), in eval mode."""
    cfg = _open_clip_config(name)
    model_cls = open_clip.model.CustomTextCLIP if custom_text else open_clip.model.CLIP
    with pytest.MonkeyPatch.context() as mp, torch.random.fork_rng():
        narrow = NARROW.get(name, ({}, {}))[0]
        shrunk = functools.partial(timm.create_model, depth=DEPTH, **narrow)
        mp.setattr(timm, "create_model", shrunk)
        torch.manual_seed(0)
        ref = model_cls(**cfg)
    with torch.no_grad():
        for p in ref.parameters():
            if p.ndim <= 1:
                p.add_(torch.randn_like(p) * 0.05)
        head = ref.visual.trunk.head.weight  # timm's init (std 0.02): embeddings ~0.1
        head.normal_(std=head.shape[1] ** -0.5)  # open_clip's projection init: ~1
    return ref.eval()


def _normalize(x: torch.Tensor) -> torch.Tensor:
    return F.normalize(x, dim=-1)


OVERRIDES = {"vision": {"layers": DEPTH}, "text": {"layers": DEPTH, "vocab_size": SMALL_VOCAB}}


def _overrides(name: str) -> dict:
    vision = {**OVERRIDES["vision"], **NARROW.get(name, ({}, {}))[1]}
    return {**OVERRIDES, "vision": vision}


@pytest.fixture(scope="module")
def reference():
    """``reference(name)``: ``_open_clip_eva(name)``, built once in this module (read only)."""
    return memoized(_open_clip_eva)


@pytest.mark.parametrize(("name", "filename"), CASES)
def test_open_clip_eva_checkpoint_files(tmp_path, reference, name, filename, h):
    ref = reference(name)
    images, tokens = h.open_clip_inputs(ref, name, SMALL_VOCAB)
    with torch.no_grad():
        ref_image, ref_text = ref.encode_image(images), ref.encode_text(tokens)
        # open_clip's get_logits, from the embeddings above
        ref_logits = ref.logit_scale.exp() * _normalize(ref_image) @ _normalize(ref_text).T
    assert not torch.allclose(ref_image[0], ref_image[1])  # the images tell apart
    sd = ref.state_dict()
    assert "visual.trunk.head.bias" in sd  # timm's classifier is the projection
    separate = name in SEPARATE_QKV
    assert ("visual.trunk.blocks.0.attn.k_proj.weight" in sd) == separate  # else a fused qkv
    assert ("visual.trunk.blocks.0.attn.qkv.bias" in sd) == (name in PE)  # AttentionRope's
    assert ("visual.trunk.attn_pool.latent" in sd) == (name in PE)
    path = h.save_checkpoint(sd, tmp_path / filename)
    ours = create_model(name, pretrained=path, **_overrides(name))
    v = ours.config.vision
    assert (v.proj_type, v.eva["rope"], v.eva["qkv_fused"]) == ("head", name in ROPE, not separate)
    assert v.eva["post_norm"] == (name == "EVA02-E-14")
    assert (v.pool_type, v.eva["rope_grid_indexing"]) == (("map", "xy") if name in PE else
                                                          ("tok", "ij"))  # fmt: skip
    # open_clip's vision_cfg of the shrunk tower (timm_model_args) reads back the same
    assert CLIPConfig.from_open_clip(ours.config.to_open_clip()) == ours.config
    with torch.no_grad():
        image, text = ours.encode_image(images), ours.encode_text(tokens)
        per_image = ours.logits(_normalize(image), _normalize(text))[0]  # as forward does
    assert_close(image, ref_image, **TOL)
    assert_close(text, ref_text, **TOL)
    assert_close(per_image, ref_logits, **TOL)
    fast_inference.disable(ours)  # the plain modules give the same
    with torch.no_grad():
        assert_close(ours.encode_image(images), ref_image, **TOL)
    # back to open_clip's (CLIP-layout) names: every tensor as open_clip has it, the zero
    # key bias our fused qkv carries left out
    back = to_open_clip(ours.state_dict(), v)
    want = {(k[5:] if k.startswith("text.") else k): t for k, t in sd.items()}
    assert back.keys() == want.keys()
    assert all(torch.equal(back[k], t) for k, t in want.items())


def test_eva_save_pretrained_round_trips_and_loads_in_open_clip(tmp_path, reference, h):
    """save_pretrained writes open_clip's layout with timm Eva's block names; the shrunk
    tower's timm arguments go to ``timm_model_args`` (attn_clip reads them back exactly;
    open_clip, given the same depth, loads the weights)."""
    ref = reference("EVA02-B-16")
    path = h.save_checkpoint(ref.state_dict(), tmp_path / "w.safetensors")
    ours = create_model("EVA02-B-16", pretrained=path, **OVERRIDES)
    save_pretrained(ours, tmp_path / "saved")
    back = create_model(str(tmp_path / "saved"))
    assert back.config == ours.config
    for k, t in ours.state_dict().items():
        assert torch.equal(back.state_dict()[k], t), k
    vision_cfg = ours.config.to_open_clip()["vision_cfg"]
    assert vision_cfg["timm_proj"] is None and vision_cfg["timm_model_args"]["depth"] == DEPTH
    twin = _open_clip_eva("EVA02-B-16", custom_text=False)
    twin.load_state_dict(load_file(str(tmp_path / "saved" / "open_clip_model.safetensors")))
    images, tokens = h.open_clip_inputs(ref, "EVA02-B-16", SMALL_VOCAB)
    with torch.no_grad():
        assert_close(twin.encode_image(images), ref.encode_image(images), **TOL)
        assert_close(twin.encode_text(tokens), ref.encode_text(tokens), **TOL)


def test_eva_configs_and_refusals():
    """The EVA towers come from attn_vision's timm Eva presets (EVA02-E's with timm's
    post-norm blocks, which take no layer scale); what they cannot be is named."""
    b16 = get_model_config("EVA02-B-16")
    v = b16.vision
    assert (v.act, v.mlp_ratio * v.width, v.eva["rope_ref_grid"]) == ("swiglu", 2048, (16, 16))
    assert (v.eva["attn_inner_norm"], v.eva["mlp_inner_norm"], v.eva["qkv_fused"]) == (
        True, True, False,
    )  # fmt: skip
    assert b16.with_act(True).vision == v  # open_clip's quick_gelu leaves timm towers alone
    g14 = get_model_config("EVA01-g-14-plus")
    assert (g14.vision.width, g14.vision.layers, g14.text.width, g14.text.layers) == (
        1408, 40, 1024, 24,
    )  # fmt: skip
    e14 = get_model_config("EVA02-E-14-plus")
    assert (e14.vision.width, e14.vision.layers, e14.vision.eva["post_norm"]) == (1792, 64, True)
    assert (e14.vision.pool_type, e14.vision.ls_init_value, e14.text.width) == ("tok", None, 1280)
    cfg = open_clip.get_model_config("EVA02-E-14")
    ls = {**cfg, "vision_cfg": {**cfg["vision_cfg"], "timm_model_args": {"init_values": 0.1}}}
    assert CLIPConfig.from_open_clip(ls).vision.ls_init_value is None  # (timm ignores it too)
    cfg = open_clip.get_model_config("EVA02-B-16")
    for key, value, match in [
        ("timm_proj", "mlp", "timm_proj='mlp'"),
        ("timm_pool", "max", "timm_pool='max'"),
        ("timm_model_args", {"depth": 2, "qk_norm": True}, "qk_norm=True"),
    ]:
        bad = {**cfg, "vision_cfg": {**cfg["vision_cfg"], key: value}}
        with pytest.raises(ValueError, match=match):
            CLIPConfig.from_open_clip(bad)
    with pytest.raises(ValueError, match="need a timm_model_name"):
        type(v)(eva={"rope": True})
    with pytest.raises(ValueError, match="swiglu.*EVA towers"):
        type(v)(act="swiglu")


def test_incomplete_eva_block_is_named(tmp_path, reference, h):
    ref = reference("EVA02-B-16")
    sd = dict(ref.state_dict())
    del sd["visual.trunk.blocks.1.attn.k_proj.weight"]
    path = h.save_checkpoint(sd, tmp_path / "w.bin")
    with pytest.raises(ValueError, match=r"blocks\.1\.attn\.k_proj\.weight"):
        create_model("EVA02-B-16", pretrained=path, **OVERRIDES)
