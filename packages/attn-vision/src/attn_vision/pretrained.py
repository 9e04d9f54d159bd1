"""Where pretrained weights live (timm's pretrained configs), fetching them, reading files.

The *location* of a checkpoint comes from timm's own registry: its ``pretrained_cfg``
for ``arch.tag`` names a Hugging Face Hub repo (``hf_hub_id``) and optionally a file
(``hf_hub_filename``; default ``model.safetensors``, then ``pytorch_model.bin``, as
timm does). The file is fetched with ``huggingface_hub.hf_hub_download`` (cached under
the Hub cache). Any failure -- offline, no network, missing repo -- raises
:class:`WeightsUnavailableError` naming the repo, the file and the cache directory.

Local files: ``.safetensors`` are read with safetensors; ``.bin`` / ``.pt`` / ``.pth``
only with ``torch.load(weights_only=True)`` (tensors, never arbitrary pickles).
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import torch

__all__ = [
    "PretrainedLocation",
    "WeightsUnavailableError",
    "download_pretrained",
    "get_pretrained_cfg",
    "hub_unreachable",
    "load_state_dict_file",
    "resolve_pretrained",
]

SAFE_WEIGHTS_NAME = "model.safetensors"
PT_WEIGHTS_NAME = "pytorch_model.bin"
# Seconds to wait for the Hub's metadata answer before giving up (huggingface_hub's default is 10).
ETAG_TIMEOUT = 10.0


class WeightsUnavailableError(OSError):
    """Pretrained weights could not be found locally nor downloaded."""


@dataclass(frozen=True)
class PretrainedLocation:
    """A checkpoint on the Hugging Face Hub: ``repo_id`` (+ ``revision``) and candidate files."""

    repo_id: str
    filename: str
    revision: str | None = None
    fallback_filenames: tuple[str, ...] = ()

    @property
    def filenames(self) -> tuple[str, ...]:
        return (self.filename, *self.fallback_filenames)


def get_pretrained_cfg(name: str) -> dict[str, Any] | None:
    """timm's pretrained config for ``arch`` or ``arch.tag`` as a dict (None if timm has none).

    Raises ``ValueError`` listing the known tags when ``arch`` exists but ``tag`` does not.
    """
    import timm
    from timm.models import get_pretrained_cfg as timm_cfg

    arch, _, tag = name.partition(".")
    try:
        cfg = timm_cfg(name, allow_unregistered=True)
    except RuntimeError:  # timm knows the architecture but not this tag
        cfg = None
    if cfg is None and tag:
        tags = [n.partition(".")[2] for n in timm.list_pretrained(f"{arch}.*")]
        hint = f"; known tags: {', '.join(tags)}" if tags else " (timm has no tags for it)"
        raise ValueError(f"unknown pretrained tag {tag!r} for {arch!r}{hint}")
    return None if cfg is None else cfg.to_dict()


def resolve_pretrained(name: str) -> PretrainedLocation:
    """The Hub location of ``arch[.tag]``'s weights, exactly as timm resolves it."""
    cfg = get_pretrained_cfg(name)
    hub_id = (cfg or {}).get("hf_hub_id")
    if not hub_id:
        raise ValueError(
            f"timm has no Hugging Face Hub weights for {name!r}; pass pretrained=<path to a "
            "timm-format .safetensors / .bin file> instead"
        )
    repo_id, _, revision = hub_id.partition("@")
    if cfg.get("hf_hub_filename"):
        return PretrainedLocation(repo_id, cfg["hf_hub_filename"], revision or None)
    return PretrainedLocation(repo_id, SAFE_WEIGHTS_NAME, revision or None, (PT_WEIGHTS_NAME,))


def _cache_dir(cache_dir: str | os.PathLike | None) -> str:
    from huggingface_hub import constants

    return str(cache_dir) if cache_dir is not None else str(constants.HF_HUB_CACHE)


