"""Converters: format detection, loud errors, open_clip <-> attn_clip round trip, TorchScript."""

from __future__ import annotations

import copy
import warnings

import open_clip
import pytest
import torch
from _support.models import memoized, meta_build, shapes
from attn_clip import (
    CLIP,
    CLIPConfig,
    convert_open_clip,
    create_model,
    detect_format,
    load_checkpoint,
    read_checkpoint,
    to_open_clip,
)
from attn_clip.coca import CoCa
from attn_clip.convert import fit_to_model
from open_clip.model import convert_weights_to_fp16
from torch.testing import assert_close

TOL = {"atol": 1e-4, "rtol": 1e-4}


@pytest.fixture
def ref(tiny_open_clip):
    return tiny_open_clip  # the session's: read only


@pytest.fixture
def ours(h):
    """A fresh model (a failing load may have written some of its tensors)."""
    return CLIP(CLIPConfig.from_open_clip(h.oc_cfg())).eval()


def test_detect_format(ref, ours):
    sd = ref.state_dict()
    assert detect_format(sd) == "open_clip"
    assert detect_format({f"module.{k}": v for k, v in sd.items()}) == "open_clip"
    custom_text = {
        (f"text.{k}" if not k.startswith(("visual.", "logit")) else k): v for k, v in sd.items()
    }
    assert detect_format(custom_text) == "open_clip"
    assert detect_format(ours.state_dict()) == "attn_clip"
    with pytest.raises(ValueError, match="unrecognised CLIP checkpoint.*first keys"):
        detect_format({"encoder.weight": torch.zeros(1)})
    with pytest.raises(ValueError, match="unrecognised CLIP checkpoint"):
        detect_format({"visual.layer1.0.conv1.weight": torch.zeros(1)})  # no text tower
    # SigLIP / ConvNeXt: open_clip's timm towers; OpenAI's ResNet; transformers'
    # SiglipModel (its MAP head, text head)
    z = torch.zeros(1)
    siglip = {"visual.trunk.patch_embed.proj.weight": z, "text.positional_embedding": z}
    assert detect_format(siglip) == "open_clip"
    convnext = {"visual.trunk.stem.0.weight": z, "positional_embedding": z}
    assert detect_format(convnext) == "open_clip"
    resnet = {"visual.conv1.weight": z, "visual.attnpool.c_proj.weight": z}
    assert detect_format({**resnet, "positional_embedding": z}) == "open_clip"
    assert detect_format({"visual.trunk.conv1.weight": z, "text.blocks.0.norm1.weight": z}) == (
        "attn_clip"
    )
    hf = {
        "text_model.embeddings.token_embedding.weight": z,
        "vision_model.post_layernorm.weight": z,
    }
    assert detect_format(hf) == "hf"
    assert detect_format({**hf, "vision_model.head.probe": z}) == "hf_siglip"


def test_siglip_converters_are_loud_and_invert(h):
    """open_clip's timm-tower keys pass through by name; an unknown head is named; the
    SigLIP layout survives to_open_clip -> convert_open_clip unchanged."""
    from attn_clip import convert_hf_siglip

    cfg = CLIPConfig.from_open_clip(open_clip.get_model_config("ViT-B-16-SigLIP"))
    cfg.vision.layers = cfg.text.layers = 1
    cfg.text.vocab_size = 64
    with torch.device("meta"):
        sd = CLIP(cfg).state_dict()
    oc = to_open_clip(sd)
    assert "visual.trunk.attn_pool.latent" in oc and "visual.trunk.patch_embed.proj.bias" in oc
    assert "text_projection.bias" in oc and "visual.conv1.weight" not in oc
    assert {k: v.shape for k, v in convert_open_clip(oc).items()} == {
        k: v.shape for k, v in sd.items()
    }
    with pytest.raises(ValueError, match="no converter rule knows: visual.head.extra.weight"):
        convert_open_clip({**oc, "visual.head.extra.weight": torch.zeros(1)})
    with pytest.raises(ValueError, match="SiglipModel.*vision_model.head.extra"):
        convert_hf_siglip({"vision_model.head.extra": torch.zeros(1)})


def test_custom_text_layout_and_ddp_prefix_load(ref, ours, tiny_images, tiny_tokens):
    sd = ref.state_dict()
    custom = {
        (f"text.{k}" if not k.startswith(("visual.", "logit")) else k): v for k, v in sd.items()
    }
    for variant in (custom, {f"module.{k}": v for k, v in sd.items()}):
        model = load_checkpoint(CLIP(ours.config).eval(), variant)
        with torch.no_grad():
            assert_close(model.encode_text(tiny_tokens), ref.encode_text(tiny_tokens), **TOL)


