"""MobileCLIP / MobileCLIP2: every open_clip config and tag with its preprocessing, and
random-init open_clip models saved as open_clip folders (``open_clip_model.safetensors`` +
``open_clip_config.json``) loaded through ``create_model``: image and text embeddings equal
at 1e-4 unfolded and folded (``model.visual.reparameterize()``), timm's
``reparameterize_model`` of open_clip's tower equal to ours folded, a folded model saved and
loaded back folded, timm's reparameterized checkpoint loading into a folded tower, a
hostile pickle refused.

One config per tower family, a 2-block text tower with ``SMALL_VOCAB`` rows:
``MobileCLIP-S2`` (``fastvit_mci2`` at its real widths, one block per stage: RepMixer
stages, BatchNorm attention, Squeeze-Excite downsampling; a bidirectional text tower),
``MobileCLIP2-S3`` (``fastvit_mci3`` at half its widths, one block per stage: 5 stages,
LayerNorm2d attention, no scale branches in the stem; on 128 px so that its stride-64 last
stage attends over 2 x 2 positions; 768 wide text), ``MobileCLIP-B`` (``vit_base_mci_224``,
two blocks, on 64 px: the conv stem, a 4 x 4 position grid; a causal text tower).
open_clip builds the shrunk towers through ``timm.create_model`` with the same keyword
arguments our folder names (``timm_model_args``). Every BatchNorm's statistics (measured,
then moved) and affine parameters, LayerNorm and layer scale of the reference are drawn
away from their defaults first, so that no fold is an identity."""

from __future__ import annotations

import copy
import functools
import json
from dataclasses import replace
from pathlib import Path

import open_clip
import open_clip.pretrained as oc_pretrained
import pytest
import timm
import torch
from _support.clip import SMALL_VOCAB, small_vocab
from _support.models import memoized
from attn_clip import (
    CLIPConfig,
    create_model,
    get_model_config,
    get_pretrained_cfg,
    list_models,
    list_pretrained_tags,
    save_pretrained,
)
from attn_core.hub import CheckpointError, WeightsError
from safetensors.torch import save_file
from timm.utils import reparameterize_model
from torch import nn
from torch.testing import assert_close

TOL = {"atol": 1e-4, "rtol": 1e-4}
TEXT_LAYERS = 2
MOBILECLIP = ("MobileCLIP-S1", "MobileCLIP-S2", "MobileCLIP-B", "MobileCLIP2-S0",
              "MobileCLIP2-S2", "MobileCLIP2-S3", "MobileCLIP2-S4", "MobileCLIP2-B")  # fmt: skip
# name -> (timm.create_model keyword arguments = the folder's timm_model_args, image size)
CASES = {
    "MobileCLIP-S2": ({"layers": [1, 1, 1, 1]}, 64),
    "MobileCLIP2-S3": ({"layers": [1, 1, 1, 1, 1], "embed_dims": [48, 96, 192, 384, 768]}, 128),
    "MobileCLIP-B": ({"depth": 2, "img_size": [64, 64]}, 64),
}


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """One intra-op thread: small convolutions; on a busy 2-core machine a second thread
    mostly waits."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@torch.no_grad()
def _randomize(model: nn.Module, size: int) -> nn.Module:
    """Weights perturbed; LayerNorms, layer scales (timm's init 1e-5 would hide a block) and
    BatchNorm affine parameters drawn away from their defaults; then the BatchNorm
    statistics randomized (:func:`_batchnorm_statistics`)."""
    for p in model.parameters():
        p.add_(torch.randn_like(p) * 0.02)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.weight.uniform_(0.5, 1.5)
            m.bias.normal_(0.0, 0.2)
        elif isinstance(m, nn.LayerNorm):
            m.weight.uniform_(0.5, 1.5)
            m.bias.normal_(0.0, 0.2)
    for name, p in model.named_parameters():
        if name.endswith("gamma"):
            p.uniform_(0.2, 1.0)
    return _batchnorm_statistics(model, size).eval()


@torch.no_grad()
def _batchnorm_statistics(model: nn.Module, size: int) -> nn.Module:
    """Every BatchNorm's statistics measured on a batch of ``size`` px noise (so the signal
    keeps its scale through the stages: with made-up statistics the biases would drown the
    image), then drawn away from those."""
    norms = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    for m in norms:
        m.reset_running_stats()
        m.momentum = None  # (a plain average over the batch)
    model.visual.train()(torch.rand(4, 3, size, size))
    for m in norms:
        m.running_mean.add_(torch.randn_like(m.running_mean) * m.running_var.sqrt() * 0.3)
        m.running_var.mul_(torch.empty_like(m.running_var).uniform_(0.5, 2.0))
    return model.eval()


def _config(name: str) -> dict:
    """open_clip's config of ``name`` with the shrunk tower (``timm_model_args``) and text."""
    cfg = copy.deepcopy(open_clip.get_model_config(name))
    timm_args, size = CASES[name]
    cfg["vision_cfg"].update(timm_model_args=timm_args, image_size=size)
    cfg["text_cfg"].update(layers=TEXT_LAYERS, vocab_size=SMALL_VOCAB)
    return cfg


