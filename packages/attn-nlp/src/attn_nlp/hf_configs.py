"""The Hugging Face text encoders attn_nlp builds, and their published architectures.

``hf_text_configs.json`` (next to this file) holds the ``config.json`` of every text model
open_clip names by ``hf_model_name`` (``xlm-roberta-base``, ``google/mt5-base``,
``facebook/nllb-200-distilled-600M``, ...), so ``attn_nlp.create_model(name,
pretrained=False)`` and attn_clip's multilingual towers build with no network and no
transformers. ``config.json``'s ``model_type`` picks the module that builds it
(:data:`ENCODER_MODULES`); each such module provides

* ``config_from_hf(hf_config: dict) -> Config``: the fields that change the math, read (a
  field it cannot honour is refused by name, never dropped);
* ``Encoder(config)``: ``forward(input_ids (B, L), key_padding_mask (B, L) bool True =
  padding | None) -> (B, L, D)`` last hidden states;
* ``convert_hf(state_dict, config) -> state_dict``: Hugging Face keys -> ours, strict;
* ``MODEL_TYPE``: what :func:`attn_nlp.save_pretrained` writes for a model of ours.

Refresh the table from the hub (needs the network)::

    uv run python -m attn_nlp.hf_configs --update
"""

from __future__ import annotations

import argparse
import importlib
import json
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

__all__ = ["ENCODER_MODULES", "encoder_module", "hf_config", "known_hf_models"]

TABLE = Path(__file__).with_name("hf_text_configs.json")

# config.json model_type (Hugging Face's, or ours after save_pretrained) -> attn_nlp module
ENCODER_MODULES = {
    "roberta": "roberta",
    "xlm-roberta": "roberta",
    "attn_nlp.roberta": "roberta",
    "t5": "t5",
    "mt5": "t5",
    "attn_nlp.t5": "t5",
    "m2m_100": "m2m100",
    "attn_nlp.m2m100": "m2m100",
}


@cache
def _table() -> dict[str, dict[str, Any]]:
    table = json.loads(TABLE.read_text(encoding="utf-8"))
    return {k: v for k, v in table.items() if not k.startswith("_")}


def known_hf_models() -> list[str]:
    """Hub ids whose architecture ships with attn_nlp (buildable offline)."""
    return sorted(_table())


def hf_config(name: str) -> dict[str, Any] | None:
    """The published ``config.json`` of hub model ``name`` (a copy), or None if not shipped."""
    config = _table().get(name)
    return None if config is None else dict(config)


def encoder_module(model_type: str) -> ModuleType:
    """The attn_nlp module that builds a ``config.json`` of this ``model_type``."""
    if model_type not in ENCODER_MODULES:
        raise ValueError(
            f"model_type {model_type!r} is not a text encoder attn_nlp builds; "
            f"expected one of {sorted(ENCODER_MODULES)}"
        )
    return importlib.import_module(f"attn_nlp.{ENCODER_MODULES[model_type]}")


def _update() -> None:  # pragma: no cover - needs the network
    from attn_core import hub

    table = json.loads(TABLE.read_text(encoding="utf-8"))
    for name in known_hf_models():
        table[name] = json.loads(hub.download(name, "config.json").read_text(encoding="utf-8"))
        print(f"{name}: {table[name].get('model_type')}")
    TABLE.write_text(json.dumps(table, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":  # pragma: no cover
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--update", action="store_true", help="re-download every config.json")
    if parser.parse_args().update:
        _update()
    else:
        print("\n".join(known_hf_models()))
