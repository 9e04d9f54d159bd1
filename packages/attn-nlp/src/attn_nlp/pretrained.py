"""``create_model`` / ``save_pretrained``: presets, Marian (opus-mt) checkpoints, our own folders.

The zoo-wide loading contract (docs/loading.md), for attn_nlp:

* ``create_model("transformer-base", src_vocab_size=8000)`` -- a preset with random weights
  (``pretrained=<file>`` loads a state dict of ours into it);
* ``create_model("Helsinki-NLP/opus-mt-en-zh")`` -- a Hub repo id, downloaded (cached) and
  converted; ``create_model("runs/numbers/last")`` -- a local folder. Such names bring their
  own weights; ``pretrained=False`` builds the architecture with random weights.

A checkpoint folder holds ``config.json`` and ``model.safetensors`` (or
``pytorch_model.bin``, sharded or not), read through :mod:`attn_core.hub` (tensors only,
checked). ``config.json``'s ``model_type`` says what it holds:

* ``"marian"`` -- a Hugging Face ``MarianMTModel`` (converted by :func:`convert_hf_marian`);
* ``"roberta"`` / ``"xlm-roberta"`` / ``"t5"`` / ``"mt5"`` / ``"m2m_100"`` -- a Hugging Face
  text encoder (``XLMRobertaModel``, ``MT5EncoderModel``, NLLB's encoder, ...), built by the
  module :mod:`attn_nlp.hf_configs` names; the hub ids open_clip uses (``xlm-roberta-base``,
  ``google/mt5-base``, ...) ship their architecture, so ``pretrained=False`` needs no network;
* ``"attn_nlp.transformer"`` / ``"attn_nlp.lm"`` / ``"attn_nlp.classifier"`` -- written by
  :func:`save_pretrained` (our training scripts).

Models are returned in eval mode. Failures raise :mod:`attn_core.hub`'s exceptions.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from attn_core import hub
from torch import nn

from .config import PRESETS, TransformerConfig, get_config
from .convert import config_from_hf_marian, convert_hf_marian
from .generation import GenerationConfig
from .hf_configs import ENCODER_MODULES, encoder_module, hf_config, known_hf_models
from .model import Transformer

__all__ = ["create_model", "resolve_checkpoint", "save_pretrained"]

MODEL_TYPES = (
    "marian",
    "attn_nlp.transformer",
    "attn_nlp.lm",
    "attn_nlp.classifier",
    *ENCODER_MODULES,
)
OPTIONAL_FILES = (
    "generation_config.json",
    # Marian (sentencepiece) tokenizer
    "source.spm",
    "target.spm",
    "vocab.json",
    "target_vocab.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    # our own checkpoints (tokenizers BPE), Hugging Face fast tokenizers
    "tokenizer.json",
    # RoBERTa byte-BPE, XLM-R / NLLB / mT5 sentencepiece
    "merges.txt",
    "sentencepiece.bpe.model",
    "spiece.model",
)


def _is_repo_id(name: str) -> bool:
    if name in known_hf_models():  # legacy ids without an owner: "xlm-roberta-base"
        return True
    return name.count("/") == 1 and not name.startswith((".", "/", "~"))


def resolve_checkpoint(
    name_or_path: str | os.PathLike,
    *,
    cache_dir: str | os.PathLike | None = None,
    revision: str | None = None,
    local_files_only: bool = False,
) -> Path:
    """A local checkpoint folder for ``name_or_path``: a folder, or a Hub repo id whose
    ``config.json``, weights and tokenizer files are fetched (cached) by :mod:`attn_core.hub`."""
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise hub.WeightsUnavailableError(f"{path} is a folder but has no config.json")
        return path
    name = str(name_or_path)
    if path.exists() or not _is_repo_id(name):
        raise hub.WeightsUnavailableError(
            f"unknown model {name!r}: not a preset ({', '.join(sorted(PRESETS))}), a checkpoint "
            "folder (with config.json) nor a Hub repo id like 'Helsinki-NLP/opus-mt-en-zh'"
        )
    kw = {"cache_dir": cache_dir, "revision": revision, "local_files_only": local_files_only}
    config = hub.download(name, "config.json", **kw)
    hub.download(name, hub.WEIGHT_FILES, **kw)
    for filename in OPTIONAL_FILES:
        try:
            hub.download(name, filename, **{**kw, "local_files_only": True})
        except hub.WeightsUnavailableError:  # not cached yet: fetch it unless offline
            if not local_files_only:
                try:
                    hub.download(name, filename, **kw)
                except hub.WeightsUnavailableError:
                    pass  # optional: this repo has no such file
    return config.parent


def _read_config(directory: Path) -> dict[str, Any]:
    try:
        config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise hub.CheckpointError(f"cannot read {directory / 'config.json'}: {e}") from None
    if not isinstance(config, dict) or config.get("model_type") not in MODEL_TYPES:
        kind = config.get("model_type") if isinstance(config, dict) else None
        raise hub.CheckpointError(
            f"{directory}: model_type {kind!r} is not supported; expected one of {MODEL_TYPES}"
        )
    return config


def _build(config: dict[str, Any], overrides: dict[str, Any]) -> nn.Module:
    """The (randomly initialised) model a checkpoint's ``config.json`` describes."""
    kind = config["model_type"]
    fields = {k: v for k, v in config.items() if k != "model_type"}
    if kind == "marian":
        cfg = config_from_hf_marian(config)
        return Transformer(dataclasses.replace(cfg, **overrides) if overrides else cfg)
    if kind in ENCODER_MODULES:
        module = encoder_module(kind)
        if kind.startswith("attn_nlp."):
            cfg = module.Config.from_dict({**fields, **overrides})
        else:
            cfg = module.config_from_hf(config)
            cfg = module.Config.from_dict({**cfg.to_dict(), **overrides}) if overrides else cfg
        return module.Encoder(cfg)
    if kind == "attn_nlp.transformer":
        return Transformer(TransformerConfig.from_dict({**fields, **overrides}))
    if kind == "attn_nlp.lm":
        from .lm import DecoderOnlyLM, LMConfig

        return DecoderOnlyLM(LMConfig.from_dict({**fields, **overrides}))
    from .classifier import ClassifierConfig, TextClassifier

    return TextClassifier(ClassifierConfig.from_dict({**fields, **overrides}))


