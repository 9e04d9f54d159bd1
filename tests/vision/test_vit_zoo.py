"""The generated zoo against timm: every preset's tensor names and shapes against timm's
(a stored table of them), the table rebuilt from timm for a sample of presets each run,
one forward-parity case per ViT feature value, the coverage command and docs/vision.md.

``data/timm_layouts.json`` holds, for every preset timm has, the names and shapes of the
state dict of ``timm.create_model(name)`` built on the meta device (block indices folded
into ranges). Regenerate it after upgrading timm or adding a preset::

    uv run python tests/vision/test_vit_zoo.py --write
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import itertools
import json
import math
import random
from pathlib import Path

import pytest
import timm
import torch
from attn_vision import ViTConfig, create_model, get_model_config, get_pretrained_cfg, list_models
from attn_vision.registry import FAMILIES, get_model_spec
from attn_vision.timm_args import vit_args
from attn_vision.timm_table import main, timm_eva_args, timm_relpos_args, timm_vit_args

DOCS = Path(__file__).resolve().parents[2] / "docs" / "vision.md"
TABLE = Path(__file__).with_name("data") / "timm_layouts.json"
TIMM_PRESETS = [n for n in list_models() if get_pretrained_cfg(n) is not None]
Layout = dict[str, tuple[int, ...]]


# -- the stored table: names with their block indices folded ---------------------------------


def _fold(layout: Layout) -> dict[str, dict[str, str]]:
    """``{"blocks.{}.attn.qkv.weight": {"2304x768": "0-11"}, ...}``: each name with its
    numbers replaced by ``{}``, per shape the index tuples (the last one in ranges)."""
    out: dict[str, dict[str, list[tuple[int, ...]]]] = {}
    for name, shape in layout.items():
        parts = name.split(".")
        index = tuple(int(p) for p in parts if p.isdigit())
        template = ".".join("{}" if p.isdigit() else p for p in parts)
        out.setdefault(template, {}).setdefault("x".join(map(str, shape)), []).append(index)
    return {t: {s: _ranges(i) for s, i in by_shape.items()} for t, by_shape in out.items()}


def _ranges(indices: list[tuple[int, ...]]) -> str:
    if indices == [()]:
        return ""
    groups: dict[tuple[int, ...], list[int]] = {}
    for index in sorted(indices):
        groups.setdefault(index[:-1], []).append(index[-1])
    out = []
    for prefix, lasts in groups.items():
        for _, run in itertools.groupby(enumerate(lasts), lambda p: p[1] - p[0]):
            run = [last for _, last in run]
            last = str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}"
            out.append(".".join([*map(str, prefix), last]))
    return " ".join(out)


def _unfold(folded: dict[str, dict[str, str]]) -> Layout:
    """Inverse of :func:`_fold`."""
    out = {}
    for template, by_shape in folded.items():
        for shape, ranges in by_shape.items():
            dims = tuple(int(d) for d in shape.split("x")) if shape else ()
            for index in _indices(ranges):
                out[template.format(*index)] = dims
    return out


def _indices(ranges: str) -> list[tuple[str, ...]]:
    if not ranges:
        return [()]
    out = []
    for item in ranges.split(" "):
        *prefix, last = item.split(".")
        lo, _, hi = last.partition("-")
        out += [(*prefix, str(i)) for i in range(int(lo), int(hi or lo) + 1)]
    return out


# timm modules whose models have our very tensor names (the others, Swin and Eva, go
# through the converter; ResNet's and ConvNeXt's would only check the names are the same)
SAME_NAMES = ("vision_transformer", "deit", "vitamin", "resnet", "convnext")


def _timm_layout(name: str) -> Layout:
    """timm's model of ``name``, built on the meta device (ViTs without their init)."""
    skip = get_model_spec(name).timm_module in ("vision_transformer", "deit", "vitamin")
    with torch.device("meta"):
        ref = timm.create_model(name, **({"weight_init": "skip"} if skip else {}))
    return {k: tuple(v.shape) for k, v in ref.state_dict().items()}


