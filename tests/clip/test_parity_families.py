"""ConvNeXt, OpenAI ResNet and timm-ViT CLIPs: random-init open_clip models (a timm ConvNeXt
tower with open_clip's linear / MLP projection head; OpenAI's ModifiedResNet;
MobileCLIP2-L-14's timm ViT-L/14 tower without a projection) saved in their
real on-disk formats, loaded through ``create_model``, fp32 image and text embeddings
and logits equal at 1e-4.

Full width, depth cut (ConvNeXt: 1, 1, 2, 1 blocks per stage through timm's
``create_model``; ResNet: one bottleneck per stage; timm ViT: 2 blocks; text: 2 blocks,
its vocabulary cut to ``SMALL_VOCAB`` rows, captions folded into it). BatchNorm statistics
and every norm / bias are perturbed so a swapped or missing one cannot hide. The names and
shapes of every config at full depth are checked on the meta device in test_convert.py.
Each reference is built once per module (``reference``) and only read; the logits come
from the embeddings as ``forward`` computes them."""

from __future__ import annotations

import copy
import functools

import open_clip
import pytest
import timm
import torch
import torch.nn.functional as F
from _support.clip import SMALL_VOCAB, small_vocab
from _support.models import memoized
from attn_clip import CLIPConfig, create_model, save_pretrained, to_open_clip
from safetensors.torch import load_file, save_file
from torch.testing import assert_close

TOL = {"atol": 1e-4, "rtol": 1e-4}
TEXT_LAYERS = 2
CONVNEXT_DEPTHS = (1, 1, 2, 1)
RESNET_LAYERS = (1, 1, 1, 1)
SWIN_DEPTHS = (1, 1, 2, 1)

CASES = [
    ("convnext_base", "timm_proj linear, 224 px", "open_clip_pytorch_model.bin"),
    ("convnext_large_d", "timm_proj mlp, 256 px", "open_clip_model.safetensors"),
    ("RN50", "RN50 widths, GELU text", "open_clip_pytorch_model.bin"),
    ("RN50x4-quickgelu", "RN50x4 widths, 288 px, QuickGELU", "open_clip_model.safetensors"),
    # a timm ViT tower with no projection, LayerNorm eps 1e-5; text without a causal mask
    ("MobileCLIP2-L-14", "vit_large_patch14_clip_224, token pool", "open_clip_model.safetensors"),
    # a timm ViT tower without qkv bias, average pooled, open_clip's bias-free linear head
    (
        "vit_medium_patch16_gap_256",
        "no qkv bias, avg pool, timm_proj linear",
        "open_clip_model.safetensors",
    ),
    # a timm Swin tower (shifted windows in stage 3), average pooled, linear head
    ("swin_base_patch4_window7_224", "Swin-B, timm_proj linear", "open_clip_pytorch_model.bin"),
    # a timm relative-position ViT: no position embedding, a RelPosMlp bias in every block
    (
        "vit_relpos_medium_patch16_cls_224",
        "relpos, class token, linear",
        "open_clip_model.safetensors",
    ),
]
VIT_DEPTH = 2


@torch.no_grad()
def _perturb(model: torch.nn.Module) -> torch.nn.Module:
    for p in model.parameters():
        if p.ndim <= 1:  # norms, biases, LayerScale gammas
            p.add_(torch.randn_like(p) * 0.05)
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.normal_(0, 0.1)
            m.running_var.uniform_(0.5, 1.5)
    return model.eval()


def _shrunk(name: str, vision_cfg: dict) -> tuple[dict, dict]:
    """``(timm.create_model keyword arguments, our vision overrides)`` that cut the depth
    of ``name``'s timm image tower (a ResNet's: no timm arguments, its layers)."""
    if name.startswith("convnext"):
        return {"depths": CONVNEXT_DEPTHS}, {"convnext": {"depths": CONVNEXT_DEPTHS}}
    if name.startswith("swin_"):
        return {"depths": SWIN_DEPTHS}, {"swin": {"depths": SWIN_DEPTHS}}
    if vision_cfg.get("timm_model_name", "").startswith("vit_"):
        return {"depth": VIT_DEPTH}, {"layers": VIT_DEPTH}
    return {}, {"layers": RESNET_LAYERS}