def test_unknown_key_is_named(ref):
    sd = dict(ref.state_dict())
    sd["visual.transformer.resblocks.0.attn.q_norm.weight"] = torch.ones(16)
    with pytest.raises(ValueError, match=r"no converter rule knows: .*resblocks\.0\.attn\.q_norm"):
        convert_open_clip(sd)


def test_missing_and_shape_mismatch_are_listed(h, ref, ours):
    sd = dict(ref.state_dict())
    del sd["ln_final.bias"]
    with pytest.raises(ValueError, match=r"missing keys: text\.ln_final\.bias"):
        load_checkpoint(ours, sd)
    bigger = h.make_open_clip(h.oc_cfg(vision_cfg={"image_size": 48}))  # 6x6 grid, not 4x4
    with pytest.raises(
        ValueError,
        match=r"visual\.trunk\.pos_embed: checkpoint \(1, 37, 64\) vs model \(1, 17, 64\)",
    ):
        load_checkpoint(ours, bigger.state_dict())
    biased = h.make_open_clip(h.oc_cfg(init_logit_bias=-10.0))
    with pytest.raises(ValueError, match="unexpected keys: logit_bias"):
        load_checkpoint(ours, biased.state_dict())


@pytest.mark.parametrize(
    "cfg_update",
    [
        {},
        {
            "vision_cfg": {"final_ln_after_pool": True, "pool_type": "avg"},
            "text_cfg": {"proj_bias": True},
        },
    ],
)
def test_to_open_clip_round_trip(h, cfg_update, tiny_images, tiny_tokens):
    cfg = h.oc_cfg(**cfg_update)
    ref = h.make_open_clip(cfg)
    ours = load_checkpoint(CLIP(CLIPConfig.from_open_clip(cfg)).eval(), ref.state_dict())
    back = to_open_clip(ours.state_dict())
    assert back.keys() == ref.state_dict().keys()
    for k, v in ref.state_dict().items():
        assert torch.equal(back[k], v), k
    assert CLIPConfig.from_open_clip(ours.config.to_open_clip()) == ours.config


def _torchscript_archive(
    model: torch.nn.Module, path, images, tokens, fp16: frozenset[str] = frozenset()
) -> None:
    """Mimic OpenAI's released ``ViT-*.pt``: a traced model with three int buffers, the
    parameters named in ``fp16`` stored as fp16."""

    class Wrapper(torch.nn.Module):
        def __init__(self, clip):
            super().__init__()
            for name, child in clip.named_children():
                self.add_module(name, child)
            for name, p in clip.named_parameters(recurse=False):
                self.register_parameter(name, p)
            self.register_buffer("input_resolution", torch.tensor(32))
            self.register_buffer("context_length", torch.tensor(20))
            self.register_buffer("vocab_size", torch.tensor(49408))
            self.clip = [clip]

        def forward(self, image, text):
            return self.clip[0].get_logits(image, text)

    wrapper = Wrapper(copy.deepcopy(model))  # (tracing shares the tensors)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(wrapper, (images, tokens), check_trace=False)
    with torch.no_grad():
        for name, p in traced.named_parameters():
            if name in fp16:
                p.data = p.data.half()
    traced.save(str(path))


def test_openai_torchscript_archive(h, tmp_path, tiny_images, tiny_tokens):
    ref = h.make_open_clip(h.oc_cfg(quick_gelu=True))
    convert_weights_to_fp16(ref)  # OpenAI ships fp16 weights; compare against the same rounding
    ref.float()
    path = tmp_path / "ViT-tiny.pt"
    _torchscript_archive(ref, path, tiny_images, tiny_tokens)
    ckpt = read_checkpoint(path)
    assert ckpt.kind == "torchscript" and "input_resolution" in ckpt.state_dict
    # the config is GELU, the archive is OpenAI's: QuickGELU comes with the weights
    model = create_model(CLIPConfig.from_open_clip(h.oc_cfg()), pretrained=path)
    assert model.config.quick_gelu
    with torch.no_grad():
        assert_close(model.encode_image(tiny_images), ref.encode_image(tiny_images), **TOL)
        assert_close(model.encode_text(tiny_tokens), ref.encode_text(tiny_tokens), **TOL)
    with pytest.raises(ValueError, match="QuickGELU"):
        create_model(CLIPConfig.from_open_clip(h.oc_cfg()), pretrained=path, quick_gelu=False)


