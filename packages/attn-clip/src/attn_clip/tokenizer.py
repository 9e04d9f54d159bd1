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
(``hf_tokenizer_name``): XLM-RoBERTa (``xlm-roberta-base``), RoBERTa, mT5 and NLLB for the
multilingual towers, SigLIP's sentencepiece (``timm/ViT-B-16-SigLIP``), SigLIP2's Gemma
tokenizer, BERT for CLIPA, ... :class:`HFTokenizer` gives the ids open_clip's ``HFTokenizer``
gets from transformers' ``AutoTokenizer``, computed by the ``tokenizers`` library (no
transformers import):

1. the files: ``tokenizer.json`` (the vocabulary and added tokens), else a sentencepiece
   model (``spiece.model`` / ``sentencepiece.bpe.model`` / ``tokenizer.model``, read by
   :mod:`attn_clip.spm`) converted as transformers converts it for the class (XLM-R / NLLB:
   fairseq's ids ``<s> <pad> </s> <unk>`` first; T5: the ``<extra_id_*>`` sentinels last;
   BPE models: merges generated from the piece ids), else ``vocab.txt`` (BERT) or
   ``vocab.json`` + ``merges.txt`` (RoBERTa); the class from ``tokenizer_config.json``
   (``tokenizer_class``), else ``config.json``'s ``model_type``;
2. the class's pipeline, rebuilt as transformers' class rebuilds it (not the one stored in
   tokenizer.json): e.g. XLM-R / T5 the sentencepiece character map then whitespace split +
   ``▁`` prefix, NLLB the map + space squeezing, RoBERTa byte-level, BERT lower case + accents;
3. the special tokens around the text (``<s> ... </s>``, ``... </s>``, NLLB
   ``[lang] ... </s>``), truncation that keeps them and padding with the pad id to exactly
   ``context_length``, by the backend itself as transformers runs it.

Classes served by a library of their own (``SiglipTokenizer``: the sentencepiece library)
still go through transformers. The files come from a local folder or through
:mod:`attn_core.hub` (cached; offline or unreachable ->
:class:`~attn_core.hub.WeightsUnavailableError` at once).
"""

from __future__ import annotations

import functools
import gzip
import html
import importlib.util
import json
import re
import string
from collections.abc import Callable, Sequence
from itertools import pairwise
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from .config import CLIPConfig

if TYPE_CHECKING:
    from .spm import SentencePieceModel

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


# -- Hugging Face tokenizers -----------------------------------------------------------------

HF_TOKENIZER_CONFIG = "tokenizer_config.json"
HF_TOKENIZER_JSON = "tokenizer.json"
HF_SPM_FILES = ("spiece.model", "sentencepiece.bpe.model", "tokenizer.model")
# one vocabulary, best first: the tokenizers serialization, a sentencepiece model, WordPiece's
# vocab.txt, byte-level BPE's vocab.json (+ merges.txt)
HF_VOCAB_FILES = (HF_TOKENIZER_JSON, *HF_SPM_FILES, "vocab.txt", "vocab.json")
HF_SPECIAL_TOKENS = "special_tokens_map.json"
HF_MODEL_CONFIG = "config.json"  # its model_type names the tokenizer when tokenizer_config doesn't
_OPTIONAL_FILES = (HF_TOKENIZER_CONFIG, HF_SPECIAL_TOKENS, HF_MODEL_CONFIG)
_SPECIAL_KEYS = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)


def hf_tokenizer_folder(
    name_or_path: str | Path, cache_dir: str | Path | None = None, local_files_only: bool = False
) -> Path:
    """The local folder of a Hugging Face tokenizer: ``name_or_path`` itself if it is a
    folder, else the hub cache folder of repo ``name_or_path`` with its tokenizer files
    (downloaded through :func:`attn_core.hub.download` if needed): the first of
    ``tokenizer.json``, ``spiece.model``, ``sentencepiece.bpe.model``, ``tokenizer.model``,
    ``vocab.txt``, ``vocab.json`` (+ ``merges.txt``) the repo has, and, where the repo has
    them, ``tokenizer_config.json``, ``special_tokens_map.json`` and ``config.json``."""
    if Path(name_or_path).is_dir():
        return Path(name_or_path)
    from attn_core import hub

    if str(name_or_path).startswith(("/", ".", "~")) or Path(name_or_path).is_file():
        raise hub.WeightsUnavailableError(
            f"tokenizer folder {str(name_or_path)!r} not found (expected a folder with "
            f"{HF_TOKENIZER_CONFIG} and one of {', '.join(HF_VOCAB_FILES)}, or a hub repo id)"
        )
    repo = str(name_or_path)
    kw = {"cache_dir": cache_dir, "local_files_only": local_files_only}
    try:
        vocab = hub.download(repo, HF_VOCAB_FILES, **kw)
        if vocab.name == "vocab.json":
            hub.download(repo, "merges.txt", **kw)
    except hub.WeightsUnavailableError as e:
        raise hub.WeightsUnavailableError(
            f"tokenizer ({HF_TOKENIZER_CONFIG} and one of {', '.join(HF_VOCAB_FILES)}): {e} "
            "(A tokenizer folder works too: attn_clip.HFTokenizer(<folder>).)"
        ) from None
    # optional files: from the cache, else one reachability check and a try each
    missing = []
    for name in _OPTIONAL_FILES:
        try:
            hub.download(repo, name, cache_dir=cache_dir, local_files_only=True)
        except hub.WeightsUnavailableError:
            missing.append(name)
    if missing and not local_files_only and not _hub_offline() and hub.hub_unreachable() is None:
        for name in missing:
            try:
                hub.download(repo, name, **kw)
            except hub.WeightsUnavailableError:
                pass  # the repo has no such file
    return vocab.parent


def _hub_offline() -> bool:
    from huggingface_hub import constants

    return bool(getattr(constants, "HF_HUB_OFFLINE", False))


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold a JSON object, got {type(data).__name__}")
    return data


def _content(token: Any) -> str | None:
    """A special token's text: a string, or the ``content`` of a serialized AddedToken."""
    if isinstance(token, dict):
        token = token.get("content")
    return None if token is None else str(token)


