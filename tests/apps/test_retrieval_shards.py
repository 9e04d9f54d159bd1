"""apps/retrieval.py index over webdataset tar shards (attn_clip.retrieval.tars): ids
``shard/key``, captions kept and shown, bad samples skipped and counted in one line, the
same embeddings as the images extracted by the standard tarfile module and indexed as a
folder, ``--update`` embedding only new and changed shards, and the bad input refused."""

from __future__ import annotations

import io
import json
import os
import shutil
import tarfile
from pathlib import Path

import pytest
import retrieval
import torch
from _support.retrieval import GALLERY, call, one_line_error, one_rank_group, render

SPEC = "{00000..00003}.tar"


def add_member(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    """The 10 shapes in 3 shards of 4 (PNG, captioned ``a red circle`` ...) written by
    ShardWriter, and ``00003.tar`` written by tarfile: a sample without a caption (indexed),
    a corrupt PNG, a caption without an image and ``nocap`` again (all three skipped)."""
    from attn_vision.wds import ShardWriter

    folder = tmp_path_factory.mktemp("wds") / "shards"
    with ShardWriter(folder, shard_size=4, image_format="png") as writer:
        for item in GALLERY:
            writer.write(render(*item), f"a {item[0]} {item[1]}")
    buf = io.BytesIO()
    render("purple", "cross", seed=11).save(buf, "PNG")
    with tarfile.open(folder / "00003.tar", "w") as tar:
        add_member(tar, "nocap.png", buf.getvalue())
        add_member(tar, "corrupt.png", buf.getvalue()[:60])
        add_member(tar, "corrupt.txt", b"a broken picture")
        add_member(tar, "noimg.txt", b"a caption alone")
        add_member(tar, "nocap.png", buf.getvalue())  # the key again, after another one
    return folder


def index_argv(spec: str | Path, out: Path, *more) -> list[str]:
    return ["index", str(spec), "--out", str(out), "--model", "demo-shapes", "--json", *more]


@pytest.fixture(scope="module")
def built(shards, tmp_path_factory) -> tuple[Path, dict, str]:
    """``(index, summary, stderr)`` of the shards indexed by the app."""
    out = tmp_path_factory.mktemp("wds_index") / "shards.idx"
    result = call(retrieval.main, *index_argv(shards / SPEC, out))
    assert result.code == 0, result.err
    return out, json.loads(result.out), result.err


def test_ids_captions_and_bad_samples_counted_in_one_line(built, shards):
    from attn_clip.retrieval import load_index_set

    base, summary, err = built
    assert (summary["images"], summary["added"], summary["skipped"]) == (11, 11, 3)
    assert summary["shards"] == 4
    said = [line for line in err.splitlines() if line]
    assert len(said) == 1 and said[0].startswith("warning: skipped 3 bad samples"), err
    assert "corrupt.png" in said[0]  # (the first of them)
    manifest, index = load_index_set(base)
    assert index.ids[:5] == ["00000/000000000", "00000/000000001", "00000/000000002",
                             "00000/000000003", "00001/000010000"]  # fmt: skip
    assert index.ids[-1] == "00003/nocap" and len(index.ids) == 11
    assert manifest.caption("00001/000010001") == "a green triangle"  # GALLERY[4 + 1]
    assert manifest.caption("00000/000000003") == "a blue square"
    assert manifest.caption("00003/nocap") is None
    assert set(manifest.skipped) == {"00003/corrupt", "00003/noimg"}  # (and 1 duplicate:)
    assert manifest.shards["00003"]["duplicates"] == 1
    assert "no image" in manifest.skipped["00003/noimg"]["error"]
    assert manifest.shard_file("00002/000020001") == (shards / "00002.tar").resolve()
    assert manifest.shards["00002"]["samples"] == 2 and manifest.version == 3
    raw = json.loads(Path(f"{base}.manifest.json").read_text())
    assert raw["version"] == 3 and raw["files"]["00003/nocap"] == {"shard": "00003"}


def test_embeddings_equal_the_extracted_images_indexed_as_a_folder(built, shards, tmp_path):
    """Each sample's row equals the row of its image file, extracted by tarfile (not our
    reader) to ``<shard>/<key>.png`` and indexed as a folder."""
    from attn_clip.retrieval import load_index_set

    folder = tmp_path / "extracted"
    for tar_path in sorted(shards.glob("*.tar")):
        with tarfile.open(tar_path) as tar:
            for member in tar.getmembers():
                if member.name.endswith(".png") and not member.name.startswith("corrupt"):
                    out = folder / tar_path.stem / member.name
                    out.parent.mkdir(parents=True, exist_ok=True)
                    out.write_bytes(tar.extractfile(member).read())
    assert call(retrieval.main, *index_argv(folder, tmp_path / "files")).code == 0
    _, by_file = load_index_set(tmp_path / "files")
    _, by_shard = load_index_set(built[0])
    assert [i.removesuffix(".png") for i in by_file.ids] == by_shard.ids
    torch.testing.assert_close(by_shard.embeddings, by_file.embeddings, atol=1e-6, rtol=0)


def test_search_shows_ids_and_captions_never_a_file(built, tmp_path):
    base = built[0]
    grid = tmp_path / "grid.png"
    result = call(retrieval.main, "search", base, "--text", "a red circle", "--top-k", "3",
                  "--grid", grid, "--json")  # fmt: skip
    assert result.code == 0, result.err
    hits = json.loads(result.out.splitlines()[0])["hits"]
    assert [h["caption"] for h in hits] == ["a red circle"] * 3
    assert all(h["id"].startswith("00000/") and h["shard"].endswith("00000.tar") for h in hits)
    assert all("path" not in h for h in hits)
    from PIL import Image

    with Image.open(grid) as sheet:  # the hits' thumbnails, read from their shard: not grey
        thumb = sheet.crop((8 + 168, 8, 8 + 168 + 160, 168)).convert("RGB")
        assert thumb.getcolors(1 << 16) is not None and len(thumb.getcolors(1 << 16)) > 1
    from attn_clip.retrieval.tars import sample_image_bytes

    with tarfile.open(hits[0]["shard"]) as tar:  # (read by tarfile, not by our reader)
        stored = tar.extractfile(hits[0]["id"].split("/")[1] + ".png").read()
    assert sample_image_bytes(hits[0]["shard"], hits[0]["id"].split("/")[1]) == stored
    text = call(retrieval.main, "search", base, "--text", "a blue square", "--top-k", "1").out
    assert text.splitlines()[1].endswith("  a blue square")  # id, then caption


def test_update_embeds_only_new_and_changed_shards(built, shards, tmp_path, monkeypatch):
    from attn_clip.retrieval import load_index_set, tars

    folder, base = tmp_path / "shards", tmp_path / "up.idx"
    shutil.copytree(shards, folder)  # (copy2: the same mtimes)
    for f in built[0].parent.glob("shards.idx.*"):
        shutil.copy2(f, base.with_name("up.idx" + f.name[len("shards.idx") :]))
    old_ids = load_index_set(base)[1].ids
    embedded = []
    real = tars.embed_tar

    def embed_tar(model, path, **kw):
        embedded.append(path.name)
        return real(model, path, **kw)

    monkeypatch.setattr(tars, "embed_tar", embed_tar)
    # same bytes, another mtime: its SHA-256 says unchanged
    os.utime(folder / "00002.tar", ns=(1, 1))
    shutil.copy(folder / "00000.tar", folder / "00004.tar")  # a new shard (its samples' ids:
    # 00004/000000000 ...); 00001 replaced by a shard of one other sample
    with tarfile.open(folder / "00001.tar", "w") as tar:
        buf = io.BytesIO()
        render("yellow", "star", seed=20).save(buf, "PNG")
        add_member(tar, "000010000.png", buf.getvalue())
        add_member(tar, "000010000.txt", b"a new yellow star")
    result = call(retrieval.main, *index_argv(folder / "{00000..00004}.tar", base, "--update"))
    assert result.code == 0, result.err
    summary = json.loads(result.out)
    assert sorted(embedded) == ["00001.tar", "00004.tar"]
    # 00001: 1 sample updated, 3 removed; 00004: 4 added; 00000, 00002, 00003: unchanged
    assert (summary["added"], summary["updated"], summary["removed"]) == (4, 1, 3), summary
    assert (summary["unchanged"], summary["skipped"], summary["shards"]) == (7, 3, 5)
    manifest, index = load_index_set(base)
    assert manifest.caption("00001/000010000") == "a new yellow star"
    kept = [i for i in old_ids if not i.startswith("00001/")]
    _, before = load_index_set(built[0])
    rows = [before.ids.index(i) for i in kept]
    torch.testing.assert_close(index.embeddings[[index.ids.index(i) for i in kept]],
                               before.embeddings[rows], atol=1e-6, rtol=0)  # fmt: skip
    same = index.embeddings[index.ids.index("00004/000000000")]
    torch.testing.assert_close(same, index.embeddings[index.ids.index("00000/000000000")])

    embedded.clear()  # the shard list without 00004: its rows are dropped, nothing embedded
    result = call(retrieval.main, *index_argv(folder / "{00000..00003}.tar", base, "--update"))
    assert json.loads(result.out)["removed"] == 4 and embedded == []


def test_bad_shard_lists_exit_2_and_write_nothing(shards, tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    shutil.copy(shards / "00000.tar", other / "00000.tar")
    cases = [
        (shards / "{00000..00009}.tar", "6 of the 10 shards"),
        (f"{shards / '00000.tar'}::{other / '00000.tar'}", "two shards named '00000'"),
        ("https://example.com/{0..1}.tar", "only local shard files"),
    ]
    for spec, needle in cases:
        result = call(retrieval.main, *index_argv(spec, tmp_path / "idx"))
        assert result.code == 2, needle
        one_line_error(result.err, needle)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["other"]


def test_a_hostile_shard_manifest_is_refused(built, tmp_path):
    """A sample naming no listed shard, or a version-3 manifest without shards."""
    from attn_clip.retrieval import IndexFormatError, Manifest

    data = json.loads(Path(f"{built[0]}.manifest.json").read_text())
    for where, bad in (("files", {"shard": "../../etc"}), ("skipped", "no dict")):
        broken = json.loads(json.dumps(data))
        broken[where][next(iter(broken[where]))] = bad
        with pytest.raises(IndexFormatError, match="a sample of no listed shard"):
            Manifest.from_json(broken)
    data.pop("shards")
    with pytest.raises(IndexFormatError, match="shards"):
        Manifest.from_json(data)


def test_a_truncated_shard_keeps_what_is_before_the_damage(shards, tmp_path):
    from attn_clip.retrieval import load_index_set

    data = (shards / "00000.tar").read_bytes()
    with tarfile.open(shards / "00000.tar") as tar:
        third = [m for m in tar.getmembers() if m.name.endswith(".png")][2]
    cut = tmp_path / "00000.tar"
    cut.write_bytes(data[: third.offset_data + 100])  # in the third sample's image
    result = call(retrieval.main, *index_argv(cut, tmp_path / "idx"))
    assert result.code == 0, result.err
    assert (json.loads(result.out)["images"], json.loads(result.out)["skipped"]) == (2, 1)
    said = [line for line in result.err.splitlines() if line]
    assert len(said) == 1 and "1 bad sample" in said[0] and "1 truncated shard" in said[0]
    manifest, index = load_index_set(tmp_path / "idx")
    assert index.ids == ["00000/000000000", "00000/000000001"]
    assert "truncated" in manifest.shards["00000"]["error"]


def test_torchrun_path_resumes_tar_by_tar(built, shards, tmp_path, monkeypatch):
    """The torchrun path in one process (a gloo group of 1; 2 processes: the one launch in
    test_retrieval_scale.py): killed after its second tar, the run started again embeds
    only the other two and writes the index one process writes."""
    from attn_clip.retrieval import load_index_set, tars
    from attn_clip.retrieval import shards as units

    one_rank_group(monkeypatch)
    base, written, embedded = tmp_path / "idx", [], []
    real_write, real_embed = units.write_shard, tars.embed_tar

    def write_then_die(*args):
        real_write(*args)
        written.append(args[0])
        if len(written) == 2:
            raise KeyboardInterrupt  # (as a kill: nothing after this shard happens)

    def embed_tar(model, path, **kw):
        embedded.append(path.name)
        return real_embed(model, path, **kw)

    monkeypatch.setattr(units, "write_shard", write_then_die)
    monkeypatch.setattr(units, "embed_tar", embed_tar)
    with pytest.raises(KeyboardInterrupt):
        call(retrieval.main, *index_argv(shards / SPEC, base))
    monkeypatch.setattr(units, "write_shard", real_write)
    assert embedded == ["00000.tar", "00001.tar"] and not Path(f"{base}.manifest.json").exists()
    result = call(retrieval.main, *index_argv(shards / SPEC, base))
    assert result.code == 0, result.err
    summary = json.loads(result.out)
    assert (summary["resumed"], summary["images"], summary["skipped"]) == (2, 11, 3), summary
    assert embedded[2:] == ["00002.tar", "00003.tar"]
    assert result.err.count("skipped 3 bad samples") == 1
    (ma, ia), (mb, ib) = load_index_set(built[0]), load_index_set(base)
    assert ia.ids == ib.ids and ma.files == mb.files and ma.skipped == mb.skipped
    assert ma.shards == mb.shards
    torch.testing.assert_close(ib.embeddings, ia.embeddings, atol=1e-6, rtol=0)
    assert list(tmp_path.glob("idx.shard-*")) == []
