"""transformers' BEiT / data2vec-vision folders (``save_pretrained``: config.json +
model.safetensors) -> attn_vision's ViT with BEiT's relative position bias: logits, pooled
features and the final tokens match transformers' at 1e-4 (at the config's image size and
at another one); the strict converter and the refused architectures."""

from __future__ import annotations

import json
from pathlib import Path

import attn_vision
import pytest
import skimage.data
import torch
from attn_core.hub import CheckpointError
from attn_vision.hf.beit import config_from_hf, convert_hf
from attn_vision.vit import VisionTransformer
from PIL import Image
from safetensors.torch import load_file, save_file

transformers = pytest.importorskip("transformers")

TOL = dict(atol=1e-4, rtol=1e-4)
# 32 px / patch 8: a 4 x 4 grid, [CLS] + 16 tokens
TINY = dict(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2,
            num_attention_heads=2, intermediate_size=48, num_labels=5, drop_path_rate=0.2,
            hidden_dropout_prob=0.1)  # fmt: skip


@torch.no_grad()
def _spread_(model: torch.nn.Module) -> None:
    """Make the BEiT-only tensors large enough to matter (the bias tables, layer scales,
    position embedding): a dropped, swapped or mis-shaped one changes the outputs."""
    for name, p in model.named_parameters():
        if "relative_position_bias_table" in name:
            p.normal_(0.0, 1.0)
        elif "lambda_" in name:
            p.normal_(1.0, 0.3)
        elif "position_embeddings" in name or "cls_token" in name:
            p.normal_(0.0, 0.5)


def _folder(
    tmp_path: Path, randomize, cls_name: str, pooling: bool = True, **overrides
) -> tuple[torch.nn.Module, Path]:
    """A random-init transformers model (every tensor drawn), saved with ``save_pretrained``."""
    torch.manual_seed(0)
    config_cls = "Data2VecVisionConfig" if "Data2Vec" in cls_name else "BeitConfig"
    config = getattr(transformers, config_cls)(**{**TINY, **overrides})
    cls = getattr(transformers, cls_name)
    model = cls(config) if pooling else cls(config, add_pooling_layer=False)
    model = randomize(model, reinit=True).eval()
    _spread_(model)
    model.save_pretrained(tmp_path)
    return model, tmp_path


def _load(folder: Path) -> tuple[VisionTransformer, dict]:
    hf = json.loads((folder / "config.json").read_text())
    sd = load_file(folder / "model.safetensors")
    family, config = config_from_hf(hf, sd.keys())
    assert family == "vit"
    model = VisionTransformer(config, weight_init=False)
    model.load_state_dict(convert_hf(sd, hf))
    return model.eval(), hf


def _base(ref: torch.nn.Module) -> torch.nn.Module:
    return getattr(ref, "beit", None) or getattr(ref, "data2vec_vision", ref)


@torch.no_grad()
def _check(ref: torch.nn.Module, ours: VisionTransformer, x: torch.Tensor) -> None:
    """Final tokens, pooled features and (for a classifier) logits; the fast path (no grad)
    and the plain modules (grad enabled) both."""
    base = _base(ref)(x)
    torch.testing.assert_close(ours.forward_features(x), base.last_hidden_state, **TOL)
    if base.pooler_output is not None:
        torch.testing.assert_close(ours.forward_pre_logits(x), base.pooler_output, **TOL)
    expected = ref(x).logits if hasattr(ref, "classifier") else base.pooler_output
    if expected is not None:
        torch.testing.assert_close(ours(x), expected, **TOL)
        with torch.enable_grad():
            torch.testing.assert_close(ours(x).detach(), expected, **TOL)


ALL_ON = dict(use_relative_position_bias=True, use_shared_relative_position_bias=True,
              use_absolute_position_embeddings=True, use_mask_token=True)  # fmt: skip


def test_classifier_every_bias_at_two_image_sizes(tmp_path, randomize):
    """Mean pooling + pooler layernorm, layer scale, per-block and shared bias tables and the
    absolute position embedding; at 32 px and at 48 px (transformers resamples the position
    embedding and the tables on every forward)."""
    ref, folder = _folder(tmp_path, randomize, "BeitForImageClassification", **ALL_ON)
    ours, _ = _load(folder)
    c = ours.config
    assert (c.rel_pos, c.pos_embed, c.global_pool, c.num_classes) == ("beit", "learn", "avg", 5)
    assert c.init_values == 0.1 and c.norm_eps == 1e-12 and c.mlp_ratio == 1.5
    _check(ref, ours, torch.randn(2, 3, 32, 32))
    _check(ref, ours, torch.randn(2, 3, 48, 48))