# transformers' tokenizer classes served here, by the model_type of a config.json
# (transformers' TOKENIZER_MAPPING_NAMES); siglip2 repos name GemmaTokenizer but are
# Siglip2Tokenizer (transformers' MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS)
_MODEL_TYPE_CLASSES = {
    "xlm-roberta": "XLMRobertaTokenizer",
    "roberta": "RobertaTokenizer",
    "t5": "T5Tokenizer",
    "mt5": "T5Tokenizer",
    "nllb": "NllbTokenizer",
    "nllb-moe": "NllbTokenizer",
    "bert": "BertTokenizer",
    "gemma": "GemmaTokenizer",
    "gemma2": "GemmaTokenizer",
    "gemma3": "GemmaTokenizer",
    "gemma3_text": "GemmaTokenizer",
    "siglip": "SiglipTokenizer",
    "siglip2": "Siglip2Tokenizer",
    "m2m_100": "M2M100Tokenizer",
}
_HUB_CLASS_OVERRIDDEN = {"siglip2"}
_FAIRSEQ_SPECIALS = {
    "bos_token": "<s>",
    "eos_token": "</s>",
    "sep_token": "</s>",
    "cls_token": "<s>",
    "unk_token": "<unk>",
    "pad_token": "<pad>",
    "mask_token": "<mask>",
}
_GEMMA_SPECIALS = {
    "unk_token": "<unk>",
    "bos_token": "<bos>",
    "eos_token": "<eos>",
    "pad_token": "<pad>",
    "mask_token": "<mask>",
}
# each class's default special tokens (its __init__ arguments in transformers)
_CLASS_SPECIALS: dict[str, dict[str, str]] = {
    "XLMRobertaTokenizer": _FAIRSEQ_SPECIALS,
    "RobertaTokenizer": _FAIRSEQ_SPECIALS,
    "NllbTokenizer": _FAIRSEQ_SPECIALS,
    "T5Tokenizer": {"eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"},
    "BertTokenizer": {
        "unk_token": "[UNK]",
        "sep_token": "[SEP]",
        "pad_token": "[PAD]",
        "cls_token": "[CLS]",
        "mask_token": "[MASK]",
    },
    "GemmaTokenizer": _GEMMA_SPECIALS,
    "Siglip2Tokenizer": _GEMMA_SPECIALS,
}
_LEFT_PADDED = {"GemmaTokenizer", "Siglip2Tokenizer"}  # their class default padding_side
TOKENIZERS_CLASSES = (*_CLASS_SPECIALS, "TokenizersBackend", "PreTrainedTokenizerFast")


def _tokenizer_class(config: dict[str, Any], model_config: dict[str, Any]) -> str | None:
    """transformers' class for these files, as AutoTokenizer picks it: the class the repo
    names (tokenizer_config.json, else config.json), else the one of config.json's model_type."""
    named = config.get("tokenizer_class") or model_config.get("tokenizer_class")
    model_type = model_config.get("model_type")
    registered = _MODEL_TYPE_CLASSES.get(model_type) if isinstance(model_type, str) else None
    if named and registered and model_type in _HUB_CLASS_OVERRIDDEN:
        return registered
    if named:
        return str(named).removesuffix("Fast")
    return registered


def _generate_merges(vocab: dict[str, int]) -> list[tuple[str, str]]:
    """BPE merges from a vocabulary alone, as transformers' ``generate_merges`` builds them for
    a sentencepiece BPE model: every split of a piece into two pieces, ranked by the id of the
    merged piece (then the lengths, then the ids of the halves)."""
    merges = []
    for piece, rank in vocab.items():
        local = [
            (piece[:i], piece[i:], rank)
            for i in range(1, len(piece))
            if piece[:i] in vocab and piece[i:] in vocab
        ]
        merges += sorted(local, key=lambda m: (vocab[m[0]], vocab[m[1]]))
    merges.sort(key=lambda m: (m[2], len(m[0]), len(m[1])))
    return [(left, right) for left, right, _ in merges]


