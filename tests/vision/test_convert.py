"""Converters fail loudly, resample position embeddings, read only safe formats."""

from __future__ import annotations

import pickle

import pytest
import timm
import torch
from attn_core.hub import CheckpointError, UnsafeCheckpointError, WeightsUnavailableError
from attn_vision import convert_timm_vit, create_model, get_model_config, resample_abs_pos_embed
from safetensors.torch import save_file
from timm.layers import resample_abs_pos_embed as timm_resample

TINY = dict(depth=1)


@pytest.fixture(scope="module")
def tiny_sd() -> dict[str, torch.Tensor]:
    return timm.create_model("vit_tiny_patch16_224", **TINY).state_dict()


def test_identity_names_round_trip(tiny_sd) -> None:
    out = convert_timm_vit(tiny_sd, get_model_config("vit_tiny_patch16_224", **TINY))
    assert out.keys() == tiny_sd.keys()
    assert all(out[k] is tiny_sd[k] for k in out)  # pure: no copies, input untouched


def test_missing_and_unexpected_keys_are_listed(tiny_sd) -> None:
    cfg = get_model_config("vit_tiny_patch16_224", **TINY)
    sd = dict(tiny_sd)
    del sd["blocks.0.attn.qkv.weight"]
    sd["blocks.0.attn.bogus"] = torch.zeros(1)
    with pytest.raises(CheckpointError) as e:
        convert_timm_vit(sd, cfg)
    msg = str(e.value)
    assert "missing keys (1): blocks.0.attn.qkv.weight" in msg
    assert "unexpected keys (1): blocks.0.attn.bogus" in msg


def test_head_shape_mismatch_suggests_num_classes(tiny_sd) -> None:
    sd = dict(tiny_sd, **{"head.weight": torch.zeros(10, 192), "head.bias": torch.zeros(10)})
    with pytest.raises(
        ValueError,
        match=r"(?s)head.weight: checkpoint \(10, 192\) vs model \(1000, 192\).*num_classes=10",
    ):
        convert_timm_vit(sd, get_model_config("vit_tiny_patch16_224", **TINY))


def test_wrapped_checkpoints_and_pre_logits(tiny_sd) -> None:
    sd = {"state_dict": dict(tiny_sd, **{"pre_logits.fc.weight": torch.zeros(192, 192)})}
    out = convert_timm_vit(sd, get_model_config("vit_tiny_patch16_224", **TINY))
    assert "pre_logits.fc.weight" not in out and "state_dict" not in out


@pytest.mark.parametrize(("new", "prefix"), [((20, 12), 1), ((7, 7), 0), ((14, 14), 1)])
def test_resample_matches_timm(new, prefix) -> None:
    pos = torch.randn(1, prefix + 14 * 14, 16)
    ours = resample_abs_pos_embed(pos, new, (14, 14), num_prefix_tokens=prefix)
    ref = timm_resample(pos, list(new), [14, 14], num_prefix_tokens=prefix)
    torch.testing.assert_close(ours, ref, atol=0, rtol=0)
    if new == (14, 14):
        assert ours is pos  # no-op at the trained size


def test_converter_resamples_pos_embed_to_config_grid(tiny_sd) -> None:
    out = convert_timm_vit(tiny_sd, get_model_config("vit_tiny_patch16_224", img_size=320, **TINY))
    expected = timm_resample(tiny_sd["pos_embed"], [20, 20], [14, 14], num_prefix_tokens=1)
    torch.testing.assert_close(out["pos_embed"], expected, atol=0, rtol=0)


def test_bin_files_load_with_weights_only(tiny_sd, tmp_path) -> None:
    path = tmp_path / "pytorch_model.bin"
    torch.save({"model": tiny_sd}, path)
    model = create_model("vit_tiny_patch16_224", pretrained=path, **TINY)
    torch.testing.assert_close(model.pos_embed.detach(), tiny_sd["pos_embed"])


class _Evil:
    def __reduce__(self):
        return (print, ("arbitrary code ran",))


def test_arbitrary_pickles_are_refused(tmp_path, capsys) -> None:
    path = tmp_path / "evil.pth"
    with open(path, "wb") as f:
        pickle.dump({"x": _Evil()}, f, protocol=2)
    with pytest.raises(UnsafeCheckpointError):
        create_model("vit_tiny_patch16_224", pretrained=path, **TINY)
    assert "arbitrary code ran" not in capsys.readouterr().out


def test_bad_paths_and_files(tmp_path, tiny_sd) -> None:
    with pytest.raises(WeightsUnavailableError, match=r"neither a pretrained tag .*augreg_in21k"):
        create_model("vit_tiny_patch16_224", pretrained=str(tmp_path / "missing.safetensors"))
    (tmp_path / "weights.npz").write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError):  # not a checkpoint: refused, never unpickled
        create_model("vit_tiny_patch16_224", pretrained=tmp_path / "weights.npz", **TINY)
    save_file({k: v.contiguous() for k, v in tiny_sd.items()}, str(tmp_path / "tiny.safetensors"))
    with pytest.raises(CheckpointError, match=r"(?s)missing keys.*blocks\.1\..*depth"):
        create_model("vit_tiny_patch16_224", pretrained=tmp_path / "tiny.safetensors", depth=2)


def test_map_head_is_dropped_when_the_model_pools_otherwise() -> None:
    """timm loads a SigLIP checkpoint into a tower built with global_pool='avg' without its
    MAP head (non-strict for SigLIP); so do we. A model with the head needs every key."""
    name, small = "vit_base_patch16_siglip_224", dict(depth=1, img_size=32)
    sd = timm.create_model(name, weight_init="skip", **small).state_dict()
    assert any(k.startswith("attn_pool.") for k in sd)
    gap = get_model_config(name, global_pool="avg", fc_norm=False, **small)  # as *_siglip_gap_*
    out = convert_timm_vit(sd, gap)
    assert not any(k.startswith("attn_pool.") for k in out)
    del sd["attn_pool.latent"]
    with pytest.raises(CheckpointError, match="missing keys \\(1\\): attn_pool.latent"):
        convert_timm_vit(sd, get_model_config(name, **small))
