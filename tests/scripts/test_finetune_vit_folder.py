"""scripts/finetune_vit.py --model FOLDER: a model folder brings its weights (an
attn_vision save_pretrained folder; a transformers ViTForImageClassification folder, read by
attn_vision.create_model), gets a new head for the data's classes, fine-tunes, and a killed
run resumes to the same weights."""

from __future__ import annotations

from pathlib import Path

import finetune_vit as fv  # scripts/finetune_vit.py
import pytest
import torch
from _support.scripts import assert_same_weights, cli, events, killed_at, weights
from _support.train import RUN, shapes_data
from attn_train import read_progress

# the folder's ViT: 2 blocks of 2 x 16-channel heads at 32 px (4 x 4 patches), 5 classes
TINY_VIT = dict(img_size=32, patch_size=8, depth=2, embed_dim=32, num_heads=2, num_classes=5)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return shapes_data(tmp_path_factory)


def vision_folder(tmp: Path) -> Path:
    import attn_vision

    model = attn_vision.create_model("vit_tiny_patch16_224", **TINY_VIT)
    return attn_vision.save_pretrained(model, tmp / "attn_vision")


def transformers_folder(tmp: Path) -> Path:
    """The same ViT as transformers' ViTForImageClassification (its own labels), saved by
    transformers with its image processor."""
    from transformers import ViTConfig, ViTForImageClassification, ViTImageProcessorPil

    labels = {i: f"label {i}" for i in range(TINY_VIT["num_classes"])}
    config = ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                       intermediate_size=128, image_size=32, patch_size=8, id2label=labels,
                       label2id={v: k for k, v in labels.items()})  # fmt: skip
    ViTForImageClassification(config).save_pretrained(tmp / "transformers")
    ViTImageProcessorPil(size={"height": 32, "width": 32}).save_pretrained(tmp / "transformers")
    return tmp / "transformers"


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    """Both kinds of model folder, with 5 classes (the data has 24)."""
    tmp = tmp_path_factory.mktemp("finetune_folder")
    return {"attn_vision": vision_folder(tmp), "transformers": transformers_folder(tmp)}


def run_args(data: Path, folder: Path) -> list[str]:
    """6 updates of 8 images, drop path, layer decay and an EMA on, a checkpoint every 2."""
    args = ["--train-dir", str(data / "train"), "--val-dir", str(data / "val"), *RUN]
    args += ["--model", str(folder), "--batch-size", "8", "--max-steps", "6", "--save-every", "2"]
    return [*args, "--ema-decay", "0.9", "--layer-decay", "0.8", "--drop-path", "0.1"]


@pytest.mark.parametrize("kind", ["attn_vision", "transformers"])
def test_the_folder_brings_its_weights_and_gets_a_new_head(data, folders, kind):
    import attn_vision

    folder = folders[kind]

    args = fv.build_parser().parse_args([*run_args(data, folder), "--out", "unused"])
    model = fv.build_model(args, num_classes=24)
    own = attn_vision.create_model(folder)
    assert own.num_classes == 5 and model.num_classes == 24
    assert model.config.drop_path_rate == 0.1 and own.config.drop_path_rate == 0.0
    ours, theirs = model.state_dict(), own.state_dict()
    heads = {k for k in theirs if theirs[k].shape != ours[k].shape}
    assert heads and all(k.startswith("head.") for k in heads)
    for k in set(theirs) - heads:  # every other weight is the folder's
        torch.testing.assert_close(ours[k], theirs[k], rtol=0, atol=0, msg=k)


def test_fine_tunes_and_a_killed_run_resumes_to_the_same_weights(data, folders, tmp_path):
    """From the transformers folder (the fit loop is the same for every model)."""
    import attn_vision

    folder = folders["transformers"]
    argv = run_args(data, folder)
    straight = tmp_path / "straight"
    assert fv.main([*argv, "--out", str(straight)])["step"] == 6
    model = attn_vision.create_model(straight / "last")
    classes = sorted(p.name for p in (data / "train").iterdir())
    assert model.num_classes == 24 and list(model.pretrained_cfg["label_names"]) == classes

    killed = tmp_path / "killed"
    killed_at(fv.main, [*argv, "--out", killed], step=4)
    assert read_progress(killed / "last")["step"] == 2
    assert fv.main([*argv, "--out", str(killed)])["step"] == 6
    assert [r["step"] for r in events(killed, "resume")] == [2]
    assert [r["pretrained"] for r in events(straight, "start")] == ["the model's own"]
    for name in ("model.safetensors", "ema.safetensors"):
        assert_same_weights(straight / "last", killed / "last", name)
    torch.testing.assert_close(model.state_dict(), weights(straight / "last"))


def test_a_folder_with_a_checkpoint_file_is_one_line_and_2(data, folders, tmp_path, capsys):
    folder = folders["transformers"]
    argv = [*run_args(data, folder), "--pretrained", str(folder / "model.safetensors")]
    code, lines = cli(lambda: fv.main([*argv, "--out", str(tmp_path / "run")]), capsys)
    assert code == 2 and len(lines) == 1 and "brings its own weights" in lines[0], lines
    assert not (tmp_path / "run").exists()
