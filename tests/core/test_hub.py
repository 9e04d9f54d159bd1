"""attn_core.hub: download (offline / unreachable fail fast), readers, checks, atomic writes."""

from __future__ import annotations

import json
import os
import pickle
import stat
import time
from pathlib import Path

import pytest
import torch
from attn_core import hub
from attn_core.hub import (
    CheckpointError,
    UnsafeCheckpointError,
    WeightsError,
    WeightsUnavailableError,
)
from safetensors.torch import save_file
from torch import nn

REPO = "laion/CLIP-ViT-B-32-laion2B-s34B-b79K"
FILES = ("open_clip_model.safetensors", "open_clip_pytorch_model.bin")


def test_exception_hierarchy():
    assert issubclass(WeightsUnavailableError, WeightsError) and issubclass(
        WeightsUnavailableError, OSError
    )
    assert issubclass(CheckpointError, WeightsError) and issubclass(CheckpointError, ValueError)
    assert issubclass(UnsafeCheckpointError, CheckpointError)


def test_offline_error_names_repo_cache_and_workaround(tmp_path):
    with pytest.raises(WeightsUnavailableError) as err:
        hub.download(REPO, FILES, cache_dir=tmp_path, local_files_only=True)
    msg = str(err.value)
    assert REPO in msg and str(tmp_path) in msg and "pretrained=<path>" in msg
    assert all(f in msg for f in FILES)


def test_unreachable_hub_fails_fast(tmp_path, monkeypatch):
    from huggingface_hub import constants

    for var in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    start = time.monotonic()
    with pytest.raises(WeightsUnavailableError, match="unreachable"):
        hub.download(REPO, FILES, cache_dir=tmp_path)
    assert time.monotonic() - start < 5  # no 20-second retry loop


def test_cached_file_is_found_offline_in_order(tmp_path, fake_hub_cache):
    snap = fake_hub_cache(tmp_path, REPO, {FILES[0]: b"st", FILES[1]: b"bin"})
    assert hub.download(REPO, FILES, cache_dir=tmp_path, local_files_only=True) == snap / FILES[0]
    other = tmp_path / "other"
    snap = fake_hub_cache(other, REPO, {FILES[1]: b"bin"})
    assert hub.download(REPO, FILES, cache_dir=other, local_files_only=True) == snap / FILES[1]


def test_read_files_of_every_format(tmp_path):
    sd = {"a": torch.randn(2, 3), "b": torch.arange(4)}
    save_file(sd, str(tmp_path / "m.safetensors"))
    torch.save(sd, tmp_path / "m.bin")
    torch.save({"state_dict": sd, "epoch": 3}, tmp_path / "ckpt.pt")
    torch.save({"model": sd, "optimizer": {}}, tmp_path / "train.pth")
    for name in ("m.safetensors", "m.bin", "ckpt.pt", "train.pth"):
        got = hub.read_state_dict(tmp_path / name)
        assert set(got) == {"a", "b"} and torch.equal(got["a"], sd["a"]), name


class NotATensor:
    pass


def test_pickled_objects_are_refused_without_advising_weights_only_false(tmp_path):
    torch.save({"a": NotATensor()}, tmp_path / "evil.bin")
    with pytest.raises(UnsafeCheckpointError) as err:
        hub.read_state_dict(tmp_path / "evil.bin")
    assert "NotATensor" in str(err.value) and "weights_only=False" not in str(err.value)


def test_os_system_pickle_never_runs(tmp_path):
    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    # a legacy (non-zip) pickle and the zip format torch.save writes
    (tmp_path / "legacy.bin").write_bytes(pickle.dumps({"w": Payload()}))
    torch.save({"w": Payload()}, tmp_path / "zip.pt")
    for name in ("legacy.bin", "zip.pt"):
        with pytest.raises(CheckpointError) as err:
            hub.read_state_dict(tmp_path / name)
        assert "weights_only=False" not in str(err.value)
    assert not marker.exists()


def test_broken_files_are_clear_errors(tmp_path):
    (tmp_path / "junk.safetensors").write_bytes(b"\x00" * 10)
    (tmp_path / "junk.bin").write_bytes(b"not a checkpoint")
    torch.save({"a": [1, 2]}, tmp_path / "list.bin")
    for name in ("junk.safetensors", "junk.bin", "list.bin"):
        with pytest.raises(CheckpointError) as err:
            hub.read_state_dict(tmp_path / name)
        assert not isinstance(err.value, UnsafeCheckpointError), name
    with pytest.raises(WeightsUnavailableError, match="not found"):
        hub.read_state_dict(tmp_path / "missing.bin")


