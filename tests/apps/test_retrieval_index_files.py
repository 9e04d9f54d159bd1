"""apps/retrieval.py's index on disk: replaced as a set (a kill at any file replacement leaves
the old or the new index, and the next --update completes), locked against a second writer,
written with the usual permissions, and refused with one line when it holds bad data.
In process; the kills in a forked copy of it."""

from __future__ import annotations

import json
import os
import signal
import stat
from pathlib import Path

import pytest
import retrieval
import torch
from _support.retrieval import call, one_line_error
from PIL import Image


def killed_at_replacement(n: int, when: str, argv: list) -> int:
    """``retrieval.main(argv)`` in a forked copy of this process whose ``os.replace`` kills
    it (exit 137, as kill -9 would leave things) just before or just after its ``n``-th
    call; the exit code. (A fork: torch and the model's weights are loaded already, and
    the file replacements the index makes are the same as in a new process.)"""
    pid = os.fork()
    if pid == 0:  # the child: never returns
        try:
            signal.alarm(120)  # a hang fails the test instead of blocking it
            torch.set_num_threads(1)
            real, calls = os.replace, [0]

            def replace(src, dst):
                calls[0] += 1
                if calls[0] == n and when == "before":
                    os._exit(137)
                real(src, dst)
                if calls[0] == n and when == "after":
                    os._exit(137)

            os.replace = replace
            call(retrieval.main, *argv)
        finally:
            os._exit(1)  # not killed: fewer replacements than n
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def make_images(folder: Path, colours: list[str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for colour in colours:
        Image.new("RGB", (32, 32), colour).save(folder / f"{colour}.png")
    return folder


def files_of(base: Path) -> list[str]:
    return sorted(p.name for p in base.parent.iterdir() if base.name in p.name)


def ids_of(base: Path) -> list[str]:
    from attn_clip.retrieval import load_index_set

    return load_index_set(base)[1].ids


def index(*args) -> int:
    result = call(retrieval.main, "index", *args)
    assert result.code in (0, 2), result.err
    return result.code


@pytest.mark.parametrize(("n", "when"), [(1, "before"), (2, "before"), (3, "before"), (3, "after")])
def test_a_kill_at_any_replacement_leaves_old_or_new(tmp_path, n, when):
    images = make_images(tmp_path / "images", ["red", "blue"])
    base = tmp_path / "idx"
    assert index(images, "--out", base, "--model", "demo-shapes") == 0
    make_images(images, ["green"])
    assert killed_at_replacement(n, when, ["index", images, "--out", base, "--update"]) == 137
    old, new = ["blue.png", "red.png"], ["blue.png", "green.png", "red.png"]
    assert ids_of(base) == (new if (n, when) == (3, "after") else old)
    assert call(retrieval.main, "search", base, "--text", "a green square", "--json").code == 0
    assert index(images, "--out", base, "--update") == 0  # completes
    assert ids_of(base) == new
    names = files_of(base)
    assert len(names) == 3 and "idx.manifest.json" in names, names  # one generation, no temp


def test_a_second_writer_is_refused_and_nothing_is_lost(tmp_path):
    import attn_clip

    images = make_images(tmp_path / "images", ["red"])
    base = tmp_path / "idx"
    assert index(images, "--out", base, "--model", "demo-shapes") == 0
    make_images(images, ["blue"])
    with attn_clip.index_lock(base):  # another update in progress
        result = call(retrieval.main, "index", images, "--out", base, "--update")
        assert result.code == 2
        one_line_error(result.err, "being updated by PID", str(os.getpid()), "try again")
    assert index(images, "--out", base, "--update") == 0
    assert ids_of(base) == ["blue.png", "red.png"]
    assert not Path(f"{base}.lock").exists()


def test_files_get_the_usual_permissions(tmp_path):
    images = make_images(tmp_path / "images", ["red"])
    base = tmp_path / "idx"
    old = os.umask(0o022)
    try:
        assert index(images, "--out", base, "--model", "demo-shapes") == 0
    finally:
        os.umask(old)
    for name in files_of(base):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o644, name


def rewrite_embeddings(gen_base: Path, emb: torch.Tensor, dim: int | None = None) -> None:
    """Replace the embeddings of one generation, with a matching SHA-256 in the sidecar."""
    import hashlib

    from safetensors.torch import save_file

    save_file({"embeddings": emb}, f"{gen_base}.safetensors")
    sidecar = Path(f"{gen_base}.json")
    meta = json.loads(sidecar.read_text())
    meta["sha256"] = hashlib.sha256(Path(f"{gen_base}.safetensors").read_bytes()).hexdigest()
    meta["dim"] = dim or emb.shape[1]
    sidecar.write_text(json.dumps(meta))


def test_bad_data_that_passes_the_checksum_is_refused(tmp_path):
    from attn_clip.retrieval import load_index_set

    images = make_images(tmp_path / "images", ["red", "blue"])
    base = tmp_path / "idx"
    assert index(images, "--out", base, "--model", "demo-shapes") == 0
    gen = tmp_path / "idx.g1"
    good = load_index_set(base)[1].embeddings.clone()
    manifest_file = Path(f"{base}.manifest.json")
    manifest = json.loads(manifest_file.read_text())
    nan = good.index_fill(0, torch.tensor([0]), float("nan"))
    narrow = torch.nn.functional.normalize(good[:, :8], dim=-1)

    def drop(key: str):
        return lambda: manifest_file.write_text(
            json.dumps({k: v for k, v in manifest.items() if k != key})
        )

    cases = {
        "NaN or infinite": lambda: rewrite_embeddings(gen, nan),
        "not L2-normalized": lambda: rewrite_embeddings(gen, good * 72),
        "not floats": lambda: rewrite_embeddings(gen, (good * 100).long()),
        "embed_dim": lambda: rewrite_embeddings(gen, narrow),
        "missing or malformed files": drop("files"),
        "missing or malformed model": drop("model"),
    }
    for needle, corrupt in cases.items():
        corrupt()
        result = call(retrieval.main, "search", base, "--text", "red")
        assert result.code == 2, needle
        one_line_error(result.err, needle)
        rewrite_embeddings(gen, good)
        manifest_file.write_text(json.dumps(manifest))
    assert call(retrieval.main, "search", base, "--text", "red", "--json").code == 0
