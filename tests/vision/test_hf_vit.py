"""attn_vision.hf.vit: transformers' ViT / DeiT / DINOv2 folders (random init, written by
``save_pretrained``: safetensors; one as ``pytorch_model.bin``) -> ``create_model(folder)``,
logits and pooled features at transformers' numbers, at the config's image size and at a
smaller, non-square one (the position embedding resampled as transformers does)."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import attn_vision
import pytest
import torch
import transformers as T
from attn_core.hub import CheckpointError, UnsafeCheckpointError, WeightsUnavailableError
from attn_vision.hf import coverage_report, main
from attn_vision.hf.vit import Dinov2LinearClassifier, convert_hf
from safetensors.torch import load_file, save_file
from torch import nn
from torch.testing import assert_close

TOL = dict(atol=1e-4, rtol=1e-4)
SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, image_size=42,
             patch_size=14)  # fmt: skip
VIT = dict(SMALL, intermediate_size=64, patch_size=14)
# name -> (model class, config class, config fields, model kwargs)
CASES = {
    "vit_model": (T.ViTModel, T.ViTConfig, dict(VIT, pooler_output_size=24), {}),
    "vit_model_no_pooler": (T.ViTModel, T.ViTConfig, VIT, dict(add_pooling_layer=False)),
    "vit_classifier": (T.ViTForImageClassification, T.ViTConfig,
                       dict(VIT, num_labels=5, hidden_act="gelu_new"), {}),
    "deit_teacher": (T.DeiTForImageClassificationWithTeacher, T.DeiTConfig,
                     dict(VIT, num_labels=4), {}),
    "deit_model_no_pooler": (T.DeiTModel, T.DeiTConfig, VIT, dict(add_pooling_layer=False)),
    "dinov2": (T.Dinov2Model, T.Dinov2Config, dict(SMALL, layerscale_value=0.5), {}),
    "dinov2_giant": (T.Dinov2Model, T.Dinov2Config, dict(SMALL, use_swiglu_ffn=True), {}),
    "dinov2_classifier": (T.Dinov2ForImageClassification, T.Dinov2Config,
                          dict(SMALL, num_labels=3), {}),
    "dinov2_registers": (T.Dinov2WithRegistersModel, T.Dinov2WithRegistersConfig,
                         dict(SMALL, num_register_tokens=2), {}),
    "dinov2_registers_classifier": (T.Dinov2WithRegistersForImageClassification,
                                    T.Dinov2WithRegistersConfig,
                                    dict(SMALL, num_register_tokens=3, num_labels=2), {}),
}  # fmt: skip
BIN = "vit_classifier"  # written as pytorch_model.bin (transformers 5's own state dict names)
SECOND_SIZE = (28, 42)  # a 2 x 3 grid from the 3 x 3 one: resampled, downsampled in height


@torch.no_grad()
def _randomize(model: nn.Module) -> nn.Module:
    """Every tensor drawn afresh and large enough to matter (position embeddings, tokens,
    layer scales, norms), so a swapped, dropped or mis-resampled tensor shows."""
    for name, p in model.named_parameters():
        if name.endswith(("position_embeddings", "cls_token", "register_tokens", "token")):
            p.normal_(0.0, 1.0)
        elif p.ndim >= 2:
            p.normal_(0.0, 0.2)
        elif "norm" in name and name.endswith("weight"):
            p.normal_(1.0, 0.2)
        else:
            p.normal_(0.0, 0.3)
    return model.eval()


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, tuple[nn.Module, Path]]:
    root = tmp_path_factory.mktemp("hf_vit")
    out = {}
    for name, (model_cls, config_cls, fields, kwargs) in CASES.items():
        torch.manual_seed(len(out))
        config = config_cls(**fields)
        if "num_labels" in fields:
            config.id2label = {i: f"label {i}" for i in range(fields["num_labels"])}
            config.label2id = {v: k for k, v in config.id2label.items()}
        model = _randomize(model_cls(config, **kwargs))
        folder = root / name
        if name == BIN:
            model.config.save_pretrained(folder)
            torch.save(model.state_dict(), folder / "pytorch_model.bin")
        else:
            model.save_pretrained(folder)
        out[name] = (model, folder)
    return out


@torch.no_grad()
def _reference(name: str, model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """transformers' logits, else its pooled output ([CLS] for a ViTModel without pooler;
    a distilled ViT's pooled features are the mean of [CLS] and [DIST], as timm's)."""
    kwargs = {"interpolate_pos_encoding": True} if name.startswith(("vit", "deit")) else {}
    out = model(pixel_values=x, **kwargs)
    if hasattr(out, "logits"):
        return out.logits
    if name.startswith("deit"):
        return out.last_hidden_state[:, :2].mean(dim=1)
    return out.last_hidden_state[:, 0] if out.pooler_output is None else out.pooler_output


@pytest.mark.parametrize("name", list(CASES))
def test_parity_with_transformers(folders, name):
    model, folder = folders[name]
    ours = attn_vision.create_model(folder)
    assert not ours.training
    for size in ((42, 42), SECOND_SIZE):
        x = torch.randn(2, 3, *size)
        with torch.no_grad():
            assert_close(ours(x), _reference(name, model, x), **TOL)
            if "classifier" not in name and "teacher" not in name:  # every token, in order
                kwargs = {"interpolate_pos_encoding": True} if "dinov2" not in name else {}
                hidden = model(pixel_values=x, **kwargs).last_hidden_state
                assert_close(ours.forward_features(x), hidden, **TOL)


def test_position_embedding_resampling_is_transformers_own(folders):
    """At the second size, the other antialiasing choice misses transformers' numbers: the
    config switch is what the parity above depends on (for both DINOv2 variants)."""
    x = torch.randn(1, 3, *SECOND_SIZE)
    for name, antialias in (("dinov2", False), ("dinov2_registers", True)):
        model, folder = folders[name]
        ours = attn_vision.create_model(folder)
        assert ours.config.pos_embed_antialias is antialias
        ours.config.pos_embed_antialias = not antialias
        with torch.no_grad():
            gap = (ours(x) - _reference(name, model, x)).abs().max()
        assert gap > 1e-2, name


def test_configs_read_from_config_json(folders):
    assert type(attn_vision.create_model(folders["dinov2_classifier"][1])) is Dinov2LinearClassifier
    vit = attn_vision.create_model(folders["vit_model"][1])
    assert (vit.config.norm_eps, vit.config.representation_size, vit.num_classes) == (1e-12, 24, 0)
    linear = attn_vision.create_model(folders["dinov2_classifier"][1])
    for model, width in ((vit, 24), (linear, 64)):
        model.reset_classifier(7)  # (fine-tuning) a head over the pooler / [CLS] + patch mean
        assert (model.head.in_features, model(torch.randn(1, 3, 42, 42)).shape) == (width, (1, 7))
    assert attn_vision.create_model(folders["vit_classifier"][1]).config.act == "gelu_tanh"
    giant = attn_vision.create_model(folders["dinov2_giant"][1]).config
    # transformers: 2/3 of 4 x 32 = 85, rounded up to a multiple of 8
    assert (giant.act, giant.mlp_gate_last, int(32 * giant.mlp_ratio)) == ("swiglu", False, 88)
    registers = attn_vision.create_model(folders["dinov2_registers"][1]).config
    assert (registers.reg_tokens, registers.no_embed_class, registers.init_values) == (2, True, 1.0)


def test_labels_and_preprocessing_defaults(folders):
    model = attn_vision.create_model(folders["deit_teacher"][1])
    assert model.pretrained_cfg["label_names"] == tuple(f"label {i}" for i in range(4))
    assert model.pretrained_cfg["input_size"] == (3, 42, 42)  # no preprocessor_config.json
    assert "label_names" not in attn_vision.create_model(folders["dinov2"][1]).pretrained_cfg


@pytest.mark.parametrize("name", ["vit_model", "dinov2_classifier", "deit_teacher"])
def test_save_pretrained_loads_back_exactly(folders, tmp_path, name):
    ours = attn_vision.create_model(folders[name][1])
    ours.pretrained_cfg.update(input_size=(3, 28, 28), processor_size=True, crop_offset="floor")
    again = attn_vision.create_model(attn_vision.save_pretrained(ours, tmp_path / "saved"))
    assert type(again) is type(ours) and again.config == ours.config
    assert again.pretrained_cfg == ours.pretrained_cfg
    x = torch.randn(2, 3, 42, 42)
    with torch.no_grad():
        assert torch.equal(again(x), ours(x))


class _Marker:
    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (str(self.path), "w"))


def test_hostile_pickle_is_refused_without_running(folders, tmp_path):
    folder = tmp_path / "evil"
    folders["vit_classifier"][0].config.save_pretrained(folder)
    marker = tmp_path / "ran.marker"
    with open(folder / "pytorch_model.bin", "wb") as f:
        pickle.dump({"embeddings.cls_token": _Marker(marker)}, f, protocol=2)
    with pytest.raises(UnsafeCheckpointError, match="refusing"):
        attn_vision.create_model(folder)
    assert not marker.exists()


def _copy(folder: Path, tmp_path: Path, **config_changes) -> Path:
    out = tmp_path / "copy"
    out.mkdir()
    cfg = json.loads((folder / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**cfg, **config_changes}))
    (out / "model.safetensors").write_bytes((folder / "model.safetensors").read_bytes())
    return out


@pytest.mark.parametrize(
    "name, changes, match",
    [
        ("vit_model", dict(pooler_act="relu"), "pooler_act='relu'"),
        ("vit_model", dict(hidden_act="gelu_10"), "hidden_act='gelu_10'"),
        ("vit_model", dict(patch_size=[14, 7]), "patch_size"),
        ("vit_model", dict(architectures=["ViTForMaskedImageModeling"]), "masked-image"),
        ("deit_teacher", dict(model_type="beit_3"), "model_type='beit_3'"),
    ],
)
def test_unsupported_fields_are_refused_by_name(folders, tmp_path, name, changes, match):
    with pytest.raises(ValueError, match=match):
        attn_vision.create_model(_copy(folders[name][1], tmp_path, **changes))


def test_deit_one_head_classifier_refused(tmp_path):
    config = T.DeiTConfig(**VIT, num_labels=2)
    T.DeiTForImageClassification(config).save_pretrained(tmp_path / "deit")
    with pytest.raises(ValueError, match="DeiTForImageClassification is not supported"):
        attn_vision.create_model(tmp_path / "deit")


def test_missing_and_unexpected_keys_are_named(folders, tmp_path):
    folder = _copy(folders["dinov2"][1], tmp_path)
    sd = load_file(str(folder / "model.safetensors"))
    del sd["encoder.layer.1.norm2.bias"]
    sd["encoder.layer.0.extra.weight"] = torch.zeros(1)
    save_file(sd, str(folder / "model.safetensors"))
    pattern = r"(?s)missing keys.*blocks\.1\.norm2\.bias.*unexpected keys.*layer\.0\.extra"
    with pytest.raises(CheckpointError, match=pattern):
        attn_vision.create_model(folder)


def test_hf_hub_offline_names_the_cache(tmp_path):
    with pytest.raises(WeightsUnavailableError) as err:
        attn_vision.create_model(
            "hf-hub:google/vit-base-patch16-224", cache_dir=tmp_path, local_files_only=True
        )
    assert "google/vit-base-patch16-224" in str(err.value) and str(tmp_path) in str(err.value)


def test_hf_hub_from_the_cache(folders, tmp_path, fake_hub_cache):
    model, folder = folders["dinov2_classifier"]
    files = {p.name: p.read_bytes() for p in folder.iterdir()}
    processor = dict(image_processor_type="BitImageProcessor", size={"shortest_edge": 32},
                     crop_size={"height": 28, "width": 28}, do_center_crop=True, resample=3,
                     image_mean=[0.485, 0.456, 0.406], image_std=[0.229, 0.224, 0.225])  # fmt: skip
    files["preprocessor_config.json"] = json.dumps(processor).encode()
    fake_hub_cache(tmp_path / "hub", "facebook/dinov2-tiny-test", files)
    ours = attn_vision.create_model(
        "hf-hub:facebook/dinov2-tiny-test", cache_dir=tmp_path / "hub", local_files_only=True
    )
    x = torch.randn(1, 3, 28, 28)
    with torch.no_grad():
        assert_close(ours(x), model(pixel_values=x).logits, **TOL)
    cfg = ours.pretrained_cfg
    assert (cfg["input_size"], cfg["crop_mode"], cfg["interpolation"]) == ((3, 28, 28), "center",
                                                                           "bicubic")  # fmt: skip


def test_coverage_command(capsys):
    assert main(["--coverage"]) == 0
    out = capsys.readouterr().out
    assert out.strip() == coverage_report()
    assert "loads   dinov2_with_registers: Dinov2WithRegistersModel" in out
    assert "refused DeiTForImageClassification: one head on [CLS]" in out
    docs = (Path(__file__).resolve().parents[2] / "docs" / "vision.md").read_text()
    for line in out.splitlines():  # docs/vision.md shows the command's output
        assert line in docs, f"docs/vision.md does not show the coverage line {line!r}"


def test_hf_hub_sharded_from_the_cache(folders, tmp_path, fake_hub_cache):
    model = folders["dinov2"][0]
    model.save_pretrained(tmp_path / "sharded", max_shard_size="20KB")
    files = {p.name: p.read_bytes() for p in (tmp_path / "sharded").iterdir()}
    assert "model.safetensors.index.json" in files and len(files) > 3
    fake_hub_cache(tmp_path / "hub", "facebook/dinov2-sharded-test", files)
    ours = attn_vision.create_model(
        "hf-hub:facebook/dinov2-sharded-test", cache_dir=tmp_path / "hub", local_files_only=True
    )
    x = torch.randn(1, 3, 42, 42)
    with torch.no_grad():
        assert_close(ours(x), model(pixel_values=x).pooler_output, **TOL)
    index = json.loads(files["model.safetensors.index.json"])
    index["weight_map"]["embeddings.cls_token"] = "../../evil.safetensors"
    files["model.safetensors.index.json"] = json.dumps(index).encode()
    fake_hub_cache(tmp_path / "hub2", "evil/dinov2", files)
    with pytest.raises(UnsafeCheckpointError, match="evil.safetensors"):
        attn_vision.create_model("hf-hub:evil/dinov2", cache_dir=tmp_path / "hub2")


@pytest.mark.parametrize("name", list(CASES))
def test_in_memory_names_convert_alike(folders, name):
    """transformers 5's in-memory state dict (``layers.{i}.attention.q_proj``, SwiGLU's
    ``gate_proj`` / ``up_proj``, ...) converts to the tensors its safetensors file does."""
    model, folder = folders[name]
    hf = json.loads((folder / "config.json").read_text())
    ours = convert_hf(model.state_dict(), hf)
    if name != BIN:
        from_file = convert_hf(load_file(str(folder / "model.safetensors")), hf)
        assert ours.keys() == from_file.keys()
        assert all(torch.equal(ours[k], from_file[k]) for k in ours)
    else:
        assert ours.keys() == attn_vision.create_model(folder).state_dict().keys()


def test_a_missing_projection_is_named(folders):
    model, folder = folders["dinov2_giant"]
    sd = load_file(str(folder / "model.safetensors"))
    hf = json.loads((folder / "config.json").read_text())
    del sd["encoder.layer.0.mlp.weights_in.bias"]
    with pytest.raises(CheckpointError, match=r"(?s)missing keys.*blocks\.0\.mlp\.fc1\.bias"):
        convert_hf(sd, hf)
    del sd["encoder.layer.1.attention.attention.key.bias"]
    with pytest.raises(CheckpointError, match=r"encoder\.layer\.1\.attention\.attention\.key"):
        convert_hf(sd, hf)
    sd = model.state_dict()
    del sd["encoder.layer.1.mlp.up_proj.weight"]
    with pytest.raises(CheckpointError, match=r"encoder\.layer\.1\.mlp\.up_proj\.weight"):
        convert_hf(sd, hf)


@pytest.mark.parametrize("name", ["vit_classifier", "dinov2_registers"])
def test_another_img_size_resamples_at_load(folders, name):
    """``create_model(folder, img_size=...)`` (finetune_vit.py --img-size) builds the model
    at that grid, the position embedding resampled once at load as for a timm checkpoint
    (bicubic, antialiased); the folder's own size resamples per forward as transformers."""
    from attn_vision.patch_embed import resample_abs_pos_embed

    folder = folders[name][1]
    own = attn_vision.create_model(folder)
    bigger = attn_vision.create_model(folder, img_size=56)
    prefix = 0 if own.config.no_embed_class else own.num_prefix_tokens
    assert bigger.config.grid_size == (4, 4) and bigger.pos_embed.shape[1] == prefix + 16
    expected = resample_abs_pos_embed(own.pos_embed, (4, 4), num_prefix_tokens=prefix)
    assert torch.equal(bigger.pos_embed, expected)
    others = {k: v for k, v in own.state_dict().items() if k != "pos_embed"}
    assert all(torch.equal(bigger.state_dict()[k], v) for k, v in others.items())