def _read_bpe_files(folder: Path) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Byte-level BPE's ``vocab.json`` and ``merges.txt`` (GPT-2 / RoBERTa)."""
    vocab = _read_json(folder / "vocab.json")
    merges_file = folder / "merges.txt"
    if not merges_file.is_file():
        raise ValueError(f"{folder}: vocab.json needs its merges.txt next to it")
    merges = []
    for line in merges_file.read_text(encoding="utf-8").splitlines():
        if line.startswith("#version") or not line.strip():
            continue
        parts = line.split()
        if len(parts) != 2:
            raise ValueError(f"{merges_file}: expected 'left right' per line, got {line!r}")
        merges.append((parts[0], parts[1]))
    return {str(k): int(v) for k, v in vocab.items()}, merges


def _read_wordpiece_vocab(path: Path) -> dict[str, int]:
    """BERT's ``vocab.txt``: one token a line, the line number its id."""
    lines = path.read_text(encoding="utf-8").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    vocab: dict[str, int] = {}
    for i, token in enumerate(lines):
        vocab.setdefault(token, i)
    return vocab


def _json_charsmap(spec: dict[str, Any] | None) -> bytes | None:
    """The sentencepiece character map of a tokenizer.json normalizer (``Precompiled``, alone
    or in a ``Sequence``), as transformers reads it when it rebuilds a tokenizer class."""
    import base64

    if not spec:
        return None
    items = spec.get("normalizers", []) if spec.get("type") == "Sequence" else [spec]
    for item in items:
        if isinstance(item, dict) and item.get("type") == "Precompiled":
            charsmap = item.get("precompiled_charsmap")
            if charsmap:
                return base64.b64decode(charsmap)
    return None


class _Files:
    """A tokenizer folder's files and settings: which transformers class they are for, the
    merged ``tokenizer_config.json`` / ``special_tokens_map.json`` (the class defaults under
    them), and the vocabulary file that will be read."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.config = _read_json(folder / HF_TOKENIZER_CONFIG)
        self.cls = _tokenizer_class(self.config, _read_json(folder / HF_MODEL_CONFIG))
        self.json_path = folder / HF_TOKENIZER_JSON
        if not self.json_path.is_file():
            self.json_path = None
        self.spm_path = next((folder / n for n in HF_SPM_FILES if (folder / n).is_file()), None)
        # the class defaults, under tokenizer_config's tokens, under special_tokens_map's
        # (which transformers reads only when tokenizer_config has no added_tokens_decoder)
        keys = {*_SPECIAL_KEYS, "additional_special_tokens", "extra_special_tokens"}
        self.specials = dict(_CLASS_SPECIALS.get(self.cls or "", {}))
        self.specials.update({k: v for k, v in self.config.items() if k in keys})
        if "added_tokens_decoder" not in self.config:
            special_map = _read_json(folder / HF_SPECIAL_TOKENS)
            self.specials.update({k: v for k, v in special_map.items() if k in keys})

    def token(self, key: str) -> str | None:
        """A named special token's text (``"eos_token"`` -> ``"</s>"``), None if it has none."""
        return _content(self.specials.get(key))

    def extra_tokens(self) -> list[Any]:
        extra = self.specials.get("extra_special_tokens") or self.specials.get(
            "additional_special_tokens"
        )
        return list(extra.values() if isinstance(extra, dict) else extra or [])

    def extra_ids(self) -> int:
        """T5's number of sentinel tokens (``<extra_id_0>`` ...): tokenizer_config's, else 100."""
        n = self.config.get("extra_ids", 100)
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise ValueError(f"{self.folder}: extra_ids must be an int >= 0, got {n!r}")
        return n

    def spm(self) -> SentencePieceModel:
        from .spm import read_model

        if self.spm_path is None:
            raise ValueError(
                f"{self.folder}: a {self.cls} tokenizer needs {HF_TOKENIZER_JSON} or a "
                f"sentencepiece model ({', '.join(HF_SPM_FILES)})"
            )
        return read_model(self.spm_path)


