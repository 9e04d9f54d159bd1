"""One CLIP, four implementations with identical random weights, shared by the ``image``,
``text``, ``zeroshot`` and ``compile`` sections; and one random CLIP with its ONNX graphs,
exported once per process, shared by ``engines``, ``engines-alone`` and the investigations.

transformers builds a random ``CLIPModel`` -> ours through our converter -> open_clip
through ``to_open_clip`` -> timm's ``vit_base_patch32_clip_224`` through timm's own
open_clip converter (``checkpoint_filter_fn``)."""

from __future__ import annotations

import atexit
import copy
import functools
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from benchmarks.harness import random_fill_

TINY_OC_CFG = {  # --quick: a CLIP small enough to build and run in a second
    "embed_dim": 32,
    "vision_cfg": {"image_size": 32, "patch_size": 8, "width": 64, "layers": 2, "head_width": 16},
    "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 48, "heads": 4, "layers": 2},
}


def random_clip(config: Any) -> Any:
    """Our CLIP of ``config`` with the same random weights in every process and call (seed 0,
    ``random_fill_``), in eval mode: what ``engines``, ``engines-alone`` and the
    investigations time, and what their ONNX graphs are exported from."""
    from attn_clip import create_model

    torch.manual_seed(0)
    with torch.no_grad():
        return random_fill_(create_model(config)).eval()


def random_clip_config(quick: bool, name: str = "ViT-B-32") -> Any:
    """The ``attn_clip.CLIPConfig`` of ``name`` (``quick``: the tiny CLIP)."""
    from attn_clip import CLIPConfig, get_model_config

    return CLIPConfig.from_open_clip(TINY_OC_CFG) if quick else get_model_config(name)


def random_clip_onnx(quick: bool, name: str = "ViT-B-32") -> tuple[Any, Path]:
    """``random_clip`` of ``name`` (``quick``: the tiny CLIP) and a folder with the ONNX graphs
    ``attn_clip.export.export_onnx`` writes of its towers (``image.onnx``, ``text.onnx``).

    Made once per process and shared (sections run in one process export once; the folder is
    removed at exit or by ``forget_exports``): use the model read-only."""
    return _exported_clip("tiny" if quick else name)


_EXPORT_FOLDERS: list[Path] = []


@atexit.register
def forget_exports() -> None:
    """Remove the folders ``random_clip_onnx`` exported and forget its models (at exit, and
    after each test file that ran sections, so a test worker does not hold them to its end)."""
    _exported_clip.cache_clear()
    while _EXPORT_FOLDERS:
        shutil.rmtree(_EXPORT_FOLDERS.pop(), ignore_errors=True)


@functools.cache
def _exported_clip(name: str) -> tuple[Any, Path]:
    from attn_clip import export as ex

    folder = Path(tempfile.mkdtemp(prefix="attn-zoo-bench-onnx-"))
    _EXPORT_FOLDERS.append(folder)
    # not under inference_mode (run.py's sections run there): inference tensors cannot export
    with torch.inference_mode(False), torch.no_grad():
        model = random_clip(random_clip_config(name == "tiny", name))
        ex.export_onnx(model, folder, verbose=False)
    return model, folder


def ours_and_openvino_image(quick: bool) -> tuple[Any, Any]:
    """``random_clip_onnx``'s CLIP ViT-B/32 (``quick``: the tiny one), shared: read-only, and
    OpenVINO's model of its image tower (``openvino.Model``, not compiled)."""
    import openvino as ov

    ours, folder = random_clip_onnx(quick)
    return ours, ov.convert_model(str(folder / "image.onnx"))


