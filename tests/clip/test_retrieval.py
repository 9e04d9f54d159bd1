"""Retrieval: exact chunked top-k, index save/load and corruption errors, recall@k, the
approximate index; RetrievalIndex (docs/clip.md's example, run), version-1 manifests, the
model check."""

from __future__ import annotations

import json
import sys

import pytest
import torch
import torch.nn.functional as F
from attn_clip import EmbeddingIndex, retrieval_metrics


def _index(n: int = 500, d: int = 16) -> tuple[EmbeddingIndex, torch.Tensor]:
    emb = torch.randn(n, d)
    index = EmbeddingIndex(d)
    index.add(emb[:300], ids=[f"img_{i}.png" for i in range(300)])
    index.add(emb[300:])  # default ids: row numbers
    return index, emb


@pytest.mark.parametrize("chunk_size", [7, 64, 100_000])
def test_search_is_exact_top_k(chunk_size):
    index, emb = _index()
    queries = torch.randn(9, 16)
    res = index.search(queries, k=5, chunk_size=chunk_size, use_faiss=False)
    sims = F.normalize(queries, dim=-1) @ F.normalize(emb, dim=-1).T
    best = sims.topk(5, dim=1)
    torch.testing.assert_close(res.scores, best.values)
    assert torch.equal(res.indices, best.indices)
    assert res.ids[0][0] == index.ids[int(best.indices[0, 0])]
    assert index.ids[:2] == ["img_0.png", "img_1.png"] and index.ids[300] == "300"


def test_search_edge_cases():
    index, emb = _index(n=320)
    res = index.search(emb[5], k=1000, use_faiss=False)  # one (D,) query; k > N
    assert res.indices.shape == (1, 320) and res.indices[0, 0] == 5
    with pytest.raises(ValueError, match=r"\(Q, 16\)"):
        index.search(torch.randn(2, 3))
    with pytest.raises(ValueError, match="empty"):
        EmbeddingIndex(4).search(torch.randn(1, 4))
    with pytest.raises(ValueError, match="ids"):
        EmbeddingIndex(4).add(torch.randn(3, 4), ids=["a"])
    with pytest.raises(ValueError, match=r"\(n, 4\)"):
        EmbeddingIndex(4).add(torch.randn(3, 5))


def test_faiss_matches_exact_search():
    pytest.importorskip("faiss")
    index, _ = _index()
    q = torch.randn(4, 16)
    exact = index.search(q, k=5, use_faiss=False)
    fast = index.search(q, k=5, use_faiss=True)
    torch.testing.assert_close(fast.scores, exact.scores, atol=1e-5, rtol=1e-5)
    assert torch.equal(fast.indices, exact.indices)


def test_save_load_round_trip(tmp_path):
    index, _ = _index()
    tensor_path, meta_path = index.save(tmp_path / "gallery")
    assert tensor_path.name == "gallery.safetensors" and meta_path.name == "gallery.json"
    loaded = EmbeddingIndex.load(tmp_path / "gallery.safetensors")
    assert loaded.ids == index.ids and loaded.dim == 16
    assert torch.equal(loaded.embeddings, index.embeddings)
    q = torch.randn(3, 16)
    assert torch.equal(loaded.search(q, 4).indices, index.search(q, 4).indices)


