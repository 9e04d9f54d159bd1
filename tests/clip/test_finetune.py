"""attn_clip.finetune: WiSE-FT interpolates weights key by key and refuses mismatched models;
add_logit_bias gives a CLIP a SigLIP logit bias once."""

from __future__ import annotations

import pytest
import torch
from attn_clip import add_logit_bias, create_model, wise_ft
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


def test_add_logit_bias_adds_a_learnable_bias_once():
    model = create_model("demo-shapes")
    assert model.logit_bias is None
    assert add_logit_bias(model) is model
    assert isinstance(model.logit_bias, nn.Parameter) and model.logit_bias.item() == -10.0
    assert model.config.init_logit_bias == -10.0 and "logit_bias" in model.state_dict()
    with torch.no_grad():
        model.logit_bias.fill_(3.0)
    add_logit_bias(model, init=-5.0)  # already has one: unchanged
    assert model.logit_bias.item() == 3.0 and model.config.init_logit_bias == -10.0
