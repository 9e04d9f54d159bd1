"""apps/retrieval.py with the bundled demo-shapes CLIP on generated shapes: index (skipping a
broken file), text and image search with a contact sheet, --update (new / changed / removed
/ touched files), eval recall@k, and the clear errors (another model than the index's,
unreadable index, bad queries and CSVs). In process (``main(argv)``); one real process
checks what only a process shows (exit code 2, one line on stderr)."""

from __future__ import annotations

import csv
import json
import os
import shutil
import time
from pathlib import Path

import pytest
import retrieval
from _support.retrieval import (
    GALLERY,
    call,
    one_line_error,
    rel_name,
    render,
    run_app,
    shapes_gallery,  # noqa: F401  (a fixture)
    shapes_index,  # noqa: F401  (a fixture)
    tiny_siglip,
)
from PIL import Image


@pytest.fixture(scope="module")
def built(shapes_gallery, shapes_index):  # noqa: F811
    """The gallery (10 shapes + a broken file, nested) and its index, built by the app."""
    index, summary = shapes_index
    assert summary["images"] == 10 and summary["added"] == 10 and summary["skipped"] == 1
    names = sorted(p.name for p in index.parent.iterdir())
    assert names == ["shapes.idx.g1.json", "shapes.idx.g1.safetensors", "shapes.idx.manifest.json"]
    return shapes_gallery, index


def test_index_skips_the_broken_file_with_a_warning(shapes_gallery, tmp_path):  # noqa: F811
    result = call(retrieval.main, "index", shapes_gallery, "--out", tmp_path / "i", "--model",
                  "demo-shapes")  # fmt: skip
    assert result.code == 0, result.err
    assert "broken.png" in result.err and "Traceback" not in result.err
    assert result.out.startswith(f"indexed 10 images under {shapes_gallery} with demo-shapes")
    assert "(10 added, 1 skipped)" in result.out and "i.g1.*" in result.out


def copy_index(src: Path, dst: Path) -> None:
    """Copy every file of index ``src`` (``src.*``) to index ``dst``."""
    for f in src.parent.glob(f"{src.name}.*"):
        shutil.copy2(f, dst.with_name(dst.name + f.name[len(src.name) :]))


def load_embeddings(base: Path):
    from attn_clip.retrieval import load_index_set

    return load_index_set(base)[1]


def test_search_text_and_image_with_grid_then_eval(built, tmp_path):
    gallery, index = built
    star = gallery / rel_name(*GALLERY[7])
    grid = tmp_path / "grid.png"
    result = call(
        retrieval.main, "search", index, "--text", "a red circle", "--text", "a blue square",
        "--image", star, "--top-k", "3", "--grid", grid, "--json",
    )  # fmt: skip
    assert result.code == 0, result.err
    red, blue, by_image = (json.loads(line) for line in result.out.splitlines())
    assert red["query"] == "a red circle" and red["type"] == "text"
    assert [Path(h["path"]).name.startswith("red_circle") for h in red["hits"]] == [True] * 3
    assert all(Path(h["path"]).name.startswith("blue_square") for h in blue["hits"][:2])
    assert Path(by_image["hits"][0]["path"]).resolve() == star.resolve()
    assert by_image["hits"][0]["score"] == pytest.approx(1.0, abs=1e-4)
    scores = [h["score"] for h in red["hits"]]
    assert scores == sorted(scores, reverse=True)
    with Image.open(grid) as sheet:  # 3 query rows x (query + 3 hits) columns
        assert sheet.format == "PNG" and sheet.width > sheet.height > 3 * 160
    text = call(retrieval.main, "search", index, "--text", "a red circle", "--top-k", "2")
    assert text.out.splitlines()[0] == "text: a red circle"
    assert text.out.splitlines()[1].split()[2] == red["hits"][0]["path"]

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
    result = call(retrieval.main, "eval", "--csv", captions, "--index", index, "--json")
    assert result.code == 0, result.err
    metrics = json.loads(result.out)
    assert metrics["images"] == 11 and metrics["captions"] == 21
    for direction in ("image_to_text", "text_to_image"):
        values = [metrics[f"{direction}_R@{k}"] for k in (1, 5, 10)]
        assert values == sorted(values) and values[-1] >= 0.9, metrics
        assert values[0] >= 0.3, metrics  # several same-kind shapes: R@1 cannot be perfect
    fresh = call(retrieval.main, "eval", "--csv", captions, "--model", "demo-shapes", "--json")
    assert json.loads(fresh.out) == pytest.approx(metrics, abs=1e-6)  # (all embedded again)