def test_corrupt_or_truncated_index_is_a_clear_error(tmp_path):
    index, _ = _index()
    tensor_path, meta_path = index.save(tmp_path / "idx")
    data = tensor_path.read_bytes()

    tensor_path.write_bytes(data[: len(data) // 2])  # truncated
    with pytest.raises(ValueError, match="corrupt or truncated"):
        EmbeddingIndex.load(tmp_path / "idx")
    with pytest.raises(ValueError, match="corrupt or truncated"):  # without the checksum too
        EmbeddingIndex.load(tmp_path / "idx", verify=False)

    flipped = bytearray(data)
    flipped[-5] ^= 0xFF  # a flipped bit in the tensor data: only the checksum sees it
    tensor_path.write_bytes(bytes(flipped))
    with pytest.raises(ValueError, match="SHA-256"):
        EmbeddingIndex.load(tmp_path / "idx")

    tensor_path.write_bytes(data)
    meta_path.write_text(meta_path.read_text()[:40])  # truncated sidecar
    with pytest.raises(ValueError, match="corrupt embedding index sidecar"):
        EmbeddingIndex.load(tmp_path / "idx")

    meta = json.loads(json.dumps({"format": "attn_clip.EmbeddingIndex", "version": 1}))
    meta.update(dim=16, count=3, ids=["a", "b", "c"], sha256=None)
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="does not match its sidecar"):
        EmbeddingIndex.load(tmp_path / "idx", verify=False)

    meta_path.write_text(json.dumps({"something": "else"}))
    with pytest.raises(ValueError, match="not an attn_clip embedding index"):
        EmbeddingIndex.load(tmp_path / "idx")
    with pytest.raises(FileNotFoundError, match="missing"):
        EmbeddingIndex.load(tmp_path / "nothing_here")


def _brute_force_recall(img, txt, counts, ks):
    owner = [i for i, c in enumerate(counts) for _ in range(c)]
    sims = F.normalize(img, dim=-1) @ F.normalize(txt, dim=-1).T
    out = {}
    for k in ks:
        i2t = [any(owner[j] == i for j in sims[i].argsort(descending=True)[:k].tolist())
               for i in range(len(counts))]  # fmt: skip
        t2i = [
            owner[j] in sims[:, j].argsort(descending=True)[:k].tolist() for j in range(len(owner))
        ]
        out[f"image_to_text_R@{k}"] = sum(i2t) / len(i2t)
        out[f"text_to_image_R@{k}"] = sum(t2i) / len(t2i)
    return out


@pytest.mark.parametrize("counts", [[1] * 40, [5] * 12, [1, 3, 2, 5, 1, 4, 2, 2, 3, 1, 1, 6]])
def test_retrieval_metrics_match_brute_force(counts):
    n_img, n_txt = len(counts), sum(counts)
    img = torch.randn(n_img, 8)
    owner = torch.repeat_interleave(torch.arange(n_img), torch.tensor(counts))
    # noisy captions, so recall is strictly between 0 and 1
    txt = img[owner] + 1.3 * torch.randn(n_txt, 8)
    tpi = counts[0] if len(set(counts)) == 1 else counts
    got = retrieval_metrics(img, txt, tpi, ks=(1, 5, 10), chunk_size=5)
    expected = _brute_force_recall(img, txt, counts, (1, 5, 10))
    assert got == pytest.approx(expected)
    assert 0 < got["text_to_image_R@1"] < 1


def test_retrieval_metrics_perfect_and_errors():
    x = torch.randn(10, 8)
    m = retrieval_metrics(x, x)
    assert m["image_to_text_R@1"] == 1.0 and m["text_to_image_R@1"] == 1.0
    with pytest.raises(ValueError, match="texts_per_image"):
        retrieval_metrics(x, torch.randn(15, 8), texts_per_image=2)


def test_evaluate_retrieval_embeds_pairs_and_scores_recall(h, tiny_images, tiny_tokens):
    from attn_clip import CLIP, CLIPConfig, evaluate_retrieval

    model = h.perturb_(CLIP(CLIPConfig.from_open_clip(h.oc_cfg())))
    images, tokens = tiny_images, tiny_tokens[:3]
    batches = [(images[:2], tokens[:2]), (images[2:], tokens[2:])]
    with torch.no_grad():
        img, txt = model.encode_image(images), model.encode_text(tokens)
    assert evaluate_retrieval(model, batches, ks=(1, 2)) == retrieval_metrics(img, txt, ks=(1, 2))
    assert evaluate_retrieval(model, []) == {}


# -- large collections: memory-mapped embeddings, the approximate (faiss) index ---------------


def _clustered(n: int, d: int, centres: int, spread: float = 0.6, seed: int = 0) -> torch.Tensor:
    """``n`` normalized vectors around ``centres`` fixed centres (``seed``: which points)."""
    c = F.normalize(torch.randn(centres, d, generator=torch.Generator().manual_seed(99)), dim=-1)
    g = torch.Generator().manual_seed(seed)
    x = c[torch.randint(0, centres, (n,), generator=g)]
    return F.normalize(x + spread / d**0.5 * torch.randn(n, d, generator=g), dim=-1)


def _mapped_file(address: int) -> str | None:
    """The file mapped at ``address`` in this process (Linux's /proc/self/maps)."""
    for line in open("/proc/self/maps").read().splitlines():
        span, *rest = line.split(maxsplit=5)
        lo, hi = (int(v, 16) for v in span.split("-"))
        if lo <= address < hi:
            return rest[-1] if len(rest) == 5 else None
    return None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")
def test_load_memory_maps_float32_embeddings(tmp_path):
    index, _ = _index()
    index.save(tmp_path / "idx")
    loaded = EmbeddingIndex.load(tmp_path / "idx")
    mapped = _mapped_file(loaded.embeddings.data_ptr())  # not read into the process
    assert mapped == str(tmp_path / "idx.safetensors"), mapped
    before = (tmp_path / "idx.safetensors").read_bytes()
    loaded.embeddings[0] = 0  # copy-on-write: this process only, never the file
    assert (tmp_path / "idx.safetensors").read_bytes() == before
    assert torch.equal(EmbeddingIndex.load(tmp_path / "idx").embeddings, index.embeddings)


def test_other_dtypes_still_load(tmp_path):
    import hashlib

    from safetensors.torch import save_file

    index, _ = _index(n=400)
    tensor_path, meta_path = index.save(tmp_path / "idx")
    save_file({"embeddings": index.embeddings.half()}, str(tensor_path))
    meta = json.loads(meta_path.read_text())
    meta["sha256"] = hashlib.sha256(tensor_path.read_bytes()).hexdigest()
    meta_path.write_text(json.dumps(meta))
    loaded = EmbeddingIndex.load(tmp_path / "idx")
    assert loaded.embeddings.dtype == torch.float32
    torch.testing.assert_close(loaded.embeddings, index.embeddings, atol=1e-3, rtol=0)


def test_choose_ann_factory_by_size_and_budget():
    from attn_clip.retrieval import choose_ann_factory, ivf_lists

    n, d = 1_000_000, 512
    assert ivf_lists(n) == 4096 and ivf_lists(10_000) == 256 and ivf_lists(100) == 2
    assert choose_ann_factory(n, d, n * d * 4 // 8) == "IVF4096,PQ64x4fs"  # 1/8 of float32
    assert choose_ann_factory(n, d, 40 << 20) == "IVF4096,PQ32x4fs"  # a smaller code
    assert choose_ann_factory(n, d, 4 << 30) == "HNSW32"  # the vectors fit: a graph
    assert choose_ann_factory(500, d, 1) == "HNSW32"  # too few to train quantizers
    with pytest.raises(ValueError, match="no approximate index .* fits"):
        choose_ann_factory(n, d, 1 << 20)


def test_ann_index_recall_rerank_and_round_trip(tmp_path):
    pytest.importorskip("faiss")
    emb = _clustered(6000, 32, 60)
    index = EmbeddingIndex(32)
    index.add(emb, ids=[f"img_{i}.png" for i in range(len(emb))])
    budget = 6000 * 32 * 4 // 4  # (1/8, the default, leaves 16 bytes a row: 8 for the id)
    info = index.build_ann(memory_budget=budget, seed=0)
    assert info["factory"] == "IVF128,PQ4x4fs" and info["kind"] == "ivf"
    assert info["recall_at_10"] >= 0.9 and info["check_queries"] == 500
    assert info["bytes"] <= budget
    queries = _clustered(50, 32, 60, seed=1)
    approx, exact = index.search(queries, k=10), index.search(queries, k=10, exact=True)
    # the scores are exact cosines of the rows returned (re-ranked), best first
    want = (F.normalize(queries, dim=-1)[:, None] * index.embeddings[approx.indices]).sum(-1)
    torch.testing.assert_close(approx.scores, want, atol=1e-5, rtol=0)
    assert (approx.scores[:, :-1] >= approx.scores[:, 1:]).all()

    def recall(res):
        found = [len(set(a) & set(e)) for a, e in zip(res.ids, exact.ids, strict=True)]
        return sum(found) / (10 * len(found))

    assert recall(approx) >= 0.9
    one_list = index.search(queries, k=10, nprobe=1)  # the knob works (fewer candidates)
    assert one_list.indices.shape == (50, 10) and recall(one_list) <= recall(approx)
    assert torch.equal(exact.indices, index.search(queries, k=10, use_faiss=False).indices)

    tensor_path, meta_path = index.save(tmp_path / "idx")
    ann_path = tmp_path / "idx.faiss"
    assert json.loads(meta_path.read_text())["ann"]["file"] == "idx.faiss"
    loaded = EmbeddingIndex.load(tmp_path / "idx")
    assert loaded.ann is not None and loaded.ann_info["nprobe"] == info["nprobe"]
    assert torch.equal(loaded.search(queries, k=10).indices, approx.indices)

    data = ann_path.read_bytes()
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0xFF
    ann_path.write_bytes(bytes(flipped))
    with pytest.raises(ValueError, match="approximate index .*SHA-256"):
        EmbeddingIndex.load(tmp_path / "idx")
    ann_path.unlink()
    with pytest.raises(FileNotFoundError, match="approximate index file missing"):
        EmbeddingIndex.load(tmp_path / "idx")


def test_ann_kept_training_hnsw_and_errors():
    pytest.importorskip("faiss")
    emb = _clustered(3000, 16, 30)
    index = EmbeddingIndex(16)
    index.add(emb)
    first = index.build_ann("IVF32,PQ4x4fs")
    grown = EmbeddingIndex(16)
    grown.add(torch.cat([emb, _clustered(200, 16, 30, seed=2)]))
    again = grown.build_ann("IVF32,PQ4x4fs", trained=index.ann)  # --update: no new training
    assert first["retrained"] and not again["retrained"] and again["train_rows"] == 0
    assert grown.ann.ntotal == 3200 and again["recall_at_10"] >= 0.9
    grown.add(emb[:1])  # new rows: the approximate index no longer covers them
    assert grown.ann is None and grown.ann_info is None

    small = EmbeddingIndex(16)
    small.add(emb[:300])
    info = small.build_ann()  # HNSW below 1,000 rows; efSearch is its search knob
    assert info["factory"] == "HNSW32" and info["param"] == "efSearch"
    res = small.search(emb[:3], k=300)  # k beyond the candidates: exact for those queries
    assert torch.equal(res.indices, small.search(emb[:3], k=300, exact=True).indices)
    with pytest.raises(ValueError, match="bad faiss index factory"):
        small.build_ann("IVF7,Nonsense")
    with pytest.raises(ValueError, match="nprobe"):
        small.search(emb[:1], nprobe=0)


# -- the index of a folder: RetrievalIndex and its files ----------------------------------------


def docs_snippet() -> str:
    """The first Python block of docs/clip.md's Retrieval section."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "clip.md").read_text()
    section = text[text.index("### Retrieval\n") :]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


def test_the_docs_snippet_runs_and_prints_what_it_says(tmp_path, monkeypatch, capsys):
    """docs/clip.md's RetrievalIndex example, run as it is: create, update, open, update
    again (only the new file), search (the yellow square first)."""
    monkeypatch.chdir(tmp_path)
    code = docs_snippet()
    exec(compile(code, "docs/clip.md", "exec"), {"__name__": "docs_snippet"})
    out = capsys.readouterr().out.splitlines()
    said = [line.strip("# ") for line in code.splitlines() if line.startswith("# {")]
    assert out[:2] == said, out
    assert len(out) == 4 and out[2].endswith(" yellow.png"), out


def test_a_version_1_index_still_loads_and_updates_to_version_2(tmp_path):
    """A version-1 manifest (no generation: the embeddings are INDEX.safetensors / .json)
    is read; the next update writes version 2 and removes the unversioned files."""
    from attn_clip.retrieval import IndexModel, Manifest, RetrievalIndex, load_index_set
    from PIL import Image

    photos = tmp_path / "photos"
    photos.mkdir()
    for colour in ("red", "blue"):
        Image.new("RGB", (32, 32), colour).save(photos / f"{colour}.png")
    model = IndexModel.load("demo-shapes", "shapes", device="cpu")
    new = RetrievalIndex.create(tmp_path / "idx", model)
    new.update(photos, progress=False)
    manifest_file = tmp_path / "idx.manifest.json"
    data = json.loads(manifest_file.read_text())
    for suffix in (".safetensors", ".json"):  # the version-1 layout
        (tmp_path / f"idx.g1{suffix}").rename(tmp_path / f"idx{suffix}")
    del data["generation"], data["model"]["precision"]
    manifest_file.write_text(json.dumps({**data, "version": 1}))

    manifest, embeddings = load_index_set(tmp_path / "idx")
    assert manifest.version == 1 and manifest.generation is None and len(embeddings) == 2
    index = RetrievalIndex.open(tmp_path / "idx", model)
    assert [h.id for h in index.search(photos / "blue.png", k=1)] == ["blue.png"]
    result = index.update(photos, progress=False)
    assert result.counts["unchanged"] == 2 and result.manifest.generation == 1
    assert sorted(p.name for p in tmp_path.glob("idx*")) == [
        "idx.g1.json", "idx.g1.safetensors", "idx.manifest.json",
    ]  # fmt: skip
    assert json.loads(manifest_file.read_text())["version"] == 2

    for broken, needle in [
        ({**data, "version": 7}, "unsupported manifest version 7"),
        ({k: v for k, v in data.items() if k != "files"}, "missing or malformed files"),
        ({**data, "format": "x"}, "is not a manifest"),
    ]:
        with pytest.raises(ValueError, match=needle):
            Manifest.from_json(broken)


def test_the_index_refuses_another_model_and_reports_its_errors(tmp_path):
    from dataclasses import replace

    from attn_clip.retrieval import (
        IndexModel,
        IndexNotFoundError,
        ModelMismatchError,
        RetrievalError,
        RetrievalIndex,
    )
    from PIL import Image

    with pytest.raises(IndexNotFoundError, match="no index at"):
        RetrievalIndex.open(tmp_path / "none.idx")
    photos = tmp_path / "photos"
    photos.mkdir()
    model = IndexModel.load("demo-shapes", "shapes", device="cpu")
    index = RetrievalIndex.create(tmp_path / "idx", model)
    with pytest.raises(RetrievalError, match="no images under"):
        index.update(photos, progress=False)
    Image.new("RGB", (32, 32), "red").save(photos / "red.png")
    index.update(photos, progress=False)
    index = RetrievalIndex.open(tmp_path / "idx")
    with pytest.raises(ModelMismatchError, match="built with demo-shapes"):
        index.model = replace(model, name="ViT-B-32", pretrained="openai")
    index.manifest.model = replace(index.record, probe=[-v for v in index.record.probe])
    with pytest.raises(ModelMismatchError, match="rebuild the index"):
        index.model = model
