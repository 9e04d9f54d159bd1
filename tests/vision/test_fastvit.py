"""FastViT / MCi and the MCi ViT: timm parity unfolded and folded (reparameterized), timm's
reparameterized checkpoints, folded save / reload, the layout of every timm fastvit_* name,
the registry presets against timm's entrypoints, strict loading."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import pytest
import timm
import torch
from attn_core import fast_inference, onednn
from attn_core.hub import CheckpointError
from attn_vision import create_model, get_model_config, list_models, save_pretrained
from attn_vision.convert import apple_fastvit_to_timm, convert_timm_fastvit
from attn_vision.fastvit import FastVit, FastVitConfig, LayerScale2d
from attn_vision.pretrained import get_pretrained_cfg
from attn_vision.registry import timm_model_config
from attn_vision.timm_table import _record, timm_fastvit_args
from attn_vision.vit_mci import MciVisionTransformer, MciViTConfig
from safetensors.torch import save_file
from timm.models import fastvit as timm_fastvit
from timm.models import vision_transformer_hybrid
from timm.utils import reparameterize_model
from torch import nn

FUSED_TOL = dict(atol=1e-5, rtol=1e-5)  # folded vs unfolded, fp32
NAMES = [
    f"fastvit_{s}" for s in ("t8 t12 s12 sa12 sa24 sa36 ma36 mci0 mci1 mci2 mci3 mci4").split()
]
# one block per stage; together every block type: RepMixer only (t8), BatchNorm attention +
# RepCPE (sa12), SE downsampling + large-kernel GELU (mci0) at timm's widths, LayerNorm2d
# attention, 5 stages, no stem scale branches (mci3: narrower, at 128 px so that its last
# stage attends over more than one position)
PARITY = {
    "fastvit_t8": {},
    "fastvit_sa12": {},
    "fastvit_mci0": {},
    "fastvit_mci3": dict(embed_dims=(32, 64, 128, 128, 256)),
}


def _shrunk(name: str) -> tuple[int, ...]:
    return (1,) * len(get_model_config(name).layers)


@torch.no_grad()
def _randomize(model: nn.Module) -> nn.Module:
    """Every BatchNorm's statistics and affine parameters, LayerNorm and layer scale drawn
    away from their defaults (so that folding them is not an identity), weights perturbed."""
    torch.manual_seed(0)
    for p in model.parameters():
        p.add_(torch.randn_like(p) * 0.02)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.weight.uniform_(0.5, 1.5)
            m.bias.normal_(0.0, 0.2)
            m.running_mean.normal_(0.0, 0.2)
            m.running_var.uniform_(0.5, 2.0)
        elif isinstance(m, nn.LayerNorm):
            m.weight.uniform_(0.5, 1.5)
            m.bias.normal_(0.0, 0.2)
    for name, p in model.named_parameters():
        if name.endswith("gamma"):  # layer scales (init 1e-5: the blocks would not count)
            p.uniform_(0.2, 1.0)
    return model.eval()


def _save(model: nn.Module, path: Path) -> Path:
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    return path


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """One intra-op thread: these convolutions are small, and on a busy 2-core machine two
    threads spend most of the time waiting on each other."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def x() -> torch.Tensor:
    return torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("name", PARITY)
