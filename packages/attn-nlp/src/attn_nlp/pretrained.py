"""``create_model``: presets, Marian (opus-mt) checkpoints and our own saved models.

A checkpoint is a directory with ``config.json`` and ``model.safetensors`` (or
``pytorch_model.bin``, read with ``torch.load(weights_only=True)``). ``config.json`` says
what it holds:

* ``"model_type": "marian"`` -- a Hugging Face ``MarianMTModel`` (``save_pretrained`` or the
  Hub); converted with :func:`attn_nlp.convert.marian_to_ours`.
* ``"model_type": "attn_nlp.transformer"`` / ``"attn_nlp.lm"`` / ``"attn_nlp.classifier"`` --
  written by :func:`save_pretrained` (our training scripts).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .config import PRESETS, TransformerConfig, get_config
from .convert import marian_config_to_ours, marian_to_ours
from .generation import GenerationConfig
from .hub import WeightsNotFoundError, find_weights, resolve_checkpoint
from .model import Transformer

__all__ = ["create_model", "load_pretrained", "load_state_dict", "save_pretrained"]

MODEL_TYPES = ("marian", "attn_nlp.transformer", "attn_nlp.lm", "attn_nlp.classifier")


def load_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """Tensors of a ``.safetensors`` file, or of a ``.bin``/``.pt`` via ``weights_only=True``."""
    path = Path(path)
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path))
    state = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(state, dict):
        raise ValueError(f"{path} does not hold a state dict")
    return state


def _read_config(directory: Path) -> dict[str, Any]:
    try:
        config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise WeightsNotFoundError(f"cannot read {directory / 'config.json'}: {e}") from e
    if config.get("model_type") not in MODEL_TYPES:
        raise ValueError(
            f"{directory}: model_type {config.get('model_type')!r} is not supported; "
            f"expected one of {MODEL_TYPES}"
        )
    return config


def _generation_config(directory: Path, model: Transformer) -> GenerationConfig:
    """Checkpoint settings on top of the model's token ids (which fill any gap)."""
    base = model.generation_config.to_dict()
    loaded = GenerationConfig.from_pretrained(directory).to_dict()
    defaults = GenerationConfig().to_dict()
    changed = {k: v for k, v in loaded.items() if v != defaults[k]}
    return GenerationConfig(**{**base, **changed})


def load_pretrained(directory: str | Path) -> nn.Module:
    """Build and load the model saved in ``directory`` (eval mode, on CPU)."""
    directory = Path(directory)
    config = _read_config(directory)
    kind = config["model_type"]
    state = load_state_dict(find_weights(directory))
    if kind == "marian":
        cfg = marian_config_to_ours(config)
        model: nn.Module = Transformer(cfg)
        model.load_state_dict(marian_to_ours(state, cfg))
    else:
        model = _build_ours(kind, config)
        _load_ours(model, state, directory)
    if isinstance(model, Transformer):
        model.generation_config = _generation_config(directory, model)
    return model.eval()


def _build_ours(kind: str, config: dict[str, Any]) -> nn.Module:
    if kind == "attn_nlp.transformer":
        return Transformer(TransformerConfig.from_dict(config))
    if kind == "attn_nlp.lm":
        from .lm import DecoderOnlyLM, LMConfig

        return DecoderOnlyLM(LMConfig.from_dict(config))
    from .classifier import ClassifierConfig, TextClassifier

    return TextClassifier(ClassifierConfig.from_dict(config))


def _load_ours(model: nn.Module, state: dict[str, torch.Tensor], directory: Path) -> None:
    """Strict load that tolerates tied weights saved once (safetensors drops duplicates)."""
    missing, unexpected = model.load_state_dict(state, strict=False)
    params = dict(model.named_parameters(remove_duplicate=False))
    unique = {id(p) for n, p in params.items() if n in state}
    missing = [k for k in missing if not (k in params and id(params[k]) in unique)]
    if missing or unexpected:
        raise ValueError(
            f"weights in {directory} do not fit the model: missing {sorted(missing)}, "
            f"unexpected {sorted(unexpected)}"
        )


def save_pretrained(
    model: nn.Module,
    directory: str | Path,
    *,
    tokenizer: Any = None,
    generation_config: GenerationConfig | None = None,
) -> Path:
    """Write ``config.json`` + ``model.safetensors`` (+ tokenizer, generation settings)."""
    from safetensors.torch import save_model

    from .classifier import TextClassifier
    from .lm import DecoderOnlyLM

    kinds = {
        Transformer: "attn_nlp.transformer",
        DecoderOnlyLM: "attn_nlp.lm",
        TextClassifier: "attn_nlp.classifier",
    }
    kind = kinds.get(type(model))
    if kind is None:
        raise TypeError(f"cannot save a {type(model).__name__}")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    config = {"model_type": kind, **model.config.to_dict()}
    (directory / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    save_model(model, str(directory / "model.safetensors"))
    gen = generation_config or getattr(model, "generation_config", None)
    if gen is not None:
        text = json.dumps(gen.to_dict(), indent=2)
        (directory / "generation_config.json").write_text(text, encoding="utf-8")
    if tokenizer is not None:
        tokenizer.save(directory)
    return directory


def create_model(
    name: str | Path,
    *,
    pretrained: bool = True,
    cache_dir: str | Path | None = None,
    **overrides: Any,
) -> nn.Module:
    """A model by preset name, Hub repo id or local checkpoint directory.

    * ``create_model("transformer-base", src_vocab_size=8000)`` -- a fresh preset.
    * ``create_model("Helsinki-NLP/opus-mt-en-zh")`` -- downloads (cached) and converts.
    * ``create_model("runs/numbers/last")`` -- a local directory (Marian or ours).

    ``pretrained=False`` builds the architecture of a checkpoint with random weights.
    Raises :class:`WeightsNotFoundError` when a checkpoint cannot be found or fetched.
    """
    if str(name) in PRESETS:
        return Transformer(get_config(str(name), **overrides))
    if overrides:
        raise TypeError(f"config overrides only apply to presets, got {sorted(overrides)}")
    if not Path(name).expanduser().exists() and str(name).count("/") != 1:
        raise WeightsNotFoundError(
            f"unknown model {str(name)!r}: not a preset ({', '.join(sorted(PRESETS))}), a "
            "checkpoint directory nor a Hub repo id like 'Helsinki-NLP/opus-mt-en-zh'"
        )
    directory = resolve_checkpoint(name, cache_dir=cache_dir)
    if pretrained:
        return load_pretrained(directory)
    config = _read_config(directory)
    if config["model_type"] == "marian":
        return Transformer(marian_config_to_ours(config)).eval()
    return _build_ours(config["model_type"], config).eval()
