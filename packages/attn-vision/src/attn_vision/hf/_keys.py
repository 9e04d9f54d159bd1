"""Helpers the transformers converters share: the ``model_type`` / architecture check and a
strict rename of a state dict by a table of regular expressions."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from ..convert import check_state_dict, expected_state_dict_shapes

__all__ = ["check_architectures", "renamed_checked"]

# (pattern, replacement) pairs for re.sub, applied in order
Renames = Sequence[tuple[str, str | Callable[[re.Match[str]], str]]]


def check_architectures(
    hf: Mapping[str, Any], model_types: Sequence[str], refused: Mapping[str, str]
) -> str:
    """The config's ``model_type``; ``ValueError`` if it is not one of ``model_types`` or
    ``architectures`` names a class of ``refused`` (with its reason)."""
    model_type = hf.get("model_type")
    if model_type not in model_types:
        raise ValueError(f"model_type={model_type!r} is not one of {tuple(model_types)}")
    for arch in hf.get("architectures") or ():
        if arch in refused:
            raise ValueError(f"architecture {arch} is not supported: {refused[arch]}")
    return model_type


def renamed_checked(
    state_dict: Mapping[str, torch.Tensor],
    renames: Renames,
    model_cls: Callable[..., nn.Module],
    config: Any,
    source: str,
) -> dict[str, torch.Tensor]:
    """Each key through every ``renames`` pair, in order; then strict against
    ``model_cls(config)``: a :class:`~attn_core.hub.CheckpointError` lists every missing,
    unexpected (an unknown key comes through unchanged) or mis-shaped key."""
    sd = {}
    for key, value in state_dict.items():
        for pattern, repl in renames:
            key = re.sub(pattern, repl, key)
        sd[key] = value
    check_state_dict(sd, expected_state_dict_shapes(model_cls, config), source)
    return sd
