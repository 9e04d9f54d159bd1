"""``create_model`` / ``create_model_and_transforms``: build a CLIP and load its weights.

Model names (the first argument):

* an open_clip architecture name (``"ViT-B-32"``; see :func:`attn_clip.list_models`),
  with ``pretrained=`` a tag (``"laion2b_s34b_b79k"``, ``"openai"``; see
  :func:`attn_clip.list_pretrained`) or a local checkpoint file / folder;
* ``"hf-hub:<repo id>"`` -- an open_clip hub repo (``open_clip_config.json``) or a
  transformers ``CLIPModel`` repo (``config.json``, e.g. ``openai/clip-vit-base-patch32``);
* ``"local-dir:<path>"`` or a folder path -- the same two layouts on disk;
* a :class:`CLIPConfig`;
* a bundled model (``"demo-shapes"``): its weights ship inside attn_clip, so
  ``create_model("demo-shapes", pretrained=True)`` works with no network.

What the weights were trained with wins over the name's defaults: the tag's QuickGELU
flag (``ViT-B-32`` + ``openai`` builds QuickGELU, where open_clip only warns), the
checkpoint's own config, and its preprocessing. An explicit ``quick_gelu=`` that
contradicts the weights raises, and so does any tensor that does not fit the config.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

import torch

from .config import CLIPConfig, PreprocessConfig
from .convert import check_state_dict, detect_format, to_attn_clip, to_open_clip
from .model import CLIP
from .pretrained import Checkpoint, download_pretrained, read_checkpoint, resolve_source
from .registry import (
    default_pretrained_tag,
    get_model_config,
    get_pretrained_cfg,
    list_pretrained_tags,
)
from .tokenizer import get_tokenizer
from .transforms import image_transform

__all__ = [
    "create_model",
    "create_model_and_transforms",
    "load_checkpoint",
    "save_pretrained",
]

PRECISIONS = {
    "fp32": torch.float32,
    "amp": torch.float32,  # fp32 weights; run under torch.autocast
    "amp_bf16": torch.float32,
    "fp16": torch.float16,
    "pure_fp16": torch.float16,
    "bf16": torch.bfloat16,
    "pure_bf16": torch.bfloat16,
}
HF_HUB_PREFIX, LOCAL_DIR_PREFIX = "hf-hub:", "local-dir:"
_RESAMPLE = {2: "bilinear", 3: "bicubic"}  # PIL resample codes in preprocessor_config.json


def _clean_tag(tag: str) -> str:
    """open_clip's tag normalisation: ``"LAION2B-s34B-b79K"`` -> ``"laion2b_s34b_b79k"``."""
    return tag.lower().replace("-", "_")


def _preprocess_from_open_clip(cfg: dict[str, Any] | None, size) -> PreprocessConfig:
    known = {f.name for f in fields(PreprocessConfig)}
    kw = {k: v for k, v in (cfg or {}).items() if k in known}
    kw.setdefault("size", size)
    return PreprocessConfig(**kw)


def _preprocess_from_hf(cfg: dict[str, Any] | None, size) -> PreprocessConfig:
    if not cfg:
        return PreprocessConfig(size=size)
    crop = cfg.get("crop_size", size)
    if isinstance(crop, dict):
        crop = (crop["height"], crop["width"]) if "height" in crop else crop["shortest_edge"]
    return PreprocessConfig(
        size=crop,
        mean=tuple(cfg.get("image_mean", PreprocessConfig.mean)),
        std=tuple(cfg.get("image_std", PreprocessConfig.std)),
        interpolation=_RESAMPLE.get(cfg.get("resample", 3), "bicubic"),
        resize_mode="shortest",
    )


def _config_from_checkpoint(ckpt: Checkpoint) -> tuple[CLIPConfig, PreprocessConfig]:
    if ckpt.open_clip_config is not None:
        oc = ckpt.open_clip_config
        config = CLIPConfig.from_open_clip(oc.get("model_cfg", oc))
        pre = _preprocess_from_open_clip(oc.get("preprocess_cfg"), config.vision.image_size)
        return config, pre
    if ckpt.hf_config is not None:
        config = CLIPConfig.from_hf(ckpt.hf_config)
        return config, _preprocess_from_hf(ckpt.preprocessor_config, config.vision.image_size)
    raise ValueError(
        f"{ckpt.path} has no config (open_clip_config.json or config.json); pass an "
        "architecture name, e.g. create_model('ViT-B-32', pretrained=<path>)"
    )


