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
