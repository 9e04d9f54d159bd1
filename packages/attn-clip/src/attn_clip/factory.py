"""``create_model`` / ``create_model_and_transforms``: build a CLIP and load its weights.

Model names (the first argument):

* an open_clip architecture name (``"ViT-B-32"``; see :func:`attn_clip.list_models`),
  with ``pretrained=`` a tag (``"laion2b_s34b_b79k"``, ``"openai"``; see
  :func:`attn_clip.list_pretrained`) or a local checkpoint file / folder;
* ``"hf-hub:<repo id>"`` -- an open_clip hub repo (``open_clip_config.json``) or a
  transformers ``CLIPModel`` / ``SiglipModel`` / ``Siglip2Model`` repo (``config.json``, e.g.
  ``openai/clip-vit-base-patch32``, ``google/siglip-base-patch16-224``);
* ``"local-dir:<path>"`` or a folder path -- the same two layouts on disk;
* a :class:`CLIPConfig`;
* a bundled model (``"demo-shapes"``): its weights ship inside attn_clip, so
  ``create_model("demo-shapes", pretrained=True)`` works with no network.

``pretrained`` follows the zoo-wide contract (docs/loading.md): ``None`` / ``False`` = random
init (a folder or ``hf-hub:`` name brings its own weights unless ``pretrained=False``);
``True`` = the name's default tag; a tag; or a path to a checkpoint file / folder. Config
overrides (``embed_dim=``, ``vision={"image_size": 336}``, ``text={...}``) apply to the
architecture before weights are loaded. The model is returned in eval mode.

What the weights were trained with wins over the name's defaults: the tag's QuickGELU
flag (``ViT-B-32`` + ``openai`` builds QuickGELU, where open_clip only warns; a config that
says QuickGELU keeps it under a tag that does not, as open_clip builds it), the
checkpoint's own config, and its preprocessing. An explicit ``quick_gelu=`` that
contradicts the weights raises, and so does any tensor that does not fit the config.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from dataclasses import asdict, fields, replace
from pathlib import Path
from typing import Any

import torch
from attn_core import hub

from .config import (
    CLIPConfig,
    CLIPTextConfig,
    CLIPVisionConfig,
    MultimodalConfig,
    PreprocessConfig,
)
from .convert import detect_format, fit_to_model, to_attn_clip, to_open_clip
from .mobileclip import convert_trunk
from .model import CLIP
from .pretrained import (
    DIR_WEIGHTS,
    Checkpoint,
    download_hub_repo,
    read_checkpoint,
    resolve_source,
)
from .registry import (
    clean_tag,
    default_pretrained_tag,
    get_model_config,
    get_pretrained_cfg,
    list_pretrained_tags,
)
from .tokenizer import HF_SPECIAL_TOKENS, HF_TOKENIZER_CONFIG, HF_VOCAB_FILES, get_tokenizer
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


def _preprocess_from_open_clip(cfg: dict[str, Any] | None, size) -> PreprocessConfig:
    known = {f.name for f in fields(PreprocessConfig)}
    kw = {k: v for k, v in (cfg or {}).items() if k in known}
    kw.setdefault("size", size)
    return PreprocessConfig(**kw)


def _preprocess_from_hf(cfg: dict[str, Any] | None, size, model_type: str) -> PreprocessConfig:
    if model_type in ("siglip", "siglip2"):  # resized to the model's size, no crop
        cfg = cfg or {}
        resample = cfg.get("resample", 2 if model_type == "siglip2" else 3)  # the processors'
        return PreprocessConfig(
            size=size,
            mean=tuple(cfg.get("image_mean", (0.5, 0.5, 0.5))),
            std=tuple(cfg.get("image_std", (0.5, 0.5, 0.5))),
            interpolation=_RESAMPLE.get(resample, "bicubic"),
            resize_mode="squash",
        )
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
        model_type = ckpt.hf_config.get("model_type", "clip")
        pre = _preprocess_from_hf(ckpt.preprocessor_config, config.vision.image_size, model_type)
        return config, pre
    raise ValueError(
        f"{ckpt.path} has no config (open_clip_config.json or config.json); pass an "
        "architecture name, e.g. create_model('ViT-B-32', pretrained=<path>)"
    )


def _with_tokenizer_source(config: CLIPConfig, ckpt: Checkpoint, source: str) -> CLIPConfig:
    """Where a folder's / hub repo's text tokenizer comes from, as open_clip's
    ``get_tokenizer`` has it: a folder holding ``tokenizer_config.json`` when the config
    names a Hugging Face tokenizer; a transformers SigLIP folder or repo brings its own."""
    t = config.text
    hf = ckpt.hf_config or {}
    if not (t.hf_tokenizer_name or hf.get("model_type") in ("siglip", "siglip2")):
        return config
    if os.path.isdir(source):
        if not (Path(source) / "tokenizer_config.json").is_file():
            return config
        name = str(Path(source).resolve())
    elif t.hf_tokenizer_name:
        return config
    else:
        name = source  # the transformers repo id
    return replace(config, text=replace(t, hf_tokenizer_name=name))


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
    strictly into ``model`` (:func:`attn_core.hub.load_state_dict`: every mismatch listed in
    one :class:`~attn_core.hub.CheckpointError`, non-finite weights refused)."""
    if isinstance(checkpoint, Checkpoint):
        state_dict, source = checkpoint.state_dict, str(checkpoint.path)
    elif isinstance(checkpoint, Mapping):
        state_dict, source = dict(checkpoint), "state dict"
    else:
        state_dict, source = read_checkpoint(checkpoint).state_dict, str(checkpoint)
    try:
        sd = to_attn_clip(state_dict, detect_format(state_dict), text=model.config.text)
    except ValueError as e:
        raise hub.CheckpointError(f"{source}: {e}") from None
    # a FastViT tower (MobileCLIP): timm's reparameterized layout folded the rest of the way
    sd = convert_trunk(sd, model.config.vision, model.config.embed_dim)
    sd = fit_to_model(sd, model.state_dict())
    return hub.load_state_dict(model, sd, source=source)