def _read_table() -> dict:
    return json.loads(TABLE.read_text(encoding="utf-8"))


def write_table() -> None:
    layouts = {name: _fold(_timm_layout(name)) for name in TIMM_PRESETS}
    lines = [
        f"    {json.dumps(n)}: {json.dumps(f, separators=(',', ':'))}" for n, f in layouts.items()
    ]
    TABLE.parent.mkdir(exist_ok=True)
    TABLE.write_text(
        f'{{\n  "timm_version": {json.dumps(timm.__version__)},\n  "layouts": {{\n'
        + ",\n".join(lines)
        + "\n  }\n}\n",
        encoding="utf-8",
    )
    print(f"wrote {TABLE} ({len(layouts)} presets, timm {timm.__version__})")


def _ours(name: str) -> Layout:
    """Our model of ``name`` (``create_model``'s config and class; no init) on meta."""
    config = get_model_config(name)
    with torch.device("meta"):
        model = FAMILIES[get_model_spec(name).family][1](config, weight_init=False)
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def _expected(name: str, timm_layout: Layout) -> Layout:
    """timm's layout as ours names it (the very names, but EVA's and Swin's: through the
    converter, on meta tensors)."""
    spec = get_model_spec(name)
    if spec.timm_module in SAME_NAMES:
        return timm_layout
    sd = {k: torch.empty(s, device="meta") for k, s in timm_layout.items()}
    converted = FAMILIES[spec.family][2](sd, get_model_config(name))
    return {k: tuple(v.shape) for k, v in converted.items()}


def test_table_is_for_the_installed_timm_and_every_preset() -> None:
    table = _read_table()
    assert table["timm_version"] == timm.__version__, f"rerun: python {__file__} --write"
    assert list(table["layouts"]) == TIMM_PRESETS, f"rerun: python {__file__} --write"


@pytest.mark.parametrize("name", TIMM_PRESETS)
def test_state_dict_names_and_shapes_match_timm(name) -> None:
    """Same tensors as timm's model of that name (the stored table), both on meta."""
    assert _ours(name) == _expected(name, _unfold(_read_table()["layouts"][name]))


# the table is timm's: rebuilt for a sample of presets (a new one each day; the 48 over 400M
# parameters, 1-10 s each to build, only when the table is written)
_PARAMS = {
    name: sum(math.prod(s) for s in _unfold(folded).values())
    for name, folded in (_read_table()["layouts"] if TABLE.is_file() else {}).items()
}
SAMPLE = sorted(
    random.Random(datetime.date.today().toordinal()).sample(
        sorted(n for n in TIMM_PRESETS if _PARAMS.get(n, 0) < 4e8), 10
    )
)


@pytest.mark.parametrize("name", SAMPLE)
def test_stored_layout_is_what_timm_builds(name) -> None:
    assert _fold(_timm_layout(name)) == _read_table()["layouts"][name]


def test_fold_and_unfold_are_inverses() -> None:
    layout = {
        "a.0.w": (2, 3),
        "a.1.w": (2, 3),
        "a.2.w": (4,),
        "b.0.1.x": (),
        "b.0.2.x": (),
        "c": (1,),
    }
    assert _fold(layout) == {"a.{}.w": {"2x3": "0-1", "4": "2"}, "b.{}.{}.x": {"": "0.1-2"},
                             "c": {"1": ""}}  # fmt: skip
    assert _unfold(_fold(layout)) == layout


# -- forward parity: one preset per feature value --------------------------------------------

SIZES = {"img_size", "patch_size", "embed_dim", "depth", "num_heads", "mlp_ratio", "num_classes"}
# (a RoPE's reference grid is a size too: every case's 4 x 4 grid is scaled onto its own)
SIZES |= {"rope_ref_grid", "rel_pos_dim", "attn_pool_num_heads", "attn_pool_mlp_ratio"}


