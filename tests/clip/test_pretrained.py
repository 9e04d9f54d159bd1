"""Checkpoint files: hub cache lookups, offline errors, readers for every on-disk format."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
from attn_clip import PretrainedDownloadError, download_pretrained, read_checkpoint
from safetensors.torch import save_file

REPO = "laion/CLIP-ViT-B-32-laion2B-s34B-b79K"
FILES = ("open_clip_model.safetensors", "open_clip_pytorch_model.bin")


def fake_hub_cache(cache: Path, repo_id: str, files: dict[str, bytes]) -> Path:
    """Lay ``files`` out the way huggingface_hub caches a download of ``repo_id``@main."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    root = cache / f"models--{repo_id.replace('/', '--')}"
    (root / "refs").mkdir(parents=True)
    (root / "refs" / "main").write_text(commit)
    snap = root / "snapshots" / commit
    snap.mkdir(parents=True)
    for name, data in files.items():
        (snap / name).write_bytes(data)
    return snap


def test_offline_error_names_repo_cache_and_workaround(tmp_path):
    with pytest.raises(PretrainedDownloadError) as err:
        download_pretrained(REPO, FILES, cache_dir=tmp_path, local_files_only=True)
    msg = str(err.value)
    assert REPO in msg and str(tmp_path) in msg and "pretrained=<path" in msg
    assert "open_clip_model.safetensors" in msg and "open_clip_pytorch_model.bin" in msg
    assert isinstance(err.value, OSError)


def test_unreachable_hub_fails_fast(tmp_path, monkeypatch):
    from huggingface_hub import constants

    for var in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    start = time.monotonic()
    with pytest.raises(PretrainedDownloadError, match=r"unreachable.*pretrained=<path"):
        download_pretrained(REPO, FILES, cache_dir=tmp_path)
    assert time.monotonic() - start < 5  # no 20-second retry loop


def test_cached_file_is_found_offline_and_safetensors_preferred(tmp_path):
    snap = fake_hub_cache(tmp_path, REPO, {FILES[0]: b"st", FILES[1]: b"bin"})
    path = download_pretrained(REPO, FILES, cache_dir=tmp_path, local_files_only=True)
    assert path == snap / FILES[0]
    only_bin = tmp_path / "other"
    snap = fake_hub_cache(only_bin, REPO, {FILES[1]: b"bin"})
    path = download_pretrained(REPO, FILES, cache_dir=only_bin, local_files_only=True)
    assert path == snap / FILES[1]


def test_read_state_dict_files(tmp_path):
    sd = {"a": torch.randn(2, 3), "b": torch.arange(4)}
    save_file(sd, str(tmp_path / "m.safetensors"))
    torch.save({"state_dict": sd, "epoch": 3}, tmp_path / "ckpt.pt")
    for name in ("m.safetensors", "ckpt.pt"):
        ckpt = read_checkpoint(tmp_path / name)
        assert ckpt.kind == "file" and torch.equal(ckpt.state_dict["a"], sd["a"])


class NotATensor:
    pass


def test_unsafe_or_broken_files_are_refused(tmp_path):
    torch.save({"a": NotATensor()}, tmp_path / "evil.bin")
    with pytest.raises(ValueError, match=r"weights_only=True"):
        read_checkpoint(tmp_path / "evil.bin")
    torch.save({"a": [1, 2]}, tmp_path / "list.bin")
    with pytest.raises(ValueError, match="state dict of tensors"):
        read_checkpoint(tmp_path / "list.bin")
    (tmp_path / "broken.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{")
    with pytest.raises(ValueError, match="cannot read safetensors"):
        read_checkpoint(tmp_path / "broken.safetensors")
    with pytest.raises(FileNotFoundError):
        read_checkpoint(tmp_path / "missing.pt")
    (tmp_path / "empty_dir").mkdir()
    with pytest.raises(FileNotFoundError, match="no weights in"):
        read_checkpoint(tmp_path / "empty_dir")


def test_read_sharded_transformers_folder(tmp_path):
    import json

    save_file({"a": torch.ones(2)}, str(tmp_path / "model-00001-of-00002.safetensors"))
    save_file({"b": torch.zeros(3)}, str(tmp_path / "model-00002-of-00002.safetensors"))
    index = {
        "weight_map": {
            "a": "model-00001-of-00002.safetensors",
            "b": "model-00002-of-00002.safetensors",
        }
    }
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "clip"}))
    ckpt = read_checkpoint(tmp_path)
    assert ckpt.kind == "hf_dir" and set(ckpt.state_dict) == {"a", "b"}
    assert ckpt.hf_config == {"model_type": "clip"}
