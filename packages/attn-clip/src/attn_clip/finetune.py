"""Fine-tuning helpers: WiSE-FT weight-space ensembling, a SigLIP logit bias.

WiSE-FT (Wortsman et al., "Robust fine-tuning of zero-shot models", CVPR 2022) interpolates
the weights of the zero-shot (initial) model and the fine-tuned one: with ``alpha`` between
0 and 1 it keeps much of the zero-shot robustness and most of the fine-tuned accuracy.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

__all__ = ["add_logit_bias", "wise_ft"]

StateDict = Mapping[str, torch.Tensor]


def wise_ft(
    zero_shot: nn.Module | StateDict, finetuned: nn.Module | StateDict, alpha: float
) -> dict[str, torch.Tensor]:
    """The state dict ``(1 - alpha) * zero_shot + alpha * finetuned``, key by key.

    Either side is a model or its state dict; both must have the same keys and shapes
    (``alpha=0``: the zero-shot weights, ``1``: the fine-tuned ones). Load the result with
    ``model.load_state_dict``.
    """
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    theta_0 = zero_shot.state_dict() if isinstance(zero_shot, nn.Module) else zero_shot
    theta_1 = finetuned.state_dict() if isinstance(finetuned, nn.Module) else finetuned
    if theta_0.keys() != theta_1.keys():
        missing, extra = (
            sorted(theta_1.keys() - theta_0.keys()),
            sorted(theta_0.keys() - theta_1.keys()),
        )
        raise ValueError(
            f"wise_ft: the models differ: only fine-tuned {missing}, only zero-shot {extra}"
        )
    for k, v in theta_1.items():
        if theta_0[k].shape != v.shape:
            raise ValueError(f"wise_ft: {k} is {tuple(theta_0[k].shape)} vs {tuple(v.shape)}")
    return {k: (1 - alpha) * theta_0[k] + alpha * v for k, v in theta_1.items()}


def add_logit_bias(model: nn.Module, init: float = -10.0) -> nn.Module:
    """Give a CLIP that has none a learnable logit bias (SigLIP's, ``init`` -10), recorded
    in its config as ``init_logit_bias``; a model with one is left as it is. Returns it."""
    if model.logit_bias is None:
        model.logit_bias = nn.Parameter(torch.tensor(init))
        model.config.init_logit_bias = init
    return model
