"""One hub for the whole zoo: find, download, read, check and write weights.

Every model package (attn_vision, attn_clip, attn_nlp) loads and saves weights through
this module, so there is one set of rules and one exception hierarchy:

* **Find / download** -- :func:`download` returns the first of some file names in a
  Hugging Face Hub repo, from the cache if it is there (no network), else downloaded.
  Offline (``HF_HUB_OFFLINE=1``, ``local_files_only=True``) or with the hub unreachable it
  fails at once (no 20-second retry loop) with :class:`WeightsUnavailableError`, naming the
  repo, the files, the cache folder and how to pass a local file instead.
* **Read** -- loading a file never runs its code. :func:`read_state_dict` reads
  ``.safetensors`` with safetensors; TorchScript archives (OpenAI's ``ViT-B-32.pt``) with
  the restricted reader of :mod:`attn_core.torchscript`, which builds tensors only; anything
  else with ``torch.load(weights_only=True)``. :func:`read_folder` reads a checkpoint folder,
  sharded or not; shard files named by an index JSON must lie inside the folder.
* **Check / load** -- :func:`load_state_dict` is a strict load: missing, unexpected and
  mis-shaped keys are listed in one :class:`CheckpointError`; every floating-point tensor
  must be finite; an integer or bool tensor where the model has floats (or the reverse) is
  refused, never cast. Floating-point tensors are cast to the model's dtype.
* **Write** -- :func:`save_state_dict`, :func:`write_json` and :func:`atomic_write` write a
  temporary file next to the target and rename it into place: a crash never leaves a
  half-written file, and the result gets the usual permissions under the user's umask.

Exceptions (apps catch :class:`WeightsError` once)::

    WeightsError
    ├── WeightsUnavailableError (also OSError)   not on disk, not in the cache, not downloadable
    └── CheckpointError (also ValueError)        unreadable, or does not fit the model
        └── UnsafeCheckpointError                would run code / points outside its folder

``huggingface_hub`` is needed only to download (and is imported only then); attn-core's
``hub`` extra installs it, and every model package depends on ``attn-core[hub]``.
"""

from __future__ import annotations

import json
import os
import re
import socket
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlparse

import torch
from torch import nn

from .errors import (  # re-exported: hub is where users look for them
    CheckpointError,
    UnsafeCheckpointError,
    WeightsError,
    WeightsUnavailableError,
)
from .torchscript import is_torchscript_archive, read_torchscript_archive

__all__ = [
    "CheckpointError",
    "UnsafeCheckpointError",
    "WeightsError",
    "WeightsUnavailableError",
    "atomic_path",
    "atomic_write",
    "check_state_dict",
    "download",
    "hf_cache_dir",
    "hub_unreachable",
    "load_state_dict",
    "read_folder",
    "read_sharded",
    "read_state_dict",
    "save_state_dict",
    "tied_aliases",
    "write_json",
]

StateDict = dict[str, torch.Tensor]
ETAG_TIMEOUT = 10.0  # seconds to wait for the hub's metadata answer (huggingface_hub: 10)
CONNECT_TIMEOUT = 3.0  # seconds for the quick "is the hub reachable at all" check


# -- find / download -----------------------------------------------------------------------