def _open_clip(name: str) -> nn.Module:
    """open_clip's random-init CLIP of ``name``, shrunk and randomized, in eval mode."""
    cfg = _config(name)
    timm_args = cfg["vision_cfg"].pop("timm_model_args")  # (open_clip refuses the key)
    cfg.pop("custom_text")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(timm, "create_model", functools.partial(timm.create_model, **timm_args))
        with torch.random.fork_rng():
            torch.manual_seed(0)
            return _randomize(open_clip.CustomTextCLIP(**cfg), CASES[name][1])


@pytest.fixture(scope="module")
def reference():
    """``reference(name)``: the open_clip model, built once in this module (read only)."""
    return memoized(_open_clip)


def _folder(tmp_path: Path, name: str, sd: dict) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    save_file(
        {k: v.contiguous() for k, v in sd.items()}, str(folder / "open_clip_model.safetensors")
    )
    meta = {"model_cfg": _config(name)}
    (folder / "open_clip_config.json").write_text(json.dumps(meta), encoding="utf-8")
    return folder


def _inputs(name: str) -> tuple[torch.Tensor, torch.Tensor]:
    size = CASES[name][1]
    noise = torch.rand(2, 3, size, size, generator=torch.Generator().manual_seed(1))
    ramp = torch.linspace(0, 1, size).expand(3, size, size)  # (not noise: pools differently)
    images = torch.stack([noise[0], 0.8 * ramp + 0.2 * noise[1]])
    tokens = open_clip.get_tokenizer(name)(["a photo of a dog", "a cat on a mat", ""])
    return images, small_vocab(tokens)


def test_every_mobileclip_config_and_tag():
    """The 8 MobileCLIP / MobileCLIP2 configs build, with every open_clip tag and its
    preprocessing (MobileCLIP: mean 0 / std 1; MobileCLIP2-S3 / S4: OpenAI's; bilinear,
    shortest side, the tower's 256 / 224 px), text towers as the configs say (their
    tensors at full size: test_convert.py's meta layouts)."""
    assert set(MOBILECLIP) <= set(list_models())
    means = set()
    for name in MOBILECLIP:
        cfg = open_clip.get_model_config(name)
        tags = [t for n, t in oc_pretrained.list_pretrained() if n == name]
        assert tags and list_pretrained_tags(name) == tags
        for tag in tags:
            theirs, pre = oc_pretrained.get_pretrained_cfg(name, tag), get_pretrained_cfg(name, tag)
            assert pre.preprocess.mean == tuple(theirs["mean"])
            assert pre.preprocess.std == tuple(theirs["std"])
            assert pre.preprocess.interpolation == theirs["interpolation"] == "bilinear"
            assert pre.preprocess.resize_mode == theirs["resize_mode"] == "shortest"
            assert pre.preprocess.size == cfg["vision_cfg"]["image_size"]
            assert pre.hf_hub_id == theirs["hf_hub"].rstrip("/")
            means.add(pre.preprocess.mean)
        ours = get_model_config(name)
        v, timm_name = ours.vision, cfg["vision_cfg"]["timm_model_name"]
        assert v.tower == ("fastvit" if timm_name.startswith("fastvit") else "vit")
        assert (v.proj_type, v.timm_model_name) == ("head", timm_name)
        assert ours.text.causal == (not cfg["text_cfg"].get("no_causal_mask", False))
        assert ours.text.width == cfg["text_cfg"]["width"] and ours.embed_dim == cfg["embed_dim"]
        back = ours.to_open_clip()["vision_cfg"]
        assert "timm_model_args" not in back  # (the preset exactly: plain open_clip)
        keys = ("timm_model_name", "timm_pool", "timm_proj", "image_size")
        assert {k: back[k] for k in keys} == {k: cfg["vision_cfg"][k] for k in keys}
    assert len(means) == 2  # mean 0 and OpenAI's