def _fresh_buffer(owner: torch.nn.Module, name: str, buffer: torch.Tensor) -> torch.Tensor:
    """The value of non-persistent buffer ``name`` of module ``owner``, computed afresh."""
    from attn_core import AxialRotaryEmbedding

    if isinstance(owner, AxialRotaryEmbedding) and name.endswith(".inv_freq"):
        return AxialRotaryEmbedding(owner.dim, owner.base, owner.ref_grid, owner.grid_offset,
                                    owner.interleaved).inv_freq  # fmt: skip
    if type(owner).__module__ == "attn_vision.swin" and name.endswith(".relative_position_index"):
        from attn_vision.swin import relative_position_index

        return relative_position_index(owner.window_size)  # a Swin tower's window attention
    if type(owner).__module__ == "attn_nlp.m2m100" and name.endswith(".table"):
        from attn_nlp.m2m100 import SinusoidalPositions, sinusoidal_table

        if isinstance(owner, SinusoidalPositions):  # an NLLB text tower's positions
            return sinusoidal_table(buffer.shape[0], owner.dim, owner.padding_idx)
    raise RuntimeError(f"no rule computes the non-persistent buffer {name}")


def _compute_non_persistent_buffers(model: CLIP) -> None:
    """Fill the buffers no checkpoint holds, which a model built on the ``meta`` device
    and moved by ``to_empty`` has as uninitialized memory: the RoPE frequencies of an EVA02
    trunk (from a fresh :class:`~attn_core.AxialRotaryEmbedding`), the relative position
    index of a Swin trunk's window attention, the sinusoidal position table of an NLLB
    (M2M100) text tower. Any other such buffer is an error here rather
    than garbage in the outputs."""
    saved = set(model.state_dict())
    for name, buffer in model.named_buffers():
        if name in saved:
            continue
        owner = model.get_submodule(name.rpartition(".")[0])
        with torch.no_grad():
            buffer.copy_(_fresh_buffer(owner, name, buffer))