def hf_cache_dir(cache_dir: str | os.PathLike | None = None) -> Path:
    """The Hugging Face hub cache downloads go to (``cache_dir``, else ``HF_HUB_CACHE``)."""
    if cache_dir is not None:
        return Path(cache_dir)
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def hub_unreachable(timeout: float = CONNECT_TIMEOUT) -> str | None:
    """Why the hub endpoint cannot be reached (one quick TCP connect), or None if it can.

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


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def download(
    repo_id: str,
    filenames: str | Sequence[str],
    *,
    revision: str | None = None,
    cache_dir: str | os.PathLike | None = None,
    local_files_only: bool = False,
) -> Path:
    """Local path of the first of ``filenames`` in hub repo ``repo_id``: cached, else downloaded.

    The cache is searched first for every name (no network). Then, unless offline or the
    hub is unreachable (both fail at once), the names are tried in order on the hub; a
    name the repo does not have moves on to the next. Any failure raises
    :class:`WeightsUnavailableError`.
    """
    names = (filenames,) if isinstance(filenames, str) else tuple(filenames)
    try:
        from huggingface_hub import constants, hf_hub_download
        from huggingface_hub.errors import EntryNotFoundError, LocalEntryNotFoundError
    except ImportError as e:  # attn-core installed without its hub extra
        raise WeightsUnavailableError(
            f"downloading {' or '.join(names)} from {repo_id!r} needs huggingface_hub "
            "(pip install 'attn-core[hub]'); or pass a local file instead"
        ) from e

    def fetch(filename: str, local_only: bool) -> Path:
        return Path(
            hf_hub_download(
                repo_id,
                filename,
                revision=revision,
                cache_dir=cache_dir,
                local_files_only=local_only,
                etag_timeout=ETAG_TIMEOUT,
                library_name="attn_zoo",
            )
        )

    for filename in names:  # already cached? (no network involved)
        try:
            return fetch(filename, local_only=True)
        except Exception:  # LocalEntryNotFoundError, bad repo id, ...: try the network
            pass
    if local_files_only or getattr(constants, "HF_HUB_OFFLINE", False):
        reason = "offline (HF_HUB_OFFLINE=1 or local_files_only) and not in the cache"
    else:
        reason = hub_unreachable()
    errors = [reason] if reason else []
    if not reason:
        for filename in names:
            try:
                return fetch(filename, local_only=False)
            except EntryNotFoundError as e:  # the repo has no such file: try the next name
                if isinstance(e, LocalEntryNotFoundError):  # a connection problem after all
                    errors.append(f"{filename}: {_first_line(e)}")
                    break
                errors.append(f"{filename}: not in the repo")
            except Exception as e:  # gated / missing repo, HTTP errors, bad repo id
                errors.append(f"{filename}: {type(e).__name__}: {_first_line(e)}")
                break
    raise WeightsUnavailableError(
        f"could not get {' or '.join(names)} from the Hugging Face hub repo {repo_id!r} "
        f"(cache dir: {hf_cache_dir(cache_dir)}): {'; '.join(errors)}. Download it where the "
        "hub is reachable and pass the local file or folder instead (pretrained=<path>)."
    )


# -- read ----------------------------------------------------------------------------------


def _unwrap(obj: Any, path: Path) -> StateDict:
    """A state dict of tensors, out of a training checkpoint ``{"state_dict" | "model": ...}``."""
    for key in ("state_dict", "model"):
        if isinstance(obj, dict) and isinstance(obj.get(key), dict):
            obj = obj[key]
    if not isinstance(obj, dict) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in obj.items()
    ):
        raise CheckpointError(f"{path} does not hold a state dict of tensors")
    return dict(obj)


def _torch_load(path: Path) -> StateDict:
    import pickle

    try:
        obj = torch.load(str(path), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        # torch's message advises unpickling anyway; ours names only what was refused
        found = re.search(r"GLOBAL (\S+?)[:,.]?(\s|$)", str(e))
        refused = f"global {found.group(1)}" if found else ""
        if not refused:  # not a refusal: a corrupt or foreign file
            raise CheckpointError(
                f"cannot read {path}: not a checkpoint or a corrupt file (not a pickle of "
                "tensors torch can read)"
            ) from None
        raise UnsafeCheckpointError(
            f"refusing {path}: it holds more than tensors ({refused}); "
            "weights are read as tensors only -- convert the file to .safetensors where it "
            "came from"
        ) from None
    except Exception as e:
        detail = _first_line(e)
        if "weights_only" in detail:  # torch's advice to unpickle anyway: not ours to give
            detail = "not a plain file of tensors"
        raise CheckpointError(
            f"cannot read {path}: not a checkpoint or a corrupt file ({type(e).__name__}: {detail})"
        ) from None
    return _unwrap(obj, path)


def read_state_dict(path: str | os.PathLike) -> StateDict:
    """The tensors of one checkpoint file, on the CPU, without running any of its code.

    ``.safetensors`` -> safetensors; a TorchScript archive -> the restricted reader of
    :mod:`attn_core.torchscript`; anything else -> ``torch.load(weights_only=True)``.
    Training checkpoints ``{"state_dict": ...}`` / ``{"model": ...}`` are unwrapped.
    """
    path = Path(path)
    if path.is_dir():
        return read_folder(path)
    if not path.is_file():
        raise WeightsUnavailableError(f"checkpoint not found: {path}")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        try:
            return load_file(str(path), device="cpu")
        except Exception as e:  # SafetensorError for truncated / corrupt files
            raise CheckpointError(f"cannot read safetensors file {path}: {e}") from None
    if is_torchscript_archive(path):
        return read_torchscript_archive(path)
    return _torch_load(path)


def _inside(directory: Path, name: Any) -> Path:
    """``directory / name`` if ``name`` is a relative path that stays inside ``directory``."""
    if not isinstance(name, str) or not name:
        raise CheckpointError(f"bad shard name {name!r} in the index of {directory}")
    parts = Path(name).parts
    if os.path.isabs(name) or ".." in parts or (parts and parts[0].startswith("~")):
        raise UnsafeCheckpointError(
            f"refusing shard {name!r} named by the index of {directory}: shard files must lie "
            "inside the checkpoint folder"
        )
    return directory / name


def read_sharded(index_path: str | os.PathLike) -> StateDict:
    """A sharded checkpoint (``*.index.json`` with a ``weight_map``): every shard, merged.

    Each shard must be a relative path inside the index's folder; anything else is refused
    with :class:`UnsafeCheckpointError` before any file is opened.
    """
    index_path = Path(index_path)
    directory = index_path.parent
    try:
        weight_map = json.loads(index_path.read_text(encoding="utf-8"))["weight_map"]
        shards = sorted(set(weight_map.values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise CheckpointError(f"cannot read the shard index {index_path}: {e}") from None
    paths = [_inside(directory, s) for s in shards]  # check them all before reading any
    sd: StateDict = {}
    for p in paths:
        sd.update(read_state_dict(p))
    return sd


WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


def read_folder(
    directory: str | os.PathLike, weight_names: Sequence[str] = WEIGHT_FILES
) -> StateDict:
    """The weights of a checkpoint folder: the first of ``weight_names`` present there, or
    its sharded form (``<name>.index.json``, as transformers writes it)."""
    directory = Path(directory)
    for name in weight_names:
        if (directory / f"{name}.index.json").is_file():
            return read_sharded(directory / f"{name}.index.json")
        if (directory / name).is_file():
            return read_state_dict(directory / name)
    raise WeightsUnavailableError(
        f"no weights in {directory}: expected one of {', '.join(weight_names)}"
    )


# -- check / load --------------------------------------------------------------------------


def _show(items: list[str], n: int = 10) -> str:
    return ", ".join(items[:n]) + (f", ... ({len(items)} in all)" if len(items) > n else "")


def _kind(dtype: torch.dtype) -> str:
    if dtype.is_floating_point:
        return "float"
    if dtype.is_complex:
        return "complex"
    return "bool" if dtype == torch.bool else "integer"


def check_state_dict(
    state_dict: Mapping[str, torch.Tensor],
    expected: Mapping[str, torch.Tensor],
    *,
    source: str = "checkpoint",
    aliases: Mapping[str, Sequence[str]] | None = None,
) -> StateDict:
    """Match ``state_dict`` against ``expected`` (a ``model.state_dict()``): raise one
    :class:`CheckpointError` listing missing / unexpected keys, shape mismatches, wrong
    kinds of dtype (integer where float is expected, ...) and non-finite values.

    ``aliases`` maps a key to the others it is tied to (the same parameter): a missing key
    is filled from a present partner. Returns the state dict with floats cast to the expected
    dtypes, ready for ``load_state_dict(strict=True)``.
    """
    sd = dict(state_dict)
    for key, partners in (aliases or {}).items():
        present = [p for p in partners if p in sd]
        if key not in sd and present:
            sd[key] = sd[present[0]]
    missing = sorted(k for k in expected if k not in sd)
    unexpected = sorted(k for k in sd if k not in expected)
    shapes, kinds, nonfinite = [], [], []
    for k in sorted(set(sd) & set(expected)):
        t, want = sd[k], expected[k]
        if not isinstance(t, torch.Tensor):
            kinds.append(f"{k}: {type(t).__name__}, not a tensor")
        elif t.shape != want.shape:
            shapes.append(f"{k}: checkpoint {tuple(t.shape)} vs model {tuple(want.shape)}")
        elif _kind(t.dtype) != _kind(want.dtype):
            kinds.append(f"{k}: checkpoint {t.dtype} vs model {want.dtype}")
        elif (t.is_floating_point() or t.is_complex()) and not bool(torch.isfinite(t).all()):
            nonfinite.append(k)
    problems = []
    if missing:
        problems.append(f"missing keys: {_show(missing)}")
    if unexpected:
        problems.append(f"unexpected keys: {_show(unexpected)}")
    if shapes:
        problems.append(f"shape mismatches: {_show(shapes)}")
    if kinds:
        problems.append(f"wrong tensor types (refused, not cast): {_show(kinds)}")
    if nonfinite:
        problems.append(f"non-finite values (NaN or inf) in: {_show(nonfinite)}")
    if problems:
        raise CheckpointError(f"{source} does not fit the model: " + "; ".join(problems))
    return {
        k: (v.to(expected[k].dtype) if v.dtype != expected[k].dtype else v) for k, v in sd.items()
    }


def tied_aliases(model: nn.Module) -> dict[str, list[str]]:
    """``{name: [other names of the same parameter]}`` for tied weights."""
    groups: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(p), []).append(name)
    return {n: [m for m in g if m != n] for g in groups.values() if len(g) > 1 for n in g}


def load_state_dict(
    model: nn.Module, state_dict: Mapping[str, torch.Tensor], *, source: str = "checkpoint"
) -> nn.Module:
    """Strictly load ``state_dict`` into ``model`` after :func:`check_state_dict`.

    Tied weights saved once (safetensors keeps one copy) are accepted under either name.
    """
    sd = check_state_dict(
        state_dict, model.state_dict(), source=source, aliases=tied_aliases(model)
    )
    model.load_state_dict(sd, strict=True)
    return model


# -- write ---------------------------------------------------------------------------------


def _umask() -> int:
    try:  # Linux: read it without changing it (os.umask is process-wide and racy)
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[str]:
    """A temporary file name next to ``path``; on success the file replaces ``path`` in one
    rename. On any error it is removed and ``path`` is untouched. The file gets the
    permissions a plain ``open(path, "w")`` would give (0666 minus the umask)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        yield tmp
        with open(tmp, "rb+") as f:  # on disk before the rename makes it visible
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


@contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "wb") -> Iterator[IO]:
    """``open(path, mode)`` that writes a temporary file and renames it into place (see
    :func:`atomic_path`)."""
    with atomic_path(path) as tmp:
        with open(tmp, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as f:
            yield f


def save_state_dict(
    state_dict: Mapping[str, torch.Tensor],
    path: str | os.PathLike,
    metadata: dict[str, str] | None = None,
) -> Path:
    """Write ``state_dict`` as ``.safetensors``, atomically.

    Tensors that share memory (tied weights) are stored once, under the first name;
    :func:`load_state_dict` fills the other names back in.
    """
    from safetensors.torch import save_file

    tensors: StateDict = {}
    seen: set[tuple] = set()
    for k, v in state_dict.items():
        v = v.detach()
        ident = (v.device, v.untyped_storage().data_ptr(), v.storage_offset(), v.shape, v.dtype)
        if v.numel() and ident in seen:
            continue
        seen.add(ident)
        tensors[k] = v.cpu().contiguous()
    with atomic_path(path) as tmp:
        save_file(tensors, tmp, metadata=metadata)
    return Path(path)


def write_json(path: str | os.PathLike, obj: Any) -> Path:
    """Write ``obj`` as indented JSON, atomically."""
    with atomic_write(path, "w") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")
    return Path(path)
