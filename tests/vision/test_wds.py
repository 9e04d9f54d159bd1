"""attn_vision.wds: shards written by the standard ``tarfile`` module (dotted keys, folders in
names, metadata files, a missing caption, a corrupt JPEG, a key split across a shard boundary)
read into the same samples as the ``webdataset`` package yields; brace expansion equal to the
``braceexpand`` package's; the writer's img2dataset layout read back by webdataset."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import numpy as np
import pytest
from attn_vision import wds
from PIL import Image

wd = pytest.importorskip("webdataset")  # installed in the dev group: these tests always run


def encode(colour: tuple[int, int, int], fmt: str) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (8, 6), colour).save(buf, fmt)
    return buf.getvalue()


def write_tar(path: Path, files: list[tuple[str, bytes | None]]) -> None:
    """``(name, data)`` in order; ``data=None`` adds a folder entry."""
    with tarfile.open(path, "w") as tar:
        for name, data in files:
            info = tarfile.TarInfo(name)
            if data is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


JPG = encode((200, 30, 30), "JPEG")
NOISE = io.BytesIO()
Image.fromarray(np.random.default_rng(0).integers(0, 255, (32, 32, 3), np.uint8)).save(
    NOISE, "JPEG"
)
SHARD0 = [
    ("__index__", b"not a sample"),  # webdataset's metadata files are skipped
    ("README", b"no extension: skipped"),
    ("imgs/", None),  # a folder entry
    ("imgs/0001.jpg", JPG),  # the key keeps its folder: imgs/0001
    ("imgs/0001.txt", b"a red square"),
    ("0002.seg.png", encode((0, 0, 255), "PNG")),  # dotted: key 0002, extension seg.png
    ("0002.txt", b"no image field"),
    ("0003.PNG", encode((0, 255, 0), "PNG")),  # extensions are lower-cased
    ("0003.txt", b"a green square  \n"),
    ("0004.jpg", JPG),  # no caption
    ("0005.jpg", NOISE.getvalue()[:-400]),  # a corrupt (truncated) JPEG
    ("0005.txt", b"corrupt"),
    ("0006.jpeg", encode((9, 9, 9), "JPEG")),
    ("0006.txt", b"six"),
    ("0006.json", json.dumps({"class": "dark", "label": 4}).encode()),
    ("0007.jpg", JPG),  # its caption opens the next shard: two incomplete samples
]
SHARD1 = [
    ("0007.txt", b"split across shards"),
    ("0008.webp", encode((1, 2, 3), "WEBP")),
    ("0008.txt", b"eight"),
    ("0008.cls", b"7\n"),
    ("a.b.c/0009.x.jpg", JPG),  # a dotted folder: key a.b.c/0009, extension x.jpg
]


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("wds")
    write_tar(root / "00000.tar", SHARD0)
    write_tar(root / "00001.tar", SHARD1)
    return str(root / "{00000..00001}.tar")


def ours(spec: str) -> list[dict]:
    out = []
    for path in wds.list_shards(spec):
        with wds.ShardReader(path) as shard:
            out += list(shard)
    return out


def test_samples_equal_webdataset_raw_samples(shards):
    reference = list(wd.DataPipeline(wd.SimpleShardList(shards), wd.tarfile_to_samples()))
    got = ours(shards)
    assert [s["__key__"] for s in got] == [s["__key__"] for s in reference]
    assert got == reference  # every field's bytes, __url__ included
    keys = [s["__key__"] for s in got]
    assert keys == ["imgs/0001", "0002", "0003", "0004", "0005", "0006", "0007", "0007"] + [
        "0008",
        "a.b.c/0009",
    ]
    assert set(got[1]) == {"__key__", "__url__", "seg.png", "txt"} and "png" in got[2]


def test_decoded_samples_equal_webdataset_with_bad_ones_skipped(shards):
    skip = wd.ignore_and_continue
    reference = wd.DataPipeline(
        wd.SimpleShardList(shards),
        wd.tarfile_to_samples(),
        wd.decode("pilrgb", handler=skip),
        wd.to_tuple("__key__", "jpg;jpeg;png;webp", "txt", handler=skip),
    )
    good, bad = [], {}
    for sample in ours(shards):
        try:
            good.append((sample["__key__"], wds.sample_image(sample), wds.sample_caption(sample)))
        except wds.BadSample as e:
            bad[sample["__key__"]] = str(e)
    ref = list(reference)
    assert (
        [k for k, _, _ in good]
        == [k for k, _, _ in ref]
        == ["imgs/0001", "0003", "0006"] + ["0008"]
    )
    for (_, img, text), (_, ref_img, ref_text) in zip(good, ref, strict=True):
        assert np.array_equal(np.asarray(img), np.asarray(ref_img))
        assert text == ref_text.strip()
    assert "no image" in bad["0002"] and "seg.png" in bad["0002"]
    assert "no caption (missing)" in bad["0004"]
    assert "0005.jpg" in bad["0005"] and "truncated image" in bad["0005"]
    assert "no image" in bad["a.b.c/0009"]


def test_labels_from_cls_or_a_json_field(shards):
    samples = {s["__key__"]: s for s in ours(shards)}
    assert wds.sample_label(samples["0008"]) == 7
    assert wds.sample_label(samples["0006"], "label") == 4
    assert wds.sample_label(samples["0006"], "class") == "dark"
    for key, field in (("0006", "cls"), ("0008", "label"), ("0006", "nope")):
        with pytest.raises(wds.BadSample, match="no usable label"):
            wds.sample_label(samples[key], field)


def test_samples_by_position_and_a_truncated_shard(shards, tmp_path):
    first = wds.list_shards(shards)[0]
    with wds.ShardReader(first) as shard:
        assert len(shard) == 7 and shard.keys[2] == "0003" and shard.truncated is None
        assert shard.sample(5)["json"] == SHARD0[14][1]  # read in any order
        assert shard.extensions(1) == ["seg.png", "txt"]
    cut = tmp_path / "cut.tar"
    data = first.read_bytes()
    cut.write_bytes(data[: data.index(b"0006.jpeg") + 600])  # inside 0006.jpeg's data
    with wds.ShardReader(cut) as shard:
        assert shard.keys[-1] == "0006" and len(list(shard)) == 5  # 0006 cannot be read
        with pytest.raises(wds.BadSample, match="0006.jpeg: cannot be read"):
            shard.sample(5)
    junk = tmp_path / "junk.tar"
    junk.write_bytes(b"\x89PNG not a tar at all" * 40)
    with wds.ShardReader(junk) as shard:
        assert len(shard) == 0 and "not a readable tar" in shard.truncated


def test_empty_caption_and_undecodable_text_are_bad():
    base = {"__key__": "k", "__url__": "u.tar"}
    with pytest.raises(wds.BadSample, match="no caption \\(empty\\)"):
        wds.sample_caption({**base, "txt": b" \n"})
    with pytest.raises(wds.BadSample, match="not UTF-8"):
        wds.sample_caption({**base, "txt": b"\xff\xfe"})


@pytest.mark.parametrize(
    "pattern",
    [
        "d/{00000..00011}.tar",
        "a{1..3}b{x,y}",
        "{0..10..5}",
        "x{a,b{1..2}}y",
        "{1..03}",
        "{9..11}",
        "{3..1}",
        "a{}b",
        "a{b}c",
        "a,b",
        "{a,b}{1,2}",
        "{,x}.tar",
        "s/{-2..2}",
    ],
)
def test_brace_expansion_equals_braceexpand(pattern):
    from braceexpand import braceexpand

    assert wds.braceexpand(pattern) == list(braceexpand(pattern))


def test_shard_lists(shards, tmp_path):
    one = shards.replace("{00000..00001}", "00001")
    paths = wds.list_shards(f"{shards}::{one}")
    assert [p.name for p in paths] == ["00000.tar", "00001.tar", "00001.tar"]
    assert wds.expand_urls(f"{shards}::{one}") == [str(p) for p in paths]
    for spec, message in [
        ("pipe:curl -s http://x/{0..1}.tar", "only local shard files"),
        ("https://host/{000..009}.tar", "only local shard files"),
        (str(tmp_path / "{0..4}.tar"), "5 of the 5 shards"),
        (str(tmp_path / "{0..4.tar"), "unbalanced braces"),
    ]:
        with pytest.raises(ValueError, match=message):
            wds.list_shards(spec)


def test_writer_writes_img2datasets_layout(tmp_path):
    images = [Image.new("RGB", (16, 12), (10 * i, 50, 90)) for i in range(5)]
    for folder in ("a", "b"):
        with wds.ShardWriter(tmp_path / folder, shard_size=2) as w:
            for i, img in enumerate(images):
                w.write(img, f"caption {i}", {"class": f"c{i}"})
    root = tmp_path / "a"
    assert w.spec == str(tmp_path / "b" / "{00000..00002}.tar")
    names = sorted(p.name for p in root.iterdir())
    assert names == [
        f"0000{i}{ext}" for i in range(3) for ext in (".parquet", ".tar", "_stats.json")
    ]
    for name in names:  # the same samples, the same bytes
        assert (root / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    shard_spec = str(root / "{00000..00002}.tar")
    ref = list(
        wd.DataPipeline(wd.SimpleShardList(shard_spec), wd.tarfile_to_samples(), wd.decode("pil"))
    )
    assert [s["__key__"] for s in ref] == ["000000000", "000000001", "000010000"] + [
        "000010001",
        "000020000",
    ]
    assert [s["txt"] for s in ref] == [f"caption {i}" for i in range(5)]
    assert [s["json"]["class"] for s in ref] == [f"c{i}" for i in range(5)]
    assert all(s["jpg"].size == (16, 12) for s in ref)
    import pyarrow.parquet as pq

    table = pq.read_table(root / "00001.parquet").to_pylist()
    assert [(r["key"], r["caption"], r["status"]) for r in table] == [
        ("000010000", "caption 2", "success"),
        ("000010001", "caption 3", "success"),
    ]
    assert table[0]["sha256"] == json.loads(tarfile.open(root / "00001.tar").extractfile(
        "000010000.json").read())["sha256"]  # fmt: skip
    assert json.loads((root / "00002_stats.json").read_text())["successes"] == 1


def test_an_interrupted_writer_leaves_no_partial_shard(tmp_path):
    with pytest.raises(KeyboardInterrupt), wds.ShardWriter(tmp_path, shard_size=4) as w:
        w.write(Image.new("RGB", (8, 8)), "one")
        raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == []


def test_links_and_parent_paths_in_a_shard_read_nothing_outside_it(tmp_path):
    """A hostile shard: a symlink and a hard link to a file outside it, a ``../`` name. Links
    are not samples' files (as in webdataset); nothing is extracted to disk."""
    outside = tmp_path / "secret.jpg"
    outside.write_bytes(JPG)
    path = tmp_path / "evil.tar"
    with tarfile.open(path, "w") as tar:
        for name, kind in (("0001.jpg", tarfile.SYMTYPE), ("0002.jpg", tarfile.LNKTYPE)):
            info = tarfile.TarInfo(name)
            info.type, info.linkname = kind, str(outside)
            tar.addfile(info)
        for name, data in (("0001.txt", b"one"), ("0002.txt", b"two"), ("../0003.jpg", JPG)):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    reference = list(wd.DataPipeline(wd.SimpleShardList(str(path)), wd.tarfile_to_samples()))
    got = ours(str(path))
    assert got == reference
    assert [sorted(k for k in s if not k.startswith("__")) for s in got] == [["txt"]] * 2 + [
        ["jpg"]
    ]
    assert got[2]["__key__"] == "../0003" and got[2]["jpg"] == JPG  # the tar's own bytes
    assert sorted(p.name for p in tmp_path.iterdir()) == ["evil.tar", "secret.jpg"]
