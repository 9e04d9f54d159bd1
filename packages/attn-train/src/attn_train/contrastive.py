"""Exact gradient accumulation for contrastive (CLIP / SigLIP) losses.

A contrastive loss over a batch is not a sum of per-micro-batch losses: every pair is
scored against every other. open_clip's ``--accum-freq`` gets the big-batch gradient
anyway, and so does :func:`contrastive_step`: the features of every micro-batch are first
computed without gradients, then each micro-batch is re-run and scored against all cached
features (its own live), so the summed gradients equal those of one big batch. The
temperature / bias take part only in the last pass (their gradient there is already the
full one, so it is not counted once per micro-batch).

The model returns an output with ``image_embeds``, ``text_embeds``, ``logit_scale`` and
``logit_bias`` (``attn_clip.CLIP``); the loss is ``loss_fn(image, text, scale, bias)``
(``attn_clip.ClipLoss`` / ``SigLipLoss``, which all-gather over DDP ranks).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .loop import StepContext, StepFn

__all__ = ["contrastive_step"]


def contrastive_step(loss_fn: Callable[..., torch.Tensor], lock_image: bool = False) -> StepFn:
    """A step function for :func:`attn_train.fit` over micro-batches ``[(images, texts)]``.

    ``lock_image``: the image tower is frozen (LiT), so the cached image features are used
    in every pass. Returns the big-batch loss, checked before any backward.
    """

    def step(micro: list[Any], ctx: StepContext) -> float:
        last = len(micro) - 1
        if last == 0:
            with ctx.autocast():
                out = ctx.ddp_model(*micro[0])
                loss = loss_fn(out.image_embeds, out.text_embeds, out.logit_scale, out.logit_bias)
            ctx.check(loss)
            ctx.backward(loss)
            return loss.item()
        with torch.no_grad(), ctx.autocast():
            cached = [ctx.model(images, texts) for images, texts in micro]
            imgs, txts = [c.image_embeds for c in cached], [c.text_embeds for c in cached]
            scale, bias = cached[-1].logit_scale, cached[-1].logit_bias
            value = loss_fn(torch.cat(imgs), torch.cat(txts), scale, bias)
        ctx.check(value)
        for j, (images, texts) in enumerate(micro):
            with ctx.no_sync(j == last), ctx.autocast():
                out = ctx.ddp_model(images, texts)
                img = imgs if lock_image else imgs[:j] + [out.image_embeds] + imgs[j + 1 :]
                txt = txts[:j] + [out.text_embeds] + txts[j + 1 :]
                scale, bias = out.logit_scale, out.logit_bias
                if j != last:
                    scale = scale.detach()
                    bias = bias.detach() if bias is not None else None
                loss = loss_fn(torch.cat(img), torch.cat(txt), scale, bias)
            ctx.backward(loss)
        return value.item()

    return step
