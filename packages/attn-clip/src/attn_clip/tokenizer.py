"""Text -> token ids: OpenAI CLIP's byte-level BPE, padded to the context length.

``Tokenizer()(["a dog", "a cat"])`` is a ``(2, 77)`` LongTensor
``[SOT, ..., EOT, 0, 0, ...]``. A caption longer than the context is truncated (its last
kept position becomes EOT, as open_clip does) instead of raising as OpenAI's
``clip.tokenize`` does. The ids are open_clip's ``SimpleTokenizer`` ids, computed here:

1. clean: ``ftfy.fix_text``, HTML entities unescaped (twice), whitespace runs collapsed,
   lower-cased;
2. split into pre-tokens with OpenAI's regex (the special tokens, ``'s 't 're 've 'm 'll
   'd``, runs of letters, single digits, runs of other non-space characters);
3. each pre-token's UTF-8 bytes become printable characters (:func:`bytes_to_unicode`),
   the last one marked end-of-word (``</w>``), and adjacent symbols are merged greedily in
   the order of OpenAI's merges list (lowest rank first) until no listed pair is left;
4. every final symbol is one vocabulary id.

The merges file (``bpe_simple_vocab_16e6.txt.gz``, MIT, OpenAI) is read from the installed
open_clip package's folder without importing open_clip. ``ftfy`` and ``regex`` are imported
when the first tokenizer is built.

Text towers trained with another vocabulary name a Hugging Face tokenizer in their config
(``hf_tokenizer_name``): SigLIP's sentencepiece (``timm/ViT-B-16-SigLIP``), SigLIP2's Gemma
tokenizer (``timm/ViT-B-16-SigLIP2``), BERT for CLIPA, ... :class:`HFTokenizer` runs it
through transformers' ``AutoTokenizer`` (imported when one is built) exactly as open_clip's
``HFTokenizer`` does; its files come from a local folder or through :mod:`attn_core.hub`
(cached; offline or unreachable -> :class:`~attn_core.hub.WeightsUnavailableError` at once).
"""

from __future__ import annotations

import functools
import gzip
import html
import importlib.util
import string
from collections.abc import Callable, Sequence
from itertools import pairwise
from pathlib import Path
from typing import Any

import torch

from .config import CLIPConfig

__all__ = ["HFTokenizer", "Tokenizer", "bytes_to_unicode", "default_bpe_path", "get_tokenizer"]

DEFAULT_CONTEXT_LENGTH = 77
BPE_FILE = "bpe_simple_vocab_16e6.txt.gz"
N_MERGES = 49152 - 256 - 2  # CLIP's vocabulary: 2 x 256 byte symbols + merges + SOT/EOT = 49408
SOT, EOT = "<start_of_text>", "<end_of_text>"
END_OF_WORD = "</w>"
# After the special tokens: contractions, letter runs, single digits, other symbol runs.
PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+"""
_MAX_CACHE = 100_000  # pre-tokens whose merges are remembered


def default_bpe_path() -> Path:
    """OpenAI's merges file as installed with open_clip (found without importing it)."""
    spec = importlib.util.find_spec("open_clip")  # locates the package; imports nothing
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = Path(folder) / BPE_FILE
        if path.is_file():
            return path
    raise FileNotFoundError(
        f"{BPE_FILE} not found: it ships with open_clip (`pip install open_clip_torch`), "
        "or pass Tokenizer(bpe_path=...)"
    )


@functools.cache
def bytes_to_unicode() -> dict[int, str]:
    """A reversible byte -> character map whose characters are all printable.

    Printable Latin-1 bytes map to themselves; the other 68 (space, control codes, ...)
    to ``chr(256 + n)``, so BPE symbols never contain whitespace. The order (printable
    bytes first) is the order of the first 256 vocabulary ids.
    """
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    table = {b: chr(b) for b in printable}
    others = [b for b in range(256) if b not in table]
    table.update({b: chr(256 + n) for n, b in enumerate(others)})
    return table


@functools.cache
def _load_vocab(
    bpe_path: str, specials: tuple[str, ...]
) -> tuple[dict[str, int], dict[tuple[str, str], int]]:
    """``(symbol -> id, merge pair -> rank)`` from the merges file (shared by tokenizers)."""
    with gzip.open(bpe_path, "rt", encoding="utf-8") as f:
        lines = f.read().split("\n")[1 : N_MERGES + 1]  # line 0 is a version header
    merges = [tuple(line.split()) for line in lines]
    chars = list(bytes_to_unicode().values())
    vocab = [*chars, *(c + END_OF_WORD for c in chars), *("".join(m) for m in merges), *specials]
    return {s: i for i, s in enumerate(vocab)}, {m: r for r, m in enumerate(merges)}