def _build_model(files: _Files) -> tuple[Any, bytes | None]:
    """``(tokenizers.Tokenizer with the class's model, sentencepiece character map)`` read
    from the folder's tokenizer.json, or else converted from its sentencepiece / vocabulary
    files the way transformers converts them for that class."""
    from tokenizers import Tokenizer
    from tokenizers.models import BPE, Unigram, WordPiece

    cls = files.cls
    if files.json_path is not None:
        try:
            tok = Tokenizer.from_file(str(files.json_path))
        except Exception as e:  # tokenizers raises a bare Exception for a bad file
            raise ValueError(f"{files.json_path} is not a tokenizers file: {e}") from None
        normalizer = None if tok.normalizer is None else json.loads(tok.normalizer.__getstate__())
        return tok, _json_charsmap(normalizer)
    tok_str = files.token
    if cls in (
        "XLMRobertaTokenizer",
        "T5Tokenizer",
        "NllbTokenizer",
        "GemmaTokenizer",
        "Siglip2Tokenizer",
    ):
        sp = files.spm()
        charsmap = sp.precompiled_charsmap or None
        pieces = sp.vocab()
        if cls == "XLMRobertaTokenizer":  # fairseq's ids: <s> <pad> </s> <unk>, pieces, <mask>
            head = [(tok_str(k), 0.0) for k in ("bos_token", "pad_token", "eos_token", "unk_token")]
            vocab = [*head, *pieces[3:], (tok_str("mask_token"), 0.0)]
            tok = Tokenizer(Unigram(vocab, unk_id=3, byte_fallback=False))
        elif cls == "T5Tokenizer":  # the pieces, then the sentinels <extra_id_99> ... <extra_id_0>
            extra_ids = files.extra_ids()
            sentinels = [(f"<extra_id_{i}>", 0.0) for i in range(extra_ids - 1, -1, -1)]
            tok = Tokenizer(Unigram([*pieces, *sentinels], unk_id=2, byte_fallback=False))
        else:  # sentencepiece BPE: merges generated from the piece ids
            spm_vocab = {piece: i for i, (piece, _) in enumerate(pieces)}
            merges = _generate_merges(spm_vocab)
            if cls == "NllbTokenizer":  # fairseq's ids: <s> <pad> </s> <unk>, then the pieces
                vocab = {
                    tok_str(k): i
                    for i, k in enumerate(("bos_token", "pad_token", "eos_token", "unk_token"))
                }
                for piece in spm_vocab:
                    vocab.setdefault(piece, len(vocab))
                model = BPE(
                    vocab,
                    merges,
                    unk_token=tok_str("unk_token"),
                    fuse_unk=True,
                    byte_fallback=False,
                    dropout=None,
                )
            else:
                model = BPE(
                    spm_vocab,
                    merges,
                    unk_token=tok_str("unk_token"),
                    fuse_unk=True,
                    byte_fallback=True,
                    dropout=None,
                )
            tok = Tokenizer(model)
        # sentencepiece's control and user-defined pieces are added tokens
        from tokenizers import AddedToken

        added = [
            AddedToken(p, normalized=False, special=kind == 3)
            for p, _, kind in sp.pieces
            if kind in (3, 4)
        ]
        tok.add_tokens(added)
        return tok, charsmap
    if cls == "BertTokenizer" and (files.folder / "vocab.txt").is_file():
        vocab = _read_wordpiece_vocab(files.folder / "vocab.txt")
        return Tokenizer(WordPiece(vocab, unk_token=tok_str("unk_token"))), None
    if cls == "RobertaTokenizer" and (files.folder / "vocab.json").is_file():
        vocab, merges = _read_bpe_files(files.folder)
        return Tokenizer(
            BPE(
                vocab,
                merges,
                dropout=None,
                continuing_subword_prefix="",
                end_of_word_suffix="",
                fuse_unk=False,
            )
        ), None
    raise ValueError(
        f"{files.folder}: no {HF_TOKENIZER_JSON} and no vocabulary file a "
        f"{cls or 'Hugging Face'} tokenizer is read from"
    )


