"""The generated zoo against timm: every preset's tensor names and shapes (meta device, no
memory), one forward-parity case per distinct ViT feature combination, the coverage command
and docs/vision.md agree."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import timm
import torch
from attn_vision import (
    ViTConfig,
    create_model,
    get_model_config,
    get_pretrained_cfg,
    list_models,
)
from attn_vision.registry import FAMILIES, main
from attn_vision.timm_table import timm_eva_args, timm_vit_args, vit_args

DOCS = Path(__file__).resolve().parents[2] / "docs" / "vision.md"
TIMM_PRESETS = [n for n in list_models() if get_pretrained_cfg(n) is not None]


def _shapes(state_dict: dict[str, torch.Tensor]) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in state_dict.items()}


@pytest.mark.parametrize("name", TIMM_PRESETS)
def test_state_dict_names_and_shapes_match_timm(name) -> None:
    """Same tensors as timm's model of that name (ViT: the very names; EVA, Swin, ResNet,
    ConvNeXt: after the converter), both built on the meta device."""
    is_vit = isinstance(get_model_config(name), ViTConfig)
    timm_vit = is_vit and not name.startswith("eva")  # timm's Eva class has its own layout
    with torch.device("meta"):
        ref = timm.create_model(name, **({"weight_init": "skip"} if timm_vit else {}))
        ours = create_model(name)
    expected = ref.state_dict()
    if not timm_vit:
        family = next(f for f, (cls, _, _) in FAMILIES.items() if isinstance(ours.config, cls))
        expected = FAMILIES[family][2](expected, ours.config)
    assert _shapes(ours.state_dict()) == _shapes(expected)


# -- one forward parity case per feature combination ---------------------------------------

SIZES = {"img_size", "patch_size", "embed_dim", "depth", "num_heads", "mlp_ratio", "num_classes"}


def _features(name: str) -> tuple:
    """What a ViT preset computes, sizes aside (LayerScale on/off, not its init value)."""
    cfg = get_model_config(name)
    out = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg) if f.name not in SIZES}
    out["init_values"] = cfg.init_values is not None
    del out["dynamic_img_size"]  # ours always resample; a no-op at the trained size
    return tuple(sorted(out.items()))


FEATURE_CASES = sorted(
    {
        _features(n): n
        for n in reversed(list_models())
        if type(get_model_config(n)) is ViTConfig  # (ViTamin's subclass: test_vitamin.py)
    }.values()
)


@pytest.mark.parametrize("name", FEATURE_CASES)
def test_each_feature_combination_matches_timm(name, timm_checkpoint, assert_parity) -> None:
    """Full width, one block, a 4 x 4 patch grid: timm's random model through its
    safetensors file and our create_model(pretrained=path)."""
    overrides = dict(depth=1, img_size=4 * get_model_config(name).patch_size)
    ref, path = timm_checkpoint(name, **overrides)
    ours = create_model(name, pretrained=path, **overrides)
    assert_parity(ref, ours, torch.randn(2, 3, *ours.patch_embed.img_size))


def test_feature_cases_cover_the_new_features() -> None:
    configs = [get_model_config(n) for n in FEATURE_CASES]
    assert any(c.dist_token for c in configs) and any(c.reg_tokens for c in configs)
    assert any(c.global_pool == "map" for c in configs)
    assert any(c.proj_bias != c.qkv_bias for c in configs)
    assert any(c.act == "gelu_tanh" for c in configs) and any(not c.final_norm for c in configs)
    assert any(c.rope and c.attn_inner_norm for c in configs)  # EVA02-CLIP
    assert any(c.act == "swiglu" and not c.mlp_gate_last for c in configs)  # EVA02 GluMlp


# -- the generator's translation and the coverage command -----------------------------------


def test_timm_kwargs_translate_or_are_named() -> None:
    args, unsupported = vit_args(
        dict(patch_size=14, reg_tokens=4, act_layer="gelu_tanh", distilled=True, qk_norm=True)
    )
    assert args == dict(patch_size=14, reg_tokens=4, act="gelu_tanh", dist_token=True)
    assert unsupported == ["qk_norm=True"]
    table = {**timm_vit_args(), **timm_eva_args()}
    assert table["vit_small_patch14_reg4_dinov2"][0]["reg_tokens"] == 4
    assert table["vit_giant_patch14_dinov2"][1]  # GluMlp: named, not built
    assert "vit_giant_patch14_dinov2" not in list_models()
    built = {n for n, (_, unsupported) in table.items() if not unsupported}
    assert built == {n for n in list_models() if type(get_model_config(n)) is ViTConfig}


def test_coverage_numbers_are_in_the_docs(capsys) -> None:
    main(["--coverage"])
    out = capsys.readouterr().out
    counts = [line.strip() for line in out.splitlines() if " built: " in line]
    assert len(counts) == 14 and counts[0].startswith("architectures built: ")
    docs = DOCS.read_text(encoding="utf-8")
    assert "python -m attn_vision.registry --coverage" in docs
    for line in counts:
        assert line in docs, f"docs/vision.md does not show the coverage line {line!r}"
