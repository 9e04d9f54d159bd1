"""scripts/make_shapes.py: the files it writes, determinism, bad arguments."""

from __future__ import annotations

import csv
import json

import pytest


@pytest.fixture(scope="module")
def ms(load_script):
    return load_script("make_shapes")


def test_writes_imagefolders_csvs_and_metadata(ms, tmp_path, capsys):
    args = ["--n-train", "48", "--n-val", "6", "--n-heldout", "12", "--image-size", "32"]
    meta = ms.main([str(tmp_path / "a"), *args, "--quiet"])
    assert "wrote" in capsys.readouterr().out
    root = tmp_path / "a"
    for split, n in (("train", 48), ("val", 6), ("heldout", 12)):
        with open(root / f"{split}.csv", newline="") as f:
            rows = list(csv.DictReader(f))
        assert len(rows) == n == len(list((root / split).rglob("*.png")))
        assert all((root / r["filepath"]).is_file() for r in rows)
    assert {p.name for p in (root / "heldout").iterdir()} == set(meta["heldout"])
    assert not {p.name for p in (root / "train").iterdir()} & set(meta["heldout"])
    assert json.loads((root / "meta.json").read_text())["image_size"] == 32

    ms.main([str(tmp_path / "b"), *args, "--quiet"])  # same arguments, same bytes
    for rel in ("train.csv", "heldout.csv", "val.csv"):
        assert (root / rel).read_bytes() == (tmp_path / "b" / rel).read_bytes()
    first = next(csv.DictReader(open(root / "train.csv", newline="")))["filepath"]
    assert (root / first).read_bytes() == (tmp_path / "b" / first).read_bytes()
    ms.main([str(tmp_path / "c"), *args, "--seed", "1", "--quiet"])
    assert (root / "train.csv").read_bytes() != (tmp_path / "c" / "train.csv").read_bytes()


def test_full_captions_option(ms, tmp_path):
    ms.main(
        [str(tmp_path), "--n-train", "20", "--n-val", "0", "--n-heldout", "0"]
        + ["--captions", "full", "--quiet", "--image-size", "16"]
    )
    with open(tmp_path / "train.csv", newline="") as f:
        titles = [r["title"] for r in csv.DictReader(f)]
    assert all(t.split()[1] in ("small", "medium", "large") for t in titles)
    assert not (tmp_path / "val.csv").exists()


def test_bad_arguments_exit_2(ms, tmp_path, capsys):
    from attn_train.cli import run_main

    with pytest.raises(SystemExit) as e:
        run_main(lambda: ms.main([str(tmp_path / "out"), "--n-train", "-1"]))
    assert e.value.code == 2 and "counts must be >= 0" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
