"""attn_clip: CLIP dual encoders on attn_core / attn_vision that load open_clip, OpenAI and
Hugging Face weights, with contrastive losses, zero-shot classification and retrieval (and
their evaluation), and WiSE-FT.

Names are imported on first use (``attn_clip.ClipLoss`` does not pull in open_clip,
torchvision or the model code), so worker processes and CLIs start quickly.
"""

# ruff: noqa: F401  (the TYPE_CHECKING imports below re-export __all__)
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "coca": ["CaptionDecoder", "CoCa", "CoCaOutput", "MultimodalDecoder"],
    "config": [
        "CLIPConfig",
        "CLIPTextConfig",
        "CLIPVisionConfig",
        "MultimodalConfig",
        "PreprocessConfig",
    ],
    "convert": [
        "convert_hf_clip",
        "convert_hf_siglip",
        "convert_open_clip",
        "detect_format",
        "to_open_clip",
    ],
    "explain": [
        "explain_image",
        "heatmap_overlay",
        "image_features_with_attention",
        "image_relevancy",
        "input_box",
        "save_explanation",
    ],
    "init": ["init_image_trunk_from", "init_vision_like_open_clip"],
    "factory": [
        "create_model",
        "create_model_and_transforms",
        "load_checkpoint",
        "save_config",
        "save_pretrained",
        "save_weights",
    ],
    "finetune": ["add_logit_bias", "wise_ft"],
    "loss": ["ClipLoss", "CoCaLoss", "SigLipLoss", "create_loss"],
    "model": ["CLIP", "CLIPOutput"],
    "pretrained": ["Checkpoint", "read_checkpoint"],
    "registry": [
        "PretrainedSource",
        "get_model_config",
        "get_pretrained_cfg",
        "list_models",
        "list_pretrained",
        "list_pretrained_tags",
    ],
    "hf_text": ["HFTextTower"],
    "languages": ["ISO_639_1", "NLLB_LANGUAGES", "language_code", "tokenizer_for_language"],
    "retrieval": [
        "EmbeddingIndex",
        "IndexBusyError",
        "IndexFormatError",
        "IndexModel",
        "RetrievalError",
        "RetrievalIndex",
        "SearchResult",
        "evaluate_retrieval",
        "index_lock",
        "load_index_set",
        "retrieval_metrics",
        "save_index_set",
    ],
    "text": ["TextTransformer"],
    "tokenizer": ["HFTokenizer", "Tokenizer", "get_tokenizer"],
    "transforms": ["image_transform"],
    "vision": ["CLIPVisionTower"],
    "zero_shot": [
        "IMAGENET_CLASSNAMES",
        "LABEL_ONLY",
        "OPENAI_IMAGENET_TEMPLATES",
        "SIMPLE_TEMPLATES",
        "build_zero_shot_classifier",
        "check_templates",
        "evaluate_zero_shot",
        "match_probability",
        "predict",
        "templates_for_language",
        "zero_shot_logits",
    ],
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}

__version__ = "0.1.0"
__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        value = getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'attn_clip' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)


if TYPE_CHECKING:  # the same names, eagerly, for type checkers and IDEs
    from .coca import CaptionDecoder, CoCa, CoCaOutput, MultimodalDecoder
    from .config import (
        CLIPConfig,
        CLIPTextConfig,
        CLIPVisionConfig,
        MultimodalConfig,
        PreprocessConfig,
    )
    from .convert import (
        convert_hf_clip,
        convert_hf_siglip,
        convert_open_clip,
        detect_format,
        to_open_clip,
    )
    from .explain import (
        explain_image,
        heatmap_overlay,
        image_features_with_attention,
        image_relevancy,
        input_box,
        save_explanation,
    )
    from .factory import (
        create_model,
        create_model_and_transforms,
        load_checkpoint,
        save_config,
        save_pretrained,
        save_weights,
    )
    from .finetune import add_logit_bias, wise_ft
    from .hf_text import HFTextTower
    from .init import init_image_trunk_from, init_vision_like_open_clip
    from .languages import ISO_639_1, NLLB_LANGUAGES, language_code, tokenizer_for_language
    from .loss import ClipLoss, CoCaLoss, SigLipLoss, create_loss
    from .model import CLIP, CLIPOutput
    from .pretrained import Checkpoint, read_checkpoint
    from .registry import (
        PretrainedSource,
        get_model_config,
        get_pretrained_cfg,
        list_models,
        list_pretrained,
        list_pretrained_tags,
    )
    from .retrieval import (
        EmbeddingIndex,
        IndexBusyError,
        IndexFormatError,
        IndexModel,
        RetrievalError,
        RetrievalIndex,
        SearchResult,
        evaluate_retrieval,
        index_lock,
        load_index_set,
        retrieval_metrics,
        save_index_set,
    )
    from .text import TextTransformer
    from .tokenizer import HFTokenizer, Tokenizer, get_tokenizer
    from .transforms import image_transform
    from .vision import CLIPVisionTower
    from .zero_shot import (
        IMAGENET_CLASSNAMES,
        LABEL_ONLY,
        OPENAI_IMAGENET_TEMPLATES,
        SIMPLE_TEMPLATES,
        build_zero_shot_classifier,
        check_templates,
        evaluate_zero_shot,
        match_probability,
        predict,
        templates_for_language,
        zero_shot_logits,
    )
