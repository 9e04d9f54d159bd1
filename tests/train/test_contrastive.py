"""attn_train.contrastive: K micro-batches give the gradients of one big batch (CLIP loss)."""

from __future__ import annotations

import pytest
import torch
from _support.train import tiny_clip_config
from attn_train import StepContext, contrastive_step


@pytest.fixture(scope="module")
def tiny_clip():
    import attn_clip

    config = tiny_clip_config(embed_dim=16, **{"text.context_length": 8})
    return attn_clip.create_model(config).train()


def grads(model, micro, lock_image=False) -> tuple[float, dict[str, torch.Tensor]]:
    import attn_clip

    model.zero_grad(set_to_none=True)
    checked = []
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    ctx = StepContext(model, model, torch.device("cpu"), "fp32", scaler, check=checked.append)
    loss = contrastive_step(attn_clip.ClipLoss(), lock_image)(micro, ctx)
    assert len(checked) == 1  # the update's loss, checked once, before any backward
    return loss, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_micro_batches_give_the_big_batch_gradient(tiny_clip):
    torch.manual_seed(0)
    images, texts = torch.randn(8, 3, 32, 32), torch.randint(1, 40, (8, 8))
    big_loss, big = grads(tiny_clip, [(images, texts)])
    acc_loss, acc = grads(tiny_clip, [(images[:4], texts[:4]), (images[4:], texts[4:])])
    assert acc_loss == pytest.approx(big_loss, rel=1e-6)
    assert big.keys() == acc.keys() and "logit_scale" in big
    for k in big:
        torch.testing.assert_close(acc[k], big[k], atol=1e-6, rtol=1e-4)
    _, half = grads(tiny_clip, [(images[:4], texts[:4])])
    assert not torch.allclose(half["logit_scale"], big["logit_scale"])
