"""apps/retrieval.py at scale: ``index`` under ``torchrun`` (2 CPU processes, gloo) writes
the index one process writes (of a folder, and of webdataset shards dealt to the ranks),
updates it, and reports bad input once -- all in ONE torchrun
launch whose rank 0 writes what each case printed; shard planning, writing, merging and
resuming a killed run shard by shard in process; the approximate (faiss) index built,
searched, replaced with its generation and refused when corrupt."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import retrieval
import torch
from _support.retrieval import ROOT, call, one_rank_group
from PIL import Image

COLOURS = ["red", "blue", "green", "yellow", "purple", "orange", "white", "black", "cyan",
           "magenta", "pink", "brown", "grey"]  # fmt: skip

# Run by every torchrun rank: each case's main(argv) with its output captured; every rank
# writes its own results (rank 0's are the ones that print).
CASES = f"""
import json, sys
sys.path[:0] = [{str(ROOT / "apps")!r}, {str(ROOT / "tests")!r}]
import os, datetime
import torch.distributed as dist
import retrieval
from _support.retrieval import call
dist.init_process_group("gloo", timeout=datetime.timedelta(minutes=5))
cases = json.loads(sys.argv[1])
results = [vars(call(retrieval.main, *argv)) for argv in cases]
with open(os.path.join(sys.argv[2], f"rank{{os.environ['RANK']}}.json"), "w") as f:
    json.dump(results, f)
