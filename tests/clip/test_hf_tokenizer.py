"""HFTokenizer through ``tokenizers``: the same ids as open_clip's ``HFTokenizer`` (transformers'
AutoTokenizer) for every Hugging Face tokenizer family the CLIP text towers use.

Each family is a tiny tokenizer trained here (sentencepiece unigram / BPE models, a byte-level
BPE and a WordPiece vocabulary trained with ``tokenizers``; the corpus and the sentencepiece,
XLM-R and NLLB builders are tests/_support/multilingual.py's), loaded by transformers from the
files a hub repo ships and saved back with ``save_pretrained``: the hub's layout (e.g. mT5's
``spiece.model`` alone, XLM-R's ``tokenizer.json`` + ``config.json`` without a
tokenizer_config) and transformers' own (``tokenizer.json`` + ``tokenizer_config.json``).
"""

from __future__ import annotations

import json
import pickle
import random
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

spm = pytest.importorskip("sentencepiece")
transformers = pytest.importorskip("transformers")

from _support.multilingual import (  # noqa: E402
    CORPUS,
    nllb_tokenizer,
    train_spm,
    write_files,
    xlmr_tokenizer,
)
from attn_clip import HFTokenizer, get_tokenizer  # noqa: E402
from attn_clip.spm import read_model  # noqa: E402
from attn_clip.tokenizer import HF_VOCAB_FILES  # noqa: E402
from attn_core.hub import WeightsUnavailableError  # noqa: E402
from open_clip.tokenizer import HFTokenizer as OpenClipHFTokenizer  # noqa: E402
from open_clip.tokenizer import get_clean_fn  # noqa: E402

SAMPLE = [
    "a photo of a dog",
    "一只狗的照片 猫坐在垫子上",  # Chinese
    "صورة كلب على السجادة",  # Arabic
    "एक कुत्ते की तस्वीर",  # Hindi
    "Ein Foto eines Hundes, Straße und Größe!",  # German
    "🙂👍🏽 party 🎉 👨‍👩‍👧",  # emoji, skin tone, ZWJ sequence
    "",
    "   ",
    "mixed 中文 and العربية and हिन्दी, 日本語, 한국어, ελληνικά, עברית",
    "naïve café — Ångström ﬁ ½ Ⅻ １２３ zero\u200bwidth\u00a0nbsp \u3000 tab\tnew\nline",
    "A PHOTO   of a  Dog!! don't they'll",
    "the quick brown fox jumps over the lazy dog " * 20,  # far beyond the context
    "x" * 300,  # one long word
]


def _fuzz(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    alphabet = (
        "abcXYZ 0123'!?.,-_é東京狗🙂👍🏽\u200d\u0301\t\n&;#<>ßØكلبएक\u200b\u3000\xa0"
        "\u2028\x00\x07\ufeff\u00adﬁ½ＡＢ"
    )
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30))) for _ in range(n)]


TEXTS = SAMPLE + _fuzz(150)
CLEANED = [get_clean_fn("whitespace")(t) for t in TEXTS]  # open_clip's cleaning


