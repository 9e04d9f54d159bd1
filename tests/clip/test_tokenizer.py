"""Tokenizer: the same ids as open_clip's, truncation instead of errors, LongTensor output."""

from __future__ import annotations

import pickle
import random

import open_clip
import pytest
import torch
from attn_clip import Tokenizer, get_tokenizer
from attn_clip.tokenizer import bytes_to_unicode, default_bpe_path
from open_clip.tokenizer import SimpleTokenizer

TEXTS = [
    "a photo of a dog",
    "A PHOTO   of a  Dog!!",
    "",
    "   \t\n ",
    "naïve café — 東京 🙂",
    "e\u0301 vs é, Ångström, ǅ, ΣΊΣΥΦΟΣ, straße",
    "🙂👍🏽👨‍👩‍👧 🇫🇷",
    "&amp;lt;b&amp;gt; fish &amp; chips &#39;n&#x27; &nbsp;peas &copy;",
    "it's a <start_of_text> test <END_OF_TEXT> x",
    "don't they'll I'd we've you're she's 'm",
    "3.14159 1,000,000 2nd 42x ½ ² Ⅻ ١٢٣ １２３",
    "Ð©Ñ\x80 mojibake: â€œquotesâ€\x9d and donâ€™t",
    "snake_case_name CamelCaseName kebab-case-name http://example.com/a?b=c#d",
    "\u200b zero\u00a0width \u2028 separators \x00 control \x07",
    "the quick brown fox jumps over the lazy dog " * 20,  # far beyond 77 tokens
    "x" * 500,  # one long word
]


def _random_texts(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    alphabet = "abcXYZ 0123'!?.,-_é東京🙂\u0301\t\n&;#<>ßØ"
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40))) for _ in range(n)]


@pytest.mark.parametrize("context_length", [77, 24])
def test_same_ids_as_open_clip(context_length):
    texts = TEXTS + _random_texts(300)
    ours = Tokenizer(context_length)(texts)
    ref = SimpleTokenizer(context_length=context_length)(texts)
    assert ours.dtype == torch.long and ours.shape == (len(texts), context_length)
    assert torch.equal(ours, ref)


def test_encode_decode_and_vocab_as_open_clip():
    ours, ref = Tokenizer(), SimpleTokenizer()
    assert ours.encoder == ref.encoder
    assert (ours.sot_token_id, ours.eot_token_id, ours.vocab_size) == (49406, 49407, 49408)
    for text in TEXTS:
        ids = ours.encode(text)
        assert ids == ref.encode(text)
        kept = [i for i in ids if i not in (0, 49406, 49407)]  # padding, SOT, EOT dropped
        assert ours.decode(ids) == ref.decode(kept).strip()


def test_get_tokenizer_matches_open_clip():
    ours = get_tokenizer("ViT-B-32")(TEXTS)
    ref = open_clip.get_tokenizer("ViT-B-32")(TEXTS)
    assert torch.equal(ours, ref)
    assert get_tokenizer("demo-shapes").context_length == 24


def test_other_cleaning_modes_match_open_clip():
    for clean in ("whitespace", "canonicalize"):
        ours = Tokenizer(clean=clean)(TEXTS)
        assert torch.equal(ours, SimpleTokenizer(clean=clean)(TEXTS)), clean


def test_truncation_keeps_eot_last():
    tok = Tokenizer(context_length=10)
    ids = tok(TEXTS[-2])
    assert ids.shape == (1, 10)
    assert ids[0, 0] == tok.sot_token_id and ids[0, -1] == tok.eot_token_id
    assert torch.equal(ids, SimpleTokenizer(context_length=10)(TEXTS[-2]))
    assert tok(["a b"], context_length=5).shape == (1, 5)


def test_padding_and_eot_is_the_row_maximum():
    ids = Tokenizer()(["a cat", "a much longer caption about a cat"])
    for row in ids:
        eot = int(row.argmax())
        assert row[eot] == 49407 and (row[eot + 1 :] == 0).all()


def test_decode_round_trip_and_errors():
    tok = Tokenizer()
    assert tok.decode(tok(["a photo of a dog."])[0]) == "a photo of a dog ."
    assert tok.vocab_size == 49408
    with pytest.raises(TypeError, match="strings"):
        tok(["ok", 3])
    with pytest.raises(ValueError, match="context_length"):
        Tokenizer(1)
    with pytest.raises(ValueError, match="clean"):
        Tokenizer(clean="upper")
    assert tok([]).shape == (0, 77)


def test_byte_table_and_vocab_file():
    table = bytes_to_unicode()
    assert len(table) == 256 and len(set(table.values())) == 256
    assert all(c.isprintable() and not c.isspace() for c in table.values())
    assert default_bpe_path().name == "bpe_simple_vocab_16e6.txt.gz"


def test_additional_special_tokens_and_pickling():
    texts = ["a <mask> dog", "<MASK><mask>x"]
    tok = Tokenizer(24, additional_special_tokens=["<mask>"])
    ref = SimpleTokenizer(context_length=24, additional_special_tokens=["<mask>"])
    assert torch.equal(tok(texts), ref(texts)) and tok.vocab_size == 49409
    data = pickle.dumps(tok)
    assert len(data) < 1000  # the arguments, not the vocabulary
    assert torch.equal(pickle.loads(data)(texts), tok(texts))


# -- Hugging Face tokenizers (SigLIP's sentencepiece, SigLIP2's Gemma) -----------------------