def _with_overrides(config: CLIPConfig, overrides: dict[str, Any]) -> CLIPConfig:
    """``config`` with top-level fields and ``vision={...}`` / ``text={...}`` /
    ``multimodal={...}`` fields replaced (a dict field is updated: ``vision={"convnext":
    {"depths": (1, 1, 2, 1)}}``; ``multimodal`` on a config without one starts from
    :class:`MultimodalConfig`'s defaults)."""
    top = {f.name for f in fields(CLIPConfig)}
    unknown = sorted(set(overrides) - top)
    sub = {"vision": CLIPVisionConfig, "text": CLIPTextConfig, "multimodal": MultimodalConfig}
    for key, cls in sub.items():
        value = overrides.get(key)
        if isinstance(value, Mapping):
            names = {f.name for f in fields(cls)}
            unknown += [f"{key}.{k}" for k in sorted(set(value) - names)]
    if unknown:
        raise ValueError(
            f"unknown CLIP config override(s): {', '.join(unknown)}; valid: {sorted(top)} "
            "(vision= / text= / multimodal= take a dict of their config's fields)"
        )
    for key in sub:
        if isinstance(overrides.get(key), Mapping):
            tower = getattr(config, key) or sub[key]()  # multimodal may be None
            fields_ = dict(overrides[key])
            for name, value in fields_.items():  # dict fields merge: convnext={"depths": ...}
                if isinstance(value, Mapping) and isinstance(getattr(tower, name), dict):
                    fields_[name] = {**getattr(tower, name), **value}
            if key == "text" and "hf_model_name" in fields_ and "hf_encoder" not in fields_:
                fields_["hf_encoder"] = None  # another Hugging Face model: its architecture
            overrides = {**overrides, key: replace(tower, **fields_)}
    return replace(config, **overrides)


def _model_class(config: CLIPConfig) -> type[CLIP]:
    """:class:`CLIP`, or :class:`~attn_clip.coca.CoCa` for a config with a multimodal
    decoder (imported only then: it brings attn_nlp's decoding loop)."""
    if not config.is_coca:
        return CLIP
    from .coca import CoCa

    return CoCa