@pytest.mark.parametrize(
    "cls_name, fields",
    [
        # [CLS] after the final layernorm, no layer scale, tanh GELU, per-block tables only
        ("BeitModel", dict(use_mean_pooling=False, layer_scale_init_value=0.0,
                           hidden_act="gelu_new", use_relative_position_bias=True)),
        # only the shared table (BEiT's pretraining layout); then no relative bias at all
        ("BeitModel", dict(use_shared_relative_position_bias=True)),
        ("BeitModel", dict(use_absolute_position_embeddings=True)),
        ("Data2VecVisionForImageClassification", ALL_ON),
    ],
)  # fmt: skip
def test_variants_match_transformers(tmp_path, randomize, cls_name, fields):
    ref, folder = _folder(tmp_path, randomize, cls_name, **fields)
    ours, _ = _load(folder)
    assert ours.config.init_values == (None if "layer_scale_init_value" in fields else 0.1)
    _check(ref, ours, torch.randn(2, 3, 32, 32))


def test_model_without_pooler_and_in_memory_names(tmp_path, randomize):
    """A ``BeitModel(add_pooling_layer=False)`` with mean pooling has no norm at all after
    the blocks; transformers 5's in-memory names (``layers.{i}.attention.q_proj``,
    ``shared_position_bias``, ...) convert like the saved ones."""
    ref, folder = _folder(tmp_path, randomize, "BeitModel", pooling=False, **ALL_ON)
    ours, hf = _load(folder)
    assert not ours.config.final_norm
    x = torch.randn(2, 3, 32, 32)
    _check(ref, ours, x)
    memory = ref.state_dict()
    assert "shared_position_bias.relative_position_bias_table" in memory
    again = VisionTransformer(ours.config, weight_init=False)
    again.load_state_dict(convert_hf(memory, hf))
    _check(ref, again.eval(), x)


def test_old_hub_layout_with_index_buffers(tmp_path, randomize):
    """BEiT checkpoints on the hub saved by older transformers store each table's
    ``relative_position_index`` too: dropped (the model rebuilds it), as transformers does."""
    ref, folder = _folder(tmp_path, randomize, "BeitForImageClassification", **ALL_ON)
    sd = load_file(folder / "model.safetensors")
    tables = [k for k in sd if k.endswith("relative_position_bias_table")]
    assert len(tables) == 3
    for k in tables:
        sd[k.replace("bias_table", "index")] = torch.zeros(17, 17, dtype=torch.long)
    save_file(sd, folder / "model.safetensors")
    ours, _ = _load(folder)
    _check(ref, ours, torch.randn(1, 3, 32, 32))


def test_strict_missing_unexpected_and_key_bias(tmp_path, randomize):
    _, folder = _folder(tmp_path, randomize, "BeitForImageClassification", **ALL_ON)
    hf = json.loads((folder / "config.json").read_text())
    sd = load_file(folder / "model.safetensors")
    broken = dict(sd)
    del broken["beit.encoder.layer.1.lambda_2"]
    broken["beit.encoder.layer.1.attention.attention.key.bias"] = torch.zeros(32)
    broken["beit.encoder.layer.2.lambda_1"] = torch.ones(32)
    with pytest.raises(CheckpointError, match=r"missing keys \(1\): blocks\.1\.ls2\.gamma") as e:
        convert_hf(broken, hf)
    assert "unexpected keys (1): blocks.2.ls1.gamma" in str(e.value)
    del sd["beit.encoder.layer.0.attention.attention.value.bias"]
    with pytest.raises(CheckpointError, match="layer 0 has no attention value bias"):
        convert_hf(sd, hf)
    del sd["beit.encoder.relative_position_bias.relative_position_bias_table"]
    del sd[
        "beit.encoder.layer.0.attention.attention.relative_position_bias.relative_position_bias_table"
    ]  # noqa: E501
    sd["beit.encoder.layer.0.attention.attention.value.bias"] = torch.zeros(32)
    with pytest.raises(CheckpointError, match=r"blocks\.0\.attn\.rel_pos\.relative_position_b"):
        convert_hf(sd, hf)


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(architectures=["BeitForMaskedImageModeling"]), "BeitForMaskedImageModeling"),
        (dict(architectures=["BeitForSemanticSegmentation"]), "semantic-segmentation"),
        (dict(architectures=["BeitBackbone"]), "BeitBackbone"),
        (dict(hidden_act="mish"), "hidden_act='mish'"),
        (dict(head_dim=8), "head_dim=8"),
        (dict(patch_size=[8, 4]), r"patch_size=\[8, 4\]"),
        (dict(model_type="vit"), "model_type='vit'"),
    ],
)
def test_refused_fields_are_named(fields, message):
    hf = transformers.BeitConfig(**TINY).to_dict()
    hf.update(fields)
    with pytest.raises(ValueError, match=message):
        config_from_hf(hf, ["classifier.weight"])


