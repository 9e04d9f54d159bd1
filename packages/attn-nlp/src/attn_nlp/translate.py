"""Translate text with an encoder-decoder checkpoint and the tokenizer stored beside it.

    >>> from attn_nlp import translate
    >>> translate(["I love deep learning"], model="Helsinki-NLP/opus-mt-en-zh")  # doctest: +SKIP
    ['我爱深思熟虑的学习']

Sources longer than the model's ``max_positions`` are truncated (keeping the final
``</s>``) with a warning; empty sources raise ``ValueError``. :func:`evaluate_translation`
scores a translator on a dev set with sacrebleu (BLEU, chrF) and exact match.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from .model import Transformer
from .pretrained import create_model, resolve_checkpoint
from .tokenizer import TextTokenizer, load_tokenizer

__all__ = ["Translator", "evaluate_translation", "translate"]


class Translator:
    """A :class:`Transformer` plus its tokenizer: ``translator(["text", ...]) -> [...]``."""

    def __init__(self, model: Transformer, tokenizer: TextTokenizer, device: str | None = None):
        if not isinstance(model, Transformer):
            raise TypeError(f"translation needs an encoder-decoder, got {type(model).__name__}")
        self.device = torch.device(device or "cpu")
        self.model = model.to(self.device).eval()
        self.tokenizer = tokenizer

    @classmethod
    def from_pretrained(
        cls, name_or_path: str | Path, *, device: str | None = None, cache_dir: str | None = None
    ) -> Translator:
        """Load model and tokenizer from a Hub repo id or a local checkpoint directory."""
        directory = resolve_checkpoint(name_or_path, cache_dir=cache_dir)
        return cls(create_model(directory), load_tokenizer(directory), device)

    def _batches(self, texts: Sequence[str], batch_size: int) -> Iterator[list[int]]:
        """Indices of ``texts`` in batches of similar length (less padding)."""
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        for start in range(0, len(order), batch_size):
            yield order[start : start + batch_size]

    def encode(self, texts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Token ids ``(B, S)`` and key-padding mask ``(B, S)`` (True = pad) for ``texts``."""
        limit = self.model.config.max_positions
        rows = self.tokenizer.encode(list(texts))
        for i, row in enumerate(rows):
            if len(row) > limit:
                warnings.warn(
                    f"source {i} has {len(row)} tokens; truncated to max_positions={limit}",
                    stacklevel=3,
                )
                rows[i] = row[: limit - 1] + [self.tokenizer.eos_id]
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), self.tokenizer.pad_id, dtype=torch.long)
        mask = torch.ones(len(rows), width, dtype=torch.bool)
        for i, row in enumerate(rows):
            ids[i, : len(row)] = torch.tensor(row)
            mask[i, : len(row)] = False
        return ids.to(self.device), mask.to(self.device)

    def translate(
        self,
        texts: str | Sequence[str],
        *,
        beams: int | None = 4,
        max_new_tokens: int | None = None,
        batch_size: int = 16,
        progress: bool = False,
        **generation: Any,
    ) -> list[str]:
        """Translate each text; ``beams=None`` uses the checkpoint's ``num_beams``.

        Extra keyword arguments go to :meth:`Transformer.generate` (``length_penalty``,
        ``do_sample``, ``num_return_sequences`` ...). Returns one string per text (per
        returned sequence).
        """
        texts = [texts] if isinstance(texts, str) else list(texts)
        for i, text in enumerate(texts):
            if not isinstance(text, str) or not text.strip():
                raise ValueError(f"source text {i} is empty")
        if beams is not None:
            generation["num_beams"] = beams
        if max_new_tokens is not None:
            generation["max_new_tokens"] = max_new_tokens
        n = generation.get("num_return_sequences", 1)
        out: list[list[str]] = [[] for _ in texts]
        batches = list(self._batches(texts, batch_size))
        if progress:
            try:
                from tqdm import tqdm

                batches = tqdm(batches, desc="translate", unit="batch")
            except ImportError:  # the progress bar is optional
                pass
        for batch in batches:
            ids, mask = self.encode([texts[i] for i in batch])
            generated = self.model.generate(ids, mask, **generation)
            decoded = self.tokenizer.decode(generated.tolist())
            for j, i in enumerate(batch):
                out[i] = decoded[j * n : (j + 1) * n]
        return [s for group in out for s in group]

    __call__ = translate


@functools.lru_cache(maxsize=2)
def _translator(model: str, device: str | None) -> Translator:
    return Translator.from_pretrained(model, device=device)


def translate(
    texts: str | Sequence[str],
    model: str = "Helsinki-NLP/opus-mt-en-zh",
    *,
    beams: int | None = 4,
    device: str | None = None,
    **kwargs: Any,
) -> list[str]:
    """One-call translation (the loaded model is cached between calls)."""
    return _translator(str(model), device).translate(texts, beams=beams, **kwargs)


@torch.no_grad()
def evaluate_translation(
    translator: Translator, pairs: Sequence[tuple[str, str]], beams: int = 4, batch_size: int = 64
) -> dict[str, Any]:
    """Translate the sources of ``(source, reference)`` pairs and score them: sacrebleu's
    corpus ``bleu`` (its ``zh`` tokenizer when the references are Chinese, else ``13a``) and
    ``chrf``, ``exact`` (the fraction equal to the reference, spaces ignored) and the first
    translation as ``example``. Needs ``sacrebleu``."""
    import sacrebleu

    sources, refs = [s for s, _ in pairs], [t for _, t in pairs]
    hyps = translator.translate(sources, beams=beams, batch_size=batch_size)
    cjk = any("\u4e00" <= ch <= "\u9fff" for ref in refs[:50] for ch in ref)
    bleu = sacrebleu.corpus_bleu(hyps, [refs], tokenize="zh" if cjk else "13a")
    chrf = sacrebleu.corpus_chrf(hyps, [refs])
    same = [h.replace(" ", "") == r.replace(" ", "") for h, r in zip(hyps, refs, strict=True)]
    exact = sum(same) / len(refs)
    return {"bleu": bleu.score, "chrf": chrf.score, "exact": exact, "example": hyps[0]}
