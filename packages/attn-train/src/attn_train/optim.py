"""Optimizer parameter groups: timm's weight-decay split and layer-wise lr decay.

:func:`param_groups` calls timm's ``param_groups_weight_decay`` (no weight decay on 1-d
parameters -- gains, biases, scalars -- and on the names matching ``no_weight_decay``) or,
with ``layer_decay``, timm's ``param_groups_layer_decay`` (each group also gets an
``lr_scale`` = ``layer_decay ** (num_layers + 1 - layer_id)``: embeddings 0, block ``i``
``i + 1`` (the final norm with the last block), head last). The layer ids come from timm's
group matchers for ViT and Swin, which our models share because their parameter names are
timm's.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import nn

from .schedules import cosine_schedule, lambda_lr

__all__ = ["NO_WEIGHT_DECAY", "adamw_cosine", "param_groups"]

# timm's no_weight_decay() names of ViT / Swin (fnmatch patterns)
NO_WEIGHT_DECAY = ("pos_embed", "cls_token", "reg_token", "*relative_position_bias_table")

# timm's group_matcher(coarse=False) of VisionTransformer and SwinTransformer
_VIT = {
    "stem": r"^cls_token|reg_token|pos_embed|patch_embed|norm_pre",
    "blocks": [(r"^blocks\.(\d+)", None), (r"^norm", (99999,))],
}
_SWIN = {
    "stem": r"^patch_embed",
    "blocks": [
        (r"^layers\.(\d+).downsample", (0,)),
        (r"^layers\.(\d+)\.\w+\.(\d+)", None),
        (r"^norm", (99999,)),
    ],
}


class _Matched:
    """What timm's ``param_groups_layer_decay`` reads from a model: its parameters and
    ``group_matcher()`` (our models keep that timm-only method out of the model file)."""

    def __init__(self, model: nn.Module, matcher: dict[str, Any]) -> None:
        self.model, self.matcher = model, matcher

    def named_parameters(self) -> Iterator[tuple[str, nn.Parameter]]:
        return self.model.named_parameters()

    def group_matcher(self, coarse: bool = False) -> dict[str, Any]:
        return self.matcher


def _matcher(model: nn.Module) -> dict[str, Any] | None:
    names = [n for n, _ in model.named_parameters()]
    if any(n.startswith("layers.") and ".blocks." in n for n in names):
        return _SWIN
    if any(n.startswith("blocks.") for n in names) and "pos_embed" in names:
        return _VIT
    return None


def param_groups(
    model: nn.Module,
    weight_decay: float,
    *,
    layer_decay: float | None = None,
    no_weight_decay: Sequence[str] = NO_WEIGHT_DECAY,
) -> list[dict[str, Any]]:
    """AdamW parameter groups of ``model``'s trainable parameters (see the module doc).

    ``layer_decay`` needs a ViT or Swin (timm parameter names); anything else is a
    ``ValueError``.
    """
    from timm.optim import param_groups_layer_decay, param_groups_weight_decay

    if layer_decay is None:
        return param_groups_weight_decay(
            model, weight_decay, no_weight_decay_list=list(no_weight_decay)
        )
    matcher = _matcher(model)
    if matcher is None:
        raise ValueError(f"--layer-decay supports ViT and Swin models, not {type(model).__name__}")
    return param_groups_layer_decay(
        _Matched(model, matcher),  # type: ignore[arg-type]
        weight_decay,
        no_weight_decay_list=list(no_weight_decay),
        layer_decay=layer_decay,
    )


def adamw_cosine(
    model: nn.Module, args: Any, max_steps: int, **groups: Any
) -> tuple[torch.optim.AdamW, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW over :func:`param_groups` (``groups``: its keyword arguments) and a warm-up +
    cosine ``LambdaLR`` to ``max_steps``, from the flags of
    :func:`attn_train.cli.add_schedule_args` and :func:`~attn_train.cli.add_optimizer_args`
    (``--lr --warmup --wd --min-lr-ratio``, and ``--beta1 --beta2 --eps`` when present)."""
    kw: dict[str, Any] = {"lr": args.lr}
    if hasattr(args, "beta1"):
        kw["betas"] = (args.beta1, args.beta2)
    if hasattr(args, "eps"):
        kw["eps"] = args.eps
    optimizer = torch.optim.AdamW(param_groups(model, args.wd, **groups), **kw)
    schedule = cosine_schedule(args.warmup, max_steps, args.min_lr_ratio)
    return optimizer, lambda_lr(optimizer, schedule)
