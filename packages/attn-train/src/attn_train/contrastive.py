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

CoCa (``attn_clip.CoCa`` with ``attn_clip.CoCaLoss``): the output also holds the caption
``logits`` and ``labels``; the contrastive term is scored as above
(``loss_fn.contrastive``) and the caption cross-entropy, a sum over tokens, is divided by
the token count of the whole update (``loss_fn.captioning(..., num_tokens=)``), so each
micro-batch's live pass adds its own share and the update is the big batch's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .loop import StepContext, StepFn

__all__ = ["contrastive_step"]


def contrastive_step(loss_fn: Callable[..., Any], lock_image: bool = False) -> StepFn:
    """A step function for :func:`attn_train.fit` over micro-batches ``[(images, texts)]``.

    ``loss_fn``: ``ClipLoss`` / ``SigLipLoss``, or a ``CoCaLoss`` (it has ``captioning``:
    the contrastive and caption terms are added). ``lock_image``: the image tower is frozen
    (LiT), so the cached image features are used in every pass. Returns the big-batch loss,
    checked before any backward.
    """
    captioning = getattr(loss_fn, "captioning", None)  # CoCaLoss: + the caption term
    contrastive = loss_fn if captioning is None else loss_fn.contrastive

    def step(micro: list[Any], ctx: StepContext) -> float:
        last = len(micro) - 1
        if last == 0:
            with ctx.autocast():
                out = ctx.ddp_model(*micro[0])
                loss = contrastive(
                    out.image_embeds, out.text_embeds, out.logit_scale, out.logit_bias
                )
                if captioning is not None:
                    loss = loss + captioning(out.logits, out.labels)
            ctx.check(loss)
            ctx.backward(loss)
            return loss.item()
        imgs, txts, n_tokens, caption_sum = [], [], 0, 0.0
        with torch.no_grad(), ctx.autocast():
            for images, texts in micro:
                out = ctx.model(images, texts)
                imgs.append(out.image_embeds)
                txts.append(out.text_embeds)
                if captioning is not None:  # summed now: the caption logits are not kept
                    n_tokens += loss_fn.count_tokens(out.labels)
                    caption_sum = caption_sum + captioning(out.logits, out.labels, 1)
            value = contrastive(torch.cat(imgs), torch.cat(txts), out.logit_scale, out.logit_bias)
            if captioning is not None:
                value = value + caption_sum / max(n_tokens, 1)
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
                loss = contrastive(torch.cat(img), torch.cat(txt), scale, bias)
                if captioning is not None:  # this micro-batch's share of the update's mean
                    loss = loss + captioning(out.logits, out.labels, n_tokens)
            ctx.backward(loss)
        return value.item()

    return step
