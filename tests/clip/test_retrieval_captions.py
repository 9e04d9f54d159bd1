"""Captions in a folder index (``RetrievalIndex.create(..., caption=True)``) with the bundled
``demo-shapes-coca``: each image's kept caption is ``CoCa.caption``'s of its preprocessed
image and its embedding ``encode_image``'s (one pass); hits, the clip-retrieval export and
the server carry it; an update captions only new files and keeps the others'; a model that
is no CoCa, shards, or an update asking captions of an index built without them are refused
before anything is written; a manifest's non-string caption is an ``IndexFormatError``."""

from __future__ import annotations

import json

import httpx
import pytest
import torch
from _support.retrieval import GALLERY, make_gallery, rel_name
from attn_clip.retrieval import IndexModel, Manifest, RetrievalIndex
from attn_clip.retrieval.errors import IndexFormatError, RetrievalError
from PIL import Image

ITEMS = [GALLERY[0], GALLERY[3], GALLERY[5], GALLERY[7]]  # a red circle, square, triangle, star


@pytest.fixture(scope="module")
def coca() -> IndexModel:
    return IndexModel.load("demo-shapes-coca", "shapes", device="cpu")


def expected(model: IndexModel, folder, rels: list[str]) -> tuple[list[str], torch.Tensor]:
    """``CoCa.caption`` and the normalized ``encode_image`` of the files, one batch."""
    x = torch.stack([model.preprocess(Image.open(folder / r).convert("RGB")) for r in rels])
    with torch.no_grad():
        return model.model.caption(x), model.model.encode_image(x, normalize=True)


@pytest.fixture(scope="module")
def built(tmp_path_factory, coca):
    tmp = tmp_path_factory.mktemp("captions")
    folder = make_gallery(tmp / "g", ITEMS)
    index = RetrievalIndex.create(tmp / "g.idx", coca, caption=True)
    result = index.update(folder, progress=False, workers=0)
    return folder, index, result


def test_captions_are_the_models_and_the_image_is_encoded_once(built, coca, monkeypatch):
    folder, index, result = built
    assert result.counts["added"] == 4 and result.extra == {"captioned": 4}
    rels = index.embeddings.ids
    captions, emb = expected(coca, folder, rels)
    assert [index.manifest.caption(r) for r in rels] == captions
    assert all(captions) and "circle" in captions[rels.index(rel_name(*ITEMS[0]))]
    torch.testing.assert_close(index.embeddings.embeddings, emb, atol=1e-5, rtol=1e-5)
    data = json.loads(result.manifest_path.read_text())
    assert data["captions"] is True and data["files"][rels[0]]["caption"] == captions[0]
    reopened = RetrievalIndex.open(index.base, coca)
    assert reopened.captions and reopened.manifest.caption(rels[1]) == captions[1]
    hit = reopened.search("a red circle", k=1)[0]
    assert hit.path == folder / hit.id and hit.caption == captions[rels.index(hit.id)]

    calls = []  # one image-tower pass per batch: encode_image_tokens, never visual() again
    real = coca.model.encode_image_tokens
    monkeypatch.setattr(coca.model, "encode_image_tokens", lambda x: calls.append(1) or real(x))
    monkeypatch.setattr(coca.model, "encode_image", lambda *a, **k: pytest.fail("encoded twice"))
    emb2, caps2 = coca.encode_and_caption(
        torch.stack([coca.preprocess(Image.open(folder / rels[0]))])
    )
    assert calls == [1] and caps2 == captions[:1]