def _generation_config(directory: Path, model: Transformer) -> GenerationConfig:
    """Checkpoint settings on top of the model's token ids (which fill any gap)."""
    base = model.generation_config.to_dict()
    loaded = GenerationConfig.from_pretrained(directory).to_dict()
    defaults = GenerationConfig().to_dict()
    changed = {k: v for k, v in loaded.items() if v != defaults[k]}
    return GenerationConfig(**{**base, **changed})


def _load_folder(directory: Path, weights: bool, overrides: dict[str, Any]) -> nn.Module:
    config = _read_config(directory)
    model = _build(config, overrides)
    if weights:
        state = hub.read_folder(directory)
        kind = config["model_type"]
        if kind == "marian":
            state = convert_hf_marian(state, model.config)
        elif kind in ENCODER_MODULES and not kind.startswith("attn_nlp."):
            state = encoder_module(kind).convert_hf(state, model.config)
        hub.load_state_dict(model, state, source=str(directory))
    if isinstance(model, Transformer):
        model.generation_config = _generation_config(directory, model)
    return model


def save_pretrained(
    model: nn.Module,
    directory: str | os.PathLike,
    *,
    tokenizer: Any = None,
    generation_config: GenerationConfig | None = None,
) -> Path:
    """Write ``config.json`` + ``model.safetensors`` (+ tokenizer, generation settings), each
    atomically; ``create_model(directory)`` loads it back exactly."""
    from .classifier import TextClassifier
    from .lm import DecoderOnlyLM

    kinds = {
        Transformer: "attn_nlp.transformer",
        DecoderOnlyLM: "attn_nlp.lm",
        TextClassifier: "attn_nlp.classifier",
    }
    kind = kinds.get(type(model), getattr(type(model), "model_type", None))
    if kind is None:
        raise TypeError(f"cannot save a {type(model).__name__}")
    directory = Path(directory)
    hub.save_state_dict(model.state_dict(), directory / "model.safetensors")
    hub.write_json(directory / "config.json", {"model_type": kind, **model.config.to_dict()})
    gen = generation_config or getattr(model, "generation_config", None)
    if gen is not None:
        hub.write_json(directory / "generation_config.json", gen.to_dict())
    if tokenizer is not None:
        tokenizer.save(directory)
    return directory


def create_model(
    name_or_path: str | os.PathLike,
    pretrained: bool | str | os.PathLike | None = None,
    *,
    cache_dir: str | os.PathLike | None = None,
    local_files_only: bool = False,
    **overrides: Any,
) -> nn.Module:
    """A model by preset name, Hub repo id or local checkpoint folder (eval mode, CPU).

    Args:
        name_or_path: a preset (:func:`attn_nlp.list_models`), a Hub repo id or a folder.
        pretrained: for a repo / folder: ``None`` / ``True`` load its weights, ``False``
            builds its architecture with random weights. For a preset: ``None`` / ``False``
            = random weights, or a path to a state-dict file of ours to load.
        cache_dir, local_files_only: passed to the hub download.
        **overrides: config fields (e.g. ``src_vocab_size=8000``, ``dropout=0.0``).

    Raises :class:`attn_core.hub.WeightsError` subclasses when a checkpoint cannot be found,
    fetched or loaded, ``ValueError`` for unknown config fields.
    """
    name = str(name_or_path)
    if pretrained is False and hf_config(name) is not None:  # shipped architecture, no network
        return _build(hf_config(name), overrides).eval()
    if name in PRESETS:
        model = Transformer(get_config(name, **overrides))
        if pretrained is True:
            raise ValueError(
                f"preset {name!r} has no published weights; pass pretrained=<path to a "
                "model.safetensors of ours>, or a Hub repo id / checkpoint folder as the name"
            )
        if pretrained not in (None, False):
            hub.load_state_dict(model, hub.read_state_dict(pretrained), source=str(pretrained))
        return model.eval()
    if pretrained not in (None, True, False):
        raise ValueError(
            f"{name!r} brings its own weights; pass pretrained=None/True (load them) or False "
            f"(architecture only), not {pretrained!r}"
        )
    directory = resolve_checkpoint(name, cache_dir=cache_dir, local_files_only=local_files_only)
    return _load_folder(directory, pretrained is not False, overrides).eval()