def _download_hub(repo_id: str, **hub_kwargs: Any) -> Checkpoint:
    """Fetch an open_clip hub repo, or else a transformers CLIPModel repo, into a Checkpoint."""
    try:
        cfg_path = download_pretrained(repo_id, ["open_clip_config.json"], **hub_kwargs)
    except OSError:
        cfg_path = None
    if cfg_path is not None:
        weights = download_pretrained(
            repo_id, ["open_clip_model.safetensors", "open_clip_pytorch_model.bin"], **hub_kwargs
        )
        ckpt = read_checkpoint(weights)
        ckpt.open_clip_config = json.loads(Path(cfg_path).read_text(encoding="utf-8"))
        return ckpt
    cfg_path = download_pretrained(repo_id, ["config.json"], **hub_kwargs)
    weights = download_pretrained(repo_id, ["model.safetensors", "pytorch_model.bin"], **hub_kwargs)
    ckpt = read_checkpoint(weights)
    ckpt.hf_config = json.loads(Path(cfg_path).read_text(encoding="utf-8"))
    try:
        pre = download_pretrained(repo_id, ["preprocessor_config.json"], **hub_kwargs)
        ckpt.preprocessor_config = json.loads(Path(pre).read_text(encoding="utf-8"))
    except OSError:
        pass
    return ckpt


def _implied_quick_gelu(ckpt: Checkpoint | None, tag_quick_gelu: bool | None) -> bool | None:
    """The activation the weights were trained with, when the checkpoint tells."""
    if tag_quick_gelu is not None:
        return tag_quick_gelu
    if ckpt is None:
        return None
    if ckpt.kind == "torchscript":
        return True  # OpenAI's own archives: every one was trained with QuickGELU
    if ckpt.hf_config is not None or ckpt.open_clip_config is not None:
        return _config_from_checkpoint(ckpt)[0].quick_gelu
    return None


def load_checkpoint(
    model: CLIP, checkpoint: Checkpoint | Mapping[str, torch.Tensor] | str | os.PathLike
) -> CLIP:
    """Convert a checkpoint (file, folder or state dict; any supported format) and load it
    strictly into ``model``; raises ``ValueError`` listing every mismatch."""
    if isinstance(checkpoint, Checkpoint):
        state_dict = checkpoint.state_dict
    elif isinstance(checkpoint, Mapping):
        state_dict = dict(checkpoint)
    else:
        state_dict = read_checkpoint(checkpoint).state_dict
    sd = to_attn_clip(state_dict, detect_format(state_dict))
    expected = model.state_dict()
    sd = check_state_dict(sd, expected)
    sd = {k: v.to(expected[k].dtype) for k, v in sd.items()}  # OpenAI archives are fp16
    model.load_state_dict(sd, strict=True)
    return model


def _bundled_file(source) -> Path:
    path = Path(source.file)
    if not path.is_file():
        raise FileNotFoundError(
            f"the bundled weights of {source.model}:{source.tag} are missing ({path}); "
            "reinstall attn-clip, or train them with scripts/train_clip.py (docs/training.md) "
            "and pass pretrained=<path>"
        )
    return path


