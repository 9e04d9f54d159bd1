"""attn_train.text: readers name the bad line; padding; random windows are reproducible."""

from __future__ import annotations

import pytest
import torch
from attn_train.text import RandomWindows, pad_rows, read_labelled_csv, read_tsv


def test_bad_tsv_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.tsv"
    bad.write_text("one\t一\nno tab here\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad.tsv:2: expected 'source<TAB>target'"):
        read_tsv(bad)
    bad.write_text("\n\n", encoding="utf-8")
    with pytest.raises(ValueError, match="no sentence pairs"):
        read_tsv(bad)


def test_csv_errors(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("sentence,label\nhello,pos\n", encoding="utf-8")
    with pytest.raises(ValueError, match="'text' and 'label' columns"):
        read_labelled_csv(bad)
    bad.write_text("text,label\nhello,pos\n,neg\n", encoding="utf-8")
    with pytest.raises(ValueError, match="bad.csv:3: empty text or label"):
        read_labelled_csv(bad)


def test_pad_rows():
    assert pad_rows([[1, 2, 3], [4]], pad=0).tolist() == [[1, 2, 3], [4, 0, 0]]


def test_random_windows_depend_only_on_seed_epoch_and_index():
    data = torch.arange(100)
    w = RandomWindows(data, context=8, length=5, seed=1)
    x, y = w[3]
    assert x.shape == y.shape == (8,) and torch.equal(x[1:], y[:-1])  # next-token targets
    torch.manual_seed(0)
    first = [w[i][0] for i in range(5)]
    torch.manual_seed(1)
    assert all(torch.equal(a, w[i][0]) for i, a in enumerate(first))
    w.set_epoch(1)
    assert not all(torch.equal(a, w[i][0]) for i, a in enumerate(first))
    with pytest.raises(ValueError, match="too few"):
        RandomWindows(torch.arange(5), context=8, length=1)


class _Tok:
    """The tokenizer surface the encoded data sets use (ids = character codes - 96)."""

    pad_id, unk_id, bos_id, eos_id = 0, 1, 2, 3

    def encode(self, texts):
        return [[ord(c) - 90 for c in t] for t in texts]

    encode_target = encode


def test_char_vocab_round_trip_and_unknown_characters():
    from attn_train import CharVocab

    vocab = CharVocab(sorted(set("hello world")))
    assert vocab.decode(vocab.encode("hold")) == "hold"
    with pytest.raises(ValueError, match=r"not in the model's vocabulary: \['z'\]"):
        vocab.encode("zed")


def test_translation_pairs_cut_with_eos_and_collate_adds_bos_eos():
    from attn_train import TranslationPairs

    data = TranslationPairs([("abcdef", "abcdef"), ("ab", "a")], _Tok(), max_len=4)
    assert data[0] == ([7, 8, 9, 3], [7, 8, 9])  # source ends in EOS when cut
    assert data[1] == ([7, 8], [7])
    batch = data.collate([data[0], data[1]])
    assert batch["src"].tolist() == [[7, 8, 9, 3], [7, 8, 0, 0]]
    assert batch["tgt_in"].tolist() == [[2, 7, 8, 9], [2, 7, 0, 0]]
    assert batch["labels"].tolist() == [[7, 8, 9, 3], [7, 3, 0, 0]]


def test_labelled_texts_index_labels_and_name_unknown_ones():
    from attn_train import LabelledTexts

    data = LabelledTexts([("abc", "pos"), ("", "neg")], _Tok(), ["neg", "pos"], max_len=2)
    assert data[0] == ([7, 8], 1) and data[1] == ([1], 0)  # an empty text is [unk]
    batch = data.collate([data[0], data[1]])
    assert batch["ids"].tolist() == [[7, 8], [1, 0]] and batch["labels"].tolist() == [1, 0]
    with pytest.raises(ValueError, match=r"^--dev x: labels not seen in training: \['meh'\]"):
        LabelledTexts([("a", "meh")], _Tok(), ["neg", "pos"], 4, source="--dev x: ")
