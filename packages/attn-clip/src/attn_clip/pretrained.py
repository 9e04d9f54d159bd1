"""Getting checkpoint files: Hugging Face hub downloads (cached) and reading files / folders.

Readers, by what is on disk:

* ``*.safetensors``                      -- ``safetensors.torch.load_file``;
* ``*.bin`` / ``*.pt`` / ``*.pth``       -- ``torch.load(weights_only=True)`` (tensors only,
  no arbitrary unpickling); a nested ``{"state_dict": ...}`` is unwrapped;
* OpenAI's original ``ViT-B-32.pt`` etc. -- these are *TorchScript archives* (a zip with a
  ``code/`` folder). They are the official distribution format, so they are read with
  ``torch.jit.load(map_location="cpu")`` and only their ``state_dict()`` is kept. Loading
  TorchScript runs the archive's (TorchScript) code: only load files you trust;
* a folder -- a transformers ``save_pretrained`` folder (``config.json`` +
  ``model.safetensors`` / ``pytorch_model.bin``, sharded or not), an open_clip folder
  (``open_clip_config.json`` + ``open_clip_model.safetensors`` / ``open_clip_pytorch_model.bin``),
  or one saved by :func:`attn_clip.save_pretrained` (the open_clip layout).
"""

from __future__ import annotations

import json
import os
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from attn_vision.pretrained import hub_unreachable

from .registry import PretrainedSource

__all__ = [
    "Checkpoint",
    "PretrainedDownloadError",
    "download_pretrained",
    "hf_cache_dir",
    "is_torchscript_archive",
    "read_checkpoint",
]


class PretrainedDownloadError(OSError):
    """Weights could not be fetched from the hub (offline, unreachable, missing file)."""


def hf_cache_dir(cache_dir: str | os.PathLike | None = None) -> Path:
    """The Hugging Face hub cache folder downloads go to (``HF_HUB_CACHE`` / ``HF_HOME``)."""
    if cache_dir is not None:
        return Path(cache_dir)
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def download_pretrained(
    repo_id: str,
    filenames: tuple[str, ...] | list[str],
    *,
    cache_dir: str | os.PathLike | None = None,
    local_files_only: bool = False,
    revision: str | None = None,
) -> Path:
    """Path of the first of ``filenames`` in hub repo ``repo_id``: cached, else downloaded.

    The cache is searched first (no network). Offline (``HF_HUB_OFFLINE=1``,
    ``local_files_only=True``) or with the hub unreachable it fails at once with
    :class:`PretrainedDownloadError`, naming the repo, the files, the cache folder and how
    to pass a local file instead.
    """
    from huggingface_hub import constants, hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError, LocalEntryNotFoundError

    def fetch(filename: str, local_only: bool) -> Path:
        return Path(
            hf_hub_download(
                repo_id,
                filename,
                cache_dir=cache_dir,
                local_files_only=local_only,
                revision=revision,
                library_name="attn_clip",
            )
        )

    for filename in filenames:  # already cached? (no network involved)
        try:
            return fetch(filename, local_only=True)
        except (LocalEntryNotFoundError, OSError, ValueError):
            pass
    if local_files_only or getattr(constants, "HF_HUB_OFFLINE", False):
        reason = "offline (local_files_only / HF_HUB_OFFLINE=1) and not in the cache"
    else:
        reason = hub_unreachable()
    errors = [reason] if reason else []
    if not reason:
        for filename in filenames:
            try:
                return fetch(filename, local_only=False)
            except EntryNotFoundError as e:  # the remote says: no such file -> try the next
                if isinstance(e, LocalEntryNotFoundError):  # a connection problem after all
                    errors.append(f"{filename}: {_first_line(e)}")
                    break
                errors.append(f"{filename}: not in the repo")
            except Exception as e:  # gated / missing repo, HTTP errors, ...
                errors.append(f"{filename}: {type(e).__name__}: {_first_line(e)}")
                break
    raise PretrainedDownloadError(
        f"could not get {' or '.join(filenames)} from the Hugging Face hub repo '{repo_id}' "
        f"(cache dir: {hf_cache_dir(cache_dir)}): {'; '.join(errors)}. Download it where the "
        "hub is reachable and pass pretrained=<path to the file or folder>."
    )


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def resolve_source(source: PretrainedSource, **kwargs: Any) -> Path:
    """Download (or find in the cache) the checkpoint of a registry ``(model, tag)``."""
    return download_pretrained(source.hf_hub_id, source.filenames, **kwargs)