@pytest.mark.parametrize(
    ("name", "change", "named"),
    [
        ("MobileCLIP-S2", {"timm_pool": "token"}, r"timm_pool='token' \(expected 'avg'\)"),
        ("MobileCLIP-S2", {"timm_proj": "linear"}, "timm_proj='linear'"),
        ("MobileCLIP-S2", {"timm_model_args": {"num_classes": 7}}, "timm_model_args.num_classes"),
        ("MobileCLIP-S2", {"timm_model_args": {"fork_feat": True}}, "fork_feat=True"),
        ("MobileCLIP-B", {"timm_pool": "map"}, "timm_pool='map'"),
        ("MobileCLIP-B", {"image_size": 256}, r"img_size=\(224, 224\)"),
    ],
)
def test_what_a_mobileclip_tower_cannot_be_is_named(name, change, named):
    cfg = copy.deepcopy(open_clip.get_model_config(name))
    cfg["vision_cfg"].update(change)
    with pytest.raises(ValueError, match=named):
        CLIPConfig.from_open_clip(cfg)


@pytest.mark.parametrize("name", list(CASES))
def test_open_clip_folder_unfolded_folded_and_saved(tmp_path, reference, name):
    ref = reference(name)
    images, tokens = _inputs(name)
    with torch.no_grad():
        ref_image, ref_text = ref.encode_image(images), ref.encode_text(tokens)
    assert (ref_image[0] - ref_image[1]).abs().max() > 0.1  # the images tell apart
    ours = create_model(str(_folder(tmp_path, name, ref.state_dict())))
    v = ours.config.vision
    stem = v.fastvit if v.fastvit is not None else v.mci
    assert not stem["inference_mode"]
    with torch.no_grad():
        assert_close(ours.encode_image(images), ref_image, **TOL)
        assert_close(ours.encode_text(tokens), ref_text, **TOL)

    assert ours.visual.reparameterize() is ours.visual  # the one switch: fold for inference
    stem = v.fastvit if v.fastvit is not None else v.mci
    assert stem["inference_mode"] and ours.config.vision is v  # (the model's config records it)
    leftovers = [n for n, m in ours.visual.named_modules() if isinstance(m, nn.BatchNorm2d)]
    assert not leftovers
    with torch.no_grad():
        folded = ours.encode_image(images)
        assert_close(folded, ref_image, **TOL)
        assert_close(ours.encode_text(tokens), ref_text, **TOL)
        # timm's own reparameterization of open_clip's tower gives ours folded
        assert_close(reparameterize_model(ref.visual)(images), folded, **TOL)

    saved = save_pretrained(ours, tmp_path / "folded")
    meta = json.loads((saved / "open_clip_config.json").read_text(encoding="utf-8"))
    assert meta["model_cfg"]["vision_cfg"]["timm_model_args"] == {
        **CASES[name][0], "inference_mode": True,
    }  # fmt: skip
    back = create_model(str(saved))
    assert back.config == ours.config
    assert back.state_dict().keys() == ours.state_dict().keys()
    assert all(torch.equal(back.state_dict()[k], t) for k, t in ours.state_dict().items())
    with torch.no_grad():
        assert torch.equal(back.encode_image(images), folded)


