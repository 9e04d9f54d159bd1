import pytest
import torch
from attn_core import masks


def test_causal_mask_square_is_lower_triangular():
    m = masks.causal_mask(4)
    assert m.dtype == torch.bool
    assert torch.equal(m, torch.ones(4, 4, dtype=torch.bool).tril())


def test_causal_mask_is_bottom_right_aligned():
    # 2 new queries after 3 cached keys: they sit at positions 3 and 4 of 5.
    m = masks.causal_mask(2, 5)
    assert m.tolist() == [[True, True, True, True, False], [True, True, True, True, True]]


def test_padding_mask_marks_padding_true():
    m = masks.padding_mask([3, 1], max_len=4)
    assert m.tolist() == [[False, False, False, True], [False, True, True, True]]
    assert masks.padding_mask(torch.tensor([2, 2])).shape == (2, 2)
    with pytest.raises(ValueError, match="max_len"):
        masks.padding_mask([5], max_len=3)


def test_sliding_window_mask_rules():
    causal = masks.sliding_window_mask(6, 3)
    i, j = torch.meshgrid(torch.arange(6), torch.arange(6), indexing="ij")
    assert torch.equal(causal, (j <= i) & (i - j < 3))
    both = masks.sliding_window_mask(6, 4, causal=False)
    assert torch.equal(both, (i - j).abs() <= 2)
    glob = masks.sliding_window_mask(6, 2, causal=False, global_tokens=1)
    assert glob[0].all() and glob[:, 0].all()
    glob_causal = masks.sliding_window_mask(6, 2, global_tokens=1)
    assert glob_causal[:, 0].all() and not glob_causal[0, 1:].any()


def test_combine_and_to_additive():
    a = torch.tensor([[True, False], [True, True]])
    b = torch.tensor([[True, True], [False, True]])
    assert masks.combine_masks(a, None, b).tolist() == [[True, False], [False, True]]
    assert masks.combine_masks(None, None) is None
    add = masks.to_additive(a, torch.float32)
    assert add.tolist() == [[0.0, float("-inf")], [0.0, 0.0]]
    mixed = masks.combine_masks(a, torch.full((2, 2), 0.5))
    assert mixed.dtype == torch.float32
    assert mixed[0, 0] == 0.5 and mixed[0, 1] == float("-inf")
    with pytest.raises(ValueError, match="bool or floating"):
        masks.combine_masks(torch.ones(2, 2, dtype=torch.long))


def test_validate_attn_mask_errors_name_expected_shape():
    with pytest.raises(ValueError, match=r"\(B, H, Lq, Lk\) = \(2, 4, 5, 6\)"):
        masks.validate_attn_mask(torch.ones(5, 5, dtype=torch.bool), 2, 4, 5, 6)
    with pytest.raises(ValueError, match="bool"):
        masks.validate_attn_mask(torch.ones(5, 6, dtype=torch.int64), 2, 4, 5, 6)
    with pytest.raises(ValueError, match="2 to 4 dims"):
        masks.validate_attn_mask(torch.ones(6, dtype=torch.bool), 2, 4, 5, 6)
    assert masks.validate_attn_mask(torch.ones(5, 6, dtype=torch.bool), 2, 4, 5, 6).shape == (
        1,
        1,
        5,
        6,
    )
    with pytest.raises(ValueError, match=r"\(B, Lk\) = \(2, 6\)"):
        masks.validate_key_padding_mask(torch.zeros(2, 5, dtype=torch.bool), 2, 6)
