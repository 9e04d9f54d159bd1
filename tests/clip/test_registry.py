"""Registry: names and tags are open_clip's (from the shipped table, which must equal what
the installed open_clip gives) and resolve to the files it downloads."""

from __future__ import annotations

import json
import os
from pathlib import Path

import open_clip
import open_clip.pretrained as oc_pretrained
import pytest
from attn_clip import get_model_config, get_pretrained_cfg, list_models, list_pretrained, registry
from attn_clip.config import OPENAI_DATASET_MEAN, OPENAI_DATASET_STD
from attn_clip.registry import list_pretrained_tags

DOCS = Path(__file__).resolve().parents[2] / "docs" / "clip.md"


@pytest.fixture(scope="module")
def built_tables() -> dict:
    """The tables from the installed open_clip, built once (every config read)."""
    return registry.build_tables()


def test_shipped_tables_equal_the_installed_open_clip(built_tables, monkeypatch):
    folder = registry.TABLE_FILE.parent
    for name, content in built_tables.items():
        shipped = json.loads((folder / name).read_text(encoding="utf-8"))
        assert shipped == content, (
            f"{name} is out of date with open_clip {open_clip.__version__} "
            "(rebuild it: uv run python -m attn_clip.registry --write)"
        )
    monkeypatch.setattr(registry, "build_tables", lambda: built_tables)  # (built above)
    assert registry.main(["--check"]) == 0  # the file text too, as --write writes it


def test_list_models_has_the_clips_attn_clip_builds_and_only_them():
    names = set(list_models())
    required = {"ViT-B-32", "ViT-B-16", "ViT-L-14", "ViT-H-14", "ViT-bigG-14", "ViT-L-14-336"}
    required |= {f"{n}-quickgelu" for n in ("ViT-B-32", "ViT-B-16", "ViT-L-14", "ViT-H-14")}
    required |= {"RN50", "RN50x64-quickgelu", "convnext_base", "convnext_large_d_320"}
    required |= {"EVA02-B-16", "EVA02-L-14-336", "EVA01-g-14", "EVA01-g-14-plus"}
    required |= {"ViTamin-S", "ViTamin-L2-384", "ViTamin-XL-384"}
    assert required <= names
    assert names - set(registry.BUNDLED_MODELS) <= set(open_clip.list_models())
    required |= {"coca_ViT-B-32", "coca_ViT-L-14", "coca_base"}
    assert required <= names
    required |= {"xlm-roberta-base-ViT-B-32", "nllb-clip-base-siglip", "mt5-xl-ViT-H-14"}
    required |= {"coca_roberta-ViT-B-32"}  # a CoCa over a Hugging Face RoBERTa tower
    assert required <= names


def test_every_siglip_config_and_tag_with_a_timm_vit_tower():
    """All of open_clip's SigLIP / SigLIP2 configs: a timm ViT + the SigLIP text tower
    (26 configs, 26 tags), or + a Hugging Face text tower (the 2 NLLB ones, 4 tags)."""
    siglip = {n for n in open_clip.list_models() if "siglip" in n.lower()}
    hf_text = {n for n in siglip if open_clip.get_model_config(n)["text_cfg"].get("hf_model_name")}
    assert hf_text == {"nllb-clip-base-siglip", "nllb-clip-large-siglip"}
    built = siglip & set(list_models())
    assert built == siglip and len(built) == 28
    tags = [(n, t) for n, t in list_pretrained() if n in built - hf_text]
    assert len(tags) == 26 and all(t == "webli" for _, t in tags)
    assert sorted(t for n, t in list_pretrained() if n in hf_text) == ["mrl", "mrl", "v1", "v1"]
    src = get_pretrained_cfg("ViT-SO400M-14-SigLIP-384", "webli")
    assert src.hf_hub_id == "timm/ViT-SO400M-14-SigLIP-384"
    pre = src.preprocess
    assert (pre.size, pre.mean, pre.std, pre.resize_mode) == (384, (0.5,) * 3, (0.5,) * 3, "squash")


def test_every_convnext_and_resnet_config_and_tag():
    """open_clip's ConvNeXt (11 configs, 12 tags) and OpenAI ResNet (10 configs, 16 tags)
    CLIPs are all built; the tags' weights, QuickGELU flags and preprocessing are open_clip's
    (checked for every tag in test_every_tag_resolves_to_the_file_open_clip_downloads)."""
    for prefix, n_configs, n_tags in (("convnext_", 11, 12), ("RN", 10, 16)):
        family = {n for n in open_clip.list_models() if n.startswith(prefix)}
        assert len(family) == n_configs and family <= set(list_models())
        tags = [(n, t) for n, t in list_pretrained() if n in family]
        assert tags == [(n, t) for n, t in oc_pretrained.list_pretrained() if n in family]
        assert len(tags) == n_tags
    rn = get_pretrained_cfg("RN50", "openai")
    assert rn.quick_gelu and rn.hf_hub_id == "timm/resnet50_clip.openai"
    assert get_pretrained_cfg("RN50x16", "openai").preprocess.size == 384
    cx = get_pretrained_cfg("convnext_large_d_320", "laion2b_s29b_b131k_ft_soup")
    assert cx.hf_hub_id == "laion/CLIP-convnext_large_d_320.laion2B-s29B-b131K-ft-soup"
    assert not cx.quick_gelu and cx.preprocess.size == 320


