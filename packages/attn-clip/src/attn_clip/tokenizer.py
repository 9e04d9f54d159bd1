"""Text -> token ids: OpenAI's byte-level BPE (via open_clip), padded to the context length.

``Tokenizer()(["a dog", "a cat"])`` is a ``(2, 77)`` LongTensor
``[SOT, ..., EOT, 0, 0, ...]``. A caption longer than the context is truncated (its last
kept position becomes EOT) instead of raising as OpenAI's ``clip.tokenize`` does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from open_clip.tokenizer import SimpleTokenizer

from .config import CLIPConfig

__all__ = ["Tokenizer", "get_tokenizer"]

DEFAULT_CONTEXT_LENGTH = 77


class Tokenizer:
    """OpenAI CLIP's BPE tokenizer returning ``(N, context_length)`` int64 ids."""

    def __init__(self, context_length: int = DEFAULT_CONTEXT_LENGTH, **kwargs: Any) -> None:
        if context_length < 2:
            raise ValueError(f"context_length must be >= 2 (SOT + EOT), got {context_length}")
        self.context_length = context_length
        self._bpe = SimpleTokenizer(context_length=context_length, **kwargs)
        self.sot_token_id: int = self._bpe.sot_token_id
        self.eot_token_id: int = self._bpe.eot_token_id
        self.vocab_size: int = self._bpe.vocab_size

    def encode(self, text: str) -> list[int]:
        """BPE ids of one string, without SOT/EOT or padding."""
        return self._bpe.encode(text)

    def decode(self, ids: Sequence[int] | torch.Tensor) -> str:
        """Ids back to text; SOT, EOT and padding are dropped."""
        if isinstance(ids, torch.Tensor):
            ids = ids.tolist()
        skip = {0, self.sot_token_id, self.eot_token_id}
        return self._bpe.decode([i for i in ids if i not in skip]).strip()

    def __call__(
        self, texts: str | Sequence[str], context_length: int | None = None
    ) -> torch.LongTensor:
        """One string or a list -> ``(N, context_length)`` ids (truncated, zero-padded)."""
        if isinstance(texts, str):
            texts = [texts]
        bad = [type(t).__name__ for t in texts if not isinstance(t, str)]
        if bad:
            raise TypeError(f"texts must be strings, got {', '.join(sorted(set(bad)))}")
        n = context_length or self.context_length
        out = torch.zeros(len(texts), n, dtype=torch.long)
        for i, text in enumerate(texts):
            ids = [self.sot_token_id, *self.encode(text), self.eot_token_id]
            if len(ids) > n:
                ids = ids[:n]
                ids[-1] = self.eot_token_id
            out[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        return out


def get_tokenizer(model: str | CLIPConfig = "ViT-B-32", context_length: int | None = None):
    """The tokenizer of an architecture name or config.

    OpenAI BPE for the standard text tower; for configs that name a Hugging Face
    tokenizer (CLIPA, MetaCLIP-2 worldwide) open_clip's ``HFTokenizer`` is returned,
    which downloads that tokenizer on first use.
    """
    if isinstance(model, str):
        from .registry import get_model_config

        model = get_model_config(model)
    t = model.text
    n = context_length or t.context_length
    if t.hf_tokenizer_name:
        from open_clip.tokenizer import HFTokenizer

        return HFTokenizer(t.hf_tokenizer_name, context_length=n, **(t.tokenizer_kwargs or {}))
    return Tokenizer(n, **(t.tokenizer_kwargs or {}))