SPM_TEXTS = [
    "a photo of a dog",
    "a cat sitting on a mat wearing a small red hat",
    "the quick brown fox jumps over the lazy dog",
    "a diagram of attention heads",
] * 25


@pytest.fixture(scope="module")
def spm_model() -> bytes:
    """A small sentencepiece unigram model trained here (T5 / SigLIP ids: pad 0, eos 1, unk 2)."""
    import io

    spm = pytest.importorskip("sentencepiece")
    out = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(SPM_TEXTS), model_writer=out, vocab_size=40, model_type="unigram",
        pad_id=0, eos_id=1, unk_id=2, bos_id=-1, minloglevel=2,
    )  # fmt: skip
    return out.getvalue()


# SigLIP's timm/ViT-B-16-SigLIP ships spiece.model for a T5 tokenizer; SigLIP2's
# tokenizer.model for Gemma's
SPM_LAYOUTS = {
    "siglip": ("spiece.model", "T5Tokenizer"),
    "gemma": ("tokenizer.model", "GemmaTokenizer"),
}


def _spm_files(model: bytes, layout: str) -> dict[str, bytes]:
    import json

    vocab_file, cls = SPM_LAYOUTS[layout]
    config = {"tokenizer_class": cls, "model_max_length": 64}
    return {vocab_file: model, "tokenizer_config.json": json.dumps(config).encode()}


@pytest.mark.parametrize("layout", list(SPM_LAYOUTS))
@pytest.mark.parametrize("clean", ["canonicalize", "whitespace"])
def test_hf_tokenizer_same_ids_as_open_clip(tmp_path, spm_model, layout, clean):
    pytest.importorskip("transformers")
    from attn_clip import HFTokenizer
    from open_clip.tokenizer import HFTokenizer as OpenClipHFTokenizer

    for name, data in _spm_files(spm_model, layout).items():
        (tmp_path / name).write_bytes(data)
    texts = [*SPM_TEXTS[:4], *TEXTS, *_random_texts(50)]
    ours = HFTokenizer(tmp_path, context_length=16, clean=clean)
    ref = OpenClipHFTokenizer(str(tmp_path), context_length=16, clean=clean)
    ids = ours(texts)
    assert ids.dtype == torch.long and ids.shape == (len(texts), 16)
    assert torch.equal(ids, ref(texts))
    assert torch.equal(ours(texts[0], context_length=64), ref(texts[0], context_length=64))
    assert ours.decode(ours(["a photo of a dog"])[0]) == "a photo of a dog"
    assert len(ours.encode("a photo of a dog")) > 1
    assert torch.equal(pickle.loads(pickle.dumps(ours))(texts), ids)


def test_siglip_tokenizer_from_the_hub_cache_and_offline_error(tmp_path, spm_model, fake_hub_cache):
    """get_tokenizer("ViT-B-16-SigLIP") fetches its tokenizer repo through attn_core.hub: from
    the cache with no network; missing and offline, the same fast error as weights."""
    pytest.importorskip("transformers")
    from attn_clip import HFTokenizer
    from attn_core.hub import WeightsUnavailableError

    with pytest.raises(WeightsUnavailableError) as err:
        get_tokenizer("ViT-B-16-SigLIP", cache_dir=tmp_path / "empty", local_files_only=True)
    msg = str(err.value)
    assert "timm/ViT-B-16-SigLIP" in msg and "tokenizer_config.json" in msg
    assert str(tmp_path / "empty") in msg

    fake_hub_cache(tmp_path / "hub", "timm/ViT-B-16-SigLIP", _spm_files(spm_model, "siglip"))
    tok = get_tokenizer("ViT-B-16-SigLIP", cache_dir=tmp_path / "hub", local_files_only=True)
    assert isinstance(tok, HFTokenizer) and tok.context_length == 64 and tok.clean == "canonicalize"
    ids = tok(["A photo of a dog.", "a cat"])
    assert ids.shape == (2, 64) and ids[0, -1] == 0  # padded at the end (pooling takes the last)
    # the vocabulary file is required too
    fake_hub_cache(tmp_path / "hub2", "timm/ViT-B-16-SigLIP", {"tokenizer_config.json": b"{}"})
    with pytest.raises(WeightsUnavailableError, match="spiece.model"):
        get_tokenizer("ViT-B-16-SigLIP", cache_dir=tmp_path / "hub2", local_files_only=True)


def test_hf_tokenizer_errors(tmp_path):
    from attn_clip import CLIPConfig, HFTokenizer
    from attn_core.hub import WeightsUnavailableError

    with pytest.raises(ValueError, match="clean"):
        HFTokenizer(tmp_path, clean="upper")
    with pytest.raises(WeightsUnavailableError, match="tokenizer folder .*gone.* not found"):
        HFTokenizer(tmp_path / "gone")  # e.g. a saved model whose tokenizer folder moved
    cfg = CLIPConfig.from_open_clip(open_clip.get_model_config("ViT-B-16-SigLIP"))
    cfg.text.tokenizer_kwargs = {"clean": "lower", "language": "fr"}
    with pytest.raises(ValueError, match=r"tokenizer_kwargs \['language'\]"):
        get_tokenizer(cfg)
    cfg.text.hf_tokenizer_name = None  # a 32k vocabulary is not OpenAI's BPE
    with pytest.raises(ValueError, match="32000 ids.*names no tokenizer"):
        get_tokenizer(cfg)