def _features(name: str) -> frozenset:
    """What a ViT preset computes, sizes aside (LayerScale on/off, not its init value)."""
    cfg = get_model_config(name)
    out = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg) if f.name not in SIZES}
    out["init_values"] = cfg.init_values is not None
    del out["dynamic_img_size"]  # ours always resample; a no-op at the trained size
    return frozenset(out.items())


def _feature_cases() -> list[str]:
    """Few presets that between them have every value of every feature field (greedy set
    cover over ``(field, value)`` pairs; the narrowest preset first among equals)."""
    vits = [n for n in list_models() if type(get_model_config(n)) is ViTConfig]  # (ViTamin:
    features = {n: _features(n) for n in vits}  # test_vitamin.py)
    missing = frozenset().union(*features.values())
    chosen = []
    while missing:
        best = max(vits, key=lambda n: (len(features[n] & missing), -_width(n), n))
        chosen.append(best)
        missing -= features[best]
    return sorted(chosen)


def _width(name: str) -> int:
    return get_model_config(name).embed_dim


FEATURE_CASES = _feature_cases()


@pytest.mark.parametrize("name", FEATURE_CASES)
def test_each_feature_matches_timm(name, timm_checkpoint, assert_parity) -> None:
    """Full width, one block, a 4 x 4 patch grid: timm's random model through its
    safetensors file and our create_model(pretrained=path)."""
    overrides = dict(depth=1, img_size=4 * get_model_config(name).patch_size)
    ref, path = timm_checkpoint(name, **overrides)
    ours = create_model(name, pretrained=path, **overrides)
    assert_parity(ref, ours, torch.randn(2, 3, *ours.patch_embed.img_size))


def test_feature_cases_cover_the_new_features() -> None:
    configs = [get_model_config(n) for n in FEATURE_CASES]
    assert any(c.dist_token for c in configs) and any(c.reg_tokens for c in configs)
    assert any(c.global_pool == "map" for c in configs) and any(c.no_embed_class for c in configs)
    assert any(c.proj_bias != c.qkv_bias for c in configs) and any(
        not c.class_token for c in configs
    )
    assert any(c.act == "gelu_tanh" for c in configs) and any(not c.final_norm for c in configs)
    assert any(c.rope for c in configs) and any(c.attn_inner_norm for c in configs)  # EVA02
    assert any(c.act == "swiglu" and not c.mlp_gate_last for c in configs)  # EVA02 GluMlp
    assert len(FEATURE_CASES) < 20


# -- the generator's translation and the coverage command -----------------------------------


def test_timm_kwargs_translate_or_are_named() -> None:
    args, unsupported = vit_args(
        dict(patch_size=14, reg_tokens=4, act_layer="gelu_tanh", distilled=True, qk_norm=True)
    )
    assert args == dict(patch_size=14, reg_tokens=4, act="gelu_tanh", dist_token=True)
    assert unsupported == ["qk_norm=True"]
    table = {**timm_vit_args(), **timm_eva_args(), **timm_relpos_args()}
    assert table["vit_small_patch14_reg4_dinov2"][0]["reg_tokens"] == 4
    assert table["vit_giant_patch14_dinov2"][1]  # GluMlp: named, not built
    assert "vit_giant_patch14_dinov2" not in list_models()
    built = {n for n, (_, unsupported) in table.items() if not unsupported}
    assert built == {n for n in list_models() if type(get_model_config(n)) is ViTConfig}


def test_coverage_numbers_are_in_the_docs(capsys) -> None:
    main(["--coverage"])
    out = capsys.readouterr().out
    counts = [line.strip() for line in out.splitlines() if " built: " in line]
    assert len(counts) == 18 and counts[0].startswith("architectures built: ")
    docs = DOCS.read_text(encoding="utf-8")
    assert "python -m attn_vision.timm_table --coverage" in docs
    for line in counts:
        assert line in docs, f"docs/vision.md does not show the coverage line {line!r}"


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Rewrite data/timm_layouts.json from timm.")
    parser.add_argument("--write", action="store_true", required=True)
    parser.parse_args()
    write_table()