def open_clip_family(name: str) -> tuple[torch.nn.Module, dict]:
    """open_clip's CLIP for ``name`` with the shrunk depths, perturbed, in eval mode, and
    the ``create_model`` overrides that build ours the same."""
    cfg = copy.deepcopy(open_clip.get_model_config(name))
    cfg["text_cfg"].update(layers=TEXT_LAYERS, vocab_size=SMALL_VOCAB)
    timm_args, vision = _shrunk(name, cfg["vision_cfg"])
    overrides = {"text": {"layers": TEXT_LAYERS, "vocab_size": SMALL_VOCAB}, "vision": vision}
    if not timm_args:
        cfg["vision_cfg"]["layers"] = list(RESNET_LAYERS)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(timm, "create_model", functools.partial(timm.create_model, **timm_args))
        with torch.random.fork_rng():
            torch.manual_seed(0)
            custom = cfg.pop("custom_text", False)  # as open_clip.create_model picks
            ref = _perturb((open_clip.CustomTextCLIP if custom else open_clip.CLIP)(**cfg))
    return ref, overrides


@pytest.fixture(scope="module")
def reference():
    """``reference(name) -> (ref, overrides)``, each built once in this module (read only)."""
    return memoized(open_clip_family)


def _assert_same_model(back: torch.nn.Module, ours: torch.nn.Module) -> None:
    """``back`` (read from a saved folder) is ``ours``: the same config and the same tensors,
    so the same outputs."""
    assert type(back) is type(ours) and back.config == ours.config
    back_sd = back.state_dict()
    assert back_sd.keys() == ours.state_dict().keys()
    for k, v in ours.state_dict().items():
        assert torch.equal(back_sd[k], v), k


def _normalize(x: torch.Tensor) -> torch.Tensor:
    return F.normalize(x, dim=-1)


def _inputs(ref: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    size = ref.visual.image_size
    size = size if isinstance(size, (tuple, list)) else (size, size)
    tokens = open_clip.get_tokenizer("RN50")(["a photo of a dog", "a cat on a mat", ""])
    return torch.randn(2, 3, *size), small_vocab(tokens)


@pytest.mark.parametrize(("name", "what", "filename"), CASES)
def test_open_clip_checkpoint_files(tmp_path, reference, name, what, filename):
    ref, overrides = reference(name)
    images, tokens = _inputs(ref)
    with torch.no_grad():
        ref_image, ref_text = ref.encode_image(images), ref.encode_text(tokens)
        # open_clip's get_logits, from the embeddings above
        ref_logits = ref.logit_scale.exp() * _normalize(ref_image) @ _normalize(ref_text).T
    assert not torch.allclose(ref_image[0], ref_image[1])  # the images tell apart
    sd = {k: v.contiguous() for k, v in ref.state_dict().items()}
    head = {
        "convnext_base": "visual.head.proj.weight",
        "convnext_large_d": "visual.head.mlp.fc1.weight",
        "MobileCLIP2-L-14": f"visual.trunk.blocks.{VIT_DEPTH - 1}.attn.qkv.weight",
        "vit_medium_patch16_gap_256": "visual.head.proj.weight",
        "swin_base_patch4_window7_224": "visual.trunk.layers.2.blocks.1.attn.qkv.weight",
        "vit_relpos_medium_patch16_cls_224": "visual.trunk.blocks.1.attn.rel_pos.mlp.fc2.weight",
    }.get(name, "visual.attnpool.c_proj.weight")
    assert head in sd
    path = tmp_path / filename
    if filename.endswith(".safetensors"):
        save_file(sd, str(path))
    else:
        torch.save(sd, path)
    ours = create_model(name, pretrained=str(path), **overrides)
    assert ours.config.quick_gelu == name.endswith("-quickgelu")
    with torch.no_grad():
        image, text = ours.encode_image(images), ours.encode_text(tokens)
        per_image = ours.logits(_normalize(image), _normalize(text))[0]
    assert_close(image, ref_image, **TOL)
    assert_close(text, ref_text, **TOL)
    assert_close(per_image, ref_logits, **TOL)
    # open_clip's vision_cfg of the shrunk tower (timm_model_args) reads back the same
    assert CLIPConfig.from_open_clip(ours.config.to_open_clip()) == ours.config
    # back to open_clip's (CLIP-layout) names: every tensor where open_clip has it (a
    # CustomTextCLIP's text.* keys as open_clip's loader maps CLIP's onto it)
    back = to_open_clip(ours.state_dict(), ours.config.vision)
    want = {(k[5:] if k.startswith("text.") else k): v for k, v in sd.items()}
    assert back.keys() == want.keys()
    assert all(torch.equal(back[k], v) for k, v in want.items())


def test_resnet_save_pretrained_loads_in_open_clip(tmp_path, reference):
    """A ResNet CLIP's folder is plain open_clip: open_clip builds and loads it as is."""
    ref, overrides = reference("RN50")
    path = tmp_path / "w.safetensors"
    save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, str(path))
    ours = create_model("RN50", pretrained=str(path), **overrides)
    save_pretrained(ours, tmp_path / "saved")
    back = create_model(str(tmp_path / "saved"))
    _assert_same_model(back, ours)
    twin = open_clip.create_model("local-dir:" + str(tmp_path / "saved")).eval()
    images, tokens = _inputs(ref)
    with torch.no_grad():
        assert_close(twin.encode_image(images), ref.encode_image(images), **TOL)
        assert_close(twin.encode_text(tokens), ref.encode_text(tokens), **TOL)