def _auto(folder: Path, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return transformers.AutoTokenizer.from_pretrained(str(folder), **kwargs)


def _resaved(folder: Path, dst: Path) -> Path:
    """transformers' own layout: the tokenizer loaded from ``folder``, ``save_pretrained``."""
    _auto(folder).save_pretrained(str(dst))
    assert (dst / "tokenizer.json").is_file()
    return dst


def _reference(folder: Path, n: int, **kwargs) -> OpenClipHFTokenizer:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return OpenClipHFTokenizer(str(folder), context_length=n, **kwargs)


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    """Each family as the hub ships it and as transformers saves it."""
    from tokenizers import BertWordPieceTokenizer, ByteLevelBPETokenizer
    from transformers.models.nllb.tokenization_nllb import FAIRSEQ_LANGUAGE_CODES

    root = tmp_path_factory.mktemp("hf_tokenizers")
    out: dict[str, Path] = {}
    # XLM-R (xlm-roberta-base): a unigram model with fairseq's ids (<unk> 0, <s> 1, </s> 2);
    # the hub repo has sentencepiece.bpe.model, tokenizer.json and config.json, no tokenizer_config
    out["xlmr-spm"] = xlmr_tokenizer(root / "xlmr-spm", 300)
    xlmr = (out["xlmr-spm"] / "sentencepiece.bpe.model").read_bytes()
    out["xlmr"] = _resaved(out["xlmr-spm"], root / "xlmr")
    out["xlmr-hub"] = write_files(
        root / "xlmr-hub",
        {
            "tokenizer.json": (out["xlmr"] / "tokenizer.json").read_bytes(),
            "sentencepiece.bpe.model": xlmr,
            "config.json": {"model_type": "xlm-roberta"},
        },
    )
    # a tokenizer.json written by older converters (Metaspace alone, with the legacy
    # add_prefix_space field): transformers rebuilds the class's own pipeline over its vocabulary
    old = json.loads((out["xlmr"] / "tokenizer.json").read_text())
    old["pre_tokenizer"] = {"type": "Metaspace", "replacement": "▁", "add_prefix_space": True}
    old["decoder"] = dict(old["pre_tokenizer"])
    out["xlmr-old-json"] = write_files(
        root / "xlmr-old-json",
        {
            "tokenizer.json": json.dumps(old).encode(),
            "config.json": {"model_type": "xlm-roberta"},
        },
    )
    # mT5 (google/mt5-base): spiece.model only (pad 0, </s> 1, <unk> 2), no tokenizer.json
    mt5 = train_spm("unigram", 300, pad_id=0, eos_id=1, unk_id=2, bos_id=-1)
    out["mt5-spm"] = write_files(
        root / "mt5-spm",
        {
            "spiece.model": mt5,
            "tokenizer_config.json": {
                "eos_token": "</s>",
                "unk_token": "<unk>",
                "pad_token": "<pad>",
                "extra_ids": 0,
            },
            "special_tokens_map.json": {
                "eos_token": "</s>",
                "unk_token": "<unk>",
                "pad_token": "<pad>",
            },
            "config.json": {"model_type": "mt5"},
        },
    )
    out["mt5"] = _resaved(out["mt5-spm"], root / "mt5")
    # a T5 tokenizer with its 100 sentinels (SigLIP's timm repos: T5Tokenizer, spiece.model)
    out["t5-spm"] = write_files(
        root / "t5-spm",
        {
            "spiece.model": mt5,
            "tokenizer_config.json": {"tokenizer_class": "T5Tokenizer"},
        },
    )
    out["t5"] = _resaved(out["t5-spm"], root / "t5")
    # NLLB (facebook/nllb-200-distilled-600M): a sentencepiece BPE model, fairseq's ids, the
    # language codes listed in tokenizer_config.json
    out["nllb-spm"] = nllb_tokenizer(root / "nllb-spm", 300, codes=FAIRSEQ_LANGUAGE_CODES)
    out["nllb"] = _resaved(out["nllb-spm"], root / "nllb")
    config = json.loads((out["nllb"] / "tokenizer_config.json").read_text())
    out["nllb-legacy"] = write_files(
        root / "nllb-legacy",
        {
            "tokenizer.json": (out["nllb"] / "tokenizer.json").read_bytes(),
            "tokenizer_config.json": {**config, "legacy_behaviour": True, "src_lang": "deu_Latn"},
        },
    )
    # RoBERTa (roberta-base): byte-level BPE, vocab.json + merges.txt (+ tokenizer.json on the hub)
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(
        CORPUS * 10,
        vocab_size=600,
        min_frequency=1,
        special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
        show_progress=False,
    )
    out["roberta-files"] = root / "roberta-files"
    out["roberta-files"].mkdir()
    bpe.save_model(str(out["roberta-files"]))
    write_files(out["roberta-files"], {"config.json": {"model_type": "roberta"}})
    out["roberta"] = _resaved(out["roberta-files"], root / "roberta")
    out["roberta-hub"] = write_files(
        root / "roberta-hub",
        {
            "tokenizer.json": (out["roberta"] / "tokenizer.json").read_bytes(),
            "config.json": {"model_type": "roberta"},
        },
    )
    # BERT (bert-base-uncased, CLIPA): WordPiece vocab.txt
    wordpiece = BertWordPieceTokenizer(lowercase=True)
    wordpiece.train_from_iterator(CORPUS * 10, vocab_size=400, min_frequency=1, show_progress=False)
    out["bert-files"] = root / "bert-files"
    out["bert-files"].mkdir()
    wordpiece.save_model(str(out["bert-files"]))
    write_files(
        out["bert-files"],
        {
            "tokenizer_config.json": {"do_lower_case": True, "model_max_length": 512},
            "config.json": {"model_type": "bert"},
        },
    )
    out["bert"] = _resaved(out["bert-files"], root / "bert")
    # Gemma (SigLIP2's timm repos): a byte-fallback BPE tokenizer.model
    gemma = train_spm("bpe", 600, pad_id=0, eos_id=1, bos_id=2, unk_id=3, byte_fallback=True)
    out["gemma-spm"] = write_files(
        root / "gemma-spm",
        {
            "tokenizer.model": gemma,
            "tokenizer_config.json": {
                "tokenizer_class": "GemmaTokenizer",
                "add_bos_token": True,
                "add_eos_token": True,
            },
        },
    )
    out["gemma"] = _resaved(out["gemma-spm"], root / "gemma")
    out["siglip2-spm"] = write_files(
        root / "siglip2-spm",
        {
            "tokenizer.model": gemma,
            "tokenizer_config.json": {"tokenizer_class": "GemmaTokenizer"},
            "config.json": {"model_type": "siglip2"},
        },
    )
    return out


# (folder, tokenizers class, cleaning, HFTokenizer kwargs)
FAMILIES = {
    "xlmr-spm": ("XLMRobertaTokenizer", "whitespace", {}),
    "xlmr": ("XLMRobertaTokenizer", "whitespace", {}),
    "xlmr-hub": ("XLMRobertaTokenizer", "whitespace", {}),
    "xlmr-old-json": ("XLMRobertaTokenizer", "lower", {}),
    "mt5-spm": ("T5Tokenizer", "whitespace", {}),
    "mt5": ("T5Tokenizer", "canonicalize", {}),
    "t5-spm": ("T5Tokenizer", "canonicalize", {}),
    "t5": ("T5Tokenizer", "canonicalize", {}),
    "nllb-spm": ("NllbTokenizer", "whitespace", {}),
    "nllb": ("NllbTokenizer", "whitespace", {}),
    "nllb-legacy": ("NllbTokenizer", "whitespace", {}),
    "roberta-files": ("RobertaTokenizer", "whitespace", {}),
    "roberta": ("RobertaTokenizer", "whitespace", {}),
    "roberta-hub": ("RobertaTokenizer", "whitespace", {}),
    "bert-files": ("BertTokenizer", "whitespace", {"strip_sep_token": True}),
    "bert": ("BertTokenizer", "lower", {"strip_sep_token": True}),
    "gemma-spm": ("GemmaTokenizer", "canonicalize", {}),
    "gemma": ("GemmaTokenizer", "canonicalize", {}),
    "siglip2-spm": ("Siglip2Tokenizer", "canonicalize", {}),
}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_same_ids_as_open_clip(folders, family):
    cls, clean, kwargs = FAMILIES[family]
    folder = folders[family]
    ours = HFTokenizer(folder, context_length=16, clean=clean, **kwargs)
    ref = _reference(folder, 16, clean=clean, **kwargs)
    assert (ours.backend, ours.tokenizer_class) == ("tokenizers", cls)
    for n in (16, 64):
        ids = ours(TEXTS, n)
        assert ids.dtype == torch.long and ids.shape == (len(TEXTS), n)
        assert torch.equal(ids, ref(TEXTS, n)), family
    assert ours.num_special_tokens == len(ref.tokenizer("x")["input_ids"]) - len(
        ref.tokenizer("x", add_special_tokens=False)["input_ids"]
    )
    for text in SAMPLE:
        assert (
            ours.encode(text)
            == ref.tokenizer(ours._clean(text), add_special_tokens=False)["input_ids"]
        )
        row = ours(text, 64)[0]
        want = ref.tokenizer.decode(row.tolist(), skip_special_tokens=True)
        assert ours.decode(row) == want.strip()


def test_truncation_keeps_the_special_tokens_and_pads_with_the_pad_id(folders):
    xlmr = HFTokenizer(folders["xlmr-hub"], context_length=8)  # <s> 0, <pad> 1, </s> 2
    long, short = xlmr([SAMPLE[-2], "a dog"]).tolist()
    assert long[0] == 0 and long[-1] == 2 and 1 not in long  # <s> ... </s>, no padding
    assert short[0] == 0 and short[short.index(2) + 1 :] == [1] * (7 - short.index(2))
    t5 = HFTokenizer(folders["mt5-spm"], context_length=8)  # ... </s>, <pad> 0
    assert t5([SAMPLE[-2]])[0, -1] == 1 and t5([""]).tolist() == [[1] + [0] * 7]
    assert xlmr([]).shape == (0, 8)
    ref = _auto(folders["xlmr-hub"])
    assert (xlmr.sot_token_id, xlmr.eot_token_id, xlmr.pad_token_id) == (
        ref.bos_token_id,
        ref.eos_token_id,
        ref.pad_token_id,
    )
    assert (t5.sot_token_id, t5.eot_token_id, t5.pad_token_id) == (None, 1, 0)
    fra = HFTokenizer(folders["nllb"], language="fra_Latn")
    assert fra.sot_token_id == _auto(folders["nllb"]).convert_tokens_to_ids("fra_Latn")
    with pytest.raises(ValueError, match="context_length must leave room"):
        xlmr(["a dog"], context_length=2)


def test_nllb_source_language(folders):
    """language="fra_Latn": ``[fra_Latn] tokens </s>`` as NllbTokenizer(src_lang="fra_Latn")
    gives them; the default is tokenizer_config's src_lang (eng_Latn when it names none)."""
    for name in ("nllb", "nllb-spm"):
        for language in ("fra_Latn", "zho_Hans", None):
            ours = HFTokenizer(folders[name], context_length=16, language=language)
            kw = {} if language is None else {"src_lang": language}
            want = _auto(folders[name], **kw)(
                CLEANED, max_length=16, padding="max_length", truncation=True, return_tensors="pt"
            ).input_ids
            assert torch.equal(ours(TEXTS), want), (name, language)
            lang_id = want[0, 0].item()
            assert _auto(folders[name]).convert_ids_to_tokens(lang_id) == (language or "eng_Latn")
            assert ours.language == (language or "eng_Latn")
    # legacy_behaviour: tokens </s> [lang]; src_lang from tokenizer_config (deu_Latn here)
    legacy = HFTokenizer(folders["nllb-legacy"], context_length=16, language="fra_Latn")
    ref = _auto(folders["nllb-legacy"], src_lang="fra_Latn")
    assert torch.equal(
        legacy(TEXTS),
        ref(
            CLEANED, max_length=16, padding="max_length", truncation=True, return_tensors="pt"
        ).input_ids,
    )
    assert HFTokenizer(folders["nllb-legacy"]).language == "deu_Latn"
    fra = ref.convert_tokens_to_ids("fra_Latn")
    row = legacy(["a dog"])[0].tolist()
    assert row[row.index(fra) - 1] == ref.eos_token_id
    # open_clip's default (no language) is the same
    assert torch.equal(HFTokenizer(folders["nllb"])(TEXTS), _reference(folders["nllb"], 77)(TEXTS))


def test_language_errors(folders):
    with pytest.raises(ValueError, match="'xx_Yyyy' is not one of the tokenizer's 202 language"):
        HFTokenizer(folders["nllb"], language="xx_Yyyy")
    with pytest.raises(ValueError, match="source-language tokens.*XLMRobertaTokenizer"):
        HFTokenizer(folders["xlmr"], language="fra_Latn")
    with pytest.raises(ValueError, match="language must be a language code"):
        HFTokenizer(folders["nllb"], language=3)


def test_strip_sep_token_and_pickling(folders):
    bert = HFTokenizer(folders["bert"], context_length=12, strip_sep_token=True)
    sep = bert.tokenizer.sep_token_id
    ids = bert(SAMPLE)
    assert sep is not None and not (ids == sep).any()
    full = HFTokenizer(folders["bert"], context_length=12)(SAMPLE)
    assert (full == sep).any() and torch.equal(torch.where(full == sep, 0, full), ids)
    nllb = HFTokenizer(folders["nllb"], context_length=16, language="fra_Latn")
    for tok in (bert, nllb):
        data = pickle.dumps(tok)
        assert len(data) < 1000  # the arguments, not the vocabulary
        again = pickle.loads(data)
        assert torch.equal(again(TEXTS), tok(TEXTS)) and again.language == tok.language


def test_no_transformers_import(folders, tmp_path):
    """Building and running every family here imports neither transformers nor open_clip."""
    names = [str(folders[name]) for name in FAMILIES]
    code = (
        "import sys; from attn_clip import HFTokenizer\n"
        f"for folder in {names!r}:\n"
        "    tok = HFTokenizer(folder, context_length=16)\n"
        "    assert tok.backend == 'tokenizers' and tok(['一只狗 a dog']).shape == (1, 16)\n"
        "bad = [m for m in ('transformers', 'open_clip', 'sentencepiece') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_folder_without_tokenizer_files(tmp_path, folders):
    write_files(tmp_path / "empty", {"tokenizer_config.json": {"tokenizer_class": "T5Tokenizer"}})
    with pytest.raises(ValueError, match="has no tokenizer files: expected one of tokenizer.json"):
        HFTokenizer(tmp_path / "empty")
    # a sentencepiece model alone, with nothing naming its tokenizer class
    write_files(
        tmp_path / "anon", {"spiece.model": (folders["mt5-spm"] / "spiece.model").read_bytes()}
    )
    with pytest.raises(ValueError, match="cannot tell which tokenizer spiece.model is for"):
        HFTokenizer(tmp_path / "anon")
    write_files(tmp_path / "bad", {"tokenizer.json": b"{}"})
    with pytest.raises(ValueError, match="tokenizer.json is not a tokenizers file"):
        HFTokenizer(tmp_path / "bad")
    # a T5 tokenizer without its sentencepiece model
    write_files(
        tmp_path / "t5",
        {"vocab.txt": b"a\nb\n", "tokenizer_config.json": {"tokenizer_class": "T5Tokenizer"}},
    )
    with pytest.raises(
        ValueError, match="T5Tokenizer tokenizer needs tokenizer.json or a sentence"
    ):
        HFTokenizer(tmp_path / "t5")


def test_transformers_still_serves_other_classes(tmp_path, folders):
    """SiglipTokenizer runs the sentencepiece library itself: it stays on transformers."""
    write_files(
        tmp_path / "siglip",
        {
            "spiece.model": (folders["mt5-spm"] / "spiece.model").read_bytes(),
            "tokenizer_config.json": {"tokenizer_class": "SiglipTokenizer"},
        },
    )
    ours = HFTokenizer(tmp_path / "siglip", context_length=16, clean="canonicalize")
    assert (ours.backend, ours.tokenizer_class) == ("transformers", "SiglipTokenizer")
    ref = _reference(tmp_path / "siglip", 16, clean="canonicalize")
    assert torch.equal(ours(SAMPLE), ref(SAMPLE))


def test_hub_repo_from_the_cache_and_offline_error(tmp_path, folders, fake_hub_cache):
    """xlm-roberta-base's hub layout (tokenizer.json + config.json, no tokenizer_config) from
    the hub cache with no network; absent and offline: the fast WeightsUnavailableError."""
    from attn_clip import CLIPConfig
    from open_clip import get_model_config

    files = {p.name: p.read_bytes() for p in folders["xlmr-hub"].iterdir()}
    fake_hub_cache(tmp_path / "hub", "xlm-roberta-base", files)
    cfg = CLIPConfig.from_open_clip(get_model_config("xlm-roberta-base-ViT-B-32"))
    tok = get_tokenizer(cfg, cache_dir=tmp_path / "hub", local_files_only=True)
    assert isinstance(tok, HFTokenizer) and tok.tokenizer_class == "XLMRobertaTokenizer"
    assert torch.equal(tok(TEXTS), _reference(folders["xlmr-hub"], 77)(TEXTS))
    with pytest.raises(ValueError, match="source-language tokens"):
        get_tokenizer(cfg, language="fra_Latn", cache_dir=tmp_path / "hub", local_files_only=True)
    with pytest.raises(WeightsUnavailableError) as err:
        get_tokenizer(cfg, cache_dir=tmp_path / "empty", local_files_only=True)
    msg = str(err.value)
    assert "xlm-roberta-base" in msg and str(tmp_path / "empty") in msg
    assert all(name in msg for name in HF_VOCAB_FILES)
    # mT5's repo: spiece.model + tokenizer_config + config.json, read without tokenizer.json
    files = {p.name: p.read_bytes() for p in folders["mt5-spm"].iterdir()}
    fake_hub_cache(tmp_path / "hub", "google/mt5-base", files)
    mt5 = HFTokenizer("google/mt5-base", cache_dir=tmp_path / "hub", local_files_only=True)
    assert torch.equal(mt5(TEXTS), _reference(folders["mt5-spm"], 77)(TEXTS))


def test_sentencepiece_reader_matches_the_protobuf(folders):
    """attn_clip.spm reads ModelProto's pieces, trainer and normalizer specs as protobuf does."""
    pb2 = pytest.importorskip("sentencepiece.sentencepiece_model_pb2")
    models = [
        folders["xlmr-spm"] / "sentencepiece.bpe.model",
        folders["gemma-spm"] / "tokenizer.model",
        train_spm(
            "unigram",
            200,
            pad_id=0,
            eos_id=1,
            unk_id=2,
            bos_id=-1,
            user_defined_symbols=["<sep>"],
            normalization_rule_name="identity",
            add_dummy_prefix=False,
            remove_extra_whitespaces=False,
        ),
    ]
    for source in models:
        data = source if isinstance(source, bytes) else source.read_bytes()
        ours, proto = read_model(source), pb2.ModelProto()
        proto.ParseFromString(data)
        assert ours.pieces == [(p.piece, p.score, p.type) for p in proto.pieces]
        t, norm = proto.trainer_spec, proto.normalizer_spec
        assert ours.model_type == {1: "unigram", 2: "bpe"}[t.model_type]
        assert (ours.unk_id, ours.bos_id, ours.eos_id, ours.pad_id) == (
            t.unk_id,
            t.bos_id,
            t.eos_id,
            t.pad_id,
        )
        assert (ours.unk_piece, ours.bos_piece, ours.eos_piece, ours.pad_piece) == (
            t.unk_piece,
            t.bos_piece,
            t.eos_piece,
            t.pad_piece,
        )
        assert ours.byte_fallback == t.byte_fallback
        assert ours.precompiled_charsmap == norm.precompiled_charsmap
        assert (ours.add_dummy_prefix, ours.remove_extra_whitespaces, ours.escape_whitespaces) == (
            norm.add_dummy_prefix,
            norm.remove_extra_whitespaces,
            norm.escape_whitespaces,
        )
    assert {kind for _, _, kind in read_model(models[1]).pieces} == {1, 2, 3, 6}  # byte pieces
    with pytest.raises(ValueError, match="not a sentencepiece model"):
        read_model(b"")
    with pytest.raises(ValueError, match="truncated|malformed|not a sentencepiece"):
        read_model(b'{"model": "not protobuf"}')