@torch.no_grad()
def test_create_model_folder_labels_and_save_pretrained_round_trip(tmp_path, randomize):
    ref, folder = _folder(tmp_path / "hf", randomize, "BeitForImageClassification",
                          id2label={i: f"class {i}" for i in range(5)}, **ALL_ON)  # fmt: skip
    processor = transformers.BeitImageProcessorPil(
        size=32,
        crop_size=32,
        do_center_crop=False,
        image_mean=[0.5] * 3,
        image_std=[0.5] * 3,
        resample=2,
    )
    processor.save_pretrained(folder)  # the folder as on the hub: + preprocessor_config.json
    model = attn_vision.create_model(folder).eval()
    photo = Image.fromarray(skimage.data.astronaut())
    torch.testing.assert_close(
        attn_vision.create_transform(model)(photo)[None],
        processor(photo, return_tensors="pt").pixel_values,
        atol=1e-5,
        rtol=0.0,
    )
    assert isinstance(model, VisionTransformer) and model.config.rel_pos == "beit"
    assert model.pretrained_cfg["label_names"] == tuple(f"class {i}" for i in range(5))
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(model(x), ref(x).logits, **TOL)
    back = attn_vision.create_model(attn_vision.save_pretrained(model, tmp_path / "ours")).eval()
    torch.testing.assert_close(back(x), model(x), atol=0.0, rtol=0.0)


@pytest.mark.parametrize(
    "fields",
    [
        # microsoft/beit-base-patch16-224 (BeitConfig()'s widths)
        dict(use_relative_position_bias=True, num_labels=1000),
        # microsoft/beit-large-patch16-512
        dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
             intermediate_size=4096, image_size=512, use_relative_position_bias=True,
             num_labels=1000),
    ],
)  # fmt: skip
def test_full_size_layouts_convert(fields):
    """The hub's full-size layouts, on ``meta`` (shapes only): every key used, every
    shape ours."""
    config = transformers.BeitConfig(**fields)
    with torch.device("meta"):
        ref = transformers.BeitForImageClassification(config)
    hf = config.to_dict()
    _, ours = config_from_hf(hf, ref.state_dict().keys())
    converted = convert_hf(ref.state_dict(), hf)
    assert len(converted) == len(ref.state_dict()) - 3 * ours.depth  # 5 q/k/v tensors -> 2
    grid = ours.grid_size
    rows = (2 * grid[0] - 1) * (2 * grid[1] - 1) + 3
    table = converted[f"blocks.{ours.depth - 1}.attn.rel_pos.relative_position_bias_table"]
    assert table.shape == (rows, ours.num_heads)


def test_zero_key_bias_gets_no_gradient(tmp_path, randomize):
    """The fused qkv's key bias (BEiT has none) adds a constant to each row of scores:
    its gradient is zero, so fine-tuning leaves it at zero."""
    _, folder = _folder(tmp_path, randomize, "BeitForImageClassification", **ALL_ON)
    ours, _ = _load(folder)
    ours(torch.randn(2, 3, 32, 32)).square().sum().backward()
    D = ours.config.embed_dim
    for blk in ours.blocks:
        grad = blk.attn.qkv.bias.grad
        q, k, v = (grad[i * D : (i + 1) * D].abs().max().item() for i in range(3))
        assert k < 1e-4 * min(q, v), (q, k, v)