def create_model(
    model_name: str | CLIPConfig,
    pretrained: str | os.PathLike | bool | None = None,
    *,
    device: str | torch.device | None = None,
    precision: str = "fp32",
    quick_gelu: bool | None = None,
    cache_dir: str | os.PathLike | None = None,
    local_files_only: bool = False,
    **overrides: Any,
) -> CLIP:
    """Build a :class:`CLIP` (see the module docstring for names) and load its weights.

    Args:
        model_name: architecture name, ``hf-hub:`` / ``local-dir:`` name, folder or config.
        pretrained: ``None`` / ``False`` (random init, or the weights a folder / ``hf-hub:``
            name brings; ``False`` skips those too), ``True`` (the default tag, e.g. a
            bundled model's weights), a pretrained tag of ``model_name``, or a checkpoint
            file / folder.
        device: where to put the model.
        precision: ``fp32`` / ``amp`` / ``amp_bf16`` (fp32 weights), ``fp16`` /
            ``pure_fp16``, ``bf16`` / ``pure_bf16`` (weights cast).
        quick_gelu: force QuickGELU (True) or GELU (False); default: what the weights say.
        cache_dir, local_files_only: passed to the hub download.
        **overrides: :class:`CLIPConfig` fields (``vision=`` / ``text=`` /
            ``multimodal=`` take dicts).

    Raises :class:`attn_core.hub.WeightsError` subclasses when weights cannot be had or do
    not fit, ``ValueError`` for unknown names, tags or overrides.
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
        if (
            name.startswith(HF_HUB_PREFIX)
            or name.startswith(LOCAL_DIR_PREFIX)
            or os.path.isdir(name)
        ):
            if pretrained not in (None, False):
                raise ValueError(
                    f"{name!r} brings its own weights; pass no pretrained= (or False for the "
                    f"architecture only), not {pretrained!r}"
                )
            if name.startswith(HF_HUB_PREFIX):
                source = name[len(HF_HUB_PREFIX) :]
                ckpt = download_hub_repo(source, **hub_kwargs)
            else:
                source = name.removeprefix(LOCAL_DIR_PREFIX)
                ckpt = read_checkpoint(source)
            config, preprocess = _config_from_checkpoint(ckpt)
            config = _with_tokenizer_source(config, ckpt, source)
            if pretrained is False:
                ckpt = None
            pretrained = None
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
        if isinstance(pretrained, str) and clean_tag(pretrained) in tags:
            source = get_pretrained_cfg(model_name, clean_tag(pretrained))
            ckpt = read_checkpoint(resolve_source(source, **hub_kwargs))
            preprocess, tag_quick_gelu = source.preprocess, source.quick_gelu
            # a config that says QuickGELU was trained with it, whatever the tag's default
            # flag says (roberta-ViT-B-32:laion2b_s12b_b32k: open_clip builds QuickGELU)
            tag_quick_gelu = tag_quick_gelu or config.quick_gelu
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
    if overrides:
        config = _with_overrides(config, overrides)

    model_cls = _model_class(config)
    if ckpt is not None:
        with torch.device("meta"):  # skip the random init the weights would overwrite
            model = model_cls(config, weight_init=False)
        model.to_empty(device="cpu")
        _compute_non_persistent_buffers(model)
        load_checkpoint(model, ckpt)
    else:
        model = model_cls(config)
    model.preprocess_cfg = preprocess or PreprocessConfig(size=config.vision.image_size)
    model.to(device=device, dtype=PRECISIONS[precision])
    return model.eval()


def create_model_and_transforms(
    model_name: str | CLIPConfig, pretrained: str | os.PathLike | None = None, **kwargs: Any
):
    """``(model, preprocess, tokenizer)``: the model, its inference transform and tokenizer."""
    model = create_model(model_name, pretrained, **kwargs)
    hub_kwargs = {k: kwargs[k] for k in ("cache_dir", "local_files_only") if k in kwargs}
    tokenizer = get_tokenizer(model.config, **hub_kwargs)
    return model, image_transform(model.preprocess_cfg), tokenizer


def save_pretrained(model: CLIP, directory: str | os.PathLike) -> Path:
    """Save in open_clip's folder layout (``open_clip_config.json`` + safetensors).

    Both ``attn_clip.create_model(<dir>)`` and open_clip's ``create_model("local-dir:<dir>")``
    load it (a Hugging Face text tower's config also holds its encoder's architecture,
    attn_clip's ``text_cfg.hf_encoder``, so that it loads with no network; open_clip refuses
    that key: without it, open_clip resolves ``hf_model_name`` itself). Each file is written
    atomically with the usual permissions.
    """
    directory = Path(directory)
    save_weights(model, directory / DIR_WEIGHTS[0])
    save_config(model, directory)
    return directory


def save_config(model: CLIP, directory: str | os.PathLike) -> Path:
    """Write ``open_clip_config.json`` (model and preprocess configs) into ``directory``,
    atomically: next to weights in any checkpoint folder, ``create_model(<dir>)`` loads it.
    A Hugging Face tokenizer read from a local folder is copied along (its
    ``tokenizer_config.json`` and vocabulary files), so the folder keeps working when the
    tokenizer's folder moves; ``create_model(<dir>)`` then reads it from ``<dir>``."""
    meta = {
        "model_cfg": model.config.to_open_clip(),
        "preprocess_cfg": asdict(model.preprocess_cfg),
    }
    _copy_tokenizer_files(model.config.text.hf_tokenizer_name, Path(directory))
    return hub.write_json(Path(directory) / "open_clip_config.json", meta)


def _copy_tokenizer_files(source: str | None, directory: Path) -> None:
    if not source or not (Path(source) / HF_TOKENIZER_CONFIG).is_file():
        return  # none, a hub id (cached by the hub), or a folder the loader would not use
    if Path(source).resolve() == directory.resolve():
        return
    for name in (HF_TOKENIZER_CONFIG, HF_SPECIAL_TOKENS, *HF_VOCAB_FILES, "merges.txt"):
        if (Path(source) / name).is_file():  # (not config.json: a model's, not ours)
            with hub.atomic_path(directory / name) as tmp:
                shutil.copyfile(Path(source) / name, tmp)


def save_weights(model: CLIP, path: str | os.PathLike, dtype: torch.dtype | None = None) -> Path:
    """Write the weights alone as one open_clip-keyed ``.safetensors`` file, atomically
    (what open_clip's ``create_model(name, pretrained=path)`` loads); ``dtype`` casts the
    floating-point tensors, e.g. ``torch.float16`` for a half-size export."""
    sd = model.state_dict()
    if dtype is not None:
        sd = {k: v.to(dtype) if v.is_floating_point() else v for k, v in sd.items()}
    return hub.save_state_dict(to_open_clip(sd, model.config.vision, model.config.text), path)