def test_every_eva_config_and_its_tag():
    """open_clip's EVA-CLIPs (timm Eva towers, EVA02-E-14 / -plus with timm's post-norm
    blocks): all 7, each with its one tag; OpenAI mean / std, bicubic, shortest side."""
    eva = {n for n in open_clip.list_models() if n.startswith("EVA")}
    built = eva & set(list_models())
    assert built == eva and len(built) == 7
    tags = [(n, t) for n, t in list_pretrained() if n in built]
    assert tags == [(n, t) for n, t in oc_pretrained.list_pretrained() if n in built]
    src = get_pretrained_cfg("EVA02-L-14-336", "merged2b_s6b_b61k")
    assert src.hf_hub_id == "timm/eva02_large_patch14_clip_336.merged2b_s6b_b61k"
    pre = src.preprocess
    assert (pre.size, pre.interpolation, pre.resize_mode) == (336, "bicubic", "shortest")
    assert (pre.mean, pre.std) == (OPENAI_DATASET_MEAN, OPENAI_DATASET_STD)


def test_every_pe_core_config_and_tag():
    """open_clip's Perception Encoder CLIPs (timm ``vit_pe_core_*`` Eva towers): all 5, each
    with its tag; their image sizes and context lengths as open_clip has them."""
    pe = {n for n in open_clip.list_models() if n.startswith("PE-Core")}
    assert len(pe) == 5 and pe <= set(list_models())
    tags = [(n, t) for n, t in list_pretrained() if n in pe]
    assert tags == [(n, t) for n, t in oc_pretrained.list_pretrained() if n in pe]
    assert len(tags) == 5
    big = get_model_config("PE-Core-bigG-14-448")
    assert (big.vision.image_size, big.vision.class_token, big.text.context_length) == (
        448, False, 72,
    )  # fmt: skip
    assert big.vision.eva["attn_type"] == "rope" and big.vision.pool_type == "map"


def test_every_vitamin_config_and_tag():
    """open_clip's ViTamin CLIPs (timm ViTamin towers): all 15 configs, each with its one
    tag (the weights in the authors' Hub repos); OpenAI mean / std, bicubic, shortest side,
    at the config's image size (ViTamin-XL-384's is 256, as open_clip has it)."""
    vitamin = {n for n in open_clip.list_models() if n.startswith("ViTamin")}
    assert len(vitamin) == 15 and vitamin <= set(list_models())
    tags = [(n, t) for n, t in list_pretrained() if n in vitamin]
    assert tags == [(n, t) for n, t in oc_pretrained.list_pretrained() if n in vitamin]
    assert len(tags) == 15 and all(t == "datacomp1b" for _, t in tags)
    src = get_pretrained_cfg("ViTamin-L-384", "datacomp1b")
    assert src.hf_hub_id == "jienengchen/ViTamin-L-384px"
    assert src.filenames == ("pytorch_model.safetensors", "pytorch_model.bin")
    pre = src.preprocess
    assert (pre.size, pre.interpolation, pre.resize_mode) == (384, "bicubic", "shortest")
    assert (pre.mean, pre.std) == (OPENAI_DATASET_MEAN, OPENAI_DATASET_STD)
    assert get_pretrained_cfg("ViTamin-XL-384", "datacomp1b").preprocess.size == 256


def test_coverage_counts_what_is_listed(capsys):
    assert registry.main(["--coverage"]) == 0
    out = capsys.readouterr().out
    n_models = len(list_models()) - len(registry.BUNDLED_MODELS)
    n_tags = len(list_pretrained())
    line = (
        f"attn_clip builds {n_models} of {len(open_clip.list_models())} model configs and "
        f"{n_tags} of {len(oc_pretrained.list_pretrained())} pretrained tags"
    )
    assert line in out, out
    assert "SigLIP / SigLIP2: 28 of 28 configs, 30 of 30 tags" in out
    hf_line = "Hugging Face text towers (XLM-R, RoBERTa, NLLB, mT5): 10 of 10 configs, 9 of 9 tags"
    assert hf_line in out
    assert "ConvNeXt: 11 of 11 configs, 12 of 12 tags" in out
    assert "OpenAI ResNet (RN*): 10 of 10 configs, 16 of 16 tags" in out
    assert "EVA-CLIP (EVA01 / EVA02): 7 of 7 configs, 7 of 7 tags" in out
    assert "ViTamin: 15 of 15 configs, 15 of 15 tags" in out
    assert "PE-Core (Perception Encoder): 5 of 5 configs, 5 of 5 tags" in out
    assert "MobileCLIP / MobileCLIP2 (FastViT / MCi): 9 of 9 configs, 10 of 10 tags" in out
    assert out.strip() in DOCS.read_text(encoding="utf-8"), "docs/clip.md: rerun --coverage"
    assert get_model_config("ViT-B-32-quickgelu").quick_gelu
    assert not get_model_config("ViT-B-32").quick_gelu


