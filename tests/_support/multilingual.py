"""Tiny multilingual tokenizers and CLIPs, built offline: the shared builders of the
tokenizer tests (tests/clip/test_hf_tokenizer.py), the multilingual app tests
(tests/apps/test_multilingual.py) and the fine-tuning tests of Hugging Face text towers
(tests/scripts/test_train_clip_hf_text.py).

The tokenizers are sentencepiece models trained here on :data:`CORPUS` (English, German,
Chinese, Arabic, Hindi, French, Russian, emoji), laid out as the hub repos ship them
(``sentencepiece.bpe.model`` + ``tokenizer_config.json`` naming the class; NLLB's lists its
language codes). The CLIPs are open_clip's ``xlm-roberta-base-ViT-B-32`` and
``nllb-clip-base`` with each tower cut to 1-2 blocks, 64 wide, random init, saved by
``attn_clip.save_pretrained`` with the tokenizer in the same folder (what
``create_model_and_transforms(folder)`` reads it from).
"""

from __future__ import annotations

import io
import json
from pathlib import Path

CORPUS = [
    "a photo of a dog", "a cat sitting on a mat", "the quick brown fox jumps over the lazy dog",
    "ein Foto eines Hundes", "Straße und Größe über alles", "Die Katze schläft auf dem Sofa",
    "一只狗的照片", "猫坐在垫子上", "我们喜欢学习中文",
    "صورة كلب", "القط يجلس على السجادة", "مرحبا بالعالم",
    "एक कुत्ते की तस्वीर", "बिल्ली चटाई पर बैठी है", "नमस्ते दुनिया",
    "une photo d'un chien", "le chat est assis", "naïve café résumé",
    "фотография собаки", "кошка сидит на коврике", "🙂 emoji 👍 party 🎉", "numbers 123 4567 3.14",
]  # fmt: skip


def train_spm(
    model_type: str,
    vocab_size: int,
    corpus: list[str] | None = None,
    character_coverage: float = 0.98,
    **ids,
) -> bytes:
    """A sentencepiece model (``"unigram"`` / ``"bpe"``) trained on ``corpus`` (default
    :data:`CORPUS`; characters rarer than ``character_coverage`` become ``<unk>``), as the
    bytes of its ``.model`` file; ``ids``: trainer options such as
    ``unk_id=0, bos_id=1, eos_id=2, pad_id=-1``."""
    import sentencepiece as spm

    out = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter((corpus or CORPUS) * 10),
        model_writer=out,
        vocab_size=vocab_size,
        hard_vocab_limit=False,
        model_type=model_type,
        character_coverage=character_coverage,
        minloglevel=2,
        **ids,
    )
    return out.getvalue()


def write_files(folder: Path, files: dict[str, bytes | dict]) -> Path:
    """``files`` (bytes, or a dict written as JSON) into ``folder`` (created)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (folder / name).write_bytes(data if isinstance(data, bytes) else json.dumps(data).encode())
    return folder


def xlmr_tokenizer(folder: Path, vocab_size: int = 300, **train) -> Path:
    """An XLM-R tokenizer (``XLMRobertaTokenizer``: a sentencepiece unigram model with
    fairseq's ids, ``<s> <pad> </s> <unk>`` first in transformers' vocabulary) in ``folder``;
    ``train``: :func:`train_spm`'s ``corpus`` / ``character_coverage``."""
    model = train_spm("unigram", vocab_size, unk_id=0, bos_id=1, eos_id=2, pad_id=-1, **train)
    return write_files(
        folder,
        {
            "sentencepiece.bpe.model": model,
            "tokenizer_config.json": {"tokenizer_class": "XLMRobertaTokenizer"},
        },
    )


def nllb_tokenizer(
    folder: Path, vocab_size: int = 300, codes: list[str] | None = None, **train
) -> Path:
    """An NLLB tokenizer (``NllbTokenizer``: a sentencepiece BPE model with fairseq's ids and
    the language codes ``codes``, default NLLB-200's 202, as added tokens) in ``folder``;
    ``train``: :func:`train_spm`'s ``corpus`` / ``character_coverage``."""
    from attn_clip.languages import NLLB_LANGUAGES

    model = train_spm("bpe", vocab_size, unk_id=0, bos_id=1, eos_id=2, pad_id=-1, **train)
    config = {
        "tokenizer_class": "NllbTokenizer",
        "additional_special_tokens": list(NLLB_LANGUAGES if codes is None else codes),
    }
    return write_files(folder, {"sentencepiece.bpe.model": model, "tokenizer_config.json": config})


# -- tiny CLIPs ----------------------------------------------------------------------------

VOCAB = 1024  # rows of the token embedding: more than either tokenizer's ids
TINY_VISION = {"layers": 1, "width": 64, "head_width": 32, "image_size": 32, "patch_size": 16}
# open_clip config -> (tokenizer builder, its encoder's fields: 2 blocks, 64 wide)
TINY_TEXT = {
    "xlm-roberta-base-ViT-B-32": (
        xlmr_tokenizer,
        {"depth": 2, "embed_dim": 64, "num_heads": 4, "mlp_dim": 128, "max_positions": 40},
    ),
    "nllb-clip-base": (
        nllb_tokenizer,
        {"depth": 2, "embed_dim": 64, "num_heads": 4, "mlp_dim": 128, "max_positions": 40},
    ),
}
CONTEXT_LENGTH = 24
# what the tiny CLIPs' tokenizers also learn, every character kept: the labels of the tests
LABELS = {
    "zh": ["猫", "狗", "汽车", "一只猫的照片", "海滩上的狗"],
    "de": ["Katze", "Hund", "Auto", "ein Foto einer Katze", "ein Hund am Strand"],
}


def tiny_multilingual_model(name: str = "xlm-roberta-base-ViT-B-32", seed: int = 0):
    """A random-init (``seed``) tiny ``name`` (:data:`TINY_TEXT`): an ``attn_clip.CLIP``
    whose text tower is an :class:`~attn_clip.hf_text.HFTextTower`."""
    import attn_clip
    import torch

    _, encoder = TINY_TEXT[name]
    torch.manual_seed(seed)
    text = {"hf_encoder": {**encoder, "vocab_size": VOCAB}, "context_length": CONTEXT_LENGTH}
    return attn_clip.create_model(name, embed_dim=32, vision=TINY_VISION, text=text)


def save_tiny_multilingual(
    folder: Path, name: str = "xlm-roberta-base-ViT-B-32", extra_corpus: list[str] = ()
) -> Path:
    """:func:`tiny_multilingual_model` saved by ``attn_clip.save_pretrained`` in ``folder``,
    with its tokenizer's files next to the weights (trained on :data:`CORPUS`,
    :data:`LABELS` and ``extra_corpus``, e.g. the captions a test trains on)."""
    import attn_clip

    make_tokenizer, _ = TINY_TEXT[name]
    attn_clip.save_pretrained(tiny_multilingual_model(name), folder)
    corpus = CORPUS + [label for labels in LABELS.values() for label in labels]
    corpus += list(extra_corpus)
    return make_tokenizer(folder, corpus=corpus, character_coverage=1.0)
