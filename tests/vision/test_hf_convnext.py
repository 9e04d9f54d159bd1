"""attn_vision.hf.convnext: transformers' ConvNextModel / ConvNextForImageClassification and
ConvNextV2ForImageClassification folders (random init, ``save_pretrained``) -> our ConvNeXt,
logits and pooled features at transformers' numbers; the GRN in timm's 1x1-conv layout."""

from __future__ import annotations

import json
from pathlib import Path

import attn_vision
import pytest
import timm
import torch
import transformers
from attn_core.hub import CheckpointError, read_folder
from attn_vision.convert import convert_timm_convnext
from attn_vision.convnext import ConvNeXt, ConvNeXtConfig
from attn_vision.hf import convnext as hf_convnext
from torch.testing import assert_close

TOL = dict(atol=1e-4, rtol=1e-4)
# stages 2 and 3 share a width: transformers (and timm) still downsample there
TINY = dict(depths=[1, 1, 2, 1], hidden_sizes=[8, 16, 16, 32], image_size=64)


@torch.no_grad()
def _randomize(model: torch.nn.Module) -> torch.nn.Module:
    """Non-default norm weights / biases, layer scales and GRN (zero at init), so every
    tensor moves the output."""
    for name, p in model.named_parameters():
        if "grn" in name:
            p.copy_(torch.randn_like(p) * 0.5)
        elif p.ndim == 1 and name.endswith("weight") or "layer_scale" in name:
            p.copy_(torch.randn_like(p) * 0.3 + 1.0)
        elif p.ndim == 1:
            p.copy_(torch.randn_like(p) * 0.1)
    return model.eval()


def _save(model: torch.nn.Module, folder: Path) -> Path:
    model.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, tuple[torch.nn.Module, Path]]:
    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("hf_convnext")
    # a large final epsilon, so ignoring layer_norm_eps changes the numbers
    labels = dict(enumerate(["cat", "dog", "fox", "owl", "yak"]))
    cls_cfg = transformers.ConvNextConfig(**TINY, id2label=labels, layer_norm_eps=0.5)
    bare_cfg = transformers.ConvNextConfig(**TINY, layer_scale_init_value=0.0)
    v2_cfg = transformers.ConvNextV2Config(**TINY, num_labels=4)
    out = {}
    for name, model in (
        ("classifier", transformers.ConvNextForImageClassification(cls_cfg)),
        ("bare", transformers.ConvNextModel(bare_cfg)),
        ("v2", transformers.ConvNextV2ForImageClassification(v2_cfg)),
    ):
        model = _randomize(model)
        out[name] = model, _save(model, root / name)
    return out


def _ours(folder: Path) -> ConvNeXt:
    hf = json.loads((folder / "config.json").read_text())
    sd = read_folder(folder)
    family, config = hf_convnext.config_from_hf(hf, sd.keys())
    assert family == "convnext"
    model = ConvNeXt(config, weight_init=False)
    model.load_state_dict(hf_convnext.convert_hf(sd, hf, config), strict=True)
    return model.eval()


@pytest.mark.parametrize("name", ["classifier", "bare", "v2"])
def test_parity(folders, name):
    ref, folder = folders[name]
    ours = _ours(folder)
    assert ours.config.use_grn == (name == "v2")
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        if name != "bare":
            base = getattr(ref, "convnextv2" if name == "v2" else "convnext")(pixel_values=x)
            assert_close(ours(x), ref(pixel_values=x).logits, **TOL)
            assert ours.config.num_classes == (4 if name == "v2" else 5)
            assert ours.config.head_norm_eps == (1e-12 if name == "v2" else 0.5)
        else:
            base = ref(pixel_values=x)
            assert ours.config.num_classes == 0 and ours.config.ls_init_value is None
            assert_close(ours(x), base.pooler_output, **TOL)  # no head: the pooled features
        feats = ours.forward_features(x)
        assert_close(feats, base.last_hidden_state, **TOL)
        assert_close(ours.forward_head(feats, pre_logits=True), base.pooler_output, **TOL)


