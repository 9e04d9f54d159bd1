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