def test_timm_reparameterized_checkpoint_loads_folded(tmp_path, reference):
    """open_clip's model after timm's ``reparameterize_model`` (``reparam_conv`` blocks, its
    ConvMlp / attention BatchNorms and layer scales kept) loads into a folded tower, folded
    the rest of the way; a layout that is not the model's is refused naming the fix."""
    ref = reference("MobileCLIP-S2")
    images, _ = _inputs("MobileCLIP-S2")
    timm_folded = reparameterize_model(ref)
    sd = timm_folded.state_dict()
    assert any(".reparam_conv." in k for k in sd) and any(".mlp.conv.bn." in k for k in sd)
    path = tmp_path / "reparameterized.safetensors"
    save_file({k: t.contiguous() for k, t in sd.items()}, str(path))
    layers = {"layers": (1, 1, 1, 1)}
    text = {"layers": TEXT_LAYERS, "vocab_size": SMALL_VOCAB}
    fused = {"image_size": 64, "fastvit": {**layers, "inference_mode": True}}
    folded = create_model("MobileCLIP-S2", pretrained=str(path), text=text, vision=fused)
    with torch.no_grad():
        assert_close(folded.encode_image(images), ref.encode_image(images), **TOL)
    with pytest.raises(CheckpointError, match=r"reparameterized.*inference_mode': True"):
        create_model("MobileCLIP-S2", pretrained=str(path), text=text,
                     vision={"image_size": 64, "fastvit": layers})  # fmt: skip
    unfolded = _folder(tmp_path, "MobileCLIP-S2", ref.state_dict()) / "open_clip_model.safetensors"
    with pytest.raises(CheckpointError, match=r"multi-branch.*model\.visual\.reparameterize\(\)"):
        create_model("MobileCLIP-S2", pretrained=str(unfolded), text=text, vision=fused)


def test_hostile_pickle_is_refused(torchscript_payload, tmp_path):
    """A TorchScript archive that would write a marker when run, as a MobileCLIP folder's
    weights or as ``pretrained=``: refused, never run."""
    archive, marker = torchscript_payload
    folder = tmp_path / "evil"
    folder.mkdir()
    (folder / "open_clip_pytorch_model.bin").write_bytes(archive.read_bytes())
    meta = {"model_cfg": _config("MobileCLIP-S2")}
    (folder / "open_clip_config.json").write_text(json.dumps(meta), encoding="utf-8")
    for call in (
        lambda: create_model(str(folder)),
        lambda: create_model(f"local-dir:{folder}"),
        lambda: create_model(
            "MobileCLIP2-S0", pretrained=str(folder / "open_clip_pytorch_model.bin")
        ),
    ):
        with pytest.raises(WeightsError) as err:
            call()
        assert "weights_only=False" not in str(err.value)
        assert not marker.exists(), "the archive's code ran"


def test_folded_mobileclip_exports_to_onnx_and_openvino(tmp_path):
    """A folded MobileCLIP image tower (tiny, narrow, random BatchNorm statistics) through
    ``attn_clip.export``: ONNX with its onnxruntime check at 1e-4, no BatchNormalization
    left in the graph, and the same graph compiled by OpenVINO within 1e-4. (The text tower
    is every CLIP's: tests/scripts/test_export.py.)"""
    for module in ("onnx", "onnxscript", "onnxruntime", "openvino"):
        pytest.importorskip(module)
    import onnx
    from attn_clip import export

    cfg = get_model_config("MobileCLIP-S2")
    fastvit = {**cfg.vision.fastvit, "layers": (1, 1, 1, 1), "embed_dims": (8, 16, 32, 64)}
    vision = replace(cfg.vision, image_size=64, fastvit=fastvit)
    text = replace(cfg.text, width=32, heads=2, layers=1, context_length=16)
    torch.manual_seed(0)
    model = create_model(replace(cfg, embed_dim=24, vision=vision, text=text))
    _batchnorm_statistics(model, 64).visual.reparameterize()
    diffs = export.export_onnx(model, tmp_path, towers=("image",), verbose=False)
    assert set(diffs) == {"image batch 3", "image batch 1"} and max(diffs.values()) <= 1e-4
    ops = {node.op_type for node in onnx.load(str(tmp_path / "image.onnx")).graph.node}
    assert "Conv" in ops and "Softmax" in ops and "BatchNormalization" not in ops
    compiled = export.OpenVINOTower(export.compile_openvino(tmp_path / "image.onnx", 1))
    diffs = export.check_runtime(model, {"image": compiled}, "openvino", verbose=False)
    assert max(diffs.values()) <= 1e-4
    images, _ = export.example_inputs(model, 2)
    with torch.no_grad():
        assert model.encode_image(images).abs().max() > 0.1  # (the check saw a signal)