def _pipeline(files: _Files, tok: Any, charsmap: bytes | None) -> None:
    """Set the class's normalizer, pre-tokenizer and decoder on ``tok``, as transformers'
    tokenizer class builds them over the vocabulary (it rebuilds them from the class, not
    from tokenizer.json, for every class here; other classes keep tokenizer.json's)."""
    from tokenizers import Regex, decoders, normalizers, pre_tokenizers

    cls, cfg = files.cls, files.config
    precompiled = [normalizers.Precompiled(charsmap)] if charsmap else []
    if cls in ("XLMRobertaTokenizer", "T5Tokenizer"):
        scheme = "always" if cls == "T5Tokenizer" or cfg.get("add_prefix_space", True) else "never"
        tok.normalizer = precompiled[0] if precompiled else None
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.WhitespaceSplit(),
                pre_tokenizers.Metaspace(replacement="▁", prepend_scheme=scheme, split=True),
            ]
        )
        tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme=scheme, split=True)
    elif cls == "NllbTokenizer":
        squeeze = normalizers.Replace(Regex(r" {2,}"), " ")
        tok.normalizer = normalizers.Sequence([*precompiled, squeeze]) if precompiled else None
        tok.pre_tokenizer = pre_tokenizers.Metaspace("▁", prepend_scheme="always", split=True)
        tok.decoder = decoders.Metaspace("▁", prepend_scheme="always", split=True)
    elif cls == "RobertaTokenizer":
        tok.normalizer = None
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(
            add_prefix_space=bool(cfg.get("add_prefix_space", False))
        )
        tok.decoder = decoders.ByteLevel()
    elif cls == "BertTokenizer":
        tok.normalizer = normalizers.BertNormalizer(
            clean_text=True,
            handle_chinese_chars=bool(cfg.get("tokenize_chinese_chars", True)),
            strip_accents=cfg.get("strip_accents"),
            lowercase=bool(cfg.get("do_lower_case", True)),
        )
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece(prefix="##")
    elif cls in ("GemmaTokenizer", "Siglip2Tokenizer"):
        spaces = normalizers.Replace(" ", "▁")
        lower = [normalizers.Lowercase()] if cls == "Siglip2Tokenizer" else []
        tok.normalizer = normalizers.Sequence([*lower, spaces]) if lower else spaces
        tok.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous")
        tok.decoder = decoders.Sequence(
            [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
        )


def _add_special_tokens(files: _Files, tok: Any) -> None:
    """The special tokens transformers adds to the backend, in its order: tokenizer_config's
    ``added_tokens_decoder`` (by id), the named ones (bos, eos, unk, sep, pad, cls, mask), the
    extra ones (``additional_special_tokens``; T5's sentinels). A token already in the
    vocabulary keeps its id; a new one gets the next id."""
    from tokenizers import AddedToken

    known = {t.content for t in tok.get_added_tokens_decoder().values()}
    wanted: list[AddedToken] = []

    def want(token: Any, special: bool = True) -> None:
        if isinstance(token, dict):
            props = {
                k: token[k]
                for k in ("single_word", "lstrip", "rstrip", "normalized", "special")
                if k in token
            }
            content = _content(token)
        else:
            props, content = {}, _content(token)
        if content is None or content in known:
            return
        known.add(content)
        props.setdefault("special", special)
        props.setdefault("normalized", not props["special"])
        wanted.append(AddedToken(content, **props))

    decoder = files.config.get("added_tokens_decoder") or {}
    for _, token in sorted(decoder.items(), key=lambda item: int(item[0])):
        want(token)
    for key in _SPECIAL_KEYS:
        want(files.specials.get(key))
    for token in files.extra_tokens():
        want(token)
    if files.cls == "T5Tokenizer" and not any(
        "<extra_id_" in str(_content(t)) for t in files.extra_tokens()
    ):
        for i in range(files.extra_ids()):
            want(f"<extra_id_{i}>")
    if wanted:
        tok.add_special_tokens(wanted)


class _Backend:
    """A ``tokenizers.Tokenizer`` set up as transformers sets up the class's tokenizer:
    ``__call__`` with ``max_length`` padding and truncation (special tokens kept) is the
    backend's own truncation and padding, exactly as transformers runs it."""

    def __init__(self, files: _Files, language: str | None) -> None:
        self.files = files
        self.cls = files.cls or "TokenizersBackend"
        tok, charsmap = _build_model(files)
        _pipeline(files, tok, charsmap)
        _add_special_tokens(files, tok)
        self.tok = tok
        cfg = files.config
        self.padding_side = cfg.get("padding_side") or (
            "left" if self.cls in _LEFT_PADDED else "right"
        )
        self.truncation_side = cfg.get("truncation_side") or "right"
        for side in (self.padding_side, self.truncation_side):
            if side not in ("left", "right"):
                raise ValueError(
                    f"{files.folder}: padding_side / truncation_side must be 'left' or 'right', "
                    f"got {side!r}"
                )
        self.pad_token = files.token("pad_token")
        self.pad_token_id = self._id("pad_token")
        self.sep_token_id = self._id("sep_token")
        self.clean_up_spaces = bool(cfg.get("clean_up_tokenization_spaces", False))
        self.language = None
        self._post_processor(language)
        self._settings: tuple[Any, ...] | None = None

    def _id(self, key: str) -> int | None:
        token = self.files.token(key)
        return None if token is None else self.tok.token_to_id(token)

    def _post_processor(self, language: str | None) -> None:
        """The special tokens around each text: the class's template (NLLB: the language)."""
        from tokenizers import processors

        cls, tok, token, ids = self.cls, self.tok, self.files.token, self._id
        if language is not None and cls != "NllbTokenizer":
            raise ValueError(
                f"language={language!r} needs a tokenizer with source-language tokens (NLLB's "
                f"NllbTokenizer); {self.files.folder} is a {cls}"
            )
        if cls == "XLMRobertaTokenizer":
            bos, eos = token("bos_token"), token("eos_token")
            tok.post_processor = processors.TemplateProcessing(
                single=[bos, "$A", eos],
                pair=[bos, "$A", eos, eos, "$B", eos],
                special_tokens=[(bos, ids("bos_token")), (eos, ids("eos_token"))],
            )
        elif cls == "T5Tokenizer":
            tok.post_processor = processors.TemplateProcessing(
                single=["$A", "</s>"],
                pair=["$A", "</s>", "$B", "</s>"],
                special_tokens=[("</s>", ids("eos_token"))],
            )
        elif cls == "RobertaTokenizer":
            tok.post_processor = processors.RobertaProcessing(
                (token("sep_token"), ids("sep_token")),
                (token("cls_token"), ids("cls_token")),
                trim_offsets=bool(self.files.config.get("trim_offsets", True)),
                add_prefix_space=bool(self.files.config.get("add_prefix_space", False)),
            )
        elif cls == "BertTokenizer":
            c, s = token("cls_token"), token("sep_token")
            c_id, s_id = ids("cls_token"), ids("sep_token")
            tok.post_processor = processors.TemplateProcessing(
                single=f"{c}:0 $A:0 {s}:0",
                pair=f"{c}:0 $A:0 {s}:0 $B:1 {s}:1",
                special_tokens=[(c, 2 if c_id is None else c_id), (s, 3 if s_id is None else s_id)],
            )
        elif cls == "NllbTokenizer":
            self._language_template(language)
        elif tok.post_processor is None or (
            self.files.json_path is None
            and ("add_bos_token" in self.files.config or "add_eos_token" in self.files.config)
        ):  # transformers' update_post_processor: bos / eos by the config's flags
            self._bos_eos_template()

    def _language_template(self, language: str | None) -> None:
        """NLLB: ``[lang] tokens </s>`` (or ``tokens </s> [lang]`` with legacy_behaviour), the
        language from the argument, else tokenizer_config's ``src_lang``, else eng_Latn."""
        from tokenizers import processors

        lang = language or self.files.config.get("src_lang") or "eng_Latn"
        lang_id = self.tok.token_to_id(lang)
        if lang_id is None or lang not in {
            t.content for t in self.tok.get_added_tokens_decoder().values()
        }:
            codes = [
                t.content
                for t in self.tok.get_added_tokens_decoder().values()
                if re.fullmatch(r"[a-z]{3}_[A-Z][a-z]{3}", t.content)
            ]
            shown = ", ".join(codes[:8]) + (", ..." if len(codes) > 8 else "")
            raise ValueError(
                f"language {lang!r} is not one of the tokenizer's {len(codes)} language codes "
                f"({shown or 'none'})"
            )
        eos, eos_id = self.files.token("eos_token"), self._id("eos_token")
        if self.files.config.get("legacy_behaviour", False):
            single, pair = ["$A", eos, lang], ["$A", "$B", eos, lang]
        else:
            single, pair = [lang, "$A", eos], [lang, "$A", "$B", eos]
        self.tok.post_processor = processors.TemplateProcessing(
            single=single, pair=pair, special_tokens=[(eos, eos_id), (lang, lang_id)]
        )
        self.language = lang

    def _bos_eos_template(self) -> None:
        from tokenizers import processors

        cfg, token = self.files.config, self.files.token
        use_bos = bool(cfg.get("add_bos_token", False)) and token("bos_token") is not None
        use_eos = bool(cfg.get("add_eos_token", False)) and token("eos_token") is not None
        bos, eos = token("bos_token"), token("eos_token")
        first, last = [bos] if use_bos else [], [eos] if use_eos else []

        def part(seq: str, type_id: int) -> str:  # "<bos>:0 $A:0 <eos>:0"
            return " ".join(f"{t}:{type_id}" for t in [*first, seq, *last])

        single, pair = part("$A", 0), f"{part('$A', 0)} {part('$B', 1)}"
        special = [(bos, self._id("bos_token"))] if use_bos else []
        special += [(eos, self._id("eos_token"))] if use_eos else []
        self.tok.post_processor = processors.TemplateProcessing(
            single=single, pair=pair, special_tokens=special
        )

    @property
    def num_special_tokens(self) -> int:
        post = self.tok.post_processor
        return 0 if post is None else post.num_special_tokens_to_add(False)

    def encode(self, text: str) -> list[int]:
        self._configure(None)
        return self.tok.encode(text, add_special_tokens=False).ids

    def template(self) -> tuple[list[int], list[int]]:
        """The special ids the tokenizer puts before and after a text."""
        self._configure(None)
        enc = self.tok.encode("x")
        return _split_template(enc.ids, enc.special_tokens_mask)

    def __call__(self, texts: list[str], n: int) -> torch.LongTensor:
        if not texts:
            return torch.zeros(0, n, dtype=torch.long)
        if self.pad_token_id is None:
            raise ValueError(
                f"{self.files.folder}: the tokenizer has no padding token (pad_token "
                f"{self.pad_token!r}), so it cannot pad to context_length"
            )
        if n < self.num_special_tokens + 1:
            raise ValueError(
                f"context_length must leave room for a token after the tokenizer's "
                f"{self.num_special_tokens} special tokens, got {n}"
            )
        self._configure(n)
        return torch.tensor([e.ids for e in self.tok.encode_batch(texts)], dtype=torch.long)

    def _configure(self, n: int | None) -> None:
        """Truncation and padding to ``n`` (None: neither), set only when they change."""
        if self._settings == (n,):
            return
        if n is None:
            self.tok.no_truncation()
            self.tok.no_padding()
        else:
            self.tok.enable_truncation(
                n, stride=0, strategy="longest_first", direction=self.truncation_side
            )
            self.tok.enable_padding(
                direction=self.padding_side,
                pad_id=self.pad_token_id,
                pad_token=self.pad_token,
                length=n,
            )
        self._settings = (n,)

    def decode(self, ids: list[int]) -> str:
        text = self.tok.decode(ids, skip_special_tokens=True)
        if self.clean_up_spaces and type(self.tok.model).__name__ != "BPE":
            for a, b in (
                (" .", "."),
                (" ?", "?"),
                (" !", "!"),
                (" ,", ","),
                (" ' ", "'"),
                (" n't", "n't"),
                (" 'm", "'m"),
                (" 's", "'s"),
                (" 've", "'ve"),
                (" 're", "'re"),
            ):
                text = text.replace(a, b)
        return text


class _TransformersBackend:
    """transformers' ``AutoTokenizer`` for the classes not served by ``tokenizers`` here
    (SigLIP's ``SiglipTokenizer`` runs the sentencepiece library itself; M2M100's too)."""

    def __init__(self, files: _Files, language: str | None) -> None:
        try:
            from transformers import AutoTokenizer
        except ImportError as e:
            raise ImportError(
                f"the {files.cls} tokenizer in {files.folder} needs transformers: "
                "pip install 'attn-clip[hf]'"
            ) from e
        self.files, self.cls = files, files.cls
        self.tok = AutoTokenizer.from_pretrained(str(files.folder), local_files_only=True)
        self.language = None
        if language is not None:
            set_lang = getattr(self.tok, "set_src_lang_special_tokens", None)
            if not callable(set_lang):
                raise ValueError(
                    f"language={language!r} needs a tokenizer with source-language tokens; "
                    f"{files.folder} is a {files.cls}"
                )
            set_lang(language)
            self.language = language
        self.sep_token_id = self.tok.sep_token_id
        self.pad_token_id = self.tok.pad_token_id

    @property
    def num_special_tokens(self) -> int:
        return len(self.tok("x")["input_ids"]) - len(self.encode("x"))

    def template(self) -> tuple[list[int], list[int]]:
        enc = self.tok("x", return_special_tokens_mask=True)
        return _split_template(enc["input_ids"], enc["special_tokens_mask"])

    def encode(self, text: str) -> list[int]:
        return self.tok(text, add_special_tokens=False)["input_ids"]

    def __call__(self, texts: list[str], n: int) -> torch.LongTensor:
        if not texts:
            return torch.zeros(0, n, dtype=torch.long)
        out = self.tok(
            texts, return_tensors="pt", max_length=n, padding="max_length", truncation=True
        )
        return out.input_ids.long()

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=True)


