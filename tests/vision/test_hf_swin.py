"""transformers' Swin folders (``save_pretrained``: config.json + model.safetensors) ->
attn_vision's SwinTransformer: logits, pooled features and the final map match
transformers' at 1e-4; the strict converter and the refused config fields."""

from __future__ import annotations

import json
from pathlib import Path

import attn_vision
import pytest
import skimage.data
import torch
from attn_core.hub import CheckpointError
from attn_vision.hf.swin import config_from_hf, convert_hf
from attn_vision.swin import SwinTransformer
from PIL import Image
from safetensors.torch import load_file, save_file

transformers = pytest.importorskip("transformers")

TOL = dict(atol=1e-4, rtol=1e-4)
# 112 px / patch 4: stages of 28, 14 (shifted windows, merged twice) and 7 (one window)
TINY = dict(image_size=112, patch_size=4, embed_dim=16, depths=[2, 2, 1], num_heads=[2, 2, 4],
            window_size=7, num_labels=5, drop_path_rate=0.3, hidden_dropout_prob=0.1)  # fmt: skip


def _folder(tmp_path: Path, randomize, cls_name: str, **overrides) -> tuple[torch.nn.Module, Path]:
    """A random-init transformers Swin (every tensor drawn, relative bias tables included),
    saved with ``save_pretrained``."""
    torch.manual_seed(0)
    config = transformers.SwinConfig(**{**TINY, **overrides})
    model = randomize(getattr(transformers, cls_name)(config), reinit=True).eval()
    with torch.no_grad():  # bias tables large enough that a swapped or dropped one shows
        for name, p in model.named_parameters():
            if name.endswith("relative_position_bias_table"):
                p.normal_(0.0, 1.0)
    model.save_pretrained(tmp_path)
    return model, tmp_path


def _load(folder: Path) -> tuple[SwinTransformer, dict, dict[str, torch.Tensor]]:
    hf = json.loads((folder / "config.json").read_text())
    sd = load_file(folder / "model.safetensors")
    family, config = config_from_hf(hf, sd.keys())
    assert family == "swin"
    model = SwinTransformer(config, weight_init=False)
    model.load_state_dict(convert_hf(sd, hf))
    return model.eval(), hf, sd


@torch.no_grad()
def test_classifier_logits_pooled_and_map_match_transformers(tmp_path, randomize):
    ref, folder = _folder(tmp_path, randomize, "SwinForImageClassification")
    ours, _, _ = _load(folder)
    assert ours.config.num_classes == 5 and ours.config.img_size == (112, 112)
    x = torch.randn(2, 3, 112, 112)
    out = ref(x, output_hidden_states=True)
    base = ref.swin(x)
    feats = ours.forward_features(x)  # (B, H, W, C)
    torch.testing.assert_close(feats.flatten(1, 2), base.last_hidden_state, **TOL)
    torch.testing.assert_close(ours.forward_head(feats, pre_logits=True), base.pooler_output, **TOL)
    torch.testing.assert_close(ours(x), out.logits, **TOL)


@torch.no_grad()
def test_bare_model_without_qkv_bias_and_in_memory_names(tmp_path, randomize):
    ref, folder = _folder(
        tmp_path, randomize, "SwinModel", qkv_bias=False, mlp_ratio=2.0, num_channels=1
    )
    ours, hf, _ = _load(folder)
    assert ours.config.num_classes == 0 and not ours.config.qkv_bias
    x = torch.randn(2, 1, 112, 112)
    torch.testing.assert_close(ours(x), ref(x).pooler_output, **TOL)
    # transformers 5's in-memory names (model.state_dict(): attention.q_proj, mlp.fc1, ...)
    memory = ref.state_dict()
    assert any(".attention.q_proj." in k for k in memory)
    _, config = config_from_hf(hf, memory.keys())
    again = SwinTransformer(config, weight_init=False)
    again.load_state_dict(convert_hf(memory, hf))
    torch.testing.assert_close(again.eval()(x), ref(x).pooler_output, **TOL)


@torch.no_grad()
def test_old_hub_layout_with_index_buffers(tmp_path, randomize):
    """Checkpoints on the hub saved by older transformers also store each block's
    ``relative_position_index``: dropped (the model rebuilds it), as transformers does."""
    ref, folder = _folder(tmp_path, randomize, "SwinForImageClassification")
    sd = load_file(folder / "model.safetensors")
    tables = [k for k in sd if k.endswith("relative_position_bias_table")]
    assert len(tables) == 5
    for k in tables:
        sd[k.replace("bias_table", "index")] = torch.zeros(49, 49, dtype=torch.long)
    save_file(sd, folder / "model.safetensors")
    ours, _, _ = _load(folder)
    x = torch.randn(1, 3, 112, 112)
    torch.testing.assert_close(ours(x), ref(x).logits, **TOL)


