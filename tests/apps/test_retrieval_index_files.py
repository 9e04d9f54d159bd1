"""apps/retrieval.py's index on disk: replaced as a set (a kill at any file replacement leaves
the old or the new index, and the next --update completes), locked against a second writer,
written with the usual permissions, and refused with one line when it holds bad data."""

from __future__ import annotations

import importlib.util
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from PIL import Image

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "apps" / "retrieval.py"
# Runs the app with os.replace patched to kill the process (exit 137, as kill -9 would
# leave things) just before or just after its N-th call.
KILLER = f"""
import os, sys
n, when = int(sys.argv[1]), sys.argv[2]
sys.path.insert(0, {str(APP.parent)!r})
real, calls = os.replace, [0]
def replace(src, dst):
    calls[0] += 1
    if calls[0] == n and when == "before":
        os._exit(137)
    real(src, dst)
    if calls[0] == n and when == "after":
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
        spec = importlib.util.spec_from_file_location("retrieval_app_files", APP)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(str(APP.parent))


def make_images(folder: Path, colours: list[str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for colour in colours:
        Image.new("RGB", (32, 32), colour).save(folder / f"{colour}.png")
    return folder


def files_of(base: Path) -> list[str]:
    return sorted(p.name for p in base.parent.iterdir() if base.name in p.name)


def ids_of(app, base: Path) -> list[str]:
    return app.load_index(base)[1].ids


def one_line_error(capsys, *needles: str) -> None:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    for needle in needles:
        assert needle in err[0], err[0]


@pytest.mark.parametrize(("n", "when"), [(1, "before"), (2, "before"), (3, "before"), (3, "after")])
def test_a_kill_at_any_replacement_leaves_old_or_new(app, tmp_path, capsys, n, when):
    images = make_images(tmp_path / "images", ["red", "blue"])
    base = tmp_path / "idx"
    assert app.main(["index", str(images), "--out", str(base), "--model", "demo-shapes"]) == 0
    make_images(images, ["green"])
    proc = subprocess.run(
        [sys.executable, "-c", KILLER, str(n), when, "index", str(images), "--out", str(base),
         "--update"],
        capture_output=True, text=True, timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )  # fmt: skip
    assert proc.returncode == 137, proc.stderr
    old, new = ["blue.png", "red.png"], ["blue.png", "green.png", "red.png"]
    assert ids_of(app, base) == (new if (n, when) == (3, "after") else old)
    capsys.readouterr()
    assert app.main(["search", str(base), "--text", "a green square", "--json"]) == 0
    assert app.main(["index", str(images), "--out", str(base), "--update"]) == 0  # completes
    assert ids_of(app, base) == new
    names = files_of(base)
    assert len(names) == 3 and "idx.manifest.json" in names, names  # one generation, no temp


def test_a_second_writer_is_refused_and_nothing_is_lost(app, tmp_path, capsys):
    import attn_clip

    images = make_images(tmp_path / "images", ["red"])
    base = tmp_path / "idx"
    assert app.main(["index", str(images), "--out", str(base), "--model", "demo-shapes"]) == 0
    make_images(images, ["blue"])
    capsys.readouterr()
    with attn_clip.index_lock(base):  # another update in progress
        assert app.main(["index", str(images), "--out", str(base), "--update"]) == 2
        one_line_error(capsys, "being updated by PID", str(os.getpid()))
    assert app.main(["index", str(images), "--out", str(base), "--update"]) == 0
    assert ids_of(app, base) == ["blue.png", "red.png"]
    assert not Path(f"{base}.lock").exists()


def test_files_get_the_usual_permissions(app, tmp_path):
    images = make_images(tmp_path / "images", ["red"])
    base = tmp_path / "idx"
    old = os.umask(0o022)
    try:
        assert app.main(["index", str(images), "--out", str(base), "--model", "demo-shapes"]) == 0
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


def test_bad_data_that_passes_the_checksum_is_refused(app, tmp_path, capsys):
    images = make_images(tmp_path / "images", ["red", "blue"])
    base = tmp_path / "idx"
    assert app.main(["index", str(images), "--out", str(base), "--model", "demo-shapes"]) == 0
    gen = tmp_path / "idx.g1"
    good = app.load_index(base)[1].embeddings.clone()
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
    capsys.readouterr()
    for needle, corrupt in cases.items():
        corrupt()
        assert app.main(["search", str(base), "--text", "red"]) == 2, needle
        one_line_error(capsys, needle)
        rewrite_embeddings(gen, good)
        manifest_file.write_text(json.dumps(manifest))
    assert app.main(["search", str(base), "--text", "red", "--json"]) == 0
