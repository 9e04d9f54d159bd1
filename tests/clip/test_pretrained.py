"""attn_clip.read_checkpoint: files and folders of every CLIP layout.

Downloads and the readers themselves are tested in tests/core/test_hub.py.
"""

from __future__ import annotations

import pytest
import torch
from attn_clip import read_checkpoint
from attn_core.hub import CheckpointError, WeightsUnavailableError
from safetensors.torch import save_file


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
    with pytest.raises(CheckpointError, match="NotATensor") as err:
        read_checkpoint(tmp_path / "evil.bin")
    assert "weights_only=False" not in str(err.value)
    torch.save({"a": [1, 2]}, tmp_path / "list.bin")
    with pytest.raises(ValueError, match="state dict of tensors"):
        read_checkpoint(tmp_path / "list.bin")
    (tmp_path / "broken.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{")
    with pytest.raises(ValueError, match="cannot read safetensors"):
        read_checkpoint(tmp_path / "broken.safetensors")
    with pytest.raises(WeightsUnavailableError):
        read_checkpoint(tmp_path / "missing.pt")
    (tmp_path / "empty_dir").mkdir()
    with pytest.raises(WeightsUnavailableError, match="no weights in"):
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
