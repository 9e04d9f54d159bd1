"""attn_clip.retrieval.server (clip-retrieval's ``clip back`` API) over real HTTP on 127.0.0.1:
answers equal to RetrievalIndex's search (text, base64 image, embedding), the request body
clip-retrieval's ClipClient sends, clip back's deduplicate and num_result_ids, /metadata,
/indices-list, /health; bad input as 4xx JSON errors (bad base64, oversize bodies with and
without Content-Length, ...); files outside the indexed folder never read; hot reload when an
update switches generations (the writer's lock held or not, a broken manifest kept out);
4 concurrent clients on a 10,000-vector index; and attn_clip.retrieval.export's
clip-retrieval layout."""

from __future__ import annotations

import base64
import json
import shutil
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from _support.retrieval import GALLERY, make_gallery, rel_name, render
from attn_clip.retrieval import (
    EmbeddingIndex,
    IndexModel,
    Manifest,
    RetrievalIndex,
    index_lock,
    load_index_set,
    save_index_set,
)
from attn_clip.retrieval.export import export_embeddings, file_below
from attn_clip.retrieval.server import BackgroundServer, make_app

SECRET = "the secret outside the indexed folder"
BIG = 10_000  # vectors of the synthetic index


def b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode("ascii")


def index_folder(folder: Path, base: Path, model: IndexModel) -> RetrievalIndex:
    index = RetrievalIndex.create(base, model)
    index.update(folder, progress=False, workers=0)
    return index


@pytest.fixture(scope="module")
def model() -> IndexModel:
    return IndexModel.load("demo-shapes", "shapes", device="cpu")


@pytest.fixture(scope="module")
def built(tmp_path_factory, model):
    """(folder, its index, a 10,000-vector index) and a server of both with images=True.
    The folder: the 10 shapes, a copy of one (a duplicate for deduplicate), a caption; after
    indexing, one image and one caption become symlinks to files outside the folder."""
    tmp = tmp_path_factory.mktemp("served")
    folder = make_gallery(tmp / "gallery")
    red = folder / rel_name(*GALLERY[0])
    shutil.copy(red, red.with_name("red_circle_copy.png"))
    red.with_suffix(".txt").write_text("a red circle\n")
    index = index_folder(folder, tmp / "g.idx", model)
    (tmp / "secret.txt").write_text(SECRET)
    render("green", "circle").save(tmp / "secret.png")
    star = folder / rel_name(*GALLERY[7])
    star.with_suffix(".txt").symlink_to(tmp / "secret.txt")  # a caption outside
    cross = folder / rel_name(*GALLERY[9])
    cross.unlink()
    cross.symlink_to(tmp / "secret.png")  # an indexed image replaced by a link out

    torch.manual_seed(0)
    big = EmbeddingIndex(index.embeddings.dim)
    ids = [f"synthetic/{i:05d}.png" for i in range(BIG)]
    big.add(F.normalize(torch.randn(BIG, big.dim), dim=-1), ids)
    info = {"size": 1, "mtime_ns": 0, "sha256": "0" * 64}
    manifest = Manifest(index.manifest.model, str(folder), {i: info for i in ids})
    save_index_set(tmp / "big.idx", big, manifest)

    app = make_app({"g": tmp / "g.idx", "big": tmp / "big.idx"}, model=model, images=True)
    with BackgroundServer(app) as server:
        yield folder, RetrievalIndex.open(tmp / "g.idx", model), tmp / "big.idx", server


@pytest.fixture
def client(built):
    with httpx.Client(base_url=built[3].url, timeout=60) as c:
        yield c


