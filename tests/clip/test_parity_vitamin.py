"""ViTamin CLIP parity: random-init open_clip ViTamin models (a timm ``vitamin_*`` tower --
a ViT on a conv stem with GeGLU MLPs -- pooled by timm, projected by open_clip's bias-free
``head.proj``; open_clip's text tower under ``text.``) saved in open_clip's on-disk formats,
loaded through ``create_model``, fp32 image and text embeddings and logits equal at 1e-4.

Full width, the ViT cut to ``DEPTH`` blocks (timm's ``depth`` through its ``create_model``),
the text tower to ``DEPTH`` blocks, its vocabulary to ``SMALL_VOCAB`` rows (captions folded
into it, end-of-text last); each reference is built once per module and only read.
ViTamin-S: a learned position embedding at 224 px; ViTamin-XL-384: no position embedding,
and open_clip feeds its 384 px trunk 256 px images. The names and shapes of every config at
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
from safetensors.torch import load_file
from torch.testing import assert_close

TOL = {"atol": 1e-4, "rtol": 1e-4}
DEPTH = 2


def _normalize(x: torch.Tensor) -> torch.Tensor:
    return F.normalize(x, dim=-1)


OVERRIDES = {"vision": {"layers": DEPTH}, "text": {"layers": DEPTH, "vocab_size": SMALL_VOCAB}}

CASES = [
    ("ViTamin-S", "open_clip_pytorch_model.bin"),
    ("ViTamin-XL-384", "open_clip_model.safetensors"),
]


def _open_clip_vitamin(name: str, custom_text: bool = True) -> torch.nn.Module:
    """open_clip's model for ``name`` with DEPTH blocks per tower, norms and biases
    perturbed (so a swapped or missing one cannot hide), in eval mode."""
    cfg = copy.deepcopy(open_clip.get_model_config(name))
    cfg.pop("custom_text")
    cfg["text_cfg"].update(layers=DEPTH, vocab_size=SMALL_VOCAB)
    model_cls = open_clip.model.CustomTextCLIP if custom_text else open_clip.model.CLIP
    with pytest.MonkeyPatch.context() as mp, torch.random.fork_rng():
        mp.setattr(timm, "create_model", functools.partial(timm.create_model, depth=DEPTH))
        torch.manual_seed(0)
        ref = model_cls(**cfg)
    with torch.no_grad():
        for p in ref.parameters():
            if p.ndim <= 1:
                p.add_(torch.randn_like(p) * 0.05)
    return ref.eval()


@pytest.fixture(scope="module")
def reference():
    """``reference(name)``: ``_open_clip_vitamin(name)``, built once in this module (read only)."""
    return memoized(_open_clip_vitamin)


@pytest.mark.parametrize(("name", "filename"), CASES)
def test_open_clip_vitamin_checkpoint_files(tmp_path, reference, name, filename, h):
    ref = reference(name)
    images, tokens = h.open_clip_inputs(ref, "ViTamin-S", SMALL_VOCAB)
    with torch.no_grad():
        ref_image, ref_text = ref.encode_image(images), ref.encode_text(tokens)
        # open_clip's get_logits, from the embeddings above
        ref_logits = ref.logit_scale.exp() * _normalize(ref_image) @ _normalize(ref_text).T
    assert not torch.allclose(ref_image[0], ref_image[1])  # the images tell apart
    sd = ref.state_dict()
    assert "visual.head.proj.weight" in sd and "visual.head.proj.bias" not in sd
    assert ("visual.trunk.pos_embed" in sd) == (name == "ViTamin-S")
    path = h.save_checkpoint(sd, tmp_path / filename)
    ours = create_model(name, pretrained=path, **OVERRIDES)
    assert ours.config.vision.vitamin is not None
    with torch.no_grad():
        image, text = ours.encode_image(images), ours.encode_text(tokens)
        per_image = ours.logits(_normalize(image), _normalize(text))[0]  # as forward does
    assert_close(image, ref_image, **TOL)
    assert_close(text, ref_text, **TOL)
    assert_close(per_image, ref_logits, **TOL)
    # back to open_clip's (CLIP-layout) names: every tensor as open_clip has it
    back = to_open_clip(ours.state_dict(), ours.config.vision)
    want = {(k[5:] if k.startswith("text.") else k): t for k, t in sd.items()}
    assert back.keys() == want.keys()
    assert all(torch.equal(back[k], t) for k, t in want.items())


def test_vitamin_save_pretrained_round_trips_and_loads_in_open_clip(tmp_path, reference, h):
    """save_pretrained writes open_clip's layout; the shrunk tower's timm arguments go to
    ``timm_model_args`` (attn_clip reads them back exactly; open_clip, given the same
    depth, loads the weights)."""
    ref = reference("ViTamin-S")
    path = h.save_checkpoint(ref.state_dict(), tmp_path / "w.safetensors")
    ours = create_model("ViTamin-S", pretrained=path, **OVERRIDES)
    save_pretrained(ours, tmp_path / "saved")
    back = create_model(str(tmp_path / "saved"))
    assert back.config == ours.config
    for k, t in ours.state_dict().items():
        assert torch.equal(back.state_dict()[k], t), k
    vision_cfg = ours.config.to_open_clip()["vision_cfg"]
    assert vision_cfg["timm_proj"] == "linear" and vision_cfg["timm_model_args"]["depth"] == DEPTH
    assert "timm_model_args" not in get_model_config("ViTamin-S").to_open_clip()["vision_cfg"]
    twin = _open_clip_vitamin("ViTamin-S", custom_text=False)
    twin.load_state_dict(load_file(str(tmp_path / "saved" / "open_clip_model.safetensors")))
    images, tokens = h.open_clip_inputs(ref, "ViTamin-S", SMALL_VOCAB)
    with torch.no_grad():
        assert_close(twin.encode_image(images), ref.encode_image(images), **TOL)
        assert_close(twin.encode_text(tokens), ref.encode_text(tokens), **TOL)


def test_vitamin_configs_and_refusals():
    """The towers come from the shipped timm_vitamin table; what open_clip would build
    otherwise (another projection, a patch size) is refused by name."""
    s = get_model_config("ViTamin-S").vision
    assert (s.width, s.layers, s.heads, s.mlp_ratio, s.pool_type) == (384, 14, 6, 2.0, "avg")
    assert s.vitamin == {
        "stem_width": 64, "conv_dims": (64, 128), "conv_depths": (2, 4), "pos_embed": "learn",
    }  # fmt: skip
    assert (s.class_token, s.final_ln_after_pool, s.proj_type) == (False, True, "linear")
    xl = get_model_config("ViTamin-XL-384").vision
    assert (xl.image_size, xl.vitamin["pos_embed"]) == (256, "none")  # open_clip's size
    assert get_model_config("ViTamin-L2-336").vision.image_size == 336
    cfg = open_clip.get_model_config("ViTamin-S")
    for key, value, match in [
        ("timm_proj", "mlp", "timm_proj='mlp'"),
        ("timm_proj_bias", True, "timm_proj_bias=True"),
        ("image_size", 256, "img_size=.*image_size is 256"),  # a learned position embedding
        ("timm_model_args", {"depth": 2, "patch_size": 8}, "patch_size=8"),
    ]:
        bad = {**cfg, "vision_cfg": {**cfg["vision_cfg"], key: value}}
        with pytest.raises(ValueError, match=match):
            CLIPConfig.from_open_clip(bad)
    with pytest.raises(ValueError, match="needs a timm_model_name"):
        type(s)(vitamin={})