@pytest.mark.parametrize("name", ["classifier", "v2"])
def test_create_model_from_the_folder(folders, name, tmp_path):
    """``attn_vision.create_model(folder)``: transformers' logits, id2label as the class
    names; ``save_pretrained`` of it loads back exactly."""
    ref, folder = folders[name]
    model = attn_vision.create_model(folder)
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        want = ref(pixel_values=x).logits
        assert_close(model(x), want, **TOL)
        labels = [ref.config.id2label[i] for i in range(ref.config.num_labels)]
        assert list(model.pretrained_cfg["label_names"]) == labels
        attn_vision.save_pretrained(model, tmp_path / "ours")
        assert_close(attn_vision.create_model(tmp_path / "ours")(x), model(x), atol=0, rtol=0)


def test_config_without_weights_gives_the_same_config(folders):
    """``convert_hf(sd, hf)`` reads the config itself when none is passed."""
    _, folder = folders["classifier"]
    hf = json.loads((folder / "config.json").read_text())
    sd = read_folder(folder)
    assert (
        hf_convnext.convert_hf(sd, hf).keys()
        == ConvNeXt(hf_convnext.config_from_hf(hf, sd.keys())[1], weight_init=False)
        .state_dict()
        .keys()
    )


def test_strict_keys(folders):
    _, folder = folders["classifier"]
    hf = json.loads((folder / "config.json").read_text())
    sd = read_folder(folder)
    missing = {k: v for k, v in sd.items() if "stages.2.layers.1.pwconv2" not in k}
    with pytest.raises(
        CheckpointError, match=r"missing keys \(2\).*stages\.2\.blocks\.1\.mlp\.fc2"
    ):
        hf_convnext.convert_hf(missing, hf)
    extra = dict(sd, **{"convnext.encoder.stages.0.layers.0.grn.weight": torch.zeros(32)})
    with pytest.raises(CheckpointError, match=r"unexpected keys \(1\).*grn\.weight"):
        hf_convnext.convert_hf(extra, hf)


@pytest.mark.parametrize(
    ("field", "match"),
    [
        (dict(hidden_act="relu"), "hidden_act='relu'"),
        (dict(num_stages=3, depths=[1, 1, 1], hidden_sizes=[8, 16, 32]), "num_stages=3"),
        (dict(patch_size=[4, 2]), r"patch_size=\[4, 2\]"),
        (dict(architectures=["ConvNextBackbone"]), "ConvNextBackbone"),
        (dict(architectures=["ConvNextV2Backbone"]), "ConvNextV2Backbone is not supported"),
        (dict(model_type="bit"), "model_type='bit'"),
    ],
)
def test_refused_by_name(folders, field, match):
    _, folder = folders["classifier"]
    hf = {**json.loads((folder / "config.json").read_text()), **field}
    with pytest.raises(ValueError, match=match):
        hf_convnext.config_from_hf(hf, read_folder(folder).keys())


def test_grn_in_the_conv_mlp_layout_matches_timm():
    """The GRN on channels-first maps (timm's ConvNeXt V2 atto ... nano layout)."""
    torch.manual_seed(0)
    args = dict(depths=(1, 1, 1, 1), dims=(8, 16, 24, 32), conv_mlp=True, ls_init_value=None)
    ref = _randomize(timm.models.convnext.ConvNeXt(**args, use_grn=True, num_classes=3))
    config = ConvNeXtConfig(**args, use_grn=True, num_classes=3)
    ours = ConvNeXt(config, weight_init=False)
    ours.load_state_dict(convert_timm_convnext(ref.state_dict(), config), strict=True)
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        assert_close(ours.eval()(x), ref(x), **TOL)


@pytest.mark.parametrize(
    ("config_cls", "model_cls"),
    [
        (transformers.ConvNextConfig, transformers.ConvNextForImageClassification),
        (transformers.ConvNextV2Config, transformers.ConvNextV2ForImageClassification),
    ],
)
def test_full_size_layout_on_meta(config_cls, model_cls):
    """ConvNeXt-T's real widths (facebook/convnext-tiny-224, convnextv2-tiny-1k-224): every
    tensor of transformers' model maps onto ours at its shape (meta device: no compute)."""
    hf = config_cls(num_labels=1000)
    with torch.device("meta"):
        sd = model_cls(hf).state_dict()
    assert len(hf_convnext.convert_hf(sd, hf.to_dict())) == len(sd)
