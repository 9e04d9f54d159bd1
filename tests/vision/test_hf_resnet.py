"""attn_vision.hf.resnet: transformers' ResNetModel / ResNetForImageClassification folders
(random init, ``save_pretrained``'s safetensors, or transformers 4's ``pytorch_model.bin``,
what older hub folders such as ``microsoft/resnet-50`` hold) -> our ResNet, logits and pooled
features at transformers' numbers."""

from __future__ import annotations

import json
from pathlib import Path

import attn_vision
import pytest
import torch
import transformers
from attn_core.hub import CheckpointError, WeightsError, read_folder
from attn_vision.hf import resnet as hf_resnet
from attn_vision.resnet import ResNet
from torch import nn
from torch.testing import assert_close

TOL = dict(atol=1e-4, rtol=1e-4)
# name -> (transformers config fields, class, safetensors?)
CASES = {
    # v1.5: the stride on the 3x3 (transformers' default, timm's)
    "bottleneck": (dict(layer_type="bottleneck", embedding_size=4, hidden_sizes=[16, 32, 64, 128],
                        depths=[1, 2, 1, 1], num_labels=7), "classify", True),
    # v1: the stride on the first 1x1
    "bottleneck_v1": (dict(layer_type="bottleneck", embedding_size=4,
                           hidden_sizes=[16, 32, 64, 128], depths=[2, 1, 1, 1],
                           downsample_in_bottleneck=True), "bare", True),
    "basic": (dict(layer_type="basic", embedding_size=8, hidden_sizes=[8, 16, 32, 64],
                   depths=[2, 1, 1, 1], num_labels=3), "classify", False),
}  # fmt: skip


@torch.no_grad()
def _randomize(model: nn.Module) -> nn.Module:
    """Non-default BatchNorm affine weights and running statistics."""
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.weight.copy_(torch.randn_like(m.weight) * 0.3 + 1.0)
            m.bias.copy_(torch.randn_like(m.bias) * 0.1)
            m.running_mean.copy_(torch.randn_like(m.running_mean) * 0.1)
            m.running_var.copy_(torch.rand_like(m.running_var) + 0.5)
    return model.eval()


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, tuple[nn.Module, Path]]:
    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("hf_resnet")
    out = {}
    for name, (fields, kind, safe) in CASES.items():
        cls = transformers.ResNetForImageClassification if kind == "classify" else None
        model = (cls or transformers.ResNetModel)(transformers.ResNetConfig(**fields))
        model = _randomize(model)
        if safe:
            model.save_pretrained(root / name)
        else:  # transformers 4's save_pretrained(safe_serialization=False); 5 writes safetensors
            model.config.save_pretrained(root / name)
            torch.save(model.state_dict(), root / name / "pytorch_model.bin")
        out[name] = model, root / name
    return out


def _hf(folder: Path) -> dict:
    return json.loads((folder / "config.json").read_text())


def _ours(folder: Path) -> ResNet:
    hf, sd = _hf(folder), read_folder(folder)
    family, config = hf_resnet.config_from_hf(hf, sd.keys())
    assert family == "resnet"
    model = ResNet(config, weight_init=False)
    model.load_state_dict(hf_resnet.convert_hf(sd, hf, config), strict=True)
    return model.eval()


@pytest.mark.parametrize("name", list(CASES))
def test_parity(folders, name):
    ref, folder = folders[name]
    weights = "model.safetensors" if CASES[name][2] else "pytorch_model.bin"
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", weights]
    ours = _ours(folder)
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        base = getattr(ref, "resnet", ref)(pixel_values=x)
        feats = ours.forward_features(x)
        assert_close(feats, base.last_hidden_state, **TOL)
        pooled = ours.forward_head(feats, pre_logits=True)
        assert_close(pooled, base.pooler_output.flatten(1), **TOL)
        if ref is base or not hasattr(ref, "classifier"):
            assert ours.config.num_classes == 0
            assert_close(ours(x), pooled)
        else:
            assert ours.config.num_classes == CASES[name][0]["num_labels"]
            assert_close(ours(x), ref(pixel_values=x).logits, **TOL)
    assert ours.config.stride_in_1x1 == (name == "bottleneck_v1")