@torch.no_grad()
def test_unfolded_and_folded_match_timm(name, x, tmp_path, assert_parity):
    args = dict(layers=_shrunk(name), num_classes=5, **PARITY[name])
    if name == "fastvit_mci3":
        x = torch.randn(1, 3, 128, 128, generator=torch.Generator().manual_seed(2))
    ref = _randomize(timm.create_model(name, **args))
    ours = create_model(name, pretrained=_save(ref, tmp_path / "model.safetensors"), **args)
    assert type(ours) is FastVit and not ours.config.inference_mode
    assert_parity(ref, ours, x)  # features, head, logits at 1e-4 (our fast path on)
    pooled = ours.forward_head(ours.forward_features(x), pre_logits=True)
    torch.testing.assert_close(pooled, ref.forward_head(ref.forward_features(x), pre_logits=True))

    folded = copy.deepcopy(ours).reparameterize()
    assert folded.config.inference_mode
    leftovers = [n for n, m in folded.named_modules()
                 if isinstance(m, nn.BatchNorm2d | LayerScale2d)]  # fmt: skip
    assert not leftovers
    torch.testing.assert_close(folded.forward_features(x), ours.forward_features(x), **FUSED_TOL)
    torch.testing.assert_close(folded(x), ours(x), **FUSED_TOL)
    with fast_inference.disabled(ours):  # the plain modules (no BatchNorm folded on the fly)
        torch.testing.assert_close(folded(x), ours(x), **FUSED_TOL)

    # timm's reparameterized model: the same outputs; its state dict loads into a folded model
    ref_folded = reparameterize_model(ref)
    torch.testing.assert_close(folded.forward_features(x), ref_folded.forward_features(x),
                               **FUSED_TOL)  # fmt: skip
    timm_path = _save(ref_folded, tmp_path / "reparameterized.safetensors")
    loaded = create_model(name, pretrained=timm_path, inference_mode=True, **args)
    torch.testing.assert_close(loaded(x), ref_folded(x), **FUSED_TOL)
    assert loaded.state_dict().keys() == folded.state_dict().keys()
    if name != "fastvit_mci0":
        return  # (once is enough:) a folded model saves and loads back folded
    back = create_model(save_pretrained(folded, tmp_path / "saved"))
    assert type(back) is FastVit and back.config == folded.config and back.config.inference_mode
    assert all(torch.equal(back.state_dict()[k], v) for k, v in folded.state_dict().items())
    assert torch.equal(back(x), folded(x))


@pytest.mark.parametrize("layout", [True, False], ids=["channels_last", "nchw"])
@torch.no_grad()
def test_fast_path_both_layouts_equal_the_plain_modules(layout, x, monkeypatch):
    """The fast path in channels-last memory (the ConvMlps' 1x1 convs as products over the
    pixels; AVX-512's default) and in NCHW (AVX2's), unfolded and folded, vs the plain
    modules; attention, SE downsampling and a RepCPE included (MCi0, one block a stage)."""
    monkeypatch.setattr(onednn, "CHANNELS_LAST_CONVS", layout)
    monkeypatch.setattr(onednn, "_MKL_ROWS", None if layout else 1024)
    ours = _randomize(create_model("fastvit_mci0", layers=_shrunk("fastvit_mci0"), num_classes=5))
    folded = copy.deepcopy(ours).reparameterize()
    with fast_inference.disabled(ours):
        expected = ours(x)
    seen = []
    hook = folded.final_conv.register_forward_hook(lambda m, i, out: seen.append(out))
    torch.testing.assert_close(folded(x), expected, **FUSED_TOL)
    torch.testing.assert_close(ours(x), expected, **FUSED_TOL)
    hook.remove()
    assert seen[0].is_contiguous(memory_format=torch.channels_last) == layout


@torch.no_grad()
def test_pooling_and_classifier_reset_match_timm(x, tmp_path):
    ref = _randomize(timm.create_model("fastvit_t8", layers=_shrunk("fastvit_t8")))
    ours = create_model("fastvit_t8", pretrained=_save(ref, tmp_path / "m.safetensors"),
                        layers=_shrunk("fastvit_t8"))  # fmt: skip
    feats = ours.forward_features(x)
    assert feats.shape == (2, 768, 2, 2) and ours.num_features == 768  # 2 x 384, stride 32
    for pool in ("max", "avgmax", "catavgmax", ""):
        ref.reset_classifier(0, pool)
        ours.reset_classifier(0, pool)
        torch.testing.assert_close(ours.forward_head(feats), ref.forward_head(feats))
    ref.reset_classifier(7, "avg")
    ours.reset_classifier(7, "avg")
    ours.head.fc.load_state_dict(ref.head.fc.state_dict())
    torch.testing.assert_close(ours(x), ref(x))
    with pytest.raises(ValueError, match="global_pool must be one of"):
        ours.reset_classifier(0, "token")