def write_index(folder: Path, shards: dict[str, str]) -> Path:
    index = folder / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {}, "weight_map": shards}))
    return index


def test_sharded_folder(tmp_path):
    save_file({"a": torch.ones(2)}, str(tmp_path / "model-00001-of-00002.safetensors"))
    save_file({"b": torch.zeros(3)}, str(tmp_path / "model-00002-of-00002.safetensors"))
    write_index(
        tmp_path, {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}
    )
    sd = hub.read_folder(tmp_path)
    assert set(sd) == {"a", "b"}


@pytest.mark.parametrize("shard", ["ABS", "../outside.safetensors", "sub/../../outside.bin"])
def test_shards_outside_the_folder_are_refused(tmp_path, shard):
    outside = tmp_path / "outside.safetensors"
    save_file({"a": torch.ones(2)}, str(outside))
    folder = tmp_path / "ckpt"
    folder.mkdir()
    write_index(folder, {"a": str(outside) if shard == "ABS" else shard})
    with pytest.raises(UnsafeCheckpointError, match="inside the checkpoint folder") as err:
        hub.read_folder(folder)
    assert "weights_only=False" not in str(err.value)


def test_torchscript_payload_never_runs(torchscript_payload, tmp_path):
    archive, marker = torchscript_payload
    for path in (archive, archive.with_suffix(".safetensors.bin"), archive.with_suffix(".pth")):
        if path != archive:
            path.write_bytes(archive.read_bytes())
        try:
            hub.read_state_dict(path)
        except CheckpointError as e:
            assert "weights_only=False" not in str(e)
    # through a folder and a shard index too
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "pytorch_model.bin").write_bytes(archive.read_bytes())
    try:
        hub.read_folder(folder)
    except CheckpointError:
        pass
    write_index(folder, {"w": str(archive)})
    with pytest.raises(UnsafeCheckpointError):
        hub.read_folder(folder)
    assert not marker.exists()


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(5, 4)
        self.head = nn.Linear(4, 5, bias=False)
        self.head.weight = self.emb.weight
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))


def test_load_state_dict_checks_everything():
    model = Tied()
    good = {"emb.weight": torch.randn(5, 4, dtype=torch.float16), "steps": torch.tensor(3)}
    hub.load_state_dict(model, good)  # tied head.weight filled in, fp16 cast to fp32
    assert model.head.weight is model.emb.weight and model.emb.weight.dtype == torch.float32
    assert torch.equal(model.emb.weight, good["emb.weight"].float())
    cases = {
        "missing keys: steps": {"emb.weight": torch.randn(5, 4)},
        "unexpected keys: extra": {**good, "extra": torch.ones(1)},
        "shape mismatches: emb.weight": {**good, "emb.weight": torch.randn(4, 4)},
        "wrong tensor types.*emb.weight": {
            **good,
            "emb.weight": torch.ones(5, 4, dtype=torch.long),
        },
        "wrong tensor types.*steps": {**good, "steps": torch.tensor(3.0)},
        "non-finite.*emb.weight": {**good, "emb.weight": torch.full((5, 4), float("nan"))},
    }
    for pattern, sd in cases.items():
        with pytest.raises(CheckpointError, match=pattern):
            hub.load_state_dict(model, sd, source="test.safetensors")
    weight = torch.randn(5, 4)
    weight[1, 2] = float("inf")
    with pytest.raises(CheckpointError, match="non-finite"):
        hub.load_state_dict(model, {**good, "emb.weight": weight})


def test_save_round_trip_with_tied_weights(tmp_path):
    model = Tied()
    path = hub.save_state_dict(model.state_dict(), tmp_path / "m.safetensors")
    loaded = hub.read_state_dict(path)
    assert len(loaded) == 2  # the tied head is stored once
    other = hub.load_state_dict(Tied(), loaded)
    assert torch.equal(other.head.weight, model.head.weight)


def test_atomic_writes_get_normal_permissions_and_leave_nothing_behind(tmp_path):
    old = os.umask(0o022)
    try:
        hub.write_json(tmp_path / "c.json", {"a": 1})
        hub.save_state_dict({"x": torch.ones(2)}, tmp_path / "w.safetensors")
    finally:
        os.umask(old)
    for name in ("c.json", "w.safetensors"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o644
    assert json.loads((tmp_path / "c.json").read_text()) == {"a": 1}
    with pytest.raises(RuntimeError):
        with hub.atomic_write(tmp_path / "c.json", "w") as f:
            f.write("half")
            raise RuntimeError("crash")
    assert json.loads((tmp_path / "c.json").read_text()) == {"a": 1}  # untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.json", "w.safetensors"]