def _split_template(ids: list[int], special: list[int]) -> tuple[list[int], list[int]]:
    """``(leading special ids, trailing special ids)`` of one encoded text."""
    words = [i for i, s in enumerate(special) if not s]
    if not words:
        return list(ids), []
    return list(ids[: words[0]]), list(ids[words[-1] + 1 :])


def load_hf_tokenizer(folder: str | Path, language: str | None = None) -> Any:
    """The tokenizer of a Hugging Face tokenizer folder: a ``tokenizers`` backend for the
    classes in :data:`TOKENIZERS_CLASSES` (and for a bare tokenizer.json), else transformers.

    Raises:
        ValueError: the folder has no tokenizer files, or files the class cannot be read from.
    """
    folder = Path(folder)
    present = [n for n in HF_VOCAB_FILES if (folder / n).is_file()]
    if not present:
        raise ValueError(
            f"{folder} has no tokenizer files: expected one of {', '.join(HF_VOCAB_FILES)} "
            f"(with {HF_TOKENIZER_CONFIG})"
        )
    files = _Files(folder)
    if files.cls in TOKENIZERS_CLASSES or (files.cls is None and files.json_path is not None):
        return _Backend(files, language)
    if files.cls is None:
        raise ValueError(
            f"{folder}: cannot tell which tokenizer {', '.join(present)} is for: no "
            f"{HF_TOKENIZER_JSON}, and neither {HF_TOKENIZER_CONFIG} (tokenizer_class) nor "
            f"{HF_MODEL_CONFIG} (model_type) names it"
        )
    return _TransformersBackend(files, language)