def knn(client: httpx.Client, **body) -> list[dict]:
    r = client.post("/knn-service", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def error(response: httpx.Response, status: int, *needles: str) -> str:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    message = response.json()["error"]
    for needle in needles:
        assert needle in message, message
    return message


def same_hits(results: list[dict], hits) -> None:
    assert [r["image_path"] for r in results] == [str(h.path) for h in hits]
    got = torch.tensor([r["similarity"] for r in results])
    torch.testing.assert_close(got, torch.tensor([h.score for h in hits]), rtol=0, atol=1e-6)


def test_answers_equal_the_library_search(built, client):
    folder, index, _, _ = built
    found = knn(client, text="a red circle", num_images=5, indice_name="g")
    same_hits(found, index.search("a red circle", k=5))
    red = folder / rel_name(*GALLERY[0])
    (answer,) = [r for r in found if r["image_path"] == str(red)]
    assert answer["caption"] == "a red circle"  # the .txt beside it; images=True: the file
    assert base64.b64decode(answer["image"]) == red.read_bytes()
    assert all("caption" not in r for r in found if r is not answer)
    assert [r["id"] for r in found] == [
        index.embeddings.ids.index(r["image_path"][len(str(folder)) + 1 :]) for r in found
    ]  # noqa: E501
    query = folder / rel_name(*GALLERY[3])
    same_hits(
        knn(client, image=b64(query), num_images=4), index.search(query, k=4)
    )  # default index: g
    text = b64(query)  # as a data: URL with MIME line breaks: the same image
    data_url = "data:image/png;base64," + "\n".join(
        text[i : i + 76] for i in range(0, len(text), 76)
    )  # noqa: E501
    assert knn(client, image=data_url, num_images=4) == knn(client, image=text, num_images=4)
    vector = torch.randn(index.embeddings.dim)
    found = knn(client, embedding_input=vector.tolist(), num_images=3)
    expected = index.embeddings.search(vector, k=3)
    assert [r["id"] for r in found] == expected.indices[0].tolist()
    torch.testing.assert_close(torch.tensor([r["similarity"] for r in found]), expected.scores[0])


def test_the_body_clip_retrieval_client_sends(built, client):
    """ClipClient.query (clip_retrieval/clip_client.py, 2.45.0) posts json.dumps of every key,
    unset ones as null, with no Content-Type; clip back answers a list, best first, of
    {metadata columns..., "id", "similarity"}."""
    folder, index, _, _ = built

    def clip_client(text=None, image=None, embedding_input=None) -> httpx.Response:
        body = {"text": text, "image": image, "image_url": None, "embedding_input": embedding_input,
                "deduplicate": True, "use_safety_model": True, "use_violence_detector": True,
                "indice_name": "g", "use_mclip": False, "aesthetic_score": 9,
                "aesthetic_weight": 0.5, "modality": "image", "num_images": 40,
                "num_result_ids": 40}  # fmt: skip
        return client.post("/knn-service", content=json.dumps(body))

    r = clip_client(text="a red circle")
    assert r.status_code == 200, r.text
    ignored = r.headers["x-ignored-options"].split(", ")
    assert ignored == [
        "use_safety_model",
        "use_violence_detector",
        "aesthetic_score",
        "aesthetic_weight",
    ]  # noqa: E501
    found = r.json()
    ranked = index.search("a red circle", k=len(index))
    rows = [index.embeddings.ids.index(h.id) for h in ranked]
    drop = clip_back_duplicates(index.embeddings.embeddings[rows].numpy())
    assert [x["id"] for x in found] == [r for i, r in enumerate(rows) if i not in drop]
    paths = [x["image_path"] for x in found]
    assert len(paths) < len(index) and str(folder / "circles/red_circle_copy.png") not in paths
    for x in found:
        assert isinstance(x["id"], int) and isinstance(x["similarity"], float)
    query = folder / rel_name(*GALLERY[5])
    assert clip_client(image=b64(query)).json()[0]["image_path"] == str(query)
    assert clip_client(embedding_input=index.embeddings.embeddings[4].tolist()).json()[0]["id"] == 4  # noqa: E501


def clip_back_duplicates(emb: np.ndarray, threshold: float = 0.94) -> set[int]:
    """clip back's get_non_uniques (faiss range_search -> numpy): connected components of
    cosine > threshold, all but each component's first node."""
    neighbours = {
        i: set(np.nonzero(emb[i] @ emb.T > threshold)[0].tolist()) for i in range(len(emb))
    }  # noqa: E501
    seen, drop = set(), set()
    for node in neighbours:
        if node in seen:
            continue
        todo, component = {node}, []
        while todo:
            n = todo.pop()
            seen.add(n)
            todo |= neighbours[n] - seen
            component.append(n)
        drop |= set(component[1:])
    return drop


def test_deduplicate_and_num_result_ids_as_clip_back(built, client):
    _, index, _, _ = built
    for q in ("a red circle", "a blue square"):
        plain = knn(client, text=q, num_images=3, num_result_ids=11)
        assert [("image_path" in r) for r in plain] == [True] * 3 + [False] * 8
        assert all(set(r) == {"id", "similarity"} for r in plain[3:])
        rows = [r["id"] for r in plain]
        drop = clip_back_duplicates(index.embeddings.embeddings[rows].numpy())
        assert drop  # the copy, and the red circles of this tiny model are alike
        deduped = knn(client, text=q, num_images=3, num_result_ids=11, deduplicate=True)
        assert [r["id"] for r in deduped] == [r for i, r in enumerate(rows) if i not in drop]


def test_metadata_indices_list_and_health(built, client):
    folder, index, _, _ = built
    assert client.get("/indices-list").json() == ["g", "big"]
    assert client.get("/health").json() == "ok"
    meta = client.post("/metadata", json={"ids": [0, 2], "indice_name": "g"}).json()
    assert [m["id"] for m in meta] == [0, 2]
    assert meta[1]["metadata"]["image_path"] == str(folder / index.embeddings.ids[2])
    big = client.post("/metadata", json={"ids": [BIG - 1], "indice_name": "big"}).json()
    assert big == [
        {"id": BIG - 1, "metadata": {"image_path": str(folder / f"synthetic/{BIG - 1:05d}.png")}}
    ]  # noqa: E501


def test_files_outside_the_folder_are_never_read(built, client):
    folder, index, _, _ = built
    found = knn(client, text="a purple cross", num_images=len(index))
    by_path = {r["image_path"]: r for r in found}
    cross = by_path[str(folder / rel_name(*GALLERY[9]))]  # a symlink out of the folder now
    assert "image" not in cross and "caption" not in cross
    star = by_path[str(folder / rel_name(*GALLERY[7]))]  # its caption is a link out
    assert "caption" not in star and "image" in star
    assert SECRET not in json.dumps(found)
    meta = client.post("/metadata", json={"ids": list(range(len(index)))}).json()
    assert SECRET not in json.dumps(meta)
    assert file_below(folder.resolve(), folder / ".." / "secret.txt") is None
    assert file_below(folder.resolve(), folder / rel_name(*GALLERY[0])) is not None


def test_bad_input_is_a_4xx_json_error(built, client):
    def post(body, **kw):
        return client.post("/knn-service", json=body, **kw)

    error(post({"image": "not base64!"}), 400, "image is not valid base64")
    error(post({"image": "data:image/png,abc"}), 400, "base64")
    inside = str(built[0] / rel_name(*GALLERY[0]))  # a path is not read: it is not base64
    error(post({"image": inside}), 400, "image is not valid base64")
    error(post({"image": "/etc/passwd/abcd"}), 400, "not an image")  # (decodes to noise)
    error(post({"image": base64.b64encode(b"no image here").decode()}), 400, "not an image")
    error(post({"image_url": "http://example.com/a.jpg"}), 400, "does not fetch URLs")
    error(post({}), 400, "nothing to search for")
    error(post([1, 2]), 400, "JSON object")
    error(client.post("/knn-service", content=b"{not json"), 400, "not JSON")
    error(post({"text": "x", "modality": "text"}), 400, "image embeddings only")
    error(post({"text": "x", "num_images": 0}), 400, "num_images must be between 1")
    error(post({"text": "x", "num_images": "5"}), 400, "num_images must be an integer")
    error(post({"text": "x", "deduplicate": "yes"}), 400, "deduplicate must be true or false")
    error(post({"text": "x", "use_mclip": True}), 400, "M-CLIP")
    error(
        post({"text": "x", "indice_name": "nope"}),
        404,
        "unknown indice_name 'nope'",
        "['g', 'big']",
    )  # noqa: E501
    error(post({"embedding_input": [1.0, 2.0]}), 400, "has 2 values", "64")
    error(post({"embedding_input": [0.0] * 64}), 400, "all zeros")
    error(post({"embedding_input": ["a"]}), 400, "list of numbers")
    error(client.post("/metadata", json={"ids": [10**6]}), 400, "rows of the index")
    error(client.get("/nowhere"), 404, "GET /nowhere")
    error(client.get("/knn-service"), 405)
    big = b'{"image": "' + b"A" * (33 << 20) + b'"}'
    error(client.post("/knn-service", content=big), 413, "larger than")

    def chunks():  # no Content-Length: counted as it arrives
        for _ in range(40):
            yield b"A" * (1 << 20)

    error(client.post("/knn-service", content=chunks()), 413, "larger than")
    assert client.get("/health").json() == "ok"  # still serving


def served_generation(client: httpx.Client, generation: str) -> httpx.Response:
    """The first answer from ``generation`` (it is loaded in the server's background)."""
    deadline = time.monotonic() + 30
    while True:
        r = client.post("/knn-service", json={"text": "a yellow star"})
        assert r.status_code == 200, r.text
        if r.headers["x-index-generation"] == generation or time.monotonic() > deadline:
            return r
        time.sleep(0.02)


def test_hot_reload_when_an_update_switches_generations(tmp_path, model, caplog):
    folder = make_gallery(tmp_path / "gallery", GALLERY[:4])
    base = tmp_path / "h.idx"
    index_folder(folder, base, model)
    app = make_app(base, model=model, reload_interval=0)
    with BackgroundServer(app) as server, httpx.Client(base_url=server.url) as client:
        r = client.post("/knn-service", json={"text": "a yellow star"})
        assert r.headers["x-index-generation"] == "1" and len(r.json()) == 4
        with index_lock(base):  # a writer holds the lock: readers go on
            assert client.post("/knn-service", json={"text": "a yellow star"}).status_code == 200
        star = folder / rel_name(*GALLERY[7])
        star.parent.mkdir()
        render(*GALLERY[7]).save(star)
        RetrievalIndex.open(base, model).update(folder, progress=False, workers=0)
        r = served_generation(client, "2")
        assert r.headers["x-index-generation"] == "2"
        same_hits(r.json(), RetrievalIndex.open(base, model).search("a yellow star", k=5))
        Path(f"{base}.manifest.json").write_text("{broken")  # a bad generation is not served
        deadline = time.monotonic() + 30
        while "reload failed" not in caplog.text and time.monotonic() < deadline:
            r = client.post("/knn-service", json={"text": "a yellow star"})  # (loads it)
            assert r.headers["x-index-generation"] == "2" and len(r.json()) == 5
            time.sleep(0.02)
    assert "keeping generation 2, reload failed" in caplog.text


def test_four_concurrent_clients_on_10000_vectors(built):
    """4 clients x 200 mixed text / image / embedding queries at once: no error, each answer
    that of the library's search."""
    folder, index, big_base, server = built
    _, big = load_index_set(big_base)
    torch.manual_seed(1)
    images = [folder / rel_name(*g) for g in GALLERY[:6]]
    queries = []
    for i in range(800):
        kind = ("text", "image", "embedding_input")[i % 3]
        q = (f"a {GALLERY[i % 10][0]} {GALLERY[i % 10][1]}", images[i % 6], torch.randn(big.dim))[
            i % 3
        ]  # noqa: E501
        queries.append((kind, q))
    embedded = index.embed_queries([q for kind, q in queries if kind != "embedding_input"])
    vectors = iter(embedded)
    expected = [
        big.search(next(vectors) if kind != "embedding_input" else q, k=7) for kind, q in queries
    ]  # noqa: E501
    answers, errors = [None] * len(queries), []

    def client_thread(offset: int) -> None:
        with httpx.Client(base_url=server.url, timeout=60) as client:
            for i in range(offset, len(queries), 4):
                kind, q = queries[i]
                value = (
                    b64(q) if kind == "image" else q.tolist() if kind == "embedding_input" else q
                )  # noqa: E501
                try:
                    r = client.post(
                        "/knn-service", json={kind: value, "num_images": 7, "indice_name": "big"}
                    )  # noqa: E501
                    r.raise_for_status()
                    answers[i] = r.json()
                except Exception as e:  # noqa: BLE001  (counted, then reported)
                    errors.append(repr(e))

    threads = [threading.Thread(target=client_thread, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors and all(a is not None for a in answers), errors[:3]
    for got, want in zip(answers, expected, strict=True):
        assert [r["id"] for r in got] == want.indices[0].tolist()
        torch.testing.assert_close(
            torch.tensor([r["similarity"] for r in got]), want.scores[0], rtol=0, atol=1e-5
        )  # noqa: E501


def test_export_writes_clip_retrievals_layout(built, tmp_path):
    import pyarrow.parquet as pq

    folder, index, _, _ = built
    out = tmp_path / "emb"
    result = export_embeddings(index.base, out, rows_per_file=4)
    assert (result.rows, result.files, result.dim) == (len(index), 3, 64)
    assert sorted(p.name for p in (out / "img_emb").iterdir()) == [
        f"img_emb_{n}.npy" for n in range(3)
    ]  # noqa: E501
    matrix = np.concatenate([np.load(out / "img_emb" / f"img_emb_{n}.npy") for n in range(3)])
    assert matrix.dtype == np.float32
    np.testing.assert_array_equal(matrix, index.embeddings.embeddings.numpy())
    meta = [pq.read_table(out / "metadata" / f"metadata_{n}.parquet").to_pylist() for n in range(3)]
    rows = [row for part in meta for row in part]
    assert [r["key"] for r in rows] == index.embeddings.ids
    assert [r["image_path"] for r in rows] == [str(folder / i) for i in index.embeddings.ids]
    captions = {r["key"]: r["caption"] for r in rows if r["caption"] is not None}
    assert captions == {rel_name(*GALLERY[0]): "a red circle"}  # (not the link out)
    assert oct(out.stat().st_mode & 0o777) == oct(0o777 & ~_umask())

    export_embeddings(index.base, out, rows_per_file=1, dtype="float16")  # replaces it
    names = sorted(p.name for p in (out / "img_emb").iterdir())
    assert names == [f"img_emb_{n:02d}.npy" for n in range(11)]  # zero-padded like clip-retrieval
    last = np.load(out / "img_emb" / "img_emb_10.npy")
    np.testing.assert_array_equal(last, index.embeddings.embeddings[10:].numpy().astype(np.float16))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["emb"]  # no temporary folder left

    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.md").write_text("mine")
    with pytest.raises(ValueError, match="holds other files"):
        export_embeddings(index.base, tmp_path / "other")
    with pytest.raises(ValueError, match="does not exist"):
        export_embeddings(index.base, tmp_path / "no" / "emb")
    with pytest.raises(ValueError, match="no index"):
        export_embeddings(tmp_path / "none.idx", tmp_path / "new")
    assert not (tmp_path / "new").exists()


def _umask() -> int:
    import os

    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def test_an_image_only_index_answers_images_and_refuses_text(tmp_path):
    """An index of an image-only attn_vision backbone (a 1-block DINOv2 at 28 px): image
    queries as the library's search, a text query a 400 naming the reason."""
    import attn_vision

    model = attn_vision.create_model("vit_small_patch14_dinov2", img_size=28, depth=1,
                                     embed_dim=32, num_heads=2, init_values=1.0)  # fmt: skip
    folder = attn_vision.save_pretrained(model, tmp_path / "dino")
    gallery = make_gallery(tmp_path / "gallery", GALLERY[:4])
    index = RetrievalIndex.create(tmp_path / "dino.idx", str(folder), device="cpu")
    index.update(gallery, progress=False, workers=0)
    with BackgroundServer(make_app(tmp_path / "dino.idx", model=index.model)) as server:
        with httpx.Client(base_url=server.url, timeout=60) as client:
            query = gallery / rel_name(*GALLERY[2])
            same_hits(knn(client, image=b64(query), num_images=3), index.search(query, k=3))
            error(client.post("/knn-service", json={"text": "a red circle"}), 400, "no text tower")


# -- an index of webdataset tar shards -------------------------------------------------------


def tar_samples(folder: Path) -> dict[str, tuple[bytes, str]]:
    """``{shard/key: (png bytes, caption)}`` of the tars under ``folder``, read by tarfile."""
    import tarfile

    found: dict[str, dict[str, bytes]] = {}
    for path in sorted(folder.glob("*.tar")):
        with tarfile.open(path) as tar:
            for member in tar.getmembers():
                key, _, ext = member.name.partition(".")
                found.setdefault(f"{path.stem}/{key}", {})[ext] = tar.extractfile(member).read()
    return {id: (f["png"], f["txt"].decode()) for id, f in found.items()}


@pytest.fixture(scope="module")
def shard_built(tmp_path_factory, model):
    """``(index, its samples by tarfile, hostile index, server)``: 6 captioned shapes in two
    tars (ShardWriter), indexed; files planted at ``folder/id`` (the image and a ``.txt``
    beside it) and a copy of the index whose first id is ``00000/../secret.png``, a planted
    file too; one server of both with images=True."""
    from attn_vision.wds import ShardWriter

    tmp = tmp_path_factory.mktemp("shard_served")
    folder = tmp / "shards"
    with ShardWriter(folder, shard_size=4, image_format="png") as writer:
        for item in GALLERY[:6]:
            writer.write(render(*item), f"a {item[0]} {item[1]}")
    index = RetrievalIndex.create(tmp / "s.idx", model)
    index.update(str(folder / "{00000..00001}.tar"), progress=False, workers=0)
    first = index.embeddings.ids[0]
    (folder / first).parent.mkdir()
    (folder / first).write_text(SECRET)  # a file named after the id, and a caption beside it
    (folder / first).with_suffix(".txt").write_text(SECRET)
    (folder / "secret.png").write_text(SECRET)

    manifest, embeddings = load_index_set(tmp / "s.idx")
    hostile_id = "00000/../secret.png"
    ids = [hostile_id, *embeddings.ids[1:]]
    files = dict(zip(ids, manifest.files.values(), strict=True))
    hostile = EmbeddingIndex(embeddings.dim)
    hostile.add(embeddings.embeddings, ids)
    save_index_set(tmp / "h.idx", hostile, Manifest(manifest.model, manifest.root, files,
                   manifest.skipped, shards=manifest.shards))  # fmt: skip
    app = make_app({"s": tmp / "s.idx", "h": tmp / "h.idx"}, model=model, images=True)
    with BackgroundServer(app) as server:
        yield index, tar_samples(folder), tmp / "h.idx", server


def test_a_shard_index_answers_ids_captions_and_the_tars_images(shard_built):
    index, samples, _, server = shard_built
    assert len(samples) == len(index) == 6
    with httpx.Client(base_url=server.url, timeout=60) as client:
        found = knn(client, text="a red circle", num_images=6, indice_name="s")
        meta = client.post("/metadata", json={"ids": [0, 5], "indice_name": "s"}).json()
    hits = index.search("a red circle", k=6)
    assert [r["image_path"] for r in found] == [h.id for h in hits]  # shard/key, not a path
    scores = torch.tensor([r["similarity"] for r in found])
    torch.testing.assert_close(scores, torch.tensor([h.score for h in hits]), rtol=0, atol=1e-6)
    for r in found:
        png, caption = samples[r["image_path"]]
        assert r["caption"] == caption  # the manifest's, not the planted .txt
        assert base64.b64decode(r["image"]) == png  # from the tar, not the planted file
    assert found[0]["caption"] == "a red circle"
    ids = index.embeddings.ids
    assert [m["metadata"]["image_path"] for m in meta] == [ids[0], ids[5]]
    assert base64.b64decode(meta[0]["metadata"]["image"]) == samples[ids[0]][0]
    assert SECRET not in json.dumps(found) + json.dumps(meta)


def test_a_hostile_shard_id_is_never_opened_as_a_file(shard_built):
    """``00000/../secret.png`` names no sample of the tar ``00000``: no image (the file of
    that name below the folder is not read), the other rows as before."""
    index, samples, _, server = shard_built
    with httpx.Client(base_url=server.url, timeout=60) as client:
        found = knn(client, text="a red circle", num_images=6, indice_name="h")
        meta = client.post("/metadata", json={"ids": list(range(6)), "indice_name": "h"})
    (bad,) = [r for r in found if r["id"] == 0]
    assert bad["image_path"] == "00000/../secret.png" and "image" not in bad
    assert bad["caption"] == "a red circle"
    for r in found:
        if r["id"] != 0:
            assert base64.b64decode(r["image"]) == samples[r["image_path"]][0]
    assert SECRET not in json.dumps(found) + meta.text


def test_the_served_shards_stay_open_up_to_size(shard_built):
    """OpenShards: a tar's listing is kept for the next read; the least recent one past
    ``size`` is closed; after close() each read closes its tar again."""
    from attn_clip.retrieval.server import OpenShards

    index, samples, _, _ = shard_built
    tars = {i.split("/")[0]: index.manifest.shard_file(i) for i in index.embeddings.ids}
    shards = OpenShards(size=1)
    first, second = sorted(samples)[0], sorted(samples)[-1]  # in 00000.tar, in 00001.tar
    assert shards.image_bytes(tars["00000"], first.split("/")[1]) == samples[first][0]
    opened = shards._open[tars["00000"]]
    assert shards.image_bytes(tars["00001"], second.split("/")[1]) == samples[second][0]
    assert list(shards._open) == [tars["00001"]] and opened._tar.closed
    assert shards.image_bytes(tars["00001"], "nosuchkey") is None
    shards.close()
    assert shards.image_bytes(tars["00000"], first.split("/")[1]) == samples[first][0]
    assert not shards._open


def test_export_of_a_shard_index(shard_built, tmp_path):
    import pyarrow.parquet as pq

    index, samples, _, _ = shard_built
    export_embeddings(index.base, tmp_path / "emb")
    rows = pq.read_table(tmp_path / "emb" / "metadata" / "metadata_0.parquet").to_pylist()
    assert [r["key"] for r in rows] == [r["image_path"] for r in rows] == index.embeddings.ids
    assert [r["caption"] for r in rows] == [samples[r["key"]][1] for r in rows]
    matrix = np.load(tmp_path / "emb" / "img_emb" / "img_emb_0.npy")
    np.testing.assert_array_equal(matrix, index.embeddings.embeddings.numpy())
