"""apps/retrieval.py serve / export / index --export-embeddings: a real server process on
127.0.0.1 answering as ``search --json`` does, Ctrl-C -> exit 130; bad input at start (no
index, port busy, bad options) one line and exit 2; the export's clip-retrieval layout, and
nothing created when its folder is refused."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import httpx
import numpy as np
import pytest
import retrieval
from _support.retrieval import (
    APPS,
    ROOT,
    call,
    one_line_error,
    shapes_gallery,  # noqa: F401  (a fixture)
    shapes_index,  # noqa: F401  (a fixture)
)


def serve_process(*args) -> tuple[subprocess.Popen, str]:
    """``apps/retrieval.py serve ARGS --port 0`` in a new interpreter, offline, and its URL
    (read from the line it prints when it listens)."""
    env = {"HF_HUB_OFFLINE": "1", "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    proc = subprocess.Popen(
        [sys.executable, str(APPS / "retrieval.py"), "serve", *map(str, args), "--port", "0"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if found := re.search(r"serving .* on (http://127\.0\.0\.1:\d+)$", line.strip()):
            return proc, found[1]
        if not line and proc.poll() is not None:
            break
    proc.kill()
    raise AssertionError(f"the server did not start: {proc.stderr.read()}")


def test_a_served_index_answers_as_search_and_stops_on_ctrl_c(shapes_index):  # noqa: F811
    index, _ = shapes_index
    proc, url = serve_process(index)
    try:
        with httpx.Client(base_url=url, timeout=60) as client:
            assert client.get("/indices-list").json() == ["shapes"]
            texts = ["a red circle", "a blue square", "a yellow star"]
            argv = [a for t in texts for a in ("--text", t)]
            cli = call(retrieval.main, "search", index, *argv, "--top-k", 3, "--json")
            for text, line in zip(texts, cli.out.splitlines(), strict=True):
                body = {"text": text, "num_images": 3, "indice_name": "shapes"}
                served = client.post("/knn-service", json=body).json()
                hits = json.loads(line)["hits"]  # paths relative to the working directory
                assert [r["image_path"] for r in served] == [str(ROOT / h["path"]) for h in hits]
                got = [r["similarity"] for r in served]
                assert got == pytest.approx([h["score"] for h in hits], abs=1e-6)
        proc.send_signal(signal.SIGINT)
        err = proc.communicate(timeout=30)[1]
        assert proc.returncode == 130, err
        assert err.strip().splitlines()[-1] == "interrupted" and "Traceback" not in err
    finally:
        proc.kill()
        proc.wait()


def test_bad_input_at_start_is_one_line_and_exit_2(shapes_index, tmp_path):  # noqa: F811
    index, _ = shapes_index
    r = call(retrieval.main, "serve", tmp_path / "none.idx")
    assert r.code == 2
    one_line_error(r.err, "no index at", "build it with: index DIR --out")
    r = call(retrieval.main, "serve", index, "--port", 70000)
    assert r.code == 2 and "--port must be 0-65535" in one_line_error(r.err)
    r = call(retrieval.main, "serve", index, index)
    assert r.code == 2 and "two indexes named 'shapes'" in one_line_error(r.err)
    r = call(retrieval.main, "serve", index, "--model", "ViT-B-32")
    assert r.code == 2 and "was built with demo-shapes" in one_line_error(r.err)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        r = call(retrieval.main, "serve", index, "--port", port)
    assert r.code == 2
    one_line_error(r.err, f"cannot listen on 127.0.0.1:{port}", "in use")


def test_export_and_index_export_embeddings(shapes_gallery, shapes_index, tmp_path):  # noqa: F811
    import pyarrow.parquet as pq
    from attn_clip.retrieval import load_index_set

    index, _ = shapes_index
    r = call(retrieval.main, "export", index, "--out", tmp_path / "emb", "--json")
    assert r.code == 0, r.err
    assert json.loads(r.out) == {"export": str(tmp_path / "emb"), "rows": 10, "files": 1}
    embeddings = load_index_set(index)[1]
    np.testing.assert_array_equal(
        np.load(tmp_path / "emb/img_emb/img_emb_0.npy"), embeddings.embeddings.numpy()
    )  # noqa: E501
    keys = pq.read_table(tmp_path / "emb/metadata/metadata_0.parquet").column("key").to_pylist()
    assert keys == embeddings.ids

    out = tmp_path / "new.idx"
    argv = ["index", shapes_gallery, "--out", out, "--model", "demo-shapes", "--export-embeddings"]
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.md").write_text("mine")
    r = call(retrieval.main, *argv, tmp_path / "taken")
    assert r.code == 2 and "holds other files" in one_line_error(r.err)
    assert not list(tmp_path.glob("new.idx*"))  # refused before any work
    r = call(retrieval.main, *argv, tmp_path / "emb")  # replaces the earlier export
    assert r.code == 0, r.err
    assert (
        r.out.strip()
        .splitlines()[-1]
        .startswith(f"exported 10 embeddings (64 wide, generation 1) to {tmp_path / 'emb'}")
    )  # noqa: E501
    np.testing.assert_array_equal(
        np.load(tmp_path / "emb/img_emb/img_emb_0.npy"), load_index_set(out)[1].embeddings.numpy()
    )  # noqa: E501
    r = call(retrieval.main, "export", tmp_path / "none.idx", "--out", tmp_path / "e2")
    assert r.code == 2 and "no index at" in one_line_error(r.err)
    assert not (tmp_path / "e2").exists()
