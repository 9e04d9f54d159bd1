"""Retrieval with an image-only backbone (attn_clip.retrieval.backbone): which library a model
name belongs to, an index of a tiny DINOv2-style attn_vision model (its embeddings are the
[CLS] token after the final norm, L2-normalized), search by image, the recorded kind and
probe (changed weights refused), --update keeping unchanged rows, text refused."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from _support.retrieval import GALLERY, make_gallery
from attn_clip.retrieval import (
    IndexFormatError,
    IndexModel,
    ModelMismatchError,
    ModelRecord,
    RetrievalError,
    RetrievalIndex,
    model_kind,
)
from PIL import Image


def tiny_dinov2():
    """timm's DINOv2 ViT-S/14, 1 block of 2 x 16-channel heads at 28 px (2 x 2 patches);
    layer scales at 1 so that the block moves the [CLS] token (DINOv2's 1e-5 would not)."""
    import attn_vision

    return attn_vision.create_model("vit_small_patch14_dinov2", img_size=28, depth=1,
                                    embed_dim=32, num_heads=2, init_values=1.0)  # fmt: skip


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(backbone folder, its model, gallery of 6 shapes, index built from Python)."""
    import attn_vision

    tmp = tmp_path_factory.mktemp("image_only")
    model = tiny_dinov2()
    folder = attn_vision.save_pretrained(model, tmp / "dino")
    gallery = make_gallery(tmp / "gallery", GALLERY[:6])
    index = RetrievalIndex.create(tmp / "photos.idx", str(folder), device="cpu")
    result = index.update(gallery, progress=False, workers=0)
    assert result.counts["added"] == 6 and len(index) == 6
    return folder, model, gallery, tmp / "photos.idx"


def test_which_library_a_name_belongs_to(built, tmp_path, monkeypatch, fake_hub_cache):
    folder = built[0]
    assert model_kind(str(folder)) == model_kind(f"local-dir:{folder}") == "vision"
    for files, kind in [
        ({"config.json": {"model_type": "dinov2", "hidden_size": 384}}, "vision"),
        ({"config.json": {"model_type": "vit"}}, "vision"),
        ({"config.json": {"model_type": "clip"}}, "clip"),
        ({"config.json": {"model_type": "siglip2"}}, "clip"),
        ({"open_clip_config.json": {}, "config.json": {"model_type": "clip"}}, "clip"),
        ({"open_clip_config.json": {}}, "clip"),
        ({"model.safetensors": {}}, "clip"),  # no config: attn_clip says what is missing
    ]:
        d = tmp_path / f"f{len(list(tmp_path.iterdir()))}"
        d.mkdir()
        for name, data in files.items():
            (d / name).write_text(json.dumps(data))
        assert model_kind(d) == kind, files
    # names: attn_clip's first (open_clip's convnext_base is a CLIP), then timm's
    assert model_kind("demo-shapes") == model_kind("ViT-B-32") == "clip"
    assert model_kind("convnext_base") == "clip"
    assert model_kind("convnext_base.fb_in1k") == "vision"
    assert model_kind("vit_small_patch14_dinov2") == "vision"
    assert model_kind("no-such-model") == "clip"  # attn_clip's error names close matches
    # hf-hub: the repo's config files, from the cache (offline)
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    cache = tmp_path / "hub"
    fake_hub_cache(cache, "facebook/dinov2-small", {"config.json": b'{"model_type": "dinov2"}'})
    fake_hub_cache(cache, "laion/some-clip", {"open_clip_config.json": b"{}"})
    assert model_kind("hf-hub:facebook/dinov2-small", cache_dir=cache) == "vision"
    assert model_kind("hf-hub:laion/some-clip", cache_dir=cache) == "clip"
    assert model_kind("hf-hub:not/cached", cache_dir=cache) == "clip"  # attn_clip's error


def test_embeddings_are_the_normalized_cls_token_and_search_finds_the_query(built):
    import attn_vision
    from attn_clip.retrieval import load_index_set

    folder, model, gallery, base = built
    manifest, embeddings = load_index_set(base)
    assert manifest.model.kind == "vision" and manifest.model.embed_dim == 32
    assert manifest.model.name == str(folder) and manifest.model.pretrained is None
    transform = attn_vision.create_transform(model)
    paths = [gallery / rel for rel in embeddings.ids]
    x = torch.stack([transform(Image.open(p).convert("RGB")) for p in paths])
    with torch.no_grad():
        cls = model.eval().forward_features(x)[:, 0]  # [CLS] after the final norm
    torch.testing.assert_close(embeddings.embeddings, F.normalize(cls, dim=-1))
    index = RetrievalIndex.open(base, device="cpu")  # the model is rebuilt from the record
    for path, hits in zip(paths, index.search_many(paths, k=2), strict=True):
        assert hits[0].path == path and hits[0].score == pytest.approx(1.0, abs=1e-5)
        assert hits[1].score < 0.9999 and hits[0].prob is None
    assert index.model.kind == "vision" and index.model.tokenizer is None


def test_update_keeps_unchanged_rows(built, tmp_path):
    _, _, gallery, base = built
    index = RetrievalIndex.open(base, device="cpu")
    result = index.update(gallery, progress=False, workers=0)
    assert result.counts["unchanged"] == 6 and result.counts["added"] == 0
    assert result.manifest.generation == 2 and result.manifest.model.kind == "vision"


def test_text_is_refused_and_other_weights_too(built, tmp_path):
    from attn_clip.retrieval import evaluate_captions

    folder, _, gallery, base = built
    index = RetrievalIndex.open(base, device="cpu")
    with pytest.raises(RetrievalError, match=r"has no text tower: search it by image"):
        index.search("a red circle")  # refused from the record: no model built
    assert index._model is None
    loaded = index.model
    with pytest.raises(RetrievalError, match="has no text tower"):
        loaded.embed_texts(["a red circle"])
    with pytest.raises(RetrievalError, match="recall@k ranks captions"):
        evaluate_captions(loaded, [(next(gallery.rglob("*.png")), "a red circle")])
    other = IndexModel(tiny_dinov2().eval(), loaded.preprocess, None, str(folder), None,
                       torch.device("cpu"), kind="vision")  # fmt: skip
    with pytest.raises(ModelMismatchError, match="not the ones this index was built with"):
        index.model = other  # same name, other weights: their probe embedding differs
    with pytest.raises(ModelMismatchError, match="loads as a clip model"):
        index.record.check(SimpleNamespace(kind="clip"))
    with pytest.raises(ValueError, match="kind must be one of"):
        IndexModel(None, None, None, "x", None, torch.device("cpu"), kind="text")


def test_the_record_keeps_a_clip_entry_as_it_was():
    clip = ModelRecord("ViT-B-32", "openai", 2, [1.0, 0.0], "fp32")
    assert "kind" not in clip.to_json() and clip.has_text
    vision = ModelRecord("/m", None, 2, [1.0, 0.0], "fp32", "vision")
    entry = vision.to_json()
    assert entry["kind"] == "vision" and ModelRecord.from_json(entry, "m") == vision
    assert not vision.has_text
    with pytest.raises(IndexFormatError, match=r"model.kind 'audio'"):
        ModelRecord.from_json({**entry, "kind": "audio"}, "m")
