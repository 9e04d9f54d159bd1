"""attn_clip.finetune: WiSE-FT interpolates weights key by key and refuses mismatched models."""

from __future__ import annotations

import pytest
import torch
from attn_clip import wise_ft
from torch import nn


def test_wise_ft_interpolates_models_or_state_dicts():
    zero_shot, finetuned = nn.Linear(3, 2), nn.Linear(3, 2)
    out = wise_ft(zero_shot, finetuned.state_dict(), 0.25)
    assert out.keys() == {"weight", "bias"}
    torch.testing.assert_close(out["weight"], 0.75 * zero_shot.weight + 0.25 * finetuned.weight)
    assert torch.equal(wise_ft(zero_shot, finetuned, 0.0)["bias"], zero_shot.bias)
    assert torch.equal(wise_ft(zero_shot, finetuned, 1.0)["bias"], finetuned.bias)
    zero_shot.load_state_dict(out)  # loads back


def test_wise_ft_errors():
    with pytest.raises(ValueError, match=r"alpha must be in \[0, 1\]"):
        wise_ft(nn.Linear(3, 2), nn.Linear(3, 2), 1.5)
    with pytest.raises(ValueError, match="only zero-shot"):
        wise_ft(nn.Linear(3, 2), nn.Linear(3, 2, bias=False), 0.5)
    with pytest.raises(ValueError, match=r"weight is \(2, 3\) vs \(2, 4\)"):
        wise_ft(nn.Linear(3, 2), nn.Linear(4, 2), 0.5)
