"""apps/retrieval.py at scale: ``index`` under ``torchrun`` (2 CPU processes, gloo) writes
the index one process writes, resumes a killed run shard by shard and reports bad input once;
the approximate (faiss) index is built, searched, replaced with its generation and refused
when corrupt."""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from PIL import Image

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "apps" / "retrieval.py"
COLOURS = ["red", "blue", "green", "yellow", "purple", "orange", "white", "black", "cyan",
           "magenta", "pink", "brown", "grey"]  # fmt: skip
# Runs the app with os.replace patched so that rank RANK_TO_KILL dies (exit 137, as kill -9
# would leave things) right after its N-th file replacement: its first finished shard.
KILLER = f"""
import os, sys
n, victim = int(sys.argv[1]), sys.argv[2]
sys.path.insert(0, {str(APP.parent)!r})
real, calls = os.replace, [0]
def replace(src, dst):
    real(src, dst)
    calls[0] += 1
    if calls[0] == n and os.environ.get("RANK") == victim:
        os._exit(137)
os.replace = replace
import runpy
sys.argv = ["retrieval.py", *sys.argv[3:]]
runpy.run_path({str(APP)!r}, run_name="__main__")
"""


@pytest.fixture(scope="module")
def app():
    sys.path.insert(0, str(APP.parent))
    try:
        spec = importlib.util.spec_from_file_location("retrieval_app_scale", APP)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(str(APP.parent))


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


@pytest.fixture(scope="module")
def single(app, images, tmp_path_factory) -> Path:
    """The index one process writes (batches of 2)."""
    base = tmp_path_factory.mktemp("single") / "idx"
    args = ["index", str(images), "--out", str(base), "--model", "demo-shapes"]
    assert app.main([*args, "--batch-size", "2"]) == 0
    return base