def hf_config(oc_cfg: dict[str, Any]) -> Any:
    """A transformers CLIPConfig with the architecture of an open_clip model config."""
    from transformers import CLIPConfig as HFCLIPConfig

    v, t = oc_cfg["vision_cfg"], oc_cfg["text_cfg"]
    return HFCLIPConfig(
        text_config=dict(
            vocab_size=t.get("vocab_size", 49408),
            hidden_size=t["width"],
            intermediate_size=int(t["width"] * t.get("mlp_ratio", 4.0)),
            num_hidden_layers=t["layers"],
            num_attention_heads=t["heads"],
            max_position_embeddings=t["context_length"],
            hidden_act="gelu",
            eos_token_id=2,  # legacy id: pool at argmax, as open_clip does
        ),
        vision_config=dict(
            hidden_size=v["width"],
            intermediate_size=int(v["width"] * v.get("mlp_ratio", 4.0)),
            num_hidden_layers=v["layers"],
            num_attention_heads=v["width"] // v.get("head_width", 64),
            image_size=v["image_size"],
            patch_size=v["patch_size"],
            hidden_act="gelu",
        ),
        projection_dim=oc_cfg["embed_dim"],
    )


@dataclass
class ClipModels:
    cfg: dict[str, Any]  # the open_clip model config
    ours: Any
    open_clip: Any
    hf: Any
    timm: Any | None


def build_clip_models(quick: bool, with_timm: bool = True) -> ClipModels:
    """ViT-B/32 (tiny with ``quick``) as ours, open_clip, transformers and (image tower) timm."""
    import open_clip
    import transformers
    from attn_clip import CLIPConfig, create_model, load_checkpoint, to_open_clip

    torch.manual_seed(0)
    cfg = copy.deepcopy(TINY_OC_CFG) if quick else open_clip.get_model_config("ViT-B-32")
    try:
        from transformers.initialization import no_init_weights
    except ImportError:  # transformers 4.x
        from transformers.modeling_utils import no_init_weights
    with no_init_weights():  # every weight is set right below
        hf = transformers.CLIPModel(hf_config(cfg))
    random_fill_(hf)
    ours = create_model(CLIPConfig.from_open_clip(cfg))
    load_checkpoint(ours, hf.state_dict())  # transformers -> ours (our converter)
    oc = open_clip.model.CLIP(**copy.deepcopy(cfg)).eval()
    oc.load_state_dict(to_open_clip(ours.state_dict()))  # ours -> open_clip
    tm = None
    if with_timm:
        import timm
        from timm.models.vision_transformer import checkpoint_filter_fn

        v = cfg["vision_cfg"]
        tm = timm.create_model(
            "vit_base_patch32_clip_224",
            pretrained=False,
            num_classes=cfg["embed_dim"],
            img_size=v["image_size"],
            patch_size=v["patch_size"],
            embed_dim=v["width"],
            depth=v["layers"],
            num_heads=v["width"] // v.get("head_width", 64),
        ).eval()
        # open_clip -> timm: the filter timm applies to open_clip checkpoints when it loads them
        tm.load_state_dict(checkpoint_filter_fn(oc.state_dict(), tm))
    return ClipModels(cfg, ours, oc, hf, tm)


def ours_bf16(m: ClipModels) -> Any:
    """Ours with bf16 weights (``precision="bf16"``), loaded from the fp32 model."""
    from attn_clip import CLIPConfig, create_model, load_checkpoint

    model = create_model(CLIPConfig.from_open_clip(m.cfg), precision="bf16")
    load_checkpoint(model, m.ours.state_dict())
    return model


def hf_image(hf: Any, x: torch.Tensor) -> torch.Tensor:
    """transformers' image features, as ``encode_image`` computes them."""
    return hf.visual_projection(hf.vision_model(pixel_values=x).pooler_output)


def hf_text(hf: Any, tokens: torch.Tensor) -> torch.Tensor:
    """transformers' text features, as ``encode_text`` computes them."""
    return hf.text_projection(hf.text_model(input_ids=tokens).pooler_output)


def prompts(classname: str) -> list[str]:
    """OpenAI's 80 ImageNet prompts for one class."""
    from attn_clip import OPENAI_IMAGENET_TEMPLATES

    return [t(classname) for t in OPENAI_IMAGENET_TEMPLATES]
