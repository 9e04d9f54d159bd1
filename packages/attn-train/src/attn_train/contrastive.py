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

Word dropout on the caption decoder's input (Bowman et al. 2016, for conditional decoders;
``caption_input_noise=p``, ``--caption-input-noise`` in ``scripts/train_clip.py``): each
word of a micro-batch's captions is, with probability ``p``, replaced by a random word of
that micro-batch (:func:`noise_caption_inputs`) in what the decoder reads
(``model(images, texts, decoder_texts)``); the labels and the contrastive embeddings stay
those of the clean captions. Teacher forcing otherwise lets the decoder learn the next word
from the word just written (a shape from the colour before it) rather than from the image.
The noise is drawn once per micro-batch, from the global torch CPU generator (part of every
checkpoint, so a resumed run draws the same noise), and the cached and live passes of an
accumulated update see the same noised captions. ``p = 0`` (the default) draws nothing and
calls ``model(images, texts)``: open_clip's loss, unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from .loop import StepContext, StepFn

__all__ = ["contrastive_step", "noise_caption_inputs"]


def noise_caption_inputs(
    texts: torch.Tensor,
    p: float,
    special_ids: Sequence[int],
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Word dropout: ``texts`` ``(B, L)`` token ids with each token that is not one of
    ``special_ids`` (start, end of text, pad) replaced, with probability ``p``, by a word
    drawn uniformly from the distinct non-special ids of ``texts`` (the batch's own
    vocabulary: a replacement is always a word, never a special token). Returns a new
    ``(B, L)`` tensor (``texts`` itself when ``p == 0``). The draws (``B L`` uniforms, then
    ``B L`` word indices) come from ``generator`` on the CPU (default: the global one)."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"the caption input noise must be a probability in [0, 1], got {p}")
    if texts.ndim != 2:
        raise ValueError(f"texts must be (B, L) token ids, got {tuple(texts.shape)}")
    if p == 0.0:
        return texts
    special = torch.tensor(list(special_ids), dtype=texts.dtype, device=texts.device)
    is_word = ~torch.isin(texts, special)  # (B, L)
    words = texts[is_word].unique()  # (W,)
    if words.numel() == 0:
        return texts
    replace = torch.rand(texts.shape, generator=generator) < p  # (B, L), CPU
    pick = torch.randint(words.numel(), texts.shape, generator=generator)  # (B, L)
    replace = replace.to(texts.device) & is_word
    return torch.where(replace, words[pick.to(texts.device)], texts)


def contrastive_step(
    loss_fn: Callable[..., Any],
    lock_image: bool = False,
    caption_input_noise: float = 0.0,
    special_ids: Sequence[int] = (),
) -> StepFn:
    """A step function for :func:`attn_train.fit` over micro-batches ``[(images, texts)]``.

    ``loss_fn``: ``ClipLoss`` / ``SigLipLoss``, or a ``CoCaLoss`` (it has ``captioning``:
    the contrastive and caption terms are added). ``lock_image``: the image tower is frozen
    (LiT), so the cached image features are used in every pass. ``caption_input_noise``
    (CoCa only): word dropout on the decoder's input with this probability, the tokens in
    ``special_ids`` (start, end of text, pad; required then) never replaced (see the module
    docstring). Returns the big-batch loss, checked before any backward.
    """
    captioning = getattr(loss_fn, "captioning", None)  # CoCaLoss: + the caption term
    contrastive = loss_fn if captioning is None else loss_fn.contrastive
    if not 0.0 <= caption_input_noise <= 1.0:
        raise ValueError(f"caption_input_noise must be in [0, 1], got {caption_input_noise}")
    if caption_input_noise > 0 and (captioning is None or not special_ids):
        raise ValueError("caption_input_noise needs a CoCaLoss and the special_ids to keep")

    def step(micro: list[Any], ctx: StepContext) -> float:
        if caption_input_noise > 0:  # drawn once: the cached and live passes see the same
            noise = caption_input_noise
            micro = [(i, t, noise_caption_inputs(t, noise, special_ids)) for i, t in micro]
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
            for batch in micro:  # (images, texts) or (images, texts, decoder_texts)
                out = ctx.model(*batch)
                imgs.append(out.image_embeds)
                txts.append(out.text_embeds)
                if captioning is not None:  # summed now: the caption logits are not kept
                    n_tokens += loss_fn.count_tokens(out.labels)
                    caption_sum = caption_sum + captioning(out.logits, out.labels, 1)
            value = contrastive(torch.cat(imgs), torch.cat(txts), out.logit_scale, out.logit_bias)
            if captioning is not None:
                value = value + caption_sum / max(n_tokens, 1)
        ctx.check(value)
        for j, batch in enumerate(micro):
            with ctx.no_sync(j == last), ctx.autocast():
                out = ctx.ddp_model(*batch)
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