def test_openai_torchscript_resnet_archive(h, tmp_path, tiny_tokens):
    """OpenAI's ``RN50.pt`` & co. are TorchScript archives too: a traced open_clip ResNet
    CLIP (fp16 conv / linear weights, fp32 BatchNorm, as OpenAI ships them) read by the
    restricted reader, its ``visual.*`` ResNet keys loaded into our tower."""
    vision = {"layers": [1, 2, 1, 1], "width": 16, "head_width": 8, "image_size": 64}
    ref = h.make_open_clip(h.oc_cfg(quick_gelu=True, vision_cfg=vision))
    with torch.no_grad():
        for m in ref.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.normal_(0, 0.1)
                m.running_var.uniform_(0.5, 1.5)
    convert_weights_to_fp16(ref)  # conv / linear weights: what OpenAI stores as fp16
    fp16 = frozenset(k for k, v in ref.state_dict().items() if v.dtype == torch.float16)
    ref.float()  # compare against the same rounding
    images = torch.randn(2, 3, 64, 64)
    path = tmp_path / "RN-tiny.pt"
    _torchscript_archive(ref, path, images, tiny_tokens, fp16)
    ckpt = read_checkpoint(path)
    assert ckpt.kind == "torchscript"
    assert ckpt.state_dict["visual.attnpool.c_proj.weight"].dtype == torch.float16
    assert ckpt.state_dict["visual.bn1.running_var"].dtype == torch.float32
    assert "visual.layer2.1.bn3.num_batches_tracked" in ckpt.state_dict
    model = create_model(CLIPConfig.from_open_clip(h.oc_cfg(vision_cfg=vision)), pretrained=path)
    assert model.config.quick_gelu and model.config.vision.tower == "resnet"
    with torch.no_grad():
        assert_close(model.encode_image(images), ref.encode_image(images), **TOL)
        assert_close(model.encode_text(tiny_tokens), ref.encode_text(tiny_tokens), **TOL)


def test_open_clip_meta_layout_matches_every_listed_model(monkeypatch):
    """Every buildable architecture has exactly open_clip's tensors (names and shapes, at
    full depth), SigLIP / SigLIP2 (open_clip's CustomTextCLIP with a timm tower), ConvNeXt
    (timm tower + projection head), EVA-CLIP (timm Eva tower, its blocks fused), ViTamin
    (timm tower on a conv stem + projection head) and OpenAI's ResNets included.

    Both sides are built on the meta device with no init, and each distinct tower once
    (configs that differ only in the other tower share it): open_clip's ``CLIP`` /
    ``CustomTextCLIP`` and ours still run their own ``__init__`` for every config."""
    from attn_clip import get_model_config, list_models
    from attn_clip import model as attn_clip_model

    for module, name in [
        (open_clip.model, "_build_vision_tower"),
        (open_clip.model, "_build_text_tower"),
        (attn_clip_model, "CLIPVisionTower"),
        (attn_clip_model, "TextTransformer"),
    ]:
        monkeypatch.setattr(module, name, memoized(getattr(module, name)))
    seen, checked = set(), []
    for name in [n for n in list_models() if n in open_clip.list_models()]:
        oc_cfg = open_clip.get_model_config(name)
        if oc_cfg["text_cfg"].get("hf_model_name"):  # open_clip's AutoConfig needs the hub:
            continue  # tests/clip/test_parity_hf_text.py builds these text towers on meta
        oc_cfg.pop("quick_gelu", None)  # the activation does not change the tensors
        if (key := repr(sorted(oc_cfg.items()))) in seen:
            continue
        seen.add(key)
        custom_text = oc_cfg.pop("custom_text", False)  # SigLIP: the text tower under text.
        model_cls = open_clip.model.CustomTextCLIP if custom_text else open_clip.model.CLIP
        if "multimodal_cfg" in oc_cfg:
            model_cls = open_clip.CoCa
        with meta_build():
            config = get_model_config(name)
            ref, ours = model_cls(**oc_cfg), (CoCa if config.is_coca else CLIP)(config)
        sd = fit_to_model(convert_open_clip(ref.state_dict()), ours.state_dict())
        assert shapes(sd) == shapes(ours), name
        checked.append(name)
    assert sum("SigLIP" in n for n in checked) >= 20, checked
    assert sum(n.startswith("convnext_") for n in checked) >= 9, checked  # 11, 2 share a layout
    assert sum(n.startswith("RN") for n in checked) == 5, checked  # -quickgelu: same tensors
    assert sum(n.startswith("EVA") for n in checked) == 7, checked
    assert sum(n.startswith("PE-Core") for n in checked) == 5, checked
    assert sum(n.startswith("ViTamin") for n in checked) == 15, checked
    assert sum(n.startswith("coca_") for n in checked) == 3, checked