def test_update_adds_changes_removes(built, tmp_path):
    """--update on a moved copy: one new, one changed, one deleted and one merely touched
    file; only the new and changed ones are embedded."""

    gallery, index = built
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

    result = call(retrieval.main, "index", copy, "--out", out, "--update", "--json")
    assert result.code == 0, result.err
    summary = json.loads(result.out)
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
    gallery, index = built
    (tmp_path / "bad.csv").write_text("name,label\na.png,a cat\n")
    cases = [
        (("search", index, "--text", "x", "--model", "ViT-B-32"), "built with demo-shapes"),
        (("search", index, "--text", "x", "--pretrained", tmp_path), "built with demo-shapes"),
        (("search", tmp_path / "nothing.idx", "--text", "x"), "no index"),
        (("search", index, "--text", " "), "empty"),
        (("search", index), "nothing to search for"),
        (("search", index, "--image", tmp_path / "q.jpg"), "image not found"),
        (("index", tmp_path / "nowhere", "--out", tmp_path / "i"), "image folder not found"),
        (("eval", "--csv", tmp_path / "bad.csv"), "no column"),
        (("eval", "--csv", tmp_path / "missing.csv"), "not found"),
    ]
    for args, needle in cases:
        result = call(retrieval.main, *args)
        assert result.code == 2, (args, result.out, result.err)
        one_line_error(result.err, needle)
    assert list(tmp_path.iterdir()) == [tmp_path / "bad.csv"]  # nothing created


def test_a_real_process_exits_2_with_one_line(tmp_path):
    """The process boundary: exit code 2 and one line on stderr, no traceback (this error
    comes before torch is imported: a fast interpreter)."""
    proc = run_app("retrieval", "search", tmp_path / "nothing.idx", "--text", "x")
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    one_line_error(proc.stderr, "no index at", "build it with: index DIR --out")


def test_corrupt_index(built, tmp_path):
    """A truncated tensor file (its SHA-256 no longer matches) is refused when the index is
    loaded."""
    _, index = built
    broken = tmp_path / "broken.idx"
    copy_index(index, broken)
    data = Path(f"{index}.g1.safetensors").read_bytes()
    Path(f"{broken}.g1.safetensors").write_bytes(data[: len(data) // 2])
    result = call(retrieval.main, "search", broken, "--text", "a red circle")
    assert result.code == 2
    one_line_error(result.err, "unreadable index", "corrupt")


def test_siglip_search_shows_match_probabilities(built, tmp_path):
    """With a SigLIP-style model (a logit bias) a text query's hits also get SigLIP's sigmoid
    probability of matching; image queries (image-image cosines) do not."""
    import attn_clip
    import torch

    gallery, _ = built
    folder = tiny_siglip(tmp_path / "siglip")
    index = tmp_path / "siglip.idx"
    assert call(retrieval.main, "index", gallery, "--out", index, "--model", folder).code == 0
    query = str(gallery / rel_name(*GALLERY[0]))
    argv = ["search", index, "--text", "a red circle", "--image", query, "--top-k", "3"]
    result = call(retrieval.main, *argv, "--json")
    assert result.code == 0, result.err
    text_hits, image_hits = (json.loads(line) for line in result.out.splitlines())
    model = attn_clip.create_model(str(folder))
    for hit in text_hits["hits"]:
        with torch.no_grad():
            want = torch.sigmoid(model.logit_scale.exp() * hit["score"] + model.logit_bias)
        assert abs(hit["prob"] - float(want)) < 1e-5
    assert all("prob" not in hit for hit in image_hits["hits"])
    assert "p(match)" in call(retrieval.main, *argv).out
