"""Pretrained weights: location from timm's pretrained_cfg (the shipped table), loading through
attn_core.hub: the Hub cache, clear offline errors, hostile and broken files refused.

No network is used: offline mode is forced, and the Hub cache is laid out by hand.
"""

from __future__ import annotations

import json
import os
import pickle
import time
import zipfile

import huggingface_hub
import pytest
import torch
from attn_core import hub
from attn_core.hub import (
    CheckpointError,
    UnsafeCheckpointError,
    WeightsError,
    WeightsUnavailableError,
)
from attn_vision import (
    PretrainedLocation,
    create_model,
    resolve_pretrained,
    save_pretrained,
)
from attn_vision import pretrained as pretrained_mod
from safetensors.torch import save_file
from timm.models import get_pretrained_cfg

TINY = dict(depth=1)


@pytest.fixture
def offline(monkeypatch, tmp_path):
    """HF_HUB_OFFLINE=1 (env and the already-imported constant) with an empty cache dir."""
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    return cache


def test_location_is_timms_pretrained_cfg() -> None:
    name = "vit_base_patch16_224.augreg2_in21k_ft_in1k"
    loc = resolve_pretrained(name)
    assert loc.repo_id == get_pretrained_cfg(name).hf_hub_id == f"timm/{name}"
    assert loc.filenames == ("model.safetensors", "pytorch_model.bin")
    assert loc.revision is None
    # a bare name resolves to timm's default tag
    assert resolve_pretrained("vit_base_patch16_224") == loc
    swin = resolve_pretrained("swin_tiny_patch4_window7_224")
    assert swin.repo_id == get_pretrained_cfg("swin_tiny_patch4_window7_224").hf_hub_id


def test_hub_filename_and_revision_from_cfg(monkeypatch) -> None:
    cfg = {"hf_hub_id": "someone/weights@v1.2", "hf_hub_filename": "open_clip_model.safetensors"}
    monkeypatch.setattr(pretrained_mod, "get_pretrained_cfg", lambda name: cfg)
    assert resolve_pretrained("anything") == PretrainedLocation(
        "someone/weights", "open_clip_model.safetensors", "v1.2"
    )
    monkeypatch.setattr(pretrained_mod, "get_pretrained_cfg", lambda name: {"url": "http://x"})
    with pytest.raises(ValueError, match="no Hugging Face Hub weights"):
        resolve_pretrained("anything")


def test_offline_error_is_fast_and_names_repo_and_cache(offline) -> None:
    start = time.monotonic()
    with pytest.raises(WeightsUnavailableError) as e:
        create_model("vit_tiny_patch16_224", pretrained=True)
    assert time.monotonic() - start < 10
    msg = str(e.value)
    assert "timm/vit_tiny_patch16_224.augreg_in21k_ft_in1k" in msg
    assert "model.safetensors" in msg and "pytorch_model.bin" in msg
    assert str(offline) in msg  # the cache directory that was searched
    assert "pretrained=" in msg  # how to pass a local file instead
    assert isinstance(e.value, OSError)


def test_explicit_cache_dir_is_named(offline, tmp_path) -> None:
    with pytest.raises(WeightsUnavailableError, match=str(tmp_path / "elsewhere")):
        create_model("resnet18.a1_in1k", pretrained=True, cache_dir=tmp_path / "elsewhere")