@pytest.mark.parametrize("name", ["bottleneck", "basic"])
def test_create_model_from_the_folder(folders, name, tmp_path):
    """``attn_vision.create_model(folder)`` (safetensors or pytorch_model.bin): transformers'
    logits, id2label as the class names; ``save_pretrained`` of it loads back exactly."""
    ref, folder = folders[name]
    model = attn_vision.create_model(folder)
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        assert_close(model(x), ref(pixel_values=x).logits, **TOL)
        labels = [ref.config.id2label[i] for i in range(ref.config.num_labels)]
        assert list(model.pretrained_cfg["label_names"]) == labels
        attn_vision.save_pretrained(model, tmp_path / "ours")
        assert_close(attn_vision.create_model(tmp_path / "ours")(x), model(x), atol=0, rtol=0)


def test_convert_reads_the_config_and_is_strict(folders):
    _, folder = folders["bottleneck"]
    hf, sd = _hf(folder), read_folder(folder)
    assert hf_resnet.convert_hf(sd, hf).keys() == _ours(folder).state_dict().keys()
    key = "resnet.encoder.stages.1.layers.1.layer.2.normalization.running_var"
    missing = {k: v for k, v in sd.items() if k != key}
    with pytest.raises(CheckpointError, match=r"missing keys \(1\): layer2\.1\.bn3\.running_var"):
        hf_resnet.convert_hf(missing, hf)
    extra = dict(sd, **{"resnet.pooler.weight": torch.ones(1)})
    with pytest.raises(CheckpointError, match=r"unexpected keys \(1\): pooler\.weight"):
        hf_resnet.convert_hf(extra, hf)


class _Payload:
    """Unpickling calls ``open(marker, "w")``: the marker exists iff the code ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_hostile_pickle_is_refused_without_running(folders, tmp_path):
    _, folder = folders["basic"]
    marker = tmp_path / "payload-ran.marker"
    (tmp_path / "config.json").write_text((folder / "config.json").read_text())
    torch.save({"classifier.1.weight": _Payload(marker)}, tmp_path / "pytorch_model.bin")
    for load in (read_folder, attn_vision.create_model):
        with pytest.raises(WeightsError):
            load(tmp_path)
    assert not marker.exists(), "the pickle's code ran"


@pytest.mark.parametrize(
    ("field", "match"),
    [
        (dict(hidden_act="gelu"), "hidden_act='gelu'"),
        (dict(downsample_in_first_stage=True), "downsample_in_first_stage=True"),
        (dict(layer_type="preact"), "layer_type='preact'"),
        (dict(embedding_size=8), r"hidden_sizes=\[16, 32, 64, 128\] with embedding_size=8"),
        (dict(depths=[1, 1, 1]), r"depths=\[1, 1, 1\]"),
        (dict(architectures=["ResNetBackbone"]), "ResNetBackbone is not supported"),
        (dict(model_type="regnet"), "model_type='regnet'"),
    ],
)
def test_refused_by_name(folders, field, match):
    _, folder = folders["bottleneck"]
    with pytest.raises(ValueError, match=match):
        hf_resnet.config_from_hf({**_hf(folder), **field}, read_folder(folder).keys())


@pytest.mark.parametrize(
    "fields",
    [{}, dict(layer_type="basic", hidden_sizes=[64, 128, 256, 512], depths=[2, 2, 2, 2])],
    ids=["resnet-50", "resnet-18"],
)
def test_full_size_layout_on_meta(fields):
    """microsoft/resnet-50's and resnet-18's real configs: every tensor of transformers'
    model maps onto ours at its shape (meta device: no compute)."""
    hf = transformers.ResNetConfig(**fields, num_labels=1000)
    with torch.device("meta"):
        sd = transformers.ResNetForImageClassification(hf).state_dict()
    assert len(hf_resnet.convert_hf(sd, hf.to_dict())) == len(sd)