def _basic_clean(text: str) -> str:
    import ftfy

    return html.unescape(html.unescape(ftfy.fix_text(text))).strip()


def _clean_lower(text: str) -> str:
    return " ".join(_basic_clean(text).split()).lower()


def _clean_whitespace(text: str) -> str:
    return " ".join(_basic_clean(text).split())


def _clean_canonicalize(text: str) -> str:
    """Lower case, no punctuation (big_vision's prompt canonicalization, for SigLIP)."""
    text = _basic_clean(text).replace("_", " ")
    text = text.translate(str.maketrans("", "", string.punctuation)).lower()
    return " ".join(text.split())


_CLEANERS: dict[str, Callable[[str], str]] = {
    "lower": _clean_lower,
    "whitespace": _clean_whitespace,
    "canonicalize": _clean_canonicalize,
}


def _as_texts(texts: str | Sequence[str]) -> list[str]:
    """One string or a list of them -> a list; ``TypeError`` naming any other type."""
    texts = [texts] if isinstance(texts, str) else list(texts)
    bad = [type(t).__name__ for t in texts if not isinstance(t, str)]
    if bad:
        raise TypeError(f"texts must be strings, got {', '.join(sorted(set(bad)))}")
    return texts


class Tokenizer:
    """OpenAI CLIP's BPE tokenizer returning ``(N, context_length)`` int64 ids.

    Args:
        context_length: ids per caption (SOT + tokens + EOT, then zero padding).
        bpe_path: the merges file; default: the copy installed with open_clip.
        clean: text cleaning, ``"lower"`` (CLIP), ``"whitespace"`` or ``"canonicalize"``.
        additional_special_tokens: extra tokens kept whole, with ids after EOT.
    """

    def __init__(
        self,
        context_length: int = DEFAULT_CONTEXT_LENGTH,
        bpe_path: str | Path | None = None,
        clean: str = "lower",
        additional_special_tokens: Sequence[str] | None = None,
    ) -> None:
        import regex

        if context_length < 2:
            raise ValueError(f"context_length must be >= 2 (SOT + EOT), got {context_length}")
        if clean not in _CLEANERS:
            raise ValueError(f"clean must be one of {sorted(_CLEANERS)}, got {clean!r}")
        self.context_length = context_length
        self.specials = (SOT, EOT, *(additional_special_tokens or ()))
        self.bpe_path = str(bpe_path or default_bpe_path())
        self.clean = clean
        self.encoder, self._ranks = _load_vocab(self.bpe_path, self.specials)
        self.decoder = {i: s for s, i in self.encoder.items()}
        self.num_special_tokens = 2  # SOT, EOT
        self.sot_token_id: int = self.encoder[SOT]
        self.eot_token_id: int = self.encoder[EOT]
        self.vocab_size: int = len(self.encoder)
        self._clean = _CLEANERS[clean]
        specials = "|".join(regex.escape(s) for s in self.specials)
        self._pattern = regex.compile(f"{specials}|{PATTERN}", regex.IGNORECASE)
        self._byte_chars = bytes_to_unicode()
        self._char_bytes = {c: b for b, c in self._byte_chars.items()}
        self._cache: dict[str, list[str]] = {s: [s] for s in self.specials}

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as its arguments (a few bytes, not the 2 MB vocabulary): DataLoader workers
        rebuild it from the merges file."""
        args = (self.context_length, self.bpe_path, self.clean, self.specials[2:])
        return (type(self), args)

    def bpe(self, token: str) -> list[str]:
        """The BPE symbols of one pre-token (its bytes already mapped to characters)."""
        cached = self._cache.get(token)
        if cached is not None:
            return cached
        word = [*token[:-1], token[-1] + END_OF_WORD]
        while len(word) > 1:
            best = min(pairwise(word), key=lambda p: self._ranks.get(p, N_MERGES))
            if best not in self._ranks:
                break
            merged: list[str] = []
            i = 0
            while i < len(word):  # merge every occurrence of ``best``, left to right
                if i + 1 < len(word) and (word[i], word[i + 1]) == best:
                    merged.append(word[i] + word[i + 1])
                    i += 2
                else:
                    merged.append(word[i])
                    i += 1
            word = merged
        if len(self._cache) > _MAX_CACHE:
            self._cache = {s: [s] for s in self.specials}
        self._cache[token] = word
        return word

    def encode(self, text: str) -> list[int]:
        """BPE ids of one string, without SOT/EOT or padding."""
        ids: list[int] = []
        for piece in self._pattern.findall(self._clean(text)):
            chars = "".join(self._byte_chars[b] for b in piece.encode("utf-8"))
            ids += [self.encoder[symbol] for symbol in self.bpe(chars)]
        return ids

    def decode(self, ids: Sequence[int] | torch.Tensor) -> str:
        """Ids back to text; SOT, EOT and padding are dropped."""
        if isinstance(ids, torch.Tensor):
            ids = ids.tolist()
        skip = {0, self.sot_token_id, self.eot_token_id}
        chars = "".join(self.decoder[i] for i in ids if i not in skip)
        data = bytes(self._char_bytes[c] for c in chars)
        return data.decode("utf-8", errors="replace").replace(END_OF_WORD, " ").strip()

    def __call__(
        self, texts: str | Sequence[str], context_length: int | None = None
    ) -> torch.LongTensor:
        """One string or a list -> ``(N, context_length)`` ids (truncated, zero-padded)."""
        texts = _as_texts(texts)
        n = context_length or self.context_length
        out = torch.zeros(len(texts), n, dtype=torch.long)
        for i, text in enumerate(texts):
            ids = [self.sot_token_id, *self.encode(text), self.eot_token_id]
            if len(ids) > n:
                ids = ids[:n]
                ids[-1] = self.eot_token_id
            out[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        return out


# files a Hugging Face tokenizer is made of: its config, one vocabulary, its special tokens
HF_TOKENIZER_CONFIG = "tokenizer_config.json"
HF_VOCAB_FILES = ("tokenizer.json", "spiece.model", "tokenizer.model", "vocab.txt")
HF_SPECIAL_TOKENS = "special_tokens_map.json"


def hf_tokenizer_folder(
    name_or_path: str | Path, cache_dir: str | Path | None = None, local_files_only: bool = False
) -> Path:
    """The local folder of a Hugging Face tokenizer: ``name_or_path`` itself if it is a
    folder, else the hub cache folder of repo ``name_or_path`` with its tokenizer files
    (downloaded through :func:`attn_core.hub.download` if needed)."""
    if Path(name_or_path).is_dir():
        return Path(name_or_path)
    from attn_core import hub

    if str(name_or_path).startswith(("/", ".", "~")) or Path(name_or_path).is_file():
        raise hub.WeightsUnavailableError(
            f"tokenizer folder {str(name_or_path)!r} not found (expected a folder with "
            f"{HF_TOKENIZER_CONFIG} and one of {', '.join(HF_VOCAB_FILES)}, or a hub repo id)"
        )

    kw = {"cache_dir": cache_dir, "local_files_only": local_files_only}
    try:
        folder = hub.download(str(name_or_path), HF_TOKENIZER_CONFIG, **kw).parent
        hub.download(str(name_or_path), HF_VOCAB_FILES, **kw)
    except hub.WeightsUnavailableError as e:
        raise hub.WeightsUnavailableError(
            f"tokenizer: {e} (A tokenizer folder works too: attn_clip.HFTokenizer(<folder>).)"
        ) from None
    try:
        hub.download(str(name_or_path), HF_SPECIAL_TOKENS, **kw)
    except hub.WeightsUnavailableError:
        pass  # optional: newer tokenizer configs carry their special tokens themselves
    return folder


class HFTokenizer:
    """A Hugging Face tokenizer with open_clip's ``HFTokenizer`` behaviour: each text is
    cleaned, then tokenized to exactly ``context_length`` ids (``max_length`` padding,
    truncation), special tokens as the tokenizer adds them (SigLIP: ``</s>`` at the end).

    Args:
        name_or_path: a folder with the tokenizer's files, or a hub repo id
            (``timm/ViT-B-16-SigLIP``), fetched through :mod:`attn_core.hub`.
        context_length: ids per text.
        clean: ``"whitespace"`` (open_clip's default here), ``"lower"`` or ``"canonicalize"``
            (SigLIP: lower case, no punctuation).
        strip_sep_token: replace the ``[SEP]`` id with 0 (CLIPA's BERT tokenizer).
        cache_dir, local_files_only: passed to the hub download.
    """

    def __init__(
        self,
        name_or_path: str | Path,
        context_length: int = DEFAULT_CONTEXT_LENGTH,
        clean: str = "whitespace",
        strip_sep_token: bool = False,
        *,
        cache_dir: str | Path | None = None,
        local_files_only: bool = False,
    ) -> None:
        if context_length < 1:
            raise ValueError(f"context_length must be >= 1, got {context_length}")
        if clean not in _CLEANERS:
            raise ValueError(f"clean must be one of {sorted(_CLEANERS)}, got {clean!r}")
        folder = hf_tokenizer_folder(name_or_path, cache_dir, local_files_only)
        try:
            from transformers import AutoTokenizer
        except ImportError as e:
            raise ImportError(
                f"the tokenizer {str(name_or_path)!r} needs transformers: "
                "pip install 'attn-clip[hf]'"
            ) from e
        self.tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
        self.name_or_path = str(name_or_path)
        self.context_length = context_length
        self.clean = clean
        self.strip_sep_token = strip_sep_token
        self._clean = _CLEANERS[clean]

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as its arguments: DataLoader workers rebuild it from the (cached) files."""
        args = (self.name_or_path, self.context_length, self.clean, self.strip_sep_token)
        return (type(self), args)

    def encode(self, text: str) -> list[int]:
        """Ids of one cleaned string, without special tokens or padding."""
        return self.tokenizer(self._clean(text), add_special_tokens=False)["input_ids"]

    @property
    def num_special_tokens(self) -> int:
        """Ids the tokenizer adds around a text (SigLIP: 1, the final ``</s>``)."""
        return len(self.tokenizer("x")["input_ids"]) - len(self.encode("x"))

    def decode(self, ids: Sequence[int] | torch.Tensor) -> str:
        """Ids back to text; special tokens and padding are dropped."""
        if isinstance(ids, torch.Tensor):
            ids = ids.tolist()
        return self.tokenizer.decode(ids, skip_special_tokens=True).strip()

    def __call__(
        self, texts: str | Sequence[str], context_length: int | None = None
    ) -> torch.LongTensor:
        """One string or a list -> ``(N, context_length)`` ids (truncated, padded)."""
        texts = _as_texts(texts)
        n = context_length or self.context_length
        ids = self.tokenizer(
            [self._clean(t) for t in texts],
            return_tensors="pt",
            max_length=n,
            padding="max_length",
            truncation=True,
        ).input_ids
        if self.strip_sep_token:
            ids = torch.where(ids == self.tokenizer.sep_token_id, torch.zeros_like(ids), ids)
        return ids.long()


def get_tokenizer(
    model: str | CLIPConfig = "ViT-B-32", context_length: int | None = None, **hub_kwargs: Any
) -> Tokenizer | HFTokenizer:
    """The tokenizer of an architecture name or config.

    OpenAI BPE for the standard text tower; :class:`HFTokenizer` for configs that name a
    Hugging Face tokenizer (SigLIP / SigLIP2, CLIPA, MetaCLIP-2 worldwide), downloaded on
    first use (``hub_kwargs``: ``cache_dir``, ``local_files_only``).
    """
    if isinstance(model, str):
        from .registry import get_model_config

        model = get_model_config(model)
    t = model.text
    n = context_length or t.context_length
    kwargs = dict(t.tokenizer_kwargs or {})
    if t.hf_tokenizer_name:
        unknown = sorted(set(kwargs) - {"clean", "strip_sep_token"})
        if unknown:
            raise ValueError(
                f"tokenizer_kwargs {unknown} are not supported; expected clean, strip_sep_token"
            )
        return HFTokenizer(t.hf_tokenizer_name, context_length=n, **kwargs, **hub_kwargs)
    if t.vocab_size < N_MERGES + 512 + 2:
        raise ValueError(
            f"the text tower's vocabulary ({t.vocab_size} ids) is not OpenAI's BPE (49408) and "
            "its config names no tokenizer (text hf_tokenizer_name); pass a tokenizer, e.g. "
            "attn_clip.HFTokenizer(<folder or hub repo of the model's tokenizer>)"
        )
    return Tokenizer(n, **kwargs)
