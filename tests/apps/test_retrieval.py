"""apps/retrieval.py, run as a user would, with the bundled demo-shapes CLIP on generated
shapes: index (skipping a broken file), text and image search with a contact sheet,
--update (new / changed / removed / touched files), eval recall@k, and the clear errors
(another model than the index's, unreadable index, bad queries and CSVs)."""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from PIL import Image

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "apps" / "retrieval.py"

# (colour, shape, size, position, seed): three red circles, two of each other kind
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


def run(*args, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(APP), *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env={"HF_HUB_OFFLINE": "1", "PATH": os.environ.get("PATH", "/usr/bin:/bin")},
    )


def assert_one_line_error(proc: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


def render(colour, shape, size, position, seed) -> Image.Image:
    from attn_train import shapes

    return shapes.render_shape(colour, shape, size, position, seed=seed, noise=0.0)


def rel_name(colour, shape, size, position, seed) -> str:
    return f"{shape}s/{colour}_{shape}_{seed}.png"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The gallery (10 shapes + a broken file, nested) and its index, built by the app."""
    work = tmp_path_factory.mktemp("retrieval")
    gallery = work / "gallery"
    for item in GALLERY:
        path = gallery / rel_name(*item)
        path.parent.mkdir(parents=True, exist_ok=True)
        render(*item).save(path)
    (gallery / "stars" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n truncated")
    proc = run("index", gallery, "--out", work / "shapes.idx", "--model", "demo-shapes", "--json")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["images"] == 10 and summary["added"] == 10 and summary["skipped"] == 1
    assert "broken.png" in proc.stderr and "Traceback" not in proc.stderr
    names = sorted(p.name for p in work.iterdir() if p.name.startswith(("shapes.idx", ".")))
    assert names == ["shapes.idx.g1.json", "shapes.idx.g1.safetensors", "shapes.idx.manifest.json"]
    return work, gallery, work / "shapes.idx"


def copy_index(src: Path, dst: Path) -> None:
    """Copy every file of index ``src`` (``src.*``) to index ``dst``."""
    for f in src.parent.glob(f"{src.name}.*"):
        shutil.copy2(f, dst.with_name(dst.name + f.name[len(src.name) :]))


def load_embeddings(base: Path):
    import attn_clip

    manifest = Path(f"{base}.manifest.json")
    return attn_clip.load_index_set(base, lambda: json.loads(manifest.read_text()))[1]


def test_search_text_and_image_with_grid_then_eval(built, tmp_path):
    work, gallery, index = built
    star = gallery / rel_name(*GALLERY[7])
    grid = tmp_path / "grid.png"
    proc = run(
        "search", index, "--text", "a red circle", "--text", "a blue square",
        "--image", star, "--top-k", "3", "--grid", grid, "--json",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    red, blue, by_image = (json.loads(line) for line in proc.stdout.splitlines())
    assert red["query"] == "a red circle" and red["type"] == "text"
    assert [Path(h["path"]).name.startswith("red_circle") for h in red["hits"]] == [True] * 3
    assert all(Path(h["path"]).name.startswith("blue_square") for h in blue["hits"][:2])
    assert Path(by_image["hits"][0]["path"]).resolve() == star.resolve()
    assert by_image["hits"][0]["score"] == pytest.approx(1.0, abs=1e-4)
    scores = [h["score"] for h in red["hits"]]
    assert scores == sorted(scores, reverse=True)
    with Image.open(grid) as sheet:  # 3 query rows x (query + 3 hits) columns
        assert sheet.format == "PNG" and sheet.width > sheet.height > 3 * 160

    # eval: captions for every indexed image (reused from the index) plus one new image
    extra = tmp_path / "orange_square.png"
    render("orange", "square", "large", "center", 11).save(extra)
    captions = tmp_path / "captions.csv"
    with open(captions, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["filepath", "title"])
        for colour, shape, size, position, seed in GALLERY:
            path = gallery / rel_name(colour, shape, size, position, seed)
            w.writerow([path, f"a {size} {colour} {shape}"])
            w.writerow([path, f"a photo of a {colour} {shape}"])
        w.writerow([extra.name, "a large orange square"])  # relative to the CSV
    proc = run("eval", "--csv", captions, "--index", index, "--json")
    assert proc.returncode == 0, proc.stderr
    metrics = json.loads(proc.stdout)
    assert metrics["images"] == 11 and metrics["captions"] == 21
    for direction in ("image_to_text", "text_to_image"):
        values = [metrics[f"{direction}_R@{k}"] for k in (1, 5, 10)]
        assert values == sorted(values) and values[-1] >= 0.9, metrics
        assert values[0] >= 0.3, metrics  # several same-kind shapes: R@1 cannot be perfect


def test_update_adds_changes_removes(built, tmp_path):
    """--update on a moved copy: one new, one changed, one deleted and one merely touched
    file; only the new and changed ones are embedded."""

    work, gallery, index = built
    copy = tmp_path / "gallery"
    shutil.copytree(gallery, copy)  # keeps the mtimes
    out = tmp_path / "copy.idx"
    copy_index(index, out)
    before = load_embeddings(out)

    new = copy / "squares" / "orange_square_20.png"
    render("orange", "square", "large", "center", 20).save(new)
    changed = copy / rel_name(*GALLERY[3])  # a blue square becomes a green triangle
    render("green", "triangle", "small", "top", 21).save(changed)
    (copy / rel_name(*GALLERY[8])).unlink()
    touched = copy / rel_name(*GALLERY[0])
    later = time.time() + 5
    os.utime(touched, (later, later))  # new mtime, same bytes: unchanged by its SHA-256

    proc = run("index", copy, "--out", out, "--update", "--json")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    expected = {"images": 10, "added": 1, "updated": 1, "removed": 1, "unchanged": 8}
    assert {k: summary[k] for k in expected} == expected and summary["skipped"] == 1, summary
    after = load_embeddings(out)
    assert sorted(p.name for p in tmp_path.glob("copy.idx*")) == [
        "copy.idx.g2.json",
        "copy.idx.g2.safetensors",
        "copy.idx.manifest.json",
    ]  # the old generation removed, no lock or temporary file left
    old_rows = dict(zip(before.ids, before.embeddings, strict=True))
    new_rows = dict(zip(after.ids, after.embeddings, strict=True))
    assert rel_name(*GALLERY[8]) not in new_rows and "squares/orange_square_20.png" in new_rows
    assert not new_rows[rel_name(*GALLERY[3])].allclose(old_rows[rel_name(*GALLERY[3])])
    assert new_rows[rel_name(*GALLERY[0])].equal(old_rows[rel_name(*GALLERY[0])])
    manifest = json.loads(Path(f"{out}.manifest.json").read_text())
    assert manifest["root"] == str(copy.resolve()) and manifest["model"]["name"] == "demo-shapes"


def test_bad_input_exits_2_with_one_line(built, tmp_path):
    work, gallery, index = built
    (tmp_path / "bad.csv").write_text("name,label\na.png,a cat\n")
    cases = [
        (("search", index, "--text", "x", "--model", "ViT-B-32"), "built with demo-shapes"),
        (("search", index, "--text", "x", "--pretrained", tmp_path), "built with demo-shapes"),
        (("search", tmp_path / "nothing.idx", "--text", "x"), "no index"),
        (("search", index, "--text", " "), "empty"),
        (("search", index), "nothing to search for"),
        (("search", index, "--image", tmp_path / "q.jpg"), "image not found"),
        (("index", tmp_path / "nowhere", "--out", tmp_path / "i"), "image folder not found"),
        (("eval", "--csv", tmp_path / "bad.csv"), "needs a header"),
        (("eval", "--csv", tmp_path / "missing.csv"), "not found"),
    ]
    for args, needle in cases:
        assert_one_line_error(run(*args), needle)


def test_corrupt_index_in_process(built, tmp_path, capsys, monkeypatch):
    """A truncated tensor file (its SHA-256 no longer matches) is refused when the index is
    loaded (main() called directly: torch is imported already)."""
    work, gallery, index = built
    broken = tmp_path / "broken.idx"
    copy_index(index, broken)
    data = Path(f"{index}.g1.safetensors").read_bytes()
    Path(f"{broken}.g1.safetensors").write_bytes(data[: len(data) // 2])
    monkeypatch.syspath_prepend(str(ROOT / "apps"))  # as when run as a script
    spec = importlib.util.spec_from_file_location("retrieval_app", APP)
    app = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, app)
    spec.loader.exec_module(app)
    assert app.main(["search", str(broken), "--text", "a red circle"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unreadable index" in err[0] and "corrupt" in err[0], err


def test_siglip_search_shows_match_probabilities(built, tmp_path, capsys, monkeypatch):
    """With a SigLIP-style model (a logit bias) a text query's hits also get SigLIP's sigmoid
    probability of matching; image queries (image-image cosines) do not."""
    from dataclasses import replace

    import attn_clip
    import torch

    work, gallery, _ = built
    cfg = attn_clip.get_model_config("ViT-B-16-SigLIP")
    v = replace(cfg.vision, image_size=32, patch_size=8, width=32, layers=1, head_width=16)
    # OpenAI's BPE here (no tokenizer download): the towers and the logit bias are SigLIP's
    t = replace(cfg.text, width=32, heads=2, layers=1, context_length=16, vocab_size=49408,
                hf_tokenizer_name=None, tokenizer_kwargs=None)  # fmt: skip
    folder = tmp_path / "siglip"
    attn_clip.save_pretrained(attn_clip.create_model(replace(cfg, embed_dim=32, vision=v, text=t)),
                              folder)  # fmt: skip
    monkeypatch.syspath_prepend(str(ROOT / "apps"))
    spec = importlib.util.spec_from_file_location("retrieval_app_siglip", APP)
    app = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, app)
    spec.loader.exec_module(app)
    index = tmp_path / "siglip.idx"
    assert app.main(["index", str(gallery), "--out", str(index), "--model", str(folder)]) == 0
    capsys.readouterr()
    query = str(gallery / rel_name(*GALLERY[0]))
    argv = ["search", str(index), "--text", "a red circle", "--image", query, "--top-k", "3"]
    assert app.main([*argv, "--json"]) == 0
    text_hits, image_hits = (json.loads(line) for line in capsys.readouterr().out.splitlines())
    model = attn_clip.create_model(str(folder))
    for hit in text_hits["hits"]:
        with torch.no_grad():
            want = torch.sigmoid(model.logit_scale.exp() * hit["score"] + model.logit_bias)
        assert abs(hit["prob"] - float(want)) < 1e-5
    assert all("prob" not in hit for hit in image_hits["hits"])
    assert app.main(argv) == 0
    assert "p(match)" in capsys.readouterr().out
