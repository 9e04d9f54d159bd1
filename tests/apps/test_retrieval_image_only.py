"""apps/retrieval.py with an image-only backbone: a tiny random transformers Dinov2Model
folder, and the same files as ``hf-hub:facebook/dinov2-small`` in a hub cache (offline).
The index's embeddings are transformers' ``pooler_output`` (the [CLS] token after the final
layernorm) through its image processor, L2-normalized; ``search --image`` finds each image;
``--text`` and ``eval`` are one line and exit 2; the index refuses another model, and the
same name whose weights changed."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import retrieval
import torch
import torch.nn.functional as F
from _support.retrieval import GALLERY, call, make_gallery, one_line_error
from PIL import Image

HUB_ID = "facebook/dinov2-small"


def tiny_dinov2(seed: int):
    """transformers' Dinov2Model, 1 block of 2 x 16-channel heads at 28 px (2 x 2 patches);
    layer scales at 1 (DINOv2's init of 1.0 at this width: the block moves the [CLS] token)."""
    from transformers import Dinov2Config, Dinov2Model

    torch.manual_seed(seed)
    config = Dinov2Config(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, mlp_ratio=2,
                          image_size=28, patch_size=14, layerscale_value=1.0)  # fmt: skip
    return Dinov2Model(config).eval()


@pytest.fixture(scope="module")
def dino(tmp_path_factory):
    """(transformers model, its processor, its folder, a 6-shape gallery, the app's index)."""
    from transformers import BitImageProcessorPil

    tmp = tmp_path_factory.mktemp("retrieval_dino")
    model, folder = tiny_dinov2(seed=0), tmp / "dinov2"
    # facebook/dinov2-small's preprocessor_config.json, at 32 / 28 px instead of 256 / 224
    processor = BitImageProcessorPil(size={"shortest_edge": 32}, resample=3,
                                     crop_size={"height": 28, "width": 28},
                                     image_mean=[0.485, 0.456, 0.406],
                                     image_std=[0.229, 0.224, 0.225])  # fmt: skip
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    gallery = make_gallery(tmp / "gallery", GALLERY[:6])
    index = tmp / "dino.idx"
    result = call(retrieval.main, "index", gallery, "--out", index, "--model", folder, "--json")
    assert result.code == 0, result.err
    assert json.loads(result.out)["added"] == 6
    return model, processor, folder, gallery, index


def test_embeddings_are_transformers_pooler_output(dino):
    from attn_clip.retrieval import load_index_set

    model, processor, folder, gallery, index = dino
    manifest, found = load_index_set(index)
    assert manifest.model.kind == "vision" and manifest.model.name == str(folder)
    images = [Image.open(gallery / rel).convert("RGB") for rel in found.ids]
    with torch.no_grad():
        pooled = model(**processor(images, return_tensors="pt")).pooler_output
    torch.testing.assert_close(found.embeddings, F.normalize(pooled, dim=-1), atol=1e-5, rtol=0)


def test_search_by_image_finds_each_image(dino):
    gallery, index = dino[3], dino[4]
    queries = sorted(gallery.rglob("*.png"))
    argv = ["search", index, "--top-k", "2", "--json"]
    result = call(retrieval.main, *argv, *(a for q in queries for a in ("--image", q)))
    assert result.code == 0, result.err
    rows = [json.loads(line) for line in result.out.splitlines()]
    assert [r["type"] for r in rows] == ["image"] * len(queries)
    for query, row in zip(queries, rows, strict=True):
        best, second = row["hits"]
        assert Path(best["path"]).name == query.name and best["score"] == pytest.approx(1, abs=1e-5)
        assert second["score"] < 0.9999


def test_text_and_eval_are_one_line_and_2(dino, tmp_path):
    folder, gallery, index = dino[2], dino[3], dino[4]
    image = next(gallery.rglob("*.png"))
    with open(tmp_path / "captions.csv", "w", newline="") as f:
        csv.writer(f).writerows([("filepath", "title"), (image, "a red circle")])
    for argv, needle in [
        (["search", index, "--text", "a red circle"], "has no text tower: search with --image"),
        (["search", index, "--text", "a dog", "--image", image], "has no text tower"),
        (["eval", "--csv", tmp_path / "captions.csv", "--index", index], "ranks captions"),
        (["eval", "--csv", tmp_path / "captions.csv", "--model", folder], "has no text tower"),
    ]:
        result = call(retrieval.main, *argv)
        assert result.code == 2, argv
        one_line_error(result.err, needle)


def test_hf_hub_id_offline_and_the_index_refuses_other_weights(dino, tmp_path, monkeypatch,
                                                               fake_hub_cache):  # fmt: skip
    """``--model hf-hub:facebook/dinov2-small`` from the cache gives the folder's embeddings;
    the index records the backbone: another --model is refused, and so are changed weights
    under the same hub id; an uncached id is one line that names it, the cache and the
    folder to pass instead."""
    from attn_clip.retrieval import load_index_set
    from huggingface_hub import constants

    _, _, folder, gallery, folder_index = dino
    cache = tmp_path / "hub"
    fake_hub_cache(cache, HUB_ID, {p.name: p.read_bytes() for p in folder.iterdir()})
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    index = tmp_path / "hub.idx"
    result = call(retrieval.main, "index", gallery, "--out", index, "--model", f"hf-hub:{HUB_ID}")
    assert result.code == 0, result.err
    manifest, found = load_index_set(index)
    assert manifest.model.name == f"hf-hub:{HUB_ID}" and manifest.model.kind == "vision"
    torch.testing.assert_close(found.embeddings, load_index_set(folder_index)[1].embeddings)
    image = next(gallery.rglob("*.png"))
    assert call(retrieval.main, "search", index, "--image", image).code == 0

    result = call(retrieval.main, "index", gallery, "--out", index, "--update", "--model", folder)
    assert result.code == 2
    one_line_error(result.err, f"was built with hf-hub:{HUB_ID}, not {folder}")
    other = tmp_path / "other"
    tiny_dinov2(seed=1).save_pretrained(other)
    fake_hub_cache(cache, HUB_ID, {"model.safetensors": (other / "model.safetensors").read_bytes()})
    result = call(retrieval.main, "search", index, "--image", image)
    assert result.code == 2
    one_line_error(result.err, "not the ones this index was built with")
    result = call(retrieval.main, "index", gallery, "--out", tmp_path / "no.idx", "--model",
                  "hf-hub:facebook/not-cached")  # fmt: skip
    assert result.code == 2 and not (tmp_path / "no.idx").exists()
    line = one_line_error(result.err, "facebook/not-cached", str(cache))
    assert line.endswith("pass the local file or folder instead (--model FOLDER)."), line
