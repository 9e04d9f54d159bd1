"""apps/retrieval.py ``index --caption`` with the bundled demo-shapes-coca, in process: the
captions kept are the model's, ``search`` shows them (text and --json), ``--update`` captions
the new file only; a model that is no CoCa, or ``--update --caption`` of an index built
without captions: one line on stderr, exit 2, nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import retrieval
from _support.retrieval import GALLERY, call, make_gallery, one_line_error, rel_name
from attn_clip.retrieval import Manifest

ITEMS = [GALLERY[0], GALLERY[3], GALLERY[5]]
COCA = ["--model", "demo-shapes-coca", "--workers", "0"]


def test_index_caption_search_and_update(tmp_path):
    folder = make_gallery(tmp_path / "g", ITEMS)
    out = tmp_path / "g.idx"
    r = call(retrieval.main, "index", folder, "--out", out, *COCA, "--caption", "--json")
    assert r.code == 0, r.err
    assert json.loads(r.out) | {"index": None} == {
        "index": None, "model": "demo-shapes-coca (shapes)", "images": 3, "added": 3,
        "updated": 0, "unchanged": 0, "removed": 0, "skipped": 0, "captioned": 3,
    }  # fmt: skip
    manifest = Manifest.read(out)
    kept = {rel: manifest.caption(rel) for rel in manifest.files}
    assert manifest.captions and all(kept.values())

    r = call(retrieval.main, "search", out, "--text", "a red circle", "--top-k", "3", "--json")
    assert r.code == 0, r.err
    hits = json.loads(r.out)["hits"]
    rels = [Path(h["path"]).resolve().relative_to(folder.resolve()).as_posix() for h in hits]
    assert [h["caption"] for h in hits] == [kept[rel] for rel in rels]
    r = call(retrieval.main, "search", out, "--text", "a red circle", "--top-k", "1")
    circle = rel_name(*ITEMS[0])
    assert r.out.splitlines()[1].endswith(f"{circle}  {kept[circle]}"), r.out

    make_gallery(folder, [GALLERY[7]])  # a new star; --update remembers --caption
    r = call(retrieval.main, "index", folder, "--out", out, "--update", "--workers", "0")
    assert r.code == 0, r.err
    assert "(1 added, 3 unchanged, 1 captioned)" in r.out
    updated = Manifest.read(out)
    assert {rel: updated.caption(rel) for rel in kept} == kept
    assert "star" in updated.caption(rel_name(*GALLERY[7]))


def test_caption_refusals_write_nothing(tmp_path):
    folder = make_gallery(tmp_path / "g", ITEMS[:1])
    r = call(retrieval.main, "index", folder, "--out", tmp_path / "a.idx", "--model",
             "demo-shapes", "--workers", "0", "--caption")  # fmt: skip
    assert r.code == 2 and r.out == ""
    one_line_error(r.err, "captions need a CoCa model; demo-shapes (shapes) is not one")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g"]

    out = tmp_path / "b.idx"
    assert call(retrieval.main, "index", folder, "--out", out, *COCA).code == 0
    written = {p: p.stat().st_mtime_ns for p in tmp_path.glob("b.idx*")}
    r = call(retrieval.main, "index", folder, "--out", out, "--update", "--caption",
             "--workers", "0")  # fmt: skip
    assert r.code == 2
    one_line_error(r.err, "built without captions: rebuild it")
    assert {p: p.stat().st_mtime_ns for p in tmp_path.glob("b.idx*")} == written
