"""The TorchScript payload archive (its ``__setstate__`` writes a marker file when
``torch.jit.load`` reads it) handed to every app and script that loads weights: each answers
with one line and exit 2 (or a WeightsError for script functions), and the marker never
appears. In-process (apps and scripts import as modules), to save interpreter starts."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import finetune_vit  # scripts/finetune_vit.py
import pytest
import retrieval  # apps/retrieval.py
import train_clip  # scripts/train_clip.py
import translate  # apps/translate.py
import zero_shot  # apps/zero_shot.py
from attn_core.hub import WeightsError
from PIL import Image


def assert_one_line_exit_2(code: int, capsys, marker: Path) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("error: "), (code, err)
    assert "weights_only=False" not in err[0]
    assert not marker.exists(), "the archive's code ran"
    return err[0]


@pytest.fixture
def images(tmp_path) -> Path:
    folder = tmp_path / "images"
    folder.mkdir()
    for i, colour in enumerate(("red", "blue")):
        Image.new("RGB", (32, 32), colour).save(folder / f"{i}.png")
    return folder


def test_zero_shot_pretrained(torchscript_payload, images, capsys):
    archive, marker = torchscript_payload
    app = zero_shot
    image = str(images / "0.png")
    for args in (
        ["--model", "demo-shapes", "--pretrained", str(archive)],
        ["--pretrained", str(archive)],
    ):
        code = app.main([*args, "--image", image, "--labels", "red", "blue"])
        assert_one_line_exit_2(code, capsys, marker)


def test_retrieval_index_search_eval(torchscript_payload, images, tmp_path, capsys):
    archive, marker = torchscript_payload
    app = retrieval
    out = tmp_path / "idx"
    code = app.main(["index", str(images), "--out", str(out), "--pretrained", str(archive)])
    assert_one_line_exit_2(code, capsys, marker)
    assert not list(tmp_path.glob("idx*"))  # nothing half-created
    # a received index whose manifest names the payload as its model's weights
    assert app.main(["index", str(images), "--out", str(out), "--model", "demo-shapes"]) == 0
    capsys.readouterr()
    manifest_path = tmp_path / "idx.manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["model"]["pretrained"] = str(archive)
    manifest_path.write_text(json.dumps(manifest))
    csv = tmp_path / "pairs.csv"
    csv.write_text("filepath,title\n0.png,red\n1.png,blue\n")
    for args in (
        ["search", str(out), "--text", "red"],
        ["eval", "--csv", str(csv), "--root", str(images), "--index", str(out)],
        ["index", str(images), "--out", str(out), "--update"],
    ):
        assert_one_line_exit_2(app.main(args), capsys, marker)


def test_translate_model_folder(torchscript_payload, tmp_path, capsys):
    archive, marker = torchscript_payload
    from attn_nlp import create_model, save_pretrained

    folder = tmp_path / "mt"
    save_pretrained(create_model("transformer-tiny", src_vocab_size=50), folder)
    (folder / "model.safetensors").unlink()
    shutil.copyfile(archive, folder / "pytorch_model.bin")
    assert_one_line_exit_2(translate.main(["--model", str(folder), "hello"]), capsys, marker)


def test_train_clip_pretrained(torchscript_payload):
    archive, marker = torchscript_payload
    args = train_clip.build_parser().parse_args(
        [
            "--model",
            "demo-shapes",
            "--pretrained",
            str(archive),
            "--train-data",
            "x.csv",
            "--out",
            "unused",
        ]
    )
    with pytest.raises(WeightsError):
        train_clip.build_model(args)
    assert not marker.exists()


def test_finetune_vit_pretrained(torchscript_payload):
    archive, marker = torchscript_payload
    args = finetune_vit.build_parser().parse_args(
        ["--model", "vit_tiny_patch16_224", "--pretrained", str(archive)]
        + ["--train-dir", "unused", "--out", "unused"]
    )
    with pytest.raises(WeightsError):
        finetune_vit.build_model(args, num_classes=3)
    assert not marker.exists()