def torchrun(*args, script: list[str] | None = None) -> subprocess.CompletedProcess[str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
    cmd += ["--master-port", str(port), *(script or [str(APP)]), *map(str, args)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)


def errors(proc: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in proc.stderr.splitlines() if line.startswith("error: ")]


def assert_same_index(app, a: Path, b: Path) -> None:
    (ma, ia), (mb, ib) = app.load_index(a), app.load_index(b)
    assert ia.ids == ib.ids and ma["files"] == mb["files"] and ma["skipped"] == mb["skipped"]
    torch.testing.assert_close(ia.embeddings, ib.embeddings, atol=1e-6, rtol=0)
    assert ma["model"] == mb["model"]


def shard_files(base: Path) -> list[Path]:
    return sorted(base.parent.glob(f"{base.name}.shard-*"))


@pytest.mark.slow
def test_torchrun_index_equals_one_process(app, images, single, tmp_path):
    base = tmp_path / "idx"
    args = ["index", images, "--out", base, "--model", "demo-shapes", "--batch-size", "2"]
    proc = torchrun(*args, "--shard-size", "3", "--json")  # 3 -> 4: whole batches
    assert proc.returncode == 0, proc.stderr[-3000:]
    (summary,) = [json.loads(line) for line in proc.stdout.splitlines()]  # rank 0 alone
    assert summary["ranks"] == 2 and summary["resumed"] == 0
    assert summary["images"] == 13 and summary["added"] == 13 and summary["skipped"] == 1
    assert_same_index(app, single, base)
    assert shard_files(base) == [] and not Path(f"{base}.lock").exists()
    assert proc.stderr.count("broken.png") == 1  # the rank that met it says so, once

    # --update under torchrun: one new file, one removed; only the new one is embedded
    Image.new("RGB", (50, 50), "navy").save(images / "navy.png")
    try:
        proc = torchrun(*args, "--update", "--json")
        assert proc.returncode == 0, proc.stderr[-3000:]
        summary = json.loads(proc.stdout)
        assert (summary["added"], summary["unchanged"], summary["skipped"]) == (1, 13, 1)
        assert "navy.png" in app.load_index(base)[1].ids
    finally:
        (images / "navy.png").unlink()


@pytest.mark.slow
def test_a_killed_torchrun_resumes_shard_by_shard(app, images, single, tmp_path):
    base = tmp_path / "idx"
    args = ["index", images, "--out", base, "--model", "demo-shapes", "--batch-size", "2"]
    args += ["--shard-size", "2", "--json"]
    killer = tmp_path / "killer.py"
    killer.write_text(KILLER)
    script = [str(killer), "1", "1"]  # rank 1 dies once its first shard is on disk
    proc = torchrun(*args, script=script)
    assert proc.returncode != 0
    killer.unlink()
    assert not Path(f"{base}.manifest.json").exists()  # no index yet
    assert len(shard_files(base)) >= 1  # but finished shards

    proc = torchrun(*args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout)
    assert summary["resumed"] >= 2 and summary["added"] == 13, summary  # not embedded again
    assert_same_index(app, single, base)
    assert shard_files(base) == []


@pytest.mark.slow
def test_torchrun_bad_input_is_one_line(tmp_path):
    proc = torchrun("index", tmp_path / "nowhere", "--out", tmp_path / "idx")
    assert proc.returncode != 0
    assert errors(proc) == [f"error: image folder not found: {tmp_path / 'nowhere'}"]
    assert list(tmp_path.iterdir()) == []


# -- the approximate index ----------------------------------------------------------------------


def test_ann_index_search_update_and_corruption(app, images, single, tmp_path, capsys):
    pytest.importorskip("faiss")
    base = tmp_path / "idx"
    argv = ["index", str(images), "--out", str(base), "--model", "demo-shapes"]
    assert app.main([*argv, "--ann-threshold", "10"]) == 0  # 13 images: auto builds one
    out = capsys.readouterr().out
    assert "approximate index HNSW32" in out and "recall@10" in out and "efSearch" in out
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["idx.g1.faiss", "idx.g1.json", "idx.g1.safetensors", "idx.manifest.json"]
    manifest, index = app.load_index(base)
    assert index.ann is not None and index.ann.ntotal == 13
    assert index.embeddings.numpy().shape == (13, manifest["model"]["embed_dim"])

    query = ["search", str(base), "--text", "a red square", "--top-k", "5", "--json"]
    assert app.main(query) == 0
    approx = json.loads(capsys.readouterr().out)
    assert app.main([*query, "--exact"]) == 0
    exact = json.loads(capsys.readouterr().out)
    assert [h["path"] for h in approx["hits"]] == [h["path"] for h in exact["hits"]]
    for a, e in zip(approx["hits"], exact["hits"], strict=True):  # (13 images: all found)
        assert a["score"] == pytest.approx(e["score"], abs=1e-6)  # exact cosines, re-ranked
    assert app.main([*query, "--nprobe", "4"]) == 0
    assert json.loads(capsys.readouterr().out)["hits"][0]["path"] == exact["hits"][0]["path"]

    # --update replaces the faiss file with its generation; --ann off drops it
    assert app.main([*argv, "--update", "--ann", "on", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["ann"]["factory"] == "HNSW32" and summary["ann"]["recall_at_10"] == 1.0
    assert sorted(p.name for p in tmp_path.glob("idx.g*")) == [
        "idx.g2.faiss", "idx.g2.json", "idx.g2.safetensors",
    ]  # fmt: skip
    ann = tmp_path / "idx.g2.faiss"
    data = ann.read_bytes()
    ann.write_bytes(data[: len(data) // 2])
    assert app.main(query) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "approximate index" in err[0] and "SHA-256" in err[0], err
    ann.write_bytes(data)
    assert app.main([*argv, "--update", "--ann", "off"]) == 0
    assert not list(tmp_path.glob("*.faiss"))


def test_ann_bad_input_exits_2_and_writes_nothing(app, images, tmp_path, capsys):
    pytest.importorskip("faiss")
    base = tmp_path / "idx"
    argv = ["index", str(images), "--out", str(base), "--model", "demo-shapes"]
    cases = [
        ([*argv, "--ann-memory", "lots"], "--ann-memory: not a size"),
        ([*argv, "--ann-factory", "IVF7,Nonsense"], "bad faiss index factory"),
        ([*argv, "--ann-threshold", "0"], "--ann-threshold"),
        ([*argv, "--ann", "on", "--ann-factory", "IVF2,PQ4x4fs"], "cannot train"),
        (["search", str(base), "--text", "x", "--nprobe", "0"], "--nprobe must be >= 1"),
    ]
    capsys.readouterr()
    for args, needle in cases:
        assert app.main(args) == 2, needle
        err = capsys.readouterr().err.strip().splitlines()  # (after the unreadable file's)
        said = [line for line in err if not line.startswith("warning: skipped")]
        assert len(said) == 1 and said[0].startswith("error: ") and needle in said[0], err
        assert list(tmp_path.iterdir()) == [], needle


def test_parse_bytes(app):
    assert app.parse_bytes("256MB") == app.parse_bytes("256 MiB") == 256 << 20
    assert app.parse_bytes("1.5g") == 3 << 29 and app.parse_bytes("1000") == 1000


# -- the decode pipeline ------------------------------------------------------------------------


def test_jpegs_are_decoded_at_the_smallest_scale_that_covers_the_model(app, tmp_path):
    from _common import load_image_file

    path = tmp_path / "photo.jpg"
    Image.effect_mandelbrot((1024, 768), (-2, -1.2, 1, 1.2), 60).convert("RGB").save(path)
    assert load_image_file(path)[0].size == (1024, 768)  # without draft: full size
    assert load_image_file(path, draft=224)[0].size == (512, 384)  # 1/4 would be 192 < 224
    assert load_image_file(path, draft=100)[0].size == (256, 192)
    assert load_image_file(path, draft=1000)[0].size == (1024, 768)
    png = tmp_path / "photo.png"
    Image.open(path).save(png)
    assert load_image_file(png, draft=224)[0].size == (1024, 768)  # JPEG only


def test_read_ahead_is_bounded_and_passes_errors_on(app):
    import threading
    import time

    made = []

    def items():
        for i in range(100):
            made.append(i)
            yield i

    stream = app.read_ahead(items(), 3)
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
        for item in app.read_ahead(broken(), 2):
            got.append(item)
    assert got == [1]
