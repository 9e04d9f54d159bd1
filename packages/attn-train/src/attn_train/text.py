"""Text data for the NLP recipes: TSV sentence pairs, labelled CSVs, their encoded data sets
(with a ``collate`` that pads), padding, a character vocabulary and random windows of a
token stream (a character LM).

The tokenizers are duck-typed like ``attn_nlp.BPETokenizer``: ``encode`` / ``encode_target``
(lists of strings -> lists of ids) and ``pad_id``, ``bos_id``, ``eos_id``, ``unk_id``."""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

__all__ = [
    "CharVocab",
    "LabelledTexts",
    "RandomWindows",
    "TranslationPairs",
    "pad_rows",
    "read_labelled_csv",
    "read_tsv",
]


def read_tsv(path: Path) -> list[tuple[str, str]]:
    """``source<TAB>target`` lines; blank lines skipped, malformed ones rejected."""
    pairs = []
    for i, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split("\t")
        if len(parts) != 2 or not parts[0].strip() or not parts[1].strip():
            raise ValueError(f"{path}:{i}: expected 'source<TAB>target', got {line[:60]!r}")
        pairs.append((parts[0].strip(), parts[1].strip()))
    if not pairs:
        raise ValueError(f"{path} has no sentence pairs")
    return pairs


def read_labelled_csv(path: Path) -> list[tuple[str, str]]:
    """``(text, label)`` rows of a CSV whose header has ``text`` and ``label`` columns."""
    with Path(path).open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        if reader.fieldnames is None or not {"text", "label"} <= set(reader.fieldnames):
            raise ValueError(f"{path}: needs a header with 'text' and 'label' columns")
        rows = []
        for i, row in enumerate(reader, 2):
            if not (row["text"] or "").strip() or not (row["label"] or "").strip():
                raise ValueError(f"{path}:{i}: empty text or label")
            rows.append((row["text"].strip(), row["label"].strip()))
    if not rows:
        raise ValueError(f"{path} has no rows")
    return rows


def pad_rows(rows: list[list[int]], pad: int) -> torch.Tensor:
    """Token-id lists -> ``(B, max_len)`` long tensor, right-padded with ``pad``."""
    out = torch.full((len(rows), max(map(len, rows))), pad, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(r, dtype=torch.long)
    return out


class RandomWindows(Dataset):
    """An epoch of ``length`` windows of ``context + 1`` tokens at random offsets of
    ``data``: item ``i`` of epoch ``e`` (:meth:`set_epoch`) is ``(inputs (T,), next-token
    targets (T,))``, drawn from ``(seed, e * length + i)`` only -- the same windows in a
    resumed run, and new ones every epoch."""

    def __init__(self, data: torch.Tensor, context: int, length: int, seed: int = 0) -> None:
        if len(data) < context + 2:
            raise ValueError(f"{len(data)} tokens are too few for windows of {context + 1}")
        self.data, self.context, self.length, self.seed = data, context, length, seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        index = self.epoch * self.length + i
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        start = int(torch.randint(0, len(self.data) - self.context - 1, (1,), generator=gen))
        chunk = self.data[start : start + self.context + 1]
        return chunk[:-1], chunk[1:]


class CharVocab:
    """Characters <-> ids for a character LM; ``chars`` are the vocabulary in id order."""

    def __init__(self, chars: Sequence[str]) -> None:
        self.chars = list(chars)
        self.index = {c: i for i, c in enumerate(self.chars)}

    def encode(self, text: str) -> list[int]:
        """Ids of ``text``'s characters; a ``ValueError`` names any not in the vocabulary."""
        unknown = sorted(set(text) - self.index.keys())
        if unknown:
            raise ValueError(f"characters not in the model's vocabulary: {unknown}")
        return [self.index[c] for c in text]

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(self.chars[i] for i in ids)


class TranslationPairs(Dataset):
    """Encoded ``(source, target)`` pairs for an encoder-decoder: source ids (cut to
    ``max_len``, ending in EOS when cut) and target ids (cut to ``max_len - 1``);
    :meth:`collate` adds BOS / EOS and pads a batch."""

    def __init__(self, pairs: Sequence[tuple[str, str]], tokenizer: Any, max_len: int) -> None:
        src = tokenizer.encode([s for s, _ in pairs])
        tgt = tokenizer.encode_target([t for _, t in pairs])
        self.pad, self.bos, self.eos = tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id
        self.items = [
            (s[: max_len - 1] + [self.eos] if len(s) > max_len else s, t[: max_len - 1])
            for s, t in zip(src, tgt, strict=True)
        ]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> tuple[list[int], list[int]]:
        return self.items[i]

    def collate(self, batch: list[tuple[list[int], list[int]]]) -> dict[str, torch.Tensor]:
        """Padded sources ``src (B, S)``, decoder inputs ``tgt_in = [BOS] + y`` and
        ``labels = y + [EOS]`` ``(B, T)``."""
        return {
            "src": pad_rows([s for s, _ in batch], self.pad),
            "tgt_in": pad_rows([[self.bos] + t for _, t in batch], self.pad),
            "labels": pad_rows([t + [self.eos] for _, t in batch], self.pad),
        }


class LabelledTexts(Dataset):
    """``(token ids, label index)`` items of ``(text, label)`` rows: ids cut to ``max_len``
    (an empty text becomes ``[unk]``), labels indexed in ``labels``; a label outside it is a
    ``ValueError`` (prefixed by ``source``). :meth:`collate` pads a batch."""

    def __init__(
        self,
        rows: Sequence[tuple[str, str]],
        tokenizer: Any,
        labels: Sequence[str],
        max_len: int,
        source: str = "",
    ) -> None:
        index = {label: i for i, label in enumerate(labels)}
        unknown = sorted({lab for _, lab in rows} - index.keys())
        if unknown:
            raise ValueError(f"{source}labels not seen in training: {unknown}")
        ids = tokenizer.encode_target([t for t, _ in rows])
        self.pad = tokenizer.pad_id
        self.items = [
            (x[:max_len] or [tokenizer.unk_id], index[lab])
            for x, (_, lab) in zip(ids, rows, strict=True)
        ]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> tuple[list[int], int]:
        return self.items[i]

    def collate(self, batch: list[tuple[list[int], int]]) -> dict[str, torch.Tensor]:
        """``ids (B, L)`` right-padded, ``labels (B,)``."""
        ids = pad_rows([x for x, _ in batch], self.pad)
        return {"ids": ids, "labels": torch.tensor([y for _, y in batch])}
