"""create_model / create_model_and_transforms / save_pretrained end to end (no network)."""

from __future__ import annotations

import numpy as np
import open_clip
import pytest
import torch
from attn_clip import (
    CLIPConfig,
    Tokenizer,
    create_model,
    create_model_and_transforms,
    save_pretrained,
)
from attn_clip import registry as registry_module
from attn_core.hub import CheckpointError, WeightsUnavailableError
from PIL import Image
from safetensors.torch import save_file
from torch.testing import assert_close

TOL = {"atol": 1e-4, "rtol": 1e-4}
NAME, TAG, REPO = "attn-test-tiny", "fake_tag", "attn-test/tiny-clip"


@pytest.fixture
def tiny_registry(h, monkeypatch, tmp_path, fake_hub_cache):
    """Register a tiny architecture + tag in attn_clip's copy of open_clip's registry and its
    weights in a fake hub cache, so create_model(NAME, pretrained=TAG) runs the real lookup
    path offline."""
    table = registry_module._table()
    monkeypatch.setitem(table["models"], NAME, h.oc_cfg(quick_gelu=False))
    tag_cfg = {
        "hf_hub": f"{REPO}/", "url": "", "quick_gelu": True, "mean": (0.5, 0.5, 0.5),
        "std": (0.5, 0.5, 0.5), "interpolation": "bilinear", "resize_mode": "squash",
    }  # fmt: skip
    monkeypatch.setitem(table["pretrained"], NAME, {TAG: tag_cfg})
    ref = h.make_open_clip(h.oc_cfg(quick_gelu=True))  # trained "with QuickGELU"
    sd = {k: v.contiguous() for k, v in ref.state_dict().items()}
    path = tmp_path / "weights.safetensors"
    save_file(sd, str(path))
    fake_hub_cache(tmp_path / "hub", REPO, {"open_clip_model.safetensors": path.read_bytes()})
    yield ref, tmp_path / "hub"


def test_create_from_tag_offline_cache(tiny_registry, tiny_images, tiny_tokens):
    ref, cache = tiny_registry
    model = create_model(NAME, pretrained=TAG, cache_dir=cache, local_files_only=True)
    assert model.config.quick_gelu  # the tag says QuickGELU although the config says GELU
    pre = model.preprocess_cfg
    assert (pre.resize_mode, pre.interpolation, pre.mean) == ("squash", "bilinear", (0.5,) * 3)
    with torch.no_grad():
        assert_close(model.encode_image(tiny_images), ref.encode_image(tiny_images), **TOL)
        assert_close(model.encode_text(tiny_tokens), ref.encode_text(tiny_tokens), **TOL)
    with pytest.raises(ValueError, match="contradicts the weights.*QuickGELU"):
        create_model(NAME, TAG, cache_dir=cache, local_files_only=True, quick_gelu=False)
    with pytest.raises(WeightsUnavailableError, match=REPO):
        create_model(NAME, TAG, cache_dir=cache.parent / "empty", local_files_only=True)


def test_create_model_and_transforms(tiny_registry):
    _, cache = tiny_registry
    model, preprocess, tokenizer = create_model_and_transforms(
        NAME, TAG, cache_dir=cache, local_files_only=True
    )
    image = Image.fromarray(np.random.randint(0, 255, (50, 70, 3), dtype=np.uint8))
    x = preprocess(image)
    assert x.shape == (3, 32, 32) and x.dtype == torch.float32
    assert isinstance(tokenizer, Tokenizer) and tokenizer.context_length == 20
    out = model(x[None], tokenizer(["a photo", "a drawing"]))
    assert out.logits_per_image.shape == (1, 2)


def test_unknown_names_and_tags(h, tmp_path):
    with pytest.raises(ValueError, match="unknown model"):
        create_model("ViT-Q-99")
    with pytest.raises(ValueError, match="neither an existing file.*laion2b_s34b_b79k"):
        create_model("ViT-B-32", pretrained="laion9b")
    (tmp_path / "ViT-B-32.pt").write_bytes(b"")
    with pytest.raises(ValueError, match="is a file.*pretrained="):
        create_model(str(tmp_path / "ViT-B-32.pt"))
    with pytest.raises(ValueError, match="precision"):
        create_model(CLIPConfig.from_open_clip(h.oc_cfg()), precision="fp8")


def test_hf_hub_name_offline_error(tmp_path):
    with pytest.raises(WeightsUnavailableError) as err:
        create_model(
            "hf-hub:openai/clip-vit-base-patch32", cache_dir=tmp_path, local_files_only=True
        )
    assert "openai/clip-vit-base-patch32" in str(err.value) and str(tmp_path) in str(err.value)


def test_save_pretrained_round_trip_with_open_clip(h, tmp_path, tiny_images, tiny_tokens):
    cfg = h.oc_cfg(quick_gelu=True, vision_cfg={"ls_init_value": 0.3})
    model = create_model(CLIPConfig.from_open_clip(cfg))
    h.perturb_(model)
    model.preprocess_cfg.resize_mode = "longest"
    out_dir = save_pretrained(model, tmp_path / "saved")
    assert sorted(p.name for p in out_dir.iterdir()) == [
        "open_clip_config.json",
        "open_clip_model.safetensors",
    ]
    with torch.no_grad():
        expected_image = model.encode_image(tiny_images)
        expected_text = model.encode_text(tiny_tokens)
        for loaded in (create_model(f"local-dir:{out_dir}"), create_model(str(out_dir))):
            assert loaded.config == model.config
            assert loaded.preprocess_cfg == model.preprocess_cfg
            assert_close(loaded.encode_image(tiny_images), expected_image, **TOL)
        ref = open_clip.create_model(f"local-dir:{out_dir}").eval()  # open_clip reads it too
        assert_close(ref.encode_image(tiny_images), expected_image, **TOL)
        assert_close(ref.encode_text(tiny_tokens), expected_text, **TOL)
    with pytest.raises(ValueError, match="brings its own weights"):
        create_model(str(out_dir), pretrained="x")
    fresh = create_model(str(out_dir), pretrained=False)  # the architecture only
    assert fresh.config == model.config and not fresh.training
    assert not torch.equal(fresh.logit_scale, model.logit_scale)
    wider = create_model(str(out_dir), pretrained=False, vision={"image_size": 48})
    assert wider.config.vision.image_size == 48
    with pytest.raises(CheckpointError, match="shape mismatches: visual.trunk.pos_embed"):
        create_model(str(out_dir), vision={"image_size": 48})  # weights for another size
    with pytest.raises(ValueError, match="unknown CLIP config override.*vision.patchsize"):
        create_model("demo-shapes", vision={"patchsize": 4})


@pytest.mark.parametrize(
    ("precision", "dtype"),
    [("fp16", torch.float16), ("bf16", torch.bfloat16), ("amp", torch.float32)],
)
def test_precision(h, precision, dtype):
    model = create_model(CLIPConfig.from_open_clip(h.oc_cfg()), precision=precision)
    assert {p.dtype for p in model.parameters()} == {dtype}
