"""Shared fixtures of the retrieval and web tests: galleries of generated shapes, a tiny
SigLIP-style CLIP, and in-process calls of an app's ``main(argv)``."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
APPS = ROOT / "apps"

# (colour, shape, size, position, seed): three red circles, then one or two of other kinds
GALLERY = [
    ("red", "circle", "large", "center", 0),
    ("red", "circle", "medium", "top left", 1),
    ("red", "circle", "large", "bottom right", 2),
    ("blue", "square", "large", "center", 3),
    ("blue", "square", "medium", "right", 4),
    ("green", "triangle", "large", "center", 5),
    ("green", "triangle", "medium", "left", 6),
    ("yellow", "star", "large", "center", 7),
    ("yellow", "star", "medium", "bottom", 8),
    ("purple", "cross", "large", "center", 9),
]


def render(colour, shape, size="large", position="center", seed=0):
    """One generated shape (a PIL image), without noise."""
    from attn_train import shapes

    return shapes.render_shape(colour, shape, size, position, seed=seed, noise=0.0)


def rel_name(colour, shape, size, position, seed) -> str:
    return f"{shape}s/{colour}_{shape}_{seed}.png"


def make_gallery(folder: Path, items=GALLERY, broken: bool = False) -> Path:
    """``items`` rendered under ``folder`` (``<shape>s/<colour>_<shape>_<seed>.png``), plus
    ``stars/broken.png`` (a truncated PNG) with ``broken``."""
    for item in items:
        path = folder / rel_name(*item)
        path.parent.mkdir(parents=True, exist_ok=True)
        render(*item).save(path)
    if broken:
        (folder / "stars").mkdir(parents=True, exist_ok=True)
        (folder / "stars" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n truncated")
    return folder


@pytest.fixture(scope="session")
def shapes_gallery(tmp_path_factory) -> Path:
    """The 10-shape gallery with a broken file (read only: copy it to change it)."""
    return make_gallery(tmp_path_factory.mktemp("gallery") / "gallery", broken=True)


@pytest.fixture(scope="session")
def shapes_index(shapes_gallery, tmp_path_factory) -> tuple[Path, dict]:
    """``(index, summary)``: the gallery indexed in process by ``apps/retrieval.py index
    --model demo-shapes --json`` (read only: copy it to change it)."""
    import retrieval

    out = tmp_path_factory.mktemp("shapes_index") / "shapes.idx"
    argv = ["index", str(shapes_gallery), "--out", str(out), "--model", "demo-shapes", "--json"]
    result = call(retrieval.main, *argv)
    assert result.code == 0, result.err
    import json

    return out, json.loads(result.out)


@dataclass
class Called:
    code: int
    out: str
    err: str


def call(main, *argv) -> Called:
    """``main(argv)`` in this process, its stdout and stderr captured (usable in fixtures
    of any scope, unlike capsys)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in argv])
    return Called(code, out.getvalue(), err.getvalue())


def run_app(name: str, *args, cwd: Path = ROOT, **env) -> subprocess.CompletedProcess[str]:
    """``apps/<name>.py ARGS`` in a new interpreter, offline, as a user runs it."""
    return subprocess.run(
        [sys.executable, str(APPS / f"{name}.py"), *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env={"HF_HUB_OFFLINE": "1", "PATH": os.environ.get("PATH", "/usr/bin:/bin"), **env},
    )


def one_rank_group(monkeypatch) -> None:
    """The environment of a torchrun rank 0 of 1 (its gloo group on a free local port): the
    torchrun path of ``index`` in this process."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for key, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0",
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}.items():  # fmt: skip
        monkeypatch.setenv(key, value)


def one_line_error(err: str, *needles: str) -> str:
    """The single ``error: ...`` line of ``err``, checked to hold every needle."""
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def tiny_siglip(folder: Path) -> Path:
    """A 1-layer SigLIP-style CLIP (32 wide, with a logit bias) saved as a model folder.
    OpenAI's BPE (no tokenizer download): the towers and the logit bias are SigLIP's."""
    import attn_clip

    cfg = attn_clip.get_model_config("ViT-B-16-SigLIP")
    v = replace(cfg.vision, image_size=32, patch_size=8, width=32, layers=1, head_width=16)
    t = replace(cfg.text, width=32, heads=2, layers=1, context_length=16, vocab_size=49408,
                hf_tokenizer_name=None, tokenizer_kwargs=None)  # fmt: skip
    model = attn_clip.create_model(replace(cfg, embed_dim=32, vision=v, text=t))
    attn_clip.save_pretrained(model, folder)
    return folder