def hub_unreachable(timeout: float = 3.0) -> str | None:
    """Why the Hub endpoint cannot be reached (a quick TCP connect), or None if it can.

    huggingface_hub retries a failing request for ~20 s per file; checking first turns
    "no network" into an immediate error. Skipped behind a proxy (it would mislead).
    """
    from huggingface_hub import constants

    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return None
    url = urlparse(constants.ENDPOINT)
    host, port = url.hostname, url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as e:
        return f"the hub is unreachable: cannot connect to {host}:{port} ({e})"
    return None


def download_pretrained(
    location: PretrainedLocation | str, cache_dir: str | os.PathLike | None = None
) -> Path:
    """Find the checkpoint in the Hub cache or download it; return its local path.

    Tries ``location.filenames`` in order (safetensors first): first in the cache, then
    -- unless offline (``HF_HUB_OFFLINE=1``) or the Hub is unreachable, which fail at
    once -- from the Hub.
    """
    from huggingface_hub import constants, hf_hub_download

    try:  # huggingface_hub >= 0.35 tells "not in the repo" apart from "not in the cache"
        from huggingface_hub.errors import RemoteEntryNotFoundError as NotInRepo
    except ImportError:  # pragma: no cover - older huggingface_hub
        from huggingface_hub.utils import EntryNotFoundError as NotInRepo

    if isinstance(location, str):
        location = resolve_pretrained(location)

    def fetch(filename: str, local_only: bool) -> Path:
        return Path(
            hf_hub_download(
                location.repo_id,
                filename,
                revision=location.revision,
                cache_dir=cache_dir,
                local_files_only=local_only,
                etag_timeout=ETAG_TIMEOUT,
            )
        )

    for filename in location.filenames:  # cached already? (no network involved)
        try:
            return fetch(filename, local_only=True)
        except Exception:  # LocalEntryNotFoundError: not cached, go on
            pass
    if getattr(constants, "HF_HUB_OFFLINE", False):
        reason = "offline mode is on (HF_HUB_OFFLINE=1) and the file is not in the cache"
    else:
        reason = hub_unreachable()
    errors = [reason] if reason else []
    if not reason:
        for filename in location.filenames:
            try:
                return fetch(filename, local_only=False)
            except NotInRepo as e:  # not in this repo: try the next name
                errors.append(f"{filename}: not found in the repo ({type(e).__name__})")
            except Exception as e:  # connection, gated / missing repo, ...
                errors.append(f"{filename}: {type(e).__name__}: {_first_line(e)}")
                break
    files = " or ".join(location.filenames)
    raise WeightsUnavailableError(
        f"could not get pretrained weights {files} from the Hugging Face Hub repo "
        f"{location.repo_id!r} (cache dir: {_cache_dir(cache_dir)}): {'; '.join(errors)}. "
        "Download the file where the Hub is reachable and pass "
        "pretrained='/path/to/model.safetensors' (a timm-format .safetensors or .bin file)."
    )


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else ""


def load_state_dict_file(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Read a checkpoint: ``.safetensors``, or ``.bin/.pt/.pth`` with ``weights_only=True``.

    Wrapped checkpoints (``{"state_dict": ...}`` / ``{"model": ...}``) are unwrapped.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint file not found: {path}")
    suffix = path.suffix.lower()
    if suffix == ".safetensors":
        from safetensors.torch import load_file

        state_dict = load_file(str(path), device="cpu")
    elif suffix in (".bin", ".pt", ".pth"):
        state_dict = torch.load(path, map_location="cpu", weights_only=True)
    else:
        raise ValueError(
            f"unsupported checkpoint format {suffix!r} for {path}; expected .safetensors, "
            ".bin, .pt or .pth"
        )
    for key in ("state_dict", "model"):
        if isinstance(state_dict, dict) and isinstance(state_dict.get(key), dict):
            state_dict = state_dict[key]
    if not isinstance(state_dict, dict):
        raise ValueError(f"{path} does not hold a state dict (got {type(state_dict).__name__})")
    return state_dict
