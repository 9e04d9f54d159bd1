"""attn_nlp: encoder-decoder Transformer, generation, Marian (opus-mt) weights, LM, classifier,
and Hugging Face text encoders: :mod:`attn_nlp.roberta` (RoBERTa / XLM-R), :mod:`attn_nlp.t5`
(T5 / mT5 encoder), :mod:`attn_nlp.m2m100` (M2M100 / NLLB encoder), each loading its hub folder
(``attn_nlp.create_model("xlm-roberta-base")``).

Every model is built from ``attn_core.TransformerBlock`` and attends through
``attn_core.attention``. Masks follow attn_core: ``key_padding_mask`` bool True = padding.
"""

from . import m2m100, roberta, t5
from .classifier import ClassifierConfig, TextClassifier
from .config import PRESETS, TransformerConfig, get_config, list_models
from .convert import config_from_hf_marian, convert_hf_marian, convert_torch_transformer
from .generation import GenerationConfig, generate
from .layers import LearnedPositionalEmbedding, SinusoidalPositionalEmbedding
from .lm import DecoderOnlyLM, LMConfig
from .model import Transformer, TransformerDecoder, TransformerEncoder
from .pretrained import create_model, resolve_checkpoint, save_pretrained
from .tokenizer import BPETokenizer, MarianTextTokenizer, load_tokenizer
from .translate import Translator, evaluate_translation, translate

__version__ = "0.1.0"

__all__ = [
    "PRESETS",
    "BPETokenizer",
    "ClassifierConfig",
    "DecoderOnlyLM",
    "GenerationConfig",
    "LMConfig",
    "LearnedPositionalEmbedding",
    "MarianTextTokenizer",
    "SinusoidalPositionalEmbedding",
    "TextClassifier",
    "Transformer",
    "TransformerConfig",
    "TransformerDecoder",
    "TransformerEncoder",
    "Translator",
    "config_from_hf_marian",
    "convert_hf_marian",
    "convert_torch_transformer",
    "create_model",
    "evaluate_translation",
    "generate",
    "get_config",
    "list_models",
    "load_tokenizer",
    "m2m100",
    "roberta",
    "t5",
    "resolve_checkpoint",
    "save_pretrained",
    "translate",
]