def test_local_files_only_never_downloads(monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    start = time.monotonic()
    with pytest.raises(WeightsUnavailableError, match="local_files_only"):
        create_model("resnet18", pretrained=True, cache_dir=tmp_path, local_files_only=True)
    assert time.monotonic() - start < 10


def test_unreachable_hub_fails_at_once(monkeypatch, tmp_path) -> None:
    """No network (not offline mode): one quick connection check instead of ~20 s of retries."""
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", "http://127.0.0.1:9")  # refused
    for var in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    start = time.monotonic()
    with pytest.raises(WeightsUnavailableError, match=r"cannot connect to 127\.0\.0\.1:9"):
        create_model("vit_tiny_patch16_224", pretrained=True, cache_dir=tmp_path)
    assert time.monotonic() - start < 10


def _put_in_hub_cache(cache, repo_id: str, filename: str, state_dict) -> None:
    """Lay a file out exactly as huggingface_hub caches a download."""
    commit = "0" * 40
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    if filename.endswith(".safetensors"):
        save_file({k: v.contiguous() for k, v in state_dict.items()}, str(snapshot / filename))
    else:
        torch.save(state_dict, snapshot / filename)


def test_pretrained_true_loads_from_the_hub_cache(offline, timm_checkpoint, assert_parity) -> None:
    """The whole pretrained=True path (timm cfg -> hf_hub_download -> convert) without network."""
    name = "vit_tiny_patch16_224.augreg_in21k_ft_in1k"
    ref, _ = timm_checkpoint("vit_tiny_patch16_224", depth=2)
    _put_in_hub_cache(offline, f"timm/{name}", "model.safetensors", ref.state_dict())
    ours = create_model(name, pretrained=True, depth=2)
    assert not ours.training  # eval mode, as every create_model returns
    assert_parity(ref, ours, torch.randn(1, 3, 224, 224))
    # the same weights by tag: pretrained="<tag>" of the bare arch
    by_tag = create_model("vit_tiny_patch16_224", pretrained="augreg_in21k_ft_in1k", depth=2)
    assert by_tag.pretrained_cfg == ours.pretrained_cfg
    assert_parity(ref, by_tag, torch.randn(1, 3, 224, 224))
    with pytest.raises(ValueError, match="names tag 'augreg_in21k_ft_in1k' but pretrained"):
        create_model(name, pretrained="augreg_in21k", depth=2)


def test_cached_pytorch_bin_is_the_fallback(offline, timm_checkpoint, assert_parity) -> None:
    """Repos with only pytorch_model.bin: found (as timm does) and read with weights_only."""
    name = "vit_small_patch16_224.augreg_in21k_ft_in1k"
    ref, _ = timm_checkpoint("vit_small_patch16_224", depth=1)
    _put_in_hub_cache(offline, f"timm/{name}", "pytorch_model.bin", ref.state_dict())
    loc = resolve_pretrained(name)
    assert hub.download(loc.repo_id, loc.filenames).name == "pytorch_model.bin"
    ours = create_model(name, pretrained=True, depth=1)
    assert_parity(ref, ours, torch.randn(1, 3, 224, 224))


# -- hostile and broken files ------------------------------------------------------------------


def test_torchscript_payload_file_never_runs(torchscript_payload) -> None:
    archive, marker = torchscript_payload
    with pytest.raises(UnsafeCheckpointError):
        create_model("vit_tiny_patch16_224", pretrained=archive, **TINY)
    assert not marker.exists()


class _System:
    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


def test_pickled_os_system_in_a_torch_zip_never_runs(tmp_path) -> None:
    """A hand-made torch zip whose data.pkl calls os.system: weights_only refuses it."""
    marker = tmp_path / "ran.marker"
    archive = tmp_path / "x.pt"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("x/data.pkl", pickle.dumps({"w": _System(f"touch {marker}")}, protocol=2))
        zf.writestr("x/version", "3\n")
        zf.writestr("x/byteorder", "little")
    with pytest.raises(UnsafeCheckpointError):
        create_model("resnet18", pretrained=archive)
    assert not marker.exists()


def test_torchscript_payload_in_a_saved_folder_never_runs(torchscript_payload, tmp_path) -> None:
    archive, marker = torchscript_payload
    folder = save_pretrained(create_model("vit_tiny_patch16_224", **TINY), tmp_path / "saved")
    (folder / "model.safetensors").write_bytes(archive.read_bytes())
    with pytest.raises(CheckpointError):
        create_model(folder)
    assert not marker.exists()


def test_a_folder_of_timm_weights(timm_checkpoint, assert_parity, tmp_path) -> None:
    """pretrained=<folder>: its model.safetensors (as a timm Hub repo lays it out)."""
    ref, path = timm_checkpoint("resnet18")
    folder = tmp_path / "timm-resnet18"
    folder.mkdir()
    path.rename(folder / "model.safetensors")
    assert_parity(ref, create_model("resnet18", pretrained=folder), torch.randn(1, 3, 64, 64))


def test_shards_outside_the_folder_are_refused(tmp_path) -> None:
    folder = tmp_path / "sharded"
    folder.mkdir()
    index = {"weight_map": {"fc.weight": "../outside.safetensors"}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(UnsafeCheckpointError, match="inside the checkpoint folder"):
        create_model("resnet18", pretrained=folder)


def test_nan_weights_are_refused_by_name(timm_checkpoint, tmp_path) -> None:
    ref, _ = timm_checkpoint("vit_tiny_patch16_224", **TINY)
    sd = {k: v.clone().contiguous() for k, v in ref.state_dict().items()}
    sd["blocks.0.mlp.fc1.weight"][0, 0] = float("nan")
    save_file(sd, str(tmp_path / "nan.safetensors"))
    with pytest.raises(CheckpointError, match=r"non-finite.*blocks\.0\.mlp\.fc1\.weight"):
        create_model("vit_tiny_patch16_224", pretrained=tmp_path / "nan.safetensors", **TINY)


def test_integer_tensors_are_refused_not_cast(timm_checkpoint, tmp_path) -> None:
    ref, _ = timm_checkpoint("resnet18")
    sd = {k: v.contiguous() for k, v in ref.state_dict().items()}
    sd["fc.weight"] = torch.ones_like(sd["fc.weight"], dtype=torch.int64)
    torch.save(sd, tmp_path / "ints.bin")
    with pytest.raises(CheckpointError, match=r"fc\.weight: checkpoint torch\.int64"):
        create_model("resnet18", pretrained=tmp_path / "ints.bin")


def test_apps_catch_one_exception(offline, tmp_path) -> None:
    for pretrained in (True, tmp_path / "missing.bin"):
        with pytest.raises(WeightsError):
            create_model("resnet18", pretrained=pretrained)
