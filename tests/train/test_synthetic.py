"""attn_train.synthetic: the generated NLP toy tasks are right and deterministic."""

from __future__ import annotations

import random

import pytest
from attn_train import read_labelled_csv, read_tsv, synthetic


@pytest.mark.parametrize(
    "n, english, chinese",
    [
        (0, "zero", "零"),
        (15, "fifteen", "十五"),
        (110, "one hundred and ten", "一百一十"),
        (3405, "three thousand four hundred and five", "三千四百零五"),
        (10050, "ten thousand and fifty", "一万零五十"),
        (945007, "nine hundred and forty-five thousand and seven", "九十四万五千零七"),
        (100000, "one hundred thousand", "十万"),
    ],
)
def test_number_generators(n, english, chinese):
    assert synthetic.english_number(n) == english
    assert synthetic.chinese_number(n) == chinese


def test_generated_corpus_is_disjoint_and_deterministic(tmp_path):
    synthetic.write_translation_corpus("numbers", tmp_path / "a", n_train=400, n_dev=20, seed=0)
    train, dev = read_tsv(tmp_path / "a" / "train.tsv"), read_tsv(tmp_path / "a" / "dev.tsv")
    assert len(train) == 400 and len(dev) == 20
    assert not {s for s, _ in train} & {s for s, _ in dev}
    synthetic.write_translation_corpus("numbers", tmp_path / "b", n_train=400, n_dev=20, seed=0)
    assert (tmp_path / "a" / "train.tsv").read_bytes() == (
        tmp_path / "b" / "train.tsv"
    ).read_bytes()
    synthetic.write_translation_corpus("dates", tmp_path / "c", n_train=10, n_dev=2, seed=0)
    assert "年" in read_tsv(tmp_path / "c" / "train.tsv")[0][1]
    with pytest.raises(ValueError, match="numbers' or 'dates"):
        synthetic.make_pair("times", random.Random(0))


def test_negation_matters_in_generated_reviews(tmp_path):
    rng = random.Random(1)
    rows = [synthetic.make_review(rng) for _ in range(200)]
    assert {label for _, label in rows} == {"pos", "neg"}
    assert any(" not " in text and label == "pos" for text, label in rows)
    synthetic.write_reviews(tmp_path, n_train=30, n_dev=5, seed=0)
    assert len(read_labelled_csv(tmp_path / "train.csv")) == 30


def test_rhymes():
    text = synthetic.rhymes(20, seed=3)
    assert text == synthetic.rhymes(20, seed=3) != synthetic.rhymes(20, seed=4)
    lines = text.splitlines()
    assert len(lines) == 20 and all(
        line.startswith("the ") and line.endswith(".") for line in lines
    )
