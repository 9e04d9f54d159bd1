"""A TorchScript archive whose ``__setstate__`` writes a marker file (``torch.jit.load`` would
run it) fed to every attn_clip loading path: refused or read as tensors only, never run."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from attn_clip import create_model, load_checkpoint, read_checkpoint
from attn_core.hub import CheckpointError, UnsafeCheckpointError, WeightsError


def copy(archive: Path, dest: Path) -> Path:
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(archive, dest)
    return dest


def assert_refused(fn, marker: Path, error=WeightsError) -> None:
    with pytest.raises(error) as err:
        fn()
    assert "weights_only=False" not in str(err.value)
    assert not marker.exists(), "the archive's code ran"


def test_pretrained_file_of_any_name(torchscript_payload, tmp_path):
    archive, marker = torchscript_payload
    for name in ("ViT-B-32.pt", "weights.bin", "model.pth", "open_clip_model.safetensors.bin"):
        path = copy(archive, tmp_path / "files" / name)
        assert_refused(lambda p=path: create_model("demo-shapes", pretrained=p), marker)
        assert_refused(lambda p=path: load_checkpoint(create_model("demo-shapes"), p), marker)
        try:  # the reader alone: tensors at most (the archive holds a few), never its code
            read_checkpoint(path)
        except CheckpointError:
            pass
        assert not marker.exists()


@pytest.mark.parametrize(
    "name", ["open_clip_pytorch_model.bin", "pytorch_model.bin", "open_clip_model.safetensors"]
)
def test_model_folder(torchscript_payload, tmp_path, name):
    archive, marker = torchscript_payload
    folder = tmp_path / "folder"
    copy(archive, folder / name)
    meta = {"model_cfg": create_model("demo-shapes").config.to_open_clip()}
    (folder / "open_clip_config.json").write_text(json.dumps(meta))
    for target in (str(folder), f"local-dir:{folder}"):
        assert_refused(lambda t=target: create_model(t), marker)
    assert_refused(lambda: create_model("demo-shapes", pretrained=folder), marker)


def test_sharded_folder_naming_a_file_outside(torchscript_payload, tmp_path):
    archive, marker = torchscript_payload
    folder = tmp_path / "sharded"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "clip"}))
    for shard in (str(archive), "../payload.pt", f"sub/../../{archive.name}"):
        index = {"weight_map": {"text_model.x": shard}}
        (folder / "model.safetensors.index.json").write_text(json.dumps(index))
        with pytest.raises(UnsafeCheckpointError, match="inside the checkpoint folder"):
            create_model(str(folder))
    assert not marker.exists()


def test_hf_hub_repo_in_the_local_cache(torchscript_payload, tmp_path, monkeypatch, fake_hub_cache):
    from huggingface_hub import constants

    archive, marker = torchscript_payload
    meta = {"model_cfg": create_model("demo-shapes").config.to_open_clip()}
    files = {
        "open_clip_pytorch_model.bin": archive.read_bytes(),
        "open_clip_config.json": json.dumps(meta).encode(),
    }
    fake_hub_cache(tmp_path / "hub", "evil/clip", files)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    assert_refused(
        lambda: create_model("hf-hub:evil/clip", cache_dir=tmp_path / "hub"),
        marker,
        CheckpointError,
    )