@dataclass
class Checkpoint:
    """What :func:`read_checkpoint` found: tensors plus any config stored beside them."""

    state_dict: dict[str, torch.Tensor]
    kind: str  # "file", "torchscript", "hf_dir", "open_clip_dir"
    path: Path
    hf_config: dict[str, Any] | None = None  # transformers config.json
    open_clip_config: dict[str, Any] | None = None  # open_clip_config.json
    preprocessor_config: dict[str, Any] | None = None  # transformers preprocessor_config.json


def is_torchscript_archive(path: str | os.PathLike) -> bool:
    """True for a TorchScript zip (it has ``<name>/code/`` entries), e.g. OpenAI's ``.pt``."""
    if not zipfile.is_zipfile(path):
        return False
    with zipfile.ZipFile(path) as zf:
        return any("/code/" in n for n in zf.namelist())


def _unwrap(obj: Any, path: Path) -> dict[str, torch.Tensor]:
    if isinstance(obj, dict) and isinstance(obj.get("state_dict"), dict):
        obj = obj["state_dict"]
    if isinstance(obj, dict) and isinstance(obj.get("model"), dict) and "epoch" in obj:
        obj = obj["model"]
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise ValueError(f"{path} does not hold a state dict of tensors")
    return dict(obj)


def _read_file(path: Path) -> tuple[dict[str, torch.Tensor], str]:
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        try:
            return load_file(str(path)), "file"
        except Exception as e:  # SafetensorError for truncated / corrupt files
            raise ValueError(f"cannot read safetensors file {path}: {e}") from e
    if is_torchscript_archive(path):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # torch.jit is deprecated upstream
            module = torch.jit.load(str(path), map_location="cpu")
        return {k: v for k, v in module.state_dict().items()}, "torchscript"
    try:
        obj = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as e:
        raise ValueError(
            f"cannot read {path} with torch.load(weights_only=True) -- not a plain state dict "
            f"of tensors (or a corrupt file): {e}"
        ) from e
    return _unwrap(obj, path), "file"


def _read_json(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


_DIR_WEIGHTS = (
    "open_clip_model.safetensors",
    "open_clip_pytorch_model.bin",
    "model.safetensors",
    "pytorch_model.bin",
)


def _read_dir(path: Path) -> Checkpoint:
    hf_config = _read_json(path / "config.json")
    oc_config = _read_json(path / "open_clip_config.json")
    pre = _read_json(path / "preprocessor_config.json")
    kind = "open_clip_dir" if oc_config is not None else "hf_dir"
    for index_name in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        index = _read_json(path / index_name)
        if index is not None:  # sharded transformers checkpoint
            sd: dict[str, torch.Tensor] = {}
            for shard in sorted(set(index["weight_map"].values())):
                sd.update(_read_file(path / shard)[0])
            return Checkpoint(sd, kind, path, hf_config, oc_config, pre)
    for name in _DIR_WEIGHTS:
        if (path / name).is_file():
            sd = _read_file(path / name)[0]
            return Checkpoint(sd, kind, path, hf_config, oc_config, pre)
    raise FileNotFoundError(f"no weights in {path}: expected one of {', '.join(_DIR_WEIGHTS)}")


def read_checkpoint(path: str | os.PathLike) -> Checkpoint:
    """Read a checkpoint file or folder (see the module docstring) on the CPU."""
    path = Path(path)
    if path.is_dir():
        return _read_dir(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    sd, kind = _read_file(path)
    return Checkpoint(sd, kind, path)