@pytest.mark.parametrize(
    "name", ["convnext_large_d", "swin_base_patch4_window7_224", "vit_medium_patch16_gap_256"]
)
def test_timm_tower_save_pretrained_round_trips(tmp_path, monkeypatch, reference, name):
    """A shrunk timm-tower CLIP's folder names its timm depths (``timm_model_args``): ours
    loads it back exactly; open_clip, given the same timm depths, reads its weights."""
    ref, overrides = reference(name)
    path = tmp_path / "w.safetensors"
    save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, str(path))
    ours = create_model(name, pretrained=str(path), **overrides)
    save_pretrained(ours, tmp_path / "saved")
    back = create_model(str(tmp_path / "saved"))
    _assert_same_model(back, ours)
    cfg = copy.deepcopy(open_clip.get_model_config(name))
    timm_args, _ = _shrunk(name, cfg["vision_cfg"])
    assert ours.config.to_open_clip()["vision_cfg"]["timm_model_args"] == {
        k: list(v) if isinstance(v, tuple) else v for k, v in timm_args.items()
    }
    monkeypatch.setattr(timm, "create_model", functools.partial(timm.create_model, **timm_args))
    cfg["text_cfg"].update(layers=TEXT_LAYERS, vocab_size=SMALL_VOCAB)
    twin = open_clip.model.CLIP(**cfg)
    monkeypatch.undo()
    twin.load_state_dict(load_file(str(tmp_path / "saved" / "open_clip_model.safetensors")))
    images, tokens = _inputs(ref)
    with torch.no_grad():
        assert_close(twin.eval().encode_image(images), ref.encode_image(images), **TOL)


def test_missing_batchnorm_counters_are_filled(tmp_path, reference):
    """Checkpoints without BatchNorm's ``num_batches_tracked`` load (zeros, unused in eval);
    any other missing tensor is still named."""
    ref, overrides = reference("RN50")
    sd = {k: v for k, v in ref.state_dict().items() if not k.endswith("num_batches_tracked")}
    ours = create_model("RN50", pretrained=_save(tmp_path, sd), **overrides)
    images, _ = _inputs(ref)
    with torch.no_grad():
        assert_close(ours.encode_image(images), ref.encode_image(images), **TOL)
    del sd["visual.layer1.0.bn2.running_var"]
    with pytest.raises(
        ValueError, match=r"missing keys: visual\.trunk\.layer1\.0\.bn2\.running_var"
    ):
        create_model("RN50", pretrained=_save(tmp_path, sd), **overrides)


def _save(tmp_path, sd: dict) -> str:
    path = tmp_path / "open_clip_pytorch_model.bin"
    torch.save(sd, path)
    return str(path)
