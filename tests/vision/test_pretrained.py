"""Pretrained weights: location from timm's pretrained_cfg, Hub cache, clear offline errors.

No network is used: offline mode is forced, and the Hub cache is laid out by hand.
"""

from __future__ import annotations

import time

import huggingface_hub
import pytest
import torch
from attn_vision import (
    PretrainedLocation,
    WeightsUnavailableError,
    create_model,
    download_pretrained,
    resolve_pretrained,
)
from attn_vision import pretrained as pretrained_mod
from safetensors.torch import save_file
from timm.models import get_pretrained_cfg


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
        download_pretrained("resnet18.a1_in1k", cache_dir=tmp_path / "elsewhere")


def test_unreachable_hub_fails_at_once(monkeypatch, tmp_path) -> None:
    """No network (not offline mode): one quick connection check instead of ~20 s of retries."""
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", "http://127.0.0.1:9")  # refused
    for var in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    start = time.monotonic()
    with pytest.raises(WeightsUnavailableError, match=r"cannot connect to 127\.0\.0\.1:9"):
        download_pretrained("vit_tiny_patch16_224", cache_dir=tmp_path)
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
    ours = create_model(name, pretrained=True, depth=2).eval()
    assert_parity(ref, ours, torch.randn(1, 3, 224, 224))


def test_cached_pytorch_bin_is_the_fallback(offline, timm_checkpoint, assert_parity) -> None:
    """Repos with only pytorch_model.bin: found (as timm does) and read with weights_only."""
    name = "vit_small_patch16_224.augreg_in21k_ft_in1k"
    ref, _ = timm_checkpoint("vit_small_patch16_224", depth=1)
    _put_in_hub_cache(offline, f"timm/{name}", "pytorch_model.bin", ref.state_dict())
    assert download_pretrained(name).name == "pytorch_model.bin"
    ours = create_model(name, pretrained=True, depth=1).eval()
    assert_parity(ref, ours, torch.randn(1, 3, 224, 224))
