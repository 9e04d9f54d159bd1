"""Text data for the NLP recipes: TSV sentence pairs, labelled CSVs, padding, and random
windows of a token stream (a character LM)."""

from __future__ import annotations

import csv
from pathlib import Path

import torch
from torch.utils.data import Dataset

__all__ = ["RandomWindows", "pad_rows", "read_labelled_csv", "read_tsv"]


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