@torch.no_grad()
def test_mci_vit_matches_timm_and_folds(x, tmp_path, assert_parity):
    ref = timm.create_model("vit_base_mci_224", depth=1, img_size=64, num_classes=5)
    ref = _randomize(ref)
    path = _save(ref, tmp_path / "model.safetensors")
    ours = create_model("vit_base_mci_224", pretrained=path, depth=1, img_size=64, num_classes=5)
    assert type(ours) is MciVisionTransformer and ours.config.no_embed_class
    assert_parity(ref, ours, x)
    folded = copy.deepcopy(ours).reparameterize()
    assert not any(isinstance(m, nn.BatchNorm2d) for m in folded.modules())
    torch.testing.assert_close(folded(x), ours(x), **FUSED_TOL)
    # timm never folds this model: its checkpoint loads into a folded one (folded on load)
    assert reparameterize_model(ref).state_dict().keys() == ref.state_dict().keys()
    loaded = create_model("vit_base_mci_224", pretrained=path, depth=1, img_size=64,
                          num_classes=5, inference_mode=True)  # fmt: skip
    torch.testing.assert_close(loaded(x), folded(x), **FUSED_TOL)
    back = create_model(save_pretrained(folded, tmp_path / "saved"))
    assert type(back) is MciVisionTransformer and back.config.inference_mode
    assert torch.equal(back(x), folded(x))
    folded_file = _save(folded, tmp_path / "folded.safetensors")
    with pytest.raises(CheckpointError, match="inference_mode=True"):
        create_model("vit_base_mci_224", pretrained=folded_file, depth=1, img_size=64,
                     num_classes=5)  # fmt: skip


@pytest.mark.parametrize("name", NAMES)
def test_every_timm_architecture_has_timms_layout(name):
    """Full widths, one block per stage (the depths are checked against timm's entrypoints
    below): the same keys and shapes as timm's model, built on the meta device."""
    layers = _shrunk(name)
    with torch.device("meta"):
        ref = timm.create_model(name, layers=layers)
        ours = create_model(name, layers=layers)
    shapes = {k: v.shape for k, v in ours.state_dict().items()}
    assert shapes == {k: v.shape for k, v in ref.state_dict().items()}


def test_presets_are_timms_architectures():
    table = timm_fastvit_args()
    assert sorted(table) == sorted(NAMES) == list_models("fastvit_*")
    for name, (args, unsupported) in table.items():
        assert not unsupported, name
        config = get_model_config(name)
        assert {k: getattr(config, k) for k in args} == args, name
    # timm keyword arguments override a preset as timm.create_model does (None: dropped)
    c = timm_model_config("fastvit_mci2", {"layers": [1, 1, 1, 1], "layer_scale_init_value": None})
    assert (c.layers, c.layer_scale_init_value) == ((1, 1, 1, 1), 1e-5)
    with pytest.raises(ValueError, match="fork_feat=True"):
        timm_model_config("fastvit_mci2", {"fork_feat": True})
    # the MCi ViT: timm's ViT arguments and its ConvStem
    kwargs = _record(["vit_base_mci_224"], vision_transformer_hybrid,
                     "_create_vision_transformer_hybrid")["vit_base_mci_224"]  # fmt: skip
    c = get_model_config("vit_base_mci_224")
    assert (c.embed_dim, c.depth, c.num_heads, c.no_embed_class) == (768, 12, 12, True)
    assert {k: kwargs[k] for k in ("embed_dim", "depth", "num_heads", "no_embed_class")} == dict(
        embed_dim=768, depth=12, num_heads=12, no_embed_class=True
    )
    stem = [m.conv for m in kwargs["backbone"]]
    assert [(s.out_channels, s.kernel_size[0], s.stride[0]) for s in stem] == [
        (c.stem_width, 4, 4), (c.stem_width, 2, 2), (c.embed_dim, 2, 2)
    ]  # fmt: skip


def test_pretrained_tags_and_preprocessing():
    assert "fastvit_mci2.apple_mclip2_dfndr2b" in list_models("fastvit_mci*", pretrained=True)
    s0 = get_pretrained_cfg("fastvit_mci0.apple_mclip")
    assert (s0["mean"], s0["std"], s0["num_classes"]) == ((0.0,) * 3, (1.0,) * 3, 512)
    assert get_model_config("fastvit_mci3").num_classes == 768  # the tag's CLIP width, as timm
    assert get_pretrained_cfg("fastvit_mci3")["mean"] == timm.data.OPENAI_CLIP_MEAN
    assert list_models("vit_base_mci_224.*", pretrained=True) == sorted(
        timm.list_pretrained("vit_base_mci_224.*")
    )


def test_loading_is_strict_and_names_what_is_wrong(tmp_path):
    config = FastVitConfig(layers=(1, 1, 1, 1), embed_dims=(32, 32, 64, 64), num_classes=3)
    sd = FastVit(config).state_dict()
    bad = {k: v for k, v in sd.items() if k != "stages.1.blocks.0.mlp.fc1.weight"}
    bad["stages.0.bogus.weight"] = torch.zeros(1)
    with pytest.raises(CheckpointError, match=r"mlp\.fc1\.weight.*\n.*stages\.0\.bogus\.weight"):
        convert_timm_fastvit(bad, config)
    with pytest.raises(CheckpointError, match="num_classes=3"):
        convert_timm_fastvit(sd, dataclasses.replace(config, num_classes=5))
    with pytest.raises(CheckpointError, match=r"reparameterize\(\)"):
        convert_timm_fastvit(sd, dataclasses.replace(config, inference_mode=True))
    folded = FastVit(config).reparameterize().state_dict()
    with pytest.raises(CheckpointError, match="inference_mode=True"):
        convert_timm_fastvit(folded, config)