def create_model(
    model_name: str | CLIPConfig,
    pretrained: str | os.PathLike | bool | None = None,
    *,
    device: str | torch.device | None = None,
    precision: str = "fp32",
    quick_gelu: bool | None = None,
    cache_dir: str | os.PathLike | None = None,
    local_files_only: bool = False,
) -> CLIP:
    """Build a :class:`CLIP` (see the module docstring for names) and load its weights.

    Args:
        model_name: architecture name, ``hf-hub:`` / ``local-dir:`` name, folder or config.
        pretrained: a pretrained tag of ``model_name``, or a checkpoint file / folder;
            ``True`` = a bundled model's own weights (``"demo-shapes"``).
        device: where to put the model.
        precision: ``fp32`` / ``amp`` / ``amp_bf16`` (fp32 weights), ``fp16`` /
            ``pure_fp16``, ``bf16`` / ``pure_bf16`` (weights cast).
        quick_gelu: force QuickGELU (True) or GELU (False); default: what the weights say.
        cache_dir, local_files_only: passed to the hub download.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {sorted(PRECISIONS)}, got {precision!r}")
    hub_kwargs = {"cache_dir": cache_dir, "local_files_only": local_files_only}
    ckpt: Checkpoint | None = None
    preprocess: PreprocessConfig | None = None
    tag_quick_gelu: bool | None = None

    if isinstance(model_name, CLIPConfig):
        config = model_name
    else:
        name = str(model_name)
        from_schema = None
        if name.startswith(HF_HUB_PREFIX):
            from_schema = _download_hub(name[len(HF_HUB_PREFIX) :], **hub_kwargs)
        elif name.startswith(LOCAL_DIR_PREFIX) or os.path.isdir(name):
            from_schema = read_checkpoint(name.removeprefix(LOCAL_DIR_PREFIX))
        if from_schema is not None:
            if pretrained is not None:
                raise ValueError(
                    f"{name!r} brings its own weights; do not pass pretrained={pretrained!r}"
                )
            ckpt = from_schema
            config, preprocess = _config_from_checkpoint(ckpt)
        elif os.path.isfile(name):
            raise ValueError(
                f"{name!r} is a file: pass an architecture name and the file as pretrained=, "
                f"e.g. create_model('ViT-B-32', pretrained={name!r})"
            )
        else:
            config = get_model_config(name)

    if pretrained is False:
        pretrained = None
    if pretrained is True:
        default = default_pretrained_tag(model_name) if isinstance(model_name, str) else None
        if default is None:
            tags = list_pretrained_tags(model_name) if isinstance(model_name, str) else []
            raise ValueError(
                f"pretrained=True needs a model with bundled weights (e.g. 'demo-shapes'); "
                f"pass one of the tags of {model_name!r} ({tags or 'none'}) or a path"
            )
        pretrained = default
    if pretrained is not None:
        tags = list_pretrained_tags(model_name) if isinstance(model_name, str) else []
        if isinstance(pretrained, str) and _clean_tag(pretrained) in tags:
            source = get_pretrained_cfg(model_name, _clean_tag(pretrained))
            if source.file:
                ckpt = read_checkpoint(_bundled_file(source))
            else:
                ckpt = read_checkpoint(resolve_source(source, **hub_kwargs))
            preprocess, tag_quick_gelu = source.preprocess, source.quick_gelu
        elif os.path.exists(pretrained):
            ckpt = read_checkpoint(pretrained)
        else:
            raise ValueError(
                f"pretrained={str(pretrained)!r} is neither an existing file/folder nor a tag of "
                f"{model_name!r} (tags: {tags or 'none'})"
            )

    implied = _implied_quick_gelu(ckpt, tag_quick_gelu)
    if quick_gelu is not None and implied is not None and quick_gelu != implied:
        raise ValueError(
            f"quick_gelu={quick_gelu} contradicts the weights, which were trained with "
            f"{'QuickGELU' if implied else 'GELU'}; the outputs would be wrong. Drop "
            "quick_gelu= (or use the matching '-quickgelu' architecture name)."
        )
    want = quick_gelu if quick_gelu is not None else implied
    if want is not None and want != config.quick_gelu:
        config = config.with_act(want)

    if ckpt is not None:
        with torch.device("meta"):  # skip the random init the weights would overwrite
            model = CLIP(config)
        model.to_empty(device="cpu")
        load_checkpoint(model, ckpt)
    else:
        model = CLIP(config)
    model.preprocess_cfg = preprocess or PreprocessConfig(size=config.vision.image_size)
    model.to(device=device, dtype=PRECISIONS[precision])
    return model.eval()


def create_model_and_transforms(
    model_name: str | CLIPConfig, pretrained: str | os.PathLike | None = None, **kwargs: Any
):
    """``(model, preprocess, tokenizer)``: the model, its inference transform and tokenizer."""
    model = create_model(model_name, pretrained, **kwargs)
    return model, image_transform(model.preprocess_cfg), get_tokenizer(model.config)


def save_pretrained(model: CLIP, directory: str | os.PathLike) -> Path:
    """Save in open_clip's folder layout (``open_clip_config.json`` + safetensors).

    Both ``attn_clip.create_model("local-dir:<dir>")`` and open_clip's
    ``create_model("local-dir:<dir>")`` load it. Files are written atomically.
    """
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    sd = {k: v.detach().cpu().contiguous() for k, v in to_open_clip(model.state_dict()).items()}
    meta = {
        "model_cfg": model.config.to_open_clip(),
        "preprocess_cfg": asdict(model.preprocess_cfg),
    }
    for name, write in (
        ("open_clip_model.safetensors", lambda p: save_file(sd, p)),
        ("open_clip_config.json", lambda p: Path(p).write_text(json.dumps(meta, indent=2))),
    ):
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{name}.")
        os.close(fd)
        try:
            write(tmp)
            os.replace(tmp, directory / name)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    return directory