def test_strict_missing_unexpected_and_partial_qkv(tmp_path, randomize):
    _, folder = _folder(tmp_path, randomize, "SwinForImageClassification")
    hf = json.loads((folder / "config.json").read_text())
    sd = load_file(folder / "model.safetensors")
    _, config = config_from_hf(hf, sd.keys())
    broken = dict(sd)
    del broken["swin.encoder.layers.0.downsample.norm.weight"]
    broken["swin.encoder.layers.2.downsample.norm.weight"] = torch.ones(64)
    with pytest.raises(CheckpointError, match=r"layers\.1\.downsample\.norm\.weight") as err:
        convert_hf(broken, hf)
    assert "unexpected keys (1): layers.3.downsample.norm.weight" in str(err.value)
    del sd["swin.encoder.layers.1.blocks.0.attention.self.key.bias"]
    with pytest.raises(CheckpointError, match=r"layers\.1\.blocks\.0 has no attention k bias"):
        convert_hf(sd, hf)


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(hidden_act="relu"), "hidden_act='relu'"),
        (dict(layer_norm_eps=1e-6), "layer_norm_eps=1e-06"),
        (dict(use_absolute_embeddings=True), "use_absolute_embeddings=True"),
        (dict(architectures=["SwinForMaskedImageModeling"]), "SwinForMaskedImageModeling"),
        (dict(architectures=["SwinBackbone"]), "SwinBackbone"),
        (dict(image_size=56, depths=[2, 2, 2]), "stage 2's 4x4 feature map is smaller"),
        (dict(image_size=64), r"stage 0's 16x16 feature map is not divisible by window_size=7"),
        (dict(image_size=[56, 112], depths=[2, 2]), "stage 1's 7x14 feature map is non-square"),
        (dict(image_size=114), "image_size=.114, 114. is not divisible by patch_size=4"),
        (dict(patch_size=[4, 2]), "patch_size=.4, 2. is not supported"),
        (dict(model_type="swinv2"), "model_type='swinv2'"),
    ],
)
def test_refused_fields_are_named(fields, message):
    hf = transformers.SwinConfig(**TINY).to_dict()
    hf.update(fields)
    with pytest.raises(ValueError, match=message):
        config_from_hf(hf, ["classifier.weight"])


@torch.no_grad()
def test_create_model_folder_labels_and_save_pretrained_round_trip(tmp_path, randomize):
    ref, folder = _folder(tmp_path / "hf", randomize, "SwinForImageClassification",
                          id2label={i: f"class {i}" for i in range(5)})  # fmt: skip
    processor = transformers.ViTImageProcessorPil(size=112, resample=3)
    processor.save_pretrained(folder)  # the folder as on the hub: + preprocessor_config.json
    model = attn_vision.create_model(folder).eval()
    photo = Image.fromarray(skimage.data.astronaut())
    torch.testing.assert_close(
        attn_vision.create_transform(model)(photo)[None],
        processor(photo, return_tensors="pt").pixel_values,
        atol=1e-5,
        rtol=0.0,
    )
    assert isinstance(model, SwinTransformer)
    assert model.pretrained_cfg["label_names"] == tuple(f"class {i}" for i in range(5))
    x = torch.randn(2, 3, 112, 112)
    torch.testing.assert_close(model(x), ref(x).logits, **TOL)
    back = attn_vision.create_model(attn_vision.save_pretrained(model, tmp_path / "ours")).eval()
    torch.testing.assert_close(back(x), model(x), atol=0.0, rtol=0.0)


@pytest.mark.parametrize(
    "fields",
    [
        {},  # SwinConfig()'s defaults: microsoft/swin-tiny-patch4-window7-224
        dict(image_size=384, embed_dim=128, depths=[2, 2, 18, 2], num_heads=[4, 8, 16, 32],
             window_size=12, num_labels=21841),  # microsoft/swin-base-patch4-window12-384-in22k
    ],
)  # fmt: skip
def test_full_size_layouts_convert(fields):
    """The hub's full-size layouts, on ``meta`` (shapes only): every key used, every
    shape ours."""
    config = transformers.SwinConfig(**fields)
    with torch.device("meta"):
        ref = transformers.SwinForImageClassification(config)
    hf = config.to_dict()
    _, ours = config_from_hf(hf, ref.state_dict().keys())
    converted = convert_hf(ref.state_dict(), hf)
    assert len(converted) == len(ref.state_dict()) - 2 * sum(ours.depths) * 2  # q/k/v fused
    assert converted["head.weight"].shape == (config.num_labels, ours.stage_dims[-1])