def _rebuild_hf_tokenizer(cls: type, kwargs: dict[str, Any]) -> Any:
    return cls(**kwargs)


class HFTokenizer:
    """A Hugging Face tokenizer with open_clip's ``HFTokenizer`` behaviour: each text is
    cleaned, then tokenized to exactly ``context_length`` ids (``max_length`` padding with
    the pad id, truncation that keeps the special tokens: XLM-R ``<s> ... </s>``, SigLIP /
    mT5 ``... </s>``, NLLB ``[lang] ... </s>``).

    The ids are transformers' (``AutoTokenizer`` of the folder) computed by the
    ``tokenizers`` library from the folder's ``tokenizer.json`` or, when it has none, from
    its sentencepiece model (read by :mod:`attn_clip.spm`), ``vocab.txt`` or
    ``vocab.json`` + ``merges.txt``, set up as transformers sets up the tokenizer class:
    XLM-RoBERTa, RoBERTa, T5 / mT5 / SigLIP, NLLB, BERT, Gemma / SigLIP2 (and any bare
    tokenizer.json). Other classes (e.g. ``SiglipTokenizer``, which runs the sentencepiece
    library itself) still go through transformers, imported for them only.

    Args:
        name_or_path: a folder with the tokenizer's files, or a hub repo id
            (``xlm-roberta-base``, ``timm/ViT-B-16-SigLIP``), fetched through
            :mod:`attn_core.hub` (cached; offline and not cached ->
            :class:`~attn_core.hub.WeightsUnavailableError` at once).
        context_length: ids per text.
        clean: ``"whitespace"`` (open_clip's default here), ``"lower"`` or ``"canonicalize"``
            (SigLIP: lower case, no punctuation).
        strip_sep_token: replace the ``[SEP]`` id with 0 (CLIPA's BERT tokenizer).
        language: NLLB's source language code (``"fra_Latn"``): each text becomes
            ``[fra_Latn] tokens </s>``; default tokenizer_config's ``src_lang`` (eng_Latn).
            ValueError for a tokenizer without language codes or a code it does not have.
        cache_dir, local_files_only: passed to the hub download.
    """

    def __init__(
        self,
        name_or_path: str | Path,
        context_length: int = DEFAULT_CONTEXT_LENGTH,
        clean: str = "whitespace",
        strip_sep_token: bool = False,
        language: str | None = None,
        *,
        cache_dir: str | Path | None = None,
        local_files_only: bool = False,
    ) -> None:
        if context_length < 1:
            raise ValueError(f"context_length must be >= 1, got {context_length}")
        if clean not in _CLEANERS:
            raise ValueError(f"clean must be one of {sorted(_CLEANERS)}, got {clean!r}")
        if language is not None and not isinstance(language, str):
            raise ValueError(f"language must be a language code string, got {language!r}")
        folder = hf_tokenizer_folder(name_or_path, cache_dir, local_files_only)
        self.tokenizer = load_hf_tokenizer(folder, language)
        self.name_or_path = str(name_or_path)
        self.context_length = context_length
        self.clean = clean
        self.strip_sep_token = strip_sep_token
        self.language: str | None = self.tokenizer.language  # NLLB: the code in use
        self._language_arg = language
        self._hub = {"cache_dir": cache_dir, "local_files_only": local_files_only}
        self._clean = _CLEANERS[clean]

    @property
    def tokenizer_class(self) -> str:
        """The transformers tokenizer class the files are for (``"XLMRobertaTokenizer"``)."""
        return self.tokenizer.cls

    @property
    def backend(self) -> str:
        """``"tokenizers"`` or ``"transformers"``: what computes the ids."""
        return "tokenizers" if isinstance(self.tokenizer, _Backend) else "transformers"

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as its arguments: DataLoader workers rebuild it from the (cached) files."""
        kwargs = {
            "name_or_path": self.name_or_path,
            "context_length": self.context_length,
            "clean": self.clean,
            "strip_sep_token": self.strip_sep_token,
            "language": self._language_arg,
            **self._hub,
        }
        return (_rebuild_hf_tokenizer, (type(self), kwargs))

    def encode(self, text: str) -> list[int]:
        """Ids of one cleaned string, without special tokens or padding."""
        return self.tokenizer.encode(self._clean(text))

    @property
    def num_special_tokens(self) -> int:
        """Ids the tokenizer adds around a text (SigLIP: 1, the final ``</s>``; XLM-R: 2)."""
        return self.tokenizer.num_special_tokens

    @property
    def pad_token_id(self) -> int | None:
        """The padding id (XLM-R / RoBERTa / NLLB: 1; T5 / SigLIP / BERT: 0)."""
        return self.tokenizer.pad_token_id

    @property
    def sot_token_id(self) -> int | None:
        """The special id each text starts with (XLM-R ``<s>``, BERT ``[CLS]``, NLLB its
        language code), None when there is none (T5 / SigLIP)."""
        prefix, _ = self.tokenizer.template()
        return prefix[0] if prefix else None

    @property
    def eot_token_id(self) -> int | None:
        """The special id ending each text (``</s>``, BERT ``[SEP]``), None when there is none."""
        _, suffix = self.tokenizer.template()
        return suffix[0] if suffix else None

    def decode(self, ids: Sequence[int] | torch.Tensor) -> str:
        """Ids back to text; special tokens and padding are dropped."""
        if isinstance(ids, torch.Tensor):
            ids = ids.tolist()
        return self.tokenizer.decode([int(i) for i in ids]).strip()

    def __call__(
        self, texts: str | Sequence[str], context_length: int | None = None
    ) -> torch.LongTensor:
        """One string or a list -> ``(N, context_length)`` ids (truncated, padded)."""
        texts = _as_texts(texts)
        n = context_length or self.context_length
        ids = self.tokenizer([self._clean(t) for t in texts], n)
        sep = self.tokenizer.sep_token_id
        if self.strip_sep_token and sep is not None:
            ids = torch.where(ids == sep, torch.zeros_like(ids), ids)
        return ids


def get_tokenizer(
    model: str | CLIPConfig = "ViT-B-32",
    context_length: int | None = None,
    language: str | None = None,
    **hub_kwargs: Any,
) -> Tokenizer | HFTokenizer:
    """The tokenizer of an architecture name or config.

    OpenAI BPE for the standard text tower; :class:`HFTokenizer` for configs that name a
    Hugging Face tokenizer (SigLIP / SigLIP2, CLIPA, MetaCLIP-2 worldwide, the XLM-R /
    RoBERTa / mT5 / NLLB text towers), downloaded on first use (``hub_kwargs``:
    ``cache_dir``, ``local_files_only``). ``language``: NLLB's source language code
    (``"fra_Latn"``); a ValueError for any other tokenizer.
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
        return HFTokenizer(
            t.hf_tokenizer_name, context_length=n, language=language, **kwargs, **hub_kwargs
        )
    if language is not None:
        raise ValueError(
            f"language={language!r} needs a tokenizer with source-language tokens (NLLB); the "
            "text tower uses OpenAI's BPE"
        )
    if t.vocab_size < N_MERGES + 512 + 2:
        raise ValueError(
            f"the text tower's vocabulary ({t.vocab_size} ids) is not OpenAI's BPE (49408) and "
            "its config names no tokenizer (text hf_tokenizer_name); pass a tokenizer, e.g. "
            "attn_clip.HFTokenizer(<folder or hub repo of the model's tokenizer>)"
        )
    return Tokenizer(n, **kwargs)