dist.destroy_process_group()
"""


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    """13 images (some in a subfolder, of several sizes) and one unreadable file."""
    folder = tmp_path_factory.mktemp("scale") / "images"
    for i, colour in enumerate(COLOURS):
        path = folder / ("sub" if i % 3 == 0 else "") / f"{colour}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (40 + 4 * i, 36), colour).save(path)
    (folder / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n truncated")
    return folder


def index_argv(images: Path, base: Path, *more) -> list[str]:
    return ["index", str(images), "--out", str(base), "--model", "demo-shapes",
            "--batch-size", "2", *map(str, more)]  # fmt: skip


@pytest.fixture(scope="module")
def single(images, tmp_path_factory) -> Path:
    """The index one process writes (batches of 2)."""
    base = tmp_path_factory.mktemp("single") / "idx"
    assert call(retrieval.main, *index_argv(images, base)).code == 0
    return base


def assert_same_index(a: Path, b: Path) -> None:
    from attn_clip.retrieval import load_index_set

    (ma, ia), (mb, ib) = load_index_set(a), load_index_set(b)
    assert ia.ids == ib.ids and ma.files == mb.files and ma.skipped == mb.skipped
    torch.testing.assert_close(ia.embeddings, ib.embeddings, atol=1e-6, rtol=0)
    assert ma.model == mb.model


def shard_files(base: Path) -> list[Path]:
    return sorted(base.parent.glob(f"{base.name}.shard-*"))


def errors(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("error: ")]


# -- the one torchrun launch ----------------------------------------------------------------


@pytest.mark.slow
def test_torchrun_cases(images, single, tmp_path):
    """2 ranks: the index equals one process's; --update embeds only a new file; bad input
    is one line from rank 0 (the other rank exits 0 quietly); 3 webdataset shards of the
    same images: the shard index one process writes. (~20 s: the launch and two
    interpreters importing torch and loading the model; every torchrun case shares them.)"""
    from attn_vision.wds import ShardWriter

    base, plus, updated = tmp_path / "idx", tmp_path / "images_plus", tmp_path / "up"
    with ShardWriter(tmp_path / "tars", shard_size=5, image_format="png") as writer:
        for path in sorted(images.rglob("*.png")):
            if path.name != "broken.png":
                writer.write(Image.open(path), path.stem)
    tars, one_tars = tmp_path / "tars" / "{00000..00002}.tar", tmp_path / "one_tars"
    assert call(retrieval.main, *index_argv(tars, one_tars)).code == 0
    shutil.copytree(images, plus)  # the same files (and mtimes), and one more
    Image.new("RGB", (50, 50), "navy").save(plus / "navy.png")
    for f in single.parent.glob("idx.*"):  # a copy of the one-process index, to update
        shutil.copy2(f, tmp_path / f"up{f.name[3:]}")
    cases = [
        index_argv(images, base, "--shard-size", "3", "--json"),  # 3 -> 4: whole batches
        index_argv(plus, updated, "--update", "--json"),
        ["index", str(tmp_path / "nowhere"), "--out", str(tmp_path / "nothing")],
        index_argv(tars, tmp_path / "tars_idx", "--json"),
    ]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           "--master-port", str(port), "--no-python", sys.executable, "-c", CASES,
           json.dumps(cases), str(tmp_path)]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    first, update, bad, by_tars = json.loads((tmp_path / "rank0.json").read_text())
    others = json.loads((tmp_path / "rank1.json").read_text())

    assert first["code"] == 0, first["err"]
    summary = json.loads(first["out"])
    assert summary["ranks"] == 2 and summary["resumed"] == 0
    assert summary["images"] == 13 and summary["added"] == 13 and summary["skipped"] == 1
    assert others[0] == {"code": 0, "out": "", "err": others[0]["err"]}  # rank 0 reports
    assert (first["err"] + others[0]["err"]).count("broken.png") == 1  # the rank that met it
    assert_same_index(single, base)
    assert shard_files(base) == [] and not Path(f"{base}.lock").exists()

    assert update["code"] == 0, update["err"]
    summary = json.loads(update["out"])
    assert (summary["added"], summary["unchanged"], summary["skipped"]) == (1, 13, 1)
    from attn_clip.retrieval import load_index_set

    assert "navy.png" in load_index_set(updated)[1].ids

    assert bad["code"] == 2 and others[2]["code"] == 0 and errors(others[2]["err"]) == []
    assert errors(bad["err"]) == [f"error: image folder not found: {tmp_path / 'nowhere'}"]
    assert not list(tmp_path.glob("nothing*"))

    assert by_tars["code"] == 0 and others[3]["code"] == 0, by_tars["err"] + others[3]["err"]
    summary = json.loads(by_tars["out"])
    assert (summary["ranks"], summary["shards"], summary["images"]) == (2, 3, 13), summary
    assert_same_index(one_tars, tmp_path / "tars_idx")
    assert load_index_set(one_tars)[0].shards == load_index_set(tmp_path / "tars_idx")[0].shards
    assert shard_files(tmp_path / "tars_idx") == []


# -- shards in process ------------------------------------------------------------------------


def test_shard_plan_keys_and_files(tmp_path):
    from attn_clip.retrieval.fingerprint import ModelRecord
    from attn_clip.retrieval.shards import plan_shards, read_shard, shard_path, write_shard

    record = ModelRecord("m", None, 2, [1.0, 0.0], "fp32")
    items = [[f"{i}.png", 10, i] for i in range(7)]
    shards, keys = plan_shards(items, shard_size=3, batch_size=2, record=record, root="/r")
    assert [len(s) for s in shards] == [4, 3] and len(set(keys)) == 2  # whole batches
    moved = [[*items[0][:2], 99], *items[1:]]  # one file's mtime changed: its shard's key
    _, keys2 = plan_shards(moved, 3, 2, record, "/r")
    assert keys2[0] != keys[0] and keys2[1] == keys[1]

    path = shard_path(tmp_path / "idx", keys[1])
    rels = [r for r, _, _ in shards[1]]
    results = [[rels[0], 10, 4, "ab", None], [rels[1], 10, 5, None, "broken"],
               [rels[2], 10, 6, "cd", None]]  # fmt: skip
    embs = [torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])]
    write_shard(path, keys[1], results, embs)
    got, emb, _ = read_shard(path, keys[1], rels)
    assert got == results and torch.equal(emb, torch.stack(embs))
    assert read_shard(path, keys[0], rels) is None  # another key
    assert read_shard(path, keys[1], rels[::-1]) is None  # other files
    path.write_bytes(path.read_bytes()[:40])
    assert read_shard(path, keys[1], rels) is None  # unreadable: embedded again


def test_a_killed_run_resumes_shard_by_shard(images, single, tmp_path, monkeypatch):
    """The torchrun path in one process (a gloo group of 1): killed after its first shard,
    the run started again takes the finished shards as they are and writes the index one
    process writes."""
    from attn_clip.retrieval import shards

    one_rank_group(monkeypatch)
    base = tmp_path / "idx"
    argv = index_argv(images, base, "--shard-size", "2", "--json")
    real, written = shards.write_shard, []

    def write_then_die(*args):
        real(*args)
        written.append(args[0])
        if len(written) == 2:
            raise KeyboardInterrupt  # (as a kill: nothing after this shard happens)

    monkeypatch.setattr(shards, "write_shard", write_then_die)
    with pytest.raises(KeyboardInterrupt):
        call(retrieval.main, *argv)
    monkeypatch.setattr(shards, "write_shard", real)
    assert not Path(f"{base}.manifest.json").exists()  # no index yet
    assert shard_files(base) == sorted(written)  # but finished shards
    result = call(retrieval.main, *argv)
    assert result.code == 0, result.err
    summary = json.loads(result.out)
    assert summary["resumed"] == 4 and summary["added"] == 13, summary  # not embedded again
    assert_same_index(single, base)
    assert shard_files(base) == []


# -- the approximate index ----------------------------------------------------------------------


def test_ann_index_search_update_and_corruption(images, tmp_path):
    pytest.importorskip("faiss")
    from attn_clip.retrieval import load_index_set

    base = tmp_path / "idx"
    argv = ["index", str(images), "--out", str(base), "--model", "demo-shapes"]
    out = call(retrieval.main, *argv, "--ann-threshold", "10").out  # 13 images: auto builds one
    assert "approximate index HNSW32" in out and "recall@10" in out and "efSearch" in out
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["idx.g1.faiss", "idx.g1.json", "idx.g1.safetensors", "idx.manifest.json"]
    manifest, index = load_index_set(base)
    assert index.ann is not None and index.ann.ntotal == 13
    assert index.embeddings.numpy().shape == (13, manifest.model.embed_dim)

    query = ["search", str(base), "--text", "a red square", "--top-k", "5", "--json"]
    approx = json.loads(call(retrieval.main, *query).out)
    exact = json.loads(call(retrieval.main, *query, "--exact").out)
    assert [h["path"] for h in approx["hits"]] == [h["path"] for h in exact["hits"]]
    for a, e in zip(approx["hits"], exact["hits"], strict=True):  # (13 images: all found)
        assert a["score"] == pytest.approx(e["score"], abs=1e-6)  # exact cosines, re-ranked
    nprobe = json.loads(call(retrieval.main, *query, "--nprobe", "4").out)
    assert nprobe["hits"][0]["path"] == exact["hits"][0]["path"]

    # --update replaces the faiss file with its generation; --ann off drops it
    summary = json.loads(call(retrieval.main, *argv, "--update", "--ann", "on", "--json").out)
    assert summary["ann"]["factory"] == "HNSW32" and summary["ann"]["recall_at_10"] == 1.0
    assert sorted(p.name for p in tmp_path.glob("idx.g*")) == [
        "idx.g2.faiss", "idx.g2.json", "idx.g2.safetensors",
    ]  # fmt: skip
    ann = tmp_path / "idx.g2.faiss"
    data = ann.read_bytes()
    ann.write_bytes(data[: len(data) // 2])
    result = call(retrieval.main, *query)
    assert result.code == 2
    err = result.err.strip().splitlines()
    assert len(err) == 1 and "approximate index" in err[0] and "SHA-256" in err[0], err
    ann.write_bytes(data)
    assert call(retrieval.main, *argv, "--update", "--ann", "off").code == 0
    assert not list(tmp_path.glob("*.faiss"))


def test_ann_bad_input_exits_2_and_writes_nothing(images, tmp_path):
    pytest.importorskip("faiss")
    base = tmp_path / "idx"
    argv = ["index", str(images), "--out", str(base), "--model", "demo-shapes"]
    cases = [
        ([*argv, "--ann-memory", "lots"], "--ann-memory: not a size"),
        ([*argv, "--ann-factory", "IVF7,Nonsense"], "--ann-factory: bad faiss index factory"),
        ([*argv, "--ann-threshold", "0"], "--ann-threshold"),
        ([*argv, "--ann", "on", "--ann-factory", "IVF2,PQ4x4fs"], "cannot train"),
        (["search", str(base), "--text", "x", "--nprobe", "0"], "--nprobe must be >= 1"),
    ]
    for args, needle in cases:
        result = call(retrieval.main, *args)
        assert result.code == 2, needle
        err = result.err.strip().splitlines()  # (after the unreadable file's)
        said = [line for line in err if not line.startswith("warning: skipped")]
        assert len(said) == 1 and said[0].startswith("error: ") and needle in said[0], err
        assert list(tmp_path.iterdir()) == [], needle


def test_parse_size():
    from attn_clip.retrieval.options import parse_size

    assert parse_size("256MB") == parse_size("256 MiB") == 256 << 20
    assert parse_size("1.5g") == 3 << 29 and parse_size("1000") == 1000
    with pytest.raises(ValueError, match="not a size"):
        parse_size("lots")


# -- the decode pipeline ------------------------------------------------------------------------


def test_jpegs_are_decoded_at_the_smallest_scale_that_covers_the_model(tmp_path):
    from attn_vision.images import load_image_file

    path = tmp_path / "photo.jpg"
    Image.effect_mandelbrot((1024, 768), (-2, -1.2, 1, 1.2), 60).convert("RGB").save(path)
    assert load_image_file(path)[0].size == (1024, 768)  # without draft: full size
    assert load_image_file(path, draft=224)[0].size == (512, 384)  # 1/4 would be 192 < 224
    assert load_image_file(path, draft=100)[0].size == (256, 192)
    assert load_image_file(path, draft=1000)[0].size == (1024, 768)
    png = tmp_path / "photo.png"
    Image.open(path).save(png)
    assert load_image_file(png, draft=224)[0].size == (1024, 768)  # JPEG only


def test_read_ahead_is_bounded_and_passes_errors_on():
    import threading
    import time

    from attn_clip.retrieval.embed import read_ahead

    made = []

    def items():
        for i in range(100):
            made.append(i)
            yield i

    stream = read_ahead(items(), 3)
    assert next(stream) == 0
    time.sleep(0.3)
    assert len(made) <= 5  # one taken, three queued, one waiting to be put
    stream.close()  # the consumer stops: so does the producer
    time.sleep(0.3)
    assert len(made) <= 5 and "read-ahead" not in {t.name for t in threading.enumerate()}

    def broken():
        yield 1
        raise OSError("disk gone")

    got = []
    with pytest.raises(OSError, match="disk gone"):
        for item in read_ahead(broken(), 2):
            got.append(item)
    assert got == [1]
