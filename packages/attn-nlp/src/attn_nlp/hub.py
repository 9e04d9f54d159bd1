"""Fetch a checkpoint directory from the Hugging Face Hub (cached) or use a local one.

``resolve_checkpoint("Helsinki-NLP/opus-mt-en-zh")`` downloads ``config.json``, the weights
(``model.safetensors``, else ``pytorch_model.bin``) and the tokenizer files with
``huggingface_hub.hf_hub_download`` into the usual cache and returns the snapshot
directory. Offline or unreachable without a cached copy -> :class:`WeightsNotFoundError`,
which says what was looked for, where the cache is and how to pass a local directory.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["WEIGHT_FILES", "WeightsNotFoundError", "find_weights", "resolve_checkpoint"]

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
OPTIONAL_FILES = (
    "generation_config.json",
    # Marian (sentencepiece) tokenizer
    "source.spm",
    "target.spm",
    "vocab.json",
    "target_vocab.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    # our own checkpoints (tokenizers BPE)
    "tokenizer.json",
)


class WeightsNotFoundError(OSError):
    """Pretrained weights could not be found locally nor downloaded."""


def find_weights(directory: Path) -> Path:
    """The weights file of a checkpoint directory (safetensors preferred)."""
    for name in WEIGHT_FILES:
        if (directory / name).is_file():
            return directory / name
    raise WeightsNotFoundError(
        f"no weights in {directory}: expected one of {', '.join(WEIGHT_FILES)}"
    )


def _cache_dir(cache_dir: str | Path | None) -> str:
    if cache_dir is not None:
        return str(cache_dir)
    from huggingface_hub import constants

    return str(constants.HF_HUB_CACHE)


def resolve_checkpoint(
    name_or_path: str | Path, *, cache_dir: str | Path | None = None, revision: str | None = None
) -> Path:
    """A local checkpoint directory for ``name_or_path`` (a directory or a Hub repo id)."""
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise WeightsNotFoundError(f"{path} is a directory but has no config.json")
        return path
    repo = str(name_or_path)
    if path.exists() or repo.startswith((".", "/", "~")) or repo.count("/") != 1:
        raise WeightsNotFoundError(
            f"unknown model {repo!r}: not a checkpoint directory (with config.json) nor a "
            "Hub repo id like 'Helsinki-NLP/opus-mt-en-zh'"
        )

    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import (
        EntryNotFoundError,
        HFValidationError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    cache = _cache_dir(cache_dir)

    def fetch(filename: str) -> Path:
        return Path(hf_hub_download(repo, filename, cache_dir=cache_dir, revision=revision))

    try:
        config = fetch("config.json")
    except LocalEntryNotFoundError as e:
        raise WeightsNotFoundError(
            f"cannot download {repo!r} from the Hugging Face Hub (offline or unreachable) and "
            f"it is not in the cache {cache}. Connect once to populate the cache, or download "
            f"it elsewhere (`hf download {repo}`) and pass the local directory instead "
            "(--model PATH)"
        ) from e
    except (RepositoryNotFoundError, RevisionNotFoundError) as e:
        raise WeightsNotFoundError(
            f"{repo!r} was not found on the Hugging Face Hub (misspelt, private or gated); "
            "pass a local checkpoint directory instead (--model PATH)"
        ) from e
    except EntryNotFoundError as e:
        raise WeightsNotFoundError(f"{repo!r} has no config.json on the Hub") from e
    except HFValidationError as e:
        raise WeightsNotFoundError(f"{repo!r} is not a valid Hub repo id: {e}") from e

    for name in WEIGHT_FILES:
        try:
            fetch(name)
            break
        except EntryNotFoundError:  # also LocalEntryNotFoundError: try the next format
            continue
    else:
        raise WeightsNotFoundError(
            f"{repo!r} has none of {', '.join(WEIGHT_FILES)} on the Hub or in the cache {cache}"
        )
    for name in OPTIONAL_FILES:
        try:
            fetch(name)
        except EntryNotFoundError:
            pass
    return config.parent
