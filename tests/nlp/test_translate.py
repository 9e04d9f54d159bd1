"""translate(): Marian tokenizer + our model give transformers' translations; bad input."""

from __future__ import annotations

import pytest
import torch
from attn_nlp import MarianTextTokenizer, Translator, create_model

pytestmark = pytest.mark.filterwarnings("ignore:Recommended. pip install sacremoses")

TEXTS = ["i love deep learning", "the cat reads a book", "we train small models fast"]


@pytest.fixture(scope="module")
def translator(marian_dir):
    return Translator.from_pretrained(marian_dir)


@pytest.mark.parametrize("beams", [1, 4])
def test_translations_match_transformers(marian_dir, hf_marian, translator, beams):
    from transformers import MarianTokenizer

    tok = MarianTokenizer.from_pretrained(str(marian_dir))
    batch = tok(TEXTS, return_tensors="pt", padding=True)
    with torch.no_grad():
        ids = hf_marian.generate(**batch, num_beams=beams)
    expected = tok.batch_decode(ids, skip_special_tokens=True)
    assert translator.translate(TEXTS, beams=beams) == expected
    assert any(expected)  # the random model does emit pieces


def test_single_string_and_order_is_kept(translator):
    many = translator.translate(TEXTS, beams=2, batch_size=2)  # sorted into batches internally
    assert [translator.translate(t, beams=2)[0] for t in TEXTS] == many


def test_empty_source_is_a_clear_error(translator):
    with pytest.raises(ValueError, match="source text 1 is empty"):
        translator.translate(["fine", "   "])


def test_long_source_is_truncated_with_a_warning(translator):
    long = " ".join(["music"] * 200)  # far more than max_positions=64 tokens
    with pytest.warns(UserWarning, match="truncated to max_positions=64"):
        ids, mask = translator.encode([long, "dog"])
    assert ids.shape[1] == 64 and ids[0, -1].item() == translator.tokenizer.eos_id
    assert mask[1].sum() == 64 - len(translator.tokenizer.encode(["dog"])[0])
    with pytest.warns(UserWarning):
        assert len(translator.translate([long], beams=1, max_new_tokens=5)) == 1


def test_encoder_rejects_too_long_input_without_truncation(marian_dir):
    model = create_model(marian_dir)
    with pytest.raises(ValueError, match="max_positions"):
        model.encode(torch.ones(1, 65, dtype=torch.long))


def test_marian_tokenizer_wrapper_round_trip(marian_dir):
    tok = MarianTextTokenizer(marian_dir)
    ids = tok.encode(["the dog reads"])[0]
    assert ids[-1] == tok.eos_id
    assert tok.decode([tok.encode_target(["the dog reads"])[0]]) == ["the dog reads"]