def test_model_configs_are_open_clips():
    from attn_clip import CLIPConfig

    for name in list_models():
        if name not in registry.BUNDLED_MODELS:
            ref = CLIPConfig.from_open_clip(open_clip.get_model_config(name))
            assert get_model_config(name) == ref, name


def test_list_models_pattern_and_pretrained():
    bundled = list(registry.BUNDLED_MODELS)  # demo-shapes, demo-shapes-coca
    assert list_models()[-len(bundled) :] == bundled  # bundled models always come along, last
    assert list_models("ViT-B-32*") == [n for n in list_models() if n.startswith("ViT-B-32")]
    assert list_models("demo-*") == bundled
    assert list_models("nothing-like-this*") == []
    tagged = list_models(pretrained=True)
    assert tagged == [*list_pretrained(as_str=True), *(f"{n}:shapes" for n in bundled)]
    assert "ViT-B-32:openai" in list_models("ViT-B-32", pretrained=True)
    assert set(list_models("ViT-B-32", pretrained=True)) == {
        f"ViT-B-32:{t}" for t in list_pretrained_tags("ViT-B-32")
    }
    openai = list_models("*:openai", pretrained=True)
    assert openai and all(t.endswith(":openai") for t in openai)
    assert list_models("demo-shapes", pretrained=True) == ["demo-shapes:shapes"]


def test_every_tag_resolves_to_the_file_open_clip_downloads():
    pairs = list_pretrained()
    assert ("ViT-B-32", "laion2b_s34b_b79k") in pairs and ("ViT-L-14", "openai") in pairs
    assert "ViT-B-32:openai" in list_pretrained(as_str=True)
    names = set(list_models())
    assert pairs == [(m, t) for m, t in oc_pretrained.list_pretrained() if m in names]
    for name, tag in pairs:
        src = get_pretrained_cfg(name, tag)
        cfg = oc_pretrained.get_pretrained_cfg(name, tag)
        repo, filename = os.path.split(cfg["hf_hub"])
        filename = filename or "open_clip_pytorch_model.bin"
        assert src.hf_hub_id == repo
        assert list(src.filenames) == [*oc_pretrained._get_safe_alternatives(filename), filename]
        assert src.quick_gelu == cfg.get("quick_gelu", False)
        assert src.url == cfg["url"]
        pre = src.preprocess
        assert (pre.mean, pre.std) == (tuple(cfg["mean"]), tuple(cfg["std"]))
        assert (pre.interpolation, pre.resize_mode) == (cfg["interpolation"], cfg["resize_mode"])
        assert pre.size == open_clip.get_model_config(name)["vision_cfg"]["image_size"]


def test_known_examples():
    src = get_pretrained_cfg("ViT-B-32", "laion2b_s34b_b79k")
    assert src.hf_hub_id == "laion/CLIP-ViT-B-32-laion2B-s34B-b79K"
    assert src.filenames == ("open_clip_model.safetensors", "open_clip_pytorch_model.bin")
    assert not src.quick_gelu
    assert get_pretrained_cfg("ViT-B-32", "LAION2B-s34b-b79k").hf_hub_id == src.hf_hub_id
    openai = get_pretrained_cfg("ViT-B-16", "openai")
    assert openai.quick_gelu and openai.hf_hub_id == "timm/vit_base_patch16_clip_224.openai"
    assert get_pretrained_cfg("ViT-L-14-CLIPA", "datacomp1b").preprocess.resize_mode == "squash"
    assert "datacomp_xl_s13b_b90k" in list_pretrained_tags("ViT-B-16")
    assert list_pretrained_tags("RN50") == ["openai", "yfcc15m", "cc12m"]
    assert list_pretrained_tags("nope") == []


def test_clear_errors(monkeypatch):
    with pytest.raises(ValueError, match=r"unknown model 'ViT-B-33'.*did you mean.*ViT-B-32"):
        get_model_config("ViT-B-33")
    # every open_clip config is built now: a refused one, as an open_clip release could add
    table = {**registry._table(), "unsupported": {"new-CLIP": "uses text_cfg.qk_norm (...)"}}
    monkeypatch.setattr(registry, "_table", lambda: table)
    with pytest.raises(ValueError, match=r"'new-CLIP' cannot be built.*text_cfg\.qk_norm"):
        get_model_config("new-CLIP")
    assert (
        "not built (1 configs), by the first feature refused:\n    1  uses text_cfg.qk_norm: "
        "new-CLIP" in registry.coverage()
    )
    monkeypatch.undo()
    with pytest.raises(ValueError, match="unknown pretrained tag 'nope'.*laion2b_s34b_b79k"):
        get_pretrained_cfg("ViT-B-32", "nope")
    with pytest.raises(ValueError, match="unknown pretrained tag 'x'.*shapes"):
        get_pretrained_cfg("demo-shapes", "x")
