"""CLIP checkpoints on disk and on the hub, read through :mod:`attn_core.hub`.

What :func:`read_checkpoint` accepts:

* a file -- ``.safetensors``; ``.bin`` / ``.pt`` / ``.pth`` (``torch.load(weights_only=True)``);
  OpenAI's original ``ViT-B-32.pt`` etc., TorchScript archives whose tensors are read by
  attn_core's restricted reader (no archive code runs);
* a folder -- a transformers ``save_pretrained`` folder (``config.json`` +
  ``model.safetensors`` / ``pytorch_model.bin``, sharded or not), an open_clip folder
  (``open_clip_config.json`` + ``open_clip_model.safetensors`` /
  ``open_clip_pytorch_model.bin``), or one written by :func:`attn_clip.save_pretrained`.

Failures raise attn_core.hub's exceptions: :class:`~attn_core.hub.WeightsUnavailableError`
(not found / not downloadable) or :class:`~attn_core.hub.CheckpointError` (unreadable,
unsafe, does not fit).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from attn_core import hub
from attn_core.torchscript import is_torchscript_archive

from .registry import PretrainedSource

__all__ = ["Checkpoint", "download_hub_repo", "read_checkpoint", "resolve_source"]

# weights of a checkpoint folder, in the order they are looked for
DIR_WEIGHTS = (
    "open_clip_model.safetensors",
    "open_clip_pytorch_model.bin",
    "model.safetensors",
    "pytorch_model.bin",
)


@dataclass
class Checkpoint:
    """What :func:`read_checkpoint` found: tensors plus any config stored beside them."""

    state_dict: dict[str, torch.Tensor]
    kind: str  # "file", "torchscript", "hf_dir", "open_clip_dir"
    path: Path
    hf_config: dict[str, Any] | None = None  # transformers config.json
    open_clip_config: dict[str, Any] | None = None  # open_clip_config.json
    preprocessor_config: dict[str, Any] | None = None  # transformers preprocessor_config.json


def _read_json(path: Path | None) -> dict[str, Any] | None:
    if path is None or not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise hub.CheckpointError(f"cannot read {path}: {e}") from None
    if not isinstance(data, dict):
        raise hub.CheckpointError(f"{path} does not hold a JSON object")
    return data


def read_checkpoint(path: str | os.PathLike) -> Checkpoint:
    """Read a checkpoint file or folder (see the module docstring) on the CPU."""
    path = Path(path)
    if path.is_dir():
        oc_config = _read_json(path / "open_clip_config.json")
        return Checkpoint(
            hub.read_folder(path, DIR_WEIGHTS),
            "open_clip_dir" if oc_config is not None else "hf_dir",
            path,
            hf_config=_read_json(path / "config.json"),
            open_clip_config=oc_config,
            preprocessor_config=_read_json(path / "preprocessor_config.json"),
        )
    kind = "torchscript" if is_torchscript_archive(path) else "file"
    return Checkpoint(hub.read_state_dict(path), kind, path)


def resolve_source(source: PretrainedSource, **hub_kwargs: Any) -> Path:
    """The local file of a registry ``(model, tag)``: bundled, cached or downloaded."""
    if source.file:
        if not Path(source.file).is_file():
            raise hub.WeightsUnavailableError(
                f"the bundled weights of {source.model}:{source.tag} are missing "
                f"({source.file}); reinstall attn-clip, or train them with "
                "scripts/train_clip.py (docs/training.md) and pass pretrained=<path>"
            )
        return Path(source.file)
    return hub.download(source.hf_hub_id, source.filenames, **hub_kwargs)


def download_hub_repo(repo_id: str, **hub_kwargs: Any) -> Checkpoint:
    """An open_clip hub repo (``open_clip_config.json``), else a transformers ``CLIPModel``
    / ``SiglipModel`` / ``Siglip2Model`` repo (``config.json``), fetched (cached) into a
    :class:`Checkpoint`."""
    try:
        oc_config = hub.download(repo_id, "open_clip_config.json", **hub_kwargs)
    except hub.WeightsUnavailableError:
        oc_config = None
    if oc_config is not None:
        weights = hub.download(repo_id, DIR_WEIGHTS[:2], **hub_kwargs)
        ckpt = read_checkpoint(weights)
        ckpt.open_clip_config = _read_json(oc_config)
        return ckpt
    hf_config = hub.download(repo_id, "config.json", **hub_kwargs)
    ckpt = read_checkpoint(hub.download(repo_id, DIR_WEIGHTS[2:], **hub_kwargs))
    ckpt.hf_config = _read_json(hf_config)
    try:
        ckpt.preprocessor_config = _read_json(
            hub.download(repo_id, "preprocessor_config.json", **hub_kwargs)
        )
    except hub.WeightsUnavailableError:
        pass  # optional: the model's image size and CLIP's mean/std are the defaults
    return ckpt
