"""Text <-> token ids for translation: Marian's sentencepiece tokenizer or our own BPE.

Both expose the same small interface (:class:`TextTokenizer`): ``encode`` a batch of
source sentences (each ending with ``</s>``), ``decode`` target ids (special tokens
dropped), and ``pad_id`` / ``eos_id``.

* :class:`MarianTextTokenizer` wraps ``transformers.MarianTokenizer`` (``source.spm``,
  ``target.spm``, ``vocab.json``) from an opus-mt checkpoint directory.
* :class:`BPETokenizer` wraps a ``tokenizers`` BPE model (``tokenizer.json``) trained by
  :func:`BPETokenizer.train`; specials ``<pad>``=0, ``<unk>``=1, ``<s>``=2, ``</s>``=3.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

__all__ = ["SPECIALS", "BPETokenizer", "MarianTextTokenizer", "TextTokenizer", "load_tokenizer"]

SPECIALS = ("<pad>", "<unk>", "<s>", "</s>")
# CJK punctuation, ideographs (+ extension A, compatibility) and full-width forms
CJK = "[\u3000-\u303f\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff00-\uffef]"


class TextTokenizer(Protocol):
    pad_id: int
    eos_id: int

    def encode(self, texts: list[str]) -> list[list[int]]:
        """Source sentences -> token ids, each ending with ``eos_id``."""
        ...

    def encode_target(self, texts: list[str]) -> list[list[int]]:
        """Target sentences -> token ids (no BOS/EOS)."""
        ...

    def decode(self, ids: Iterable[Iterable[int]]) -> list[str]:
        """Target ids -> text, special tokens skipped."""
        ...


class MarianTextTokenizer:
    """``transformers.MarianTokenizer`` behind :class:`TextTokenizer`."""

    def __init__(self, directory: str | Path) -> None:
        from transformers import MarianTokenizer

        with warnings.catch_warnings():  # "Recommended: pip install sacremoses" (unused here)
            warnings.filterwarnings("ignore", message=".*sacremoses")
            self.tok = MarianTokenizer.from_pretrained(str(directory))
        self.pad_id = int(self.tok.pad_token_id)
        self.eos_id = int(self.tok.eos_token_id)

    def encode(self, texts: list[str]) -> list[list[int]]:
        return self.tok(list(texts))["input_ids"]

    def encode_target(self, texts: list[str]) -> list[list[int]]:
        ids = self.tok(text_target=list(texts))["input_ids"]
        return [row[:-1] if row and row[-1] == self.eos_id else row for row in ids]

    def decode(self, ids: Iterable[Iterable[int]]) -> list[str]:
        return self.tok.batch_decode([list(map(int, r)) for r in ids], skip_special_tokens=True)


class BPETokenizer:
    """A byte-pair-encoding tokenizer from the ``tokenizers`` library (shared vocabulary)."""

    def __init__(self, tokenizer) -> None:  # a tokenizers.Tokenizer
        self.tok = tokenizer
        ids = [tokenizer.token_to_id(t) for t in SPECIALS]
        if ids != [0, 1, 2, 3]:
            raise ValueError(f"BPE tokenizer must map {SPECIALS} to 0..3, got {ids}")
        self.pad_id, self.unk_id, self.bos_id, self.eos_id = ids

    @property
    def vocab_size(self) -> int:
        return self.tok.get_vocab_size()

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int = 8000, min_frequency: int = 2):
        """Learn a BPE vocabulary.

        Spaces become ``▁`` (Metaspace), so decoding restores them exactly; CJK characters
        are kept as single tokens (as BERT does), since Chinese / Japanese text has no
        spaces and merging whole phrases hides the characters from the model.
        """
        from tokenizers import (
            Regex,
            Tokenizer,
            decoders,
            models,
            normalizers,
            pre_tokenizers,
            trainers,
        )

        tok = Tokenizer(models.BPE(unk_token="<unk>"))
        tok.normalizer = normalizers.NFKC()
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Metaspace(), pre_tokenizers.Split(Regex(CJK), behavior="isolated")]
        )
        tok.decoder = decoders.Metaspace()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=list(SPECIALS)
        )
        tok.train_from_iterator(texts, trainer=trainer)
        return cls(tok)

    @classmethod
    def from_file(cls, path: str | Path) -> BPETokenizer:
        from tokenizers import Tokenizer

        return cls(Tokenizer.from_file(str(path)))

    def save(self, directory: str | Path) -> None:
        self.tok.save(str(Path(directory) / "tokenizer.json"))

    def encode_target(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self.tok.encode_batch(list(texts), add_special_tokens=False)]

    def encode(self, texts: list[str]) -> list[list[int]]:
        return [ids + [self.eos_id] for ids in self.encode_target(texts)]

    def decode(self, ids: Iterable[Iterable[int]]) -> list[str]:
        return self.tok.decode_batch([list(map(int, r)) for r in ids], skip_special_tokens=True)


def load_tokenizer(directory: str | Path) -> TextTokenizer:
    """The tokenizer stored next to a checkpoint: Marian sentencepiece or our BPE."""
    directory = Path(directory)
    if (directory / "source.spm").is_file():
        return MarianTextTokenizer(directory)
    if (directory / "tokenizer.json").is_file():
        return BPETokenizer.from_file(directory / "tokenizer.json")
    raise FileNotFoundError(
        f"no tokenizer in {directory}: expected source.spm/target.spm/vocab.json (Marian) "
        "or tokenizer.json (attn-nlp BPE)"
    )