def test_export_and_server_carry_the_captions(built, tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    from attn_clip.retrieval.export import export_embeddings
    from attn_clip.retrieval.server import BackgroundServer, make_app

    folder, index, _ = built
    (folder / rel_name(*ITEMS[0])).with_suffix(".txt").write_text("a .txt beside it")
    kept = {r: index.manifest.caption(r) for r in index.embeddings.ids}
    export_embeddings(index.base, tmp_path / "emb")
    rows = pq.read_table(tmp_path / "emb" / "metadata" / "metadata_0.parquet").to_pylist()
    assert {r["key"]: r["caption"] for r in rows} == kept  # the generated ones, not the .txt
    with BackgroundServer(make_app({"g": index.base}, model=index.model)) as server:
        r = httpx.post(f"{server.url}/knn-service", json={"text": "a red circle",
                                                          "num_images": 4}, timeout=60)  # fmt: skip
    assert r.status_code == 200, r.text
    found = r.json()
    assert {x["image_path"]: x["caption"] for x in found} == {
        str(folder / k): c for k, c in kept.items()
    }


def test_an_update_captions_only_new_files_and_keeps_the_others(coca, tmp_path):
    folder = make_gallery(tmp_path / "g", ITEMS[:2])
    index = RetrievalIndex.create(tmp_path / "g.idx", coca, caption=True)
    index.update(folder, progress=False, workers=0)
    before = dict(index.manifest.files)
    make_gallery(folder, ITEMS[2:3])  # a new file
    sizes = []  # the images captioned
    real = coca.model.generate_from_tokens
    coca.model.generate_from_tokens = lambda t, *a, **k: sizes.append(len(t)) or real(t, *a, **k)
    try:
        reopened = RetrievalIndex.open(index.base, coca)  # remembers: no caption=True
        result = reopened.update(folder, progress=False, workers=0)
    finally:
        del coca.model.generate_from_tokens
    assert result.counts["added"] == 1 and result.counts["unchanged"] == 2
    assert result.extra == {"captioned": 1} and sizes == [1]
    new = rel_name(*ITEMS[2])
    assert {r: f for r, f in result.manifest.files.items() if r != new} == before
    assert result.manifest.caption(new) == expected(coca, folder, [new])[0][0]
    assert result.manifest.captions


def test_captions_are_refused_before_anything_is_written(coca, tmp_path):
    folder = make_gallery(tmp_path / "g", ITEMS[:1])
    clip = IndexModel.load("demo-shapes", "shapes", device="cpu")
    with pytest.raises(RetrievalError, match="captions need a CoCa model; demo-shapes"):
        RetrievalIndex.create(tmp_path / "a.idx", clip, caption=True)
    plain = RetrievalIndex.create(tmp_path / "a.idx", clip)
    with pytest.raises(RetrievalError, match="captions need a CoCa model"):
        plain.update(folder, progress=False, workers=0, caption=True)
    assert not list(tmp_path.glob("a.idx*"))
    plain = RetrievalIndex.create(tmp_path / "b.idx", coca)
    plain.update(folder, progress=False, workers=0)  # a CoCa index without captions
    written = {p: p.stat().st_mtime_ns for p in tmp_path.glob("b.idx*")}
    with pytest.raises(RetrievalError, match="built without captions: rebuild it"):
        RetrievalIndex.open(plain.base, coca).update(folder, progress=False, caption=True)
    assert {p: p.stat().st_mtime_ns for p in tmp_path.glob("b.idx*")} == written
    assert not plain.captions and plain.manifest.caption(rel_name(*ITEMS[0])) is None
    shards = RetrievalIndex.create(tmp_path / "s.idx", coca, caption=True)
    (tmp_path / "00000.tar").write_bytes(b"")
    with pytest.raises(RetrievalError, match="webdataset shards keep their own"):
        shards.update(str(tmp_path / "00000.tar"), progress=False)
    assert not list(tmp_path.glob("s.idx*"))


@pytest.mark.parametrize(
    "change, needle",
    [
        ({"caption": 5}, "the caption of 'x.png' is not a string"),
        ({"caption": None}, "the caption of 'x.png' is not a string"),
        ({"captions": "yes"}, "captions 'yes'"),
    ],
)
def test_a_hostile_manifest_caption_is_refused(built, tmp_path, change, needle):
    data = Manifest.read(built[1].base).to_json()
    data["files"] = {"x.png": {"size": 1, "mtime_ns": 0, "sha256": "0" * 64}}
    if "caption" in change:
        data["files"]["x.png"]["caption"] = change["caption"]
    else:
        data.update(change)
    with pytest.raises(IndexFormatError, match=needle):
        Manifest.from_json(json.loads(json.dumps(data)))
    (tmp_path / "h.idx.manifest.json").write_text(json.dumps(data))
    with pytest.raises(IndexFormatError, match="broken manifest"):
        Manifest.read(tmp_path / "h.idx")
