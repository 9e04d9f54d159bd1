"""Tokenizer: the same ids as open_clip's, truncation instead of errors, LongTensor output."""

from __future__ import annotations

import open_clip
import pytest
import torch
from attn_clip import Tokenizer, get_tokenizer

TEXTS = [
    "a photo of a dog",
    "A PHOTO   of a  Dog!!",
    "",
    "naïve café — 東京 🙂",
    "it's a <start_of_text> test",
    "the quick brown fox jumps over the lazy dog " * 20,  # far beyond 77 tokens
]


def test_same_ids_as_open_clip():
    ours = get_tokenizer("ViT-B-32")(TEXTS)
    ref = open_clip.get_tokenizer("ViT-B-32")(TEXTS)
    assert ours.dtype == torch.long and ours.shape == (len(TEXTS), 77)
    assert torch.equal(ours, ref)


def test_truncation_keeps_eot_last():
    tok = Tokenizer(context_length=10)
    ids = tok(TEXTS[-1])
    assert ids.shape == (1, 10)
    assert ids[0, 0] == tok.sot_token_id and ids[0, -1] == tok.eot_token_id
    assert torch.equal(ids, open_clip.tokenizer.SimpleTokenizer(context_length=10)(TEXTS[-1]))
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
    assert tok([]).shape == (0, 77)