@torch.no_grad()
def test_apple_checkpoints_load_as_timm_renames_them(x):
    """Apple's original layout (MobileCLIP's image_encoder.model.*, flat network list,
    rbr_* branches, CLIP projection): our renaming equals timm's checkpoint_filter_fn."""
    layers = _shrunk("fastvit_mci0")
    ref = _randomize(timm.create_model("fastvit_mci0", layers=layers, num_classes=5))
    ref.head.fc.bias.zero_()  # (a CLIP projection has none)
    apple = {"image_encoder.model." + k: v for k, v in _to_apple(ref.state_dict()).items()}
    apple["text_encoder.embedding.weight"] = torch.zeros(3)  # (the rest of a MobileCLIP file)
    renamed = timm_fastvit.checkpoint_filter_fn(apple, ref)  # timm's own reading of it
    assert renamed.keys() == ref.state_dict().keys()  # (the Apple layout below is timm's)
    ours = apple_fastvit_to_timm(apple, num_classes=5)
    assert ours.keys() == renamed.keys()
    assert all(torch.equal(ours[k], v) for k, v in renamed.items())
    model = create_model("fastvit_mci0", layers=layers, num_classes=5)
    model.load_state_dict(convert_timm_fastvit(apple, model.config))
    torch.testing.assert_close(model(x), ref(x))


def _to_apple(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """timm's FastViT names -> Apple's (the inverse of timm's checkpoint_filter_fn), for a
    model with one block per stage: network = [blocks 0, (proj 1, [pe,] blocks 1), ...]."""
    out, n, slots = {}, 0, {}
    for i in range(5):
        if i > 0 and any(k.startswith(f"stages.{i}.downsample") for k in sd):
            slots[(i, "downsample")], n = n, n + 1
        if any(k.startswith(f"stages.{i}.pos_emb") for k in sd):
            slots[(i, "pos_emb")], n = n, n + 1
        if any(k.startswith(f"stages.{i}.blocks") for k in sd):
            slots[(i, "blocks")], n = n, n + 1
    names = (
        ("conv_kxk", "rbr_conv"), ("conv_scale", "rbr_scale"), ("identity", "rbr_skip"),
        ("large_conv", "lkb_origin"), ("mlp", "convffn"), ("se.fc1", "se.reduce"),
        ("se.fc2", "se.expand"), ("final_conv", "conv_exp"), ("stem", "patch_embed"),
    )  # fmt: skip
    for key, value in sd.items():
        if key == "head.fc.bias":
            continue
        if key == "head.fc.weight":
            out["head.proj"] = value.T
            continue
        parts = key.split(".")
        if parts[0] == "stages":
            i, part = int(parts[1]), parts[2]
            rest = ".".join(parts[3:])
            if part == "pos_emb":
                rest = rest.replace("pos_enc.", "pe.")
            key = f"network.{slots[(i, part)]}.{rest}"
        for new, old in names:
            key = key.replace(new, old)
        out[key.replace(".gamma", "")] = value
    return out


def test_config_errors_name_the_field():
    with pytest.raises(ValueError, match="one entry per stage"):
        FastVitConfig(layers=(1, 1, 1))
    with pytest.raises(ValueError, match="token_mixers"):
        FastVitConfig(token_mixers=("repmixer",) * 3 + ("conv",))
    with pytest.raises(ValueError, match="multiple of 32"):
        FastVitConfig(
            embed_dims=(48, 96, 192, 400), token_mixers=("repmixer",) * 3 + ("attention",)
        )
    with pytest.raises(ValueError, match="norm_layer"):
        FastVitConfig(norm_layer="groupnorm")
    with pytest.raises(ValueError, match="stride 16"):
        MciViTConfig(patch_size=14)
    with pytest.raises(ValueError, match="image batch"):
        FastVit(FastVitConfig(layers=(1, 1, 1, 1)))(torch.randn(1, 1, 64, 64))
