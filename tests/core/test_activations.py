"""attn_core.activations: transformers' activation names -> ours (HF_ACTIVATIONS,
hf_activation), checked against transformers' own ACT2FN."""

import pytest
import torch
from attn_core.activations import ACTIVATIONS, GATED_ACTIVATIONS, HF_ACTIVATIONS, hf_activation
from torch.testing import assert_close
from transformers.activations import ACT2FN


@pytest.mark.parametrize("name", sorted(HF_ACTIVATIONS))
def test_same_function_as_transformers(name):
    ours = ACTIVATIONS[hf_activation(name, "hidden_act")]()
    x = torch.linspace(-8, 8, 4001, dtype=torch.float64)
    assert hf_activation(name, "hidden_act") not in GATED_ACTIVATIONS
    assert_close(ours(x.float()), ACT2FN[name](x).float(), atol=1e-6, rtol=1e-5)


def test_refused_names():
    with pytest.raises(ValueError, match=r"^hidden_act='mish' is not supported: expected one of "
                       r"\['gelu', .*'swish'\]$"):  # fmt: skip
        hf_activation("mish", "hidden_act")
    for bad in (None, ["gelu"], 1):  # a hostile config.json: one ValueError, never TypeError
        with pytest.raises(ValueError, match=f"act_fn={bad!r}".replace("[", r"\[")):
            hf_activation(bad, "act_fn")
    # a caller's subset: in the table but not supported there is refused, naming the subset
    assert hf_activation("gelu", "vision_config.hidden_act", ("gelu", "quick_gelu")) == "gelu"
    with pytest.raises(
        ValueError,
        match=r"^vision_config.hidden_act='relu' is not supported: expected one of "
        r"\['gelu', 'quick_gelu'\]$",
    ):
        hf_activation("relu", "vision_config.hidden_act", ("quick_gelu", "gelu"))
