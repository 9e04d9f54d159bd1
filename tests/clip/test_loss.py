"""Losses: values and gradients equal open_clip's; 2-process DDP equals one process."""

from __future__ import annotations

import importlib
import socket
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
import torch.nn.functional as F
from attn_clip import ClipLoss, SigLipLoss
from open_clip import loss as oc_loss
from torch.testing import assert_close


def _inputs(n: int = 6, e: int = 8, bias: bool = False):
    img = F.normalize(torch.randn(n, e), dim=-1).requires_grad_()
    txt = F.normalize(torch.randn(n, e), dim=-1).requires_grad_()
    scale = torch.tensor(2.7).requires_grad_()
    b = torch.tensor(-3.0).requires_grad_() if bias else None
    return img, txt, scale, b


def _value_and_grads(loss_fn, img, txt, scale, bias):
    leaves = [t.detach().clone().requires_grad_() for t in (img, txt, scale)]
    b = None if bias is None else bias.detach().clone().requires_grad_()
    loss = loss_fn(leaves[0], leaves[1], leaves[2].exp(), b)
    loss.backward()
    return loss.detach(), [t.grad for t in leaves] + ([b.grad] if b is not None else [])


@pytest.mark.parametrize("bias", [False, True])
def test_clip_loss_matches_open_clip(bias):
    inputs = _inputs(bias=bias)
    ours = _value_and_grads(ClipLoss(), *inputs)
    ref = _value_and_grads(oc_loss.ClipLoss(), *inputs)
    assert_close(ours[0], ref[0])
    for g, r in zip(ours[1], ref[1], strict=True):
        assert_close(g, r)
    out = ClipLoss(cache_labels=True)(inputs[0], inputs[1], 10.0, output_dict=True)
    assert set(out) == {"contrastive_loss"}


def test_siglip_loss_matches_open_clip():
    inputs = _inputs(bias=True)
    ours = _value_and_grads(SigLipLoss(), *inputs)
    ref = _value_and_grads(oc_loss.SigLipLoss(), *inputs)
    assert_close(ours[0], ref[0])
    for g, r in zip(ours[1], ref[1], strict=True):
        assert_close(g, r)


def test_clip_loss_is_low_for_matching_pairs():
    x = F.normalize(torch.randn(5, 8), dim=-1)
    assert ClipLoss()(x, x, 100.0) < 0.05 < ClipLoss()(x, x.roll(1, 0), 100.0)
    with pytest.raises(ValueError, match=r"\(b, E\)"):
        ClipLoss()(x, x[:4], 1.0)
    with pytest.raises(ValueError, match=r"\(b, E\)"):
        SigLipLoss()(x, x[:4], 1.0, 0.0)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ddp_results(tmp_path_factory):
    """Run clip_ddp_worker.run on 2 gloo ranks (spawned) and load what each rank recorded."""
    out = tmp_path_factory.mktemp("ddp")
    mp_ctx = pytest.MonkeyPatch()
    mp_ctx.syspath_prepend(str(Path(__file__).parent))  # children import clip_ddp_worker by name
    try:
        worker = importlib.import_module("clip_ddp_worker")
        mp.spawn(worker.run, args=(2, _free_port(), str(out)), nprocs=2, join=True)
    finally:
        mp_ctx.undo()
    return worker, [torch.load(out / f"rank{r}.pt") for r in range(2)]


def _single_process(worker, case: str):
    """The same model and loss on the concatenated batch in one process."""
    model = worker.make_model(bias=case == "siglip")
    img, txt, scale, bias = model(*worker.data(2))
    loss = worker.make_loss(case, rank=0, world_size=1)(img, txt, scale, bias)
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters()}


@pytest.mark.parametrize("case", ["clip_grad", "clip_local_grad", "siglip"])
def test_ddp_gradients_equal_single_process(ddp_results, case):
    worker, ranks = ddp_results
    loss, grads = _single_process(worker, case)
    # each rank's loss covers its own rows; their mean is the global loss
    assert_close(torch.stack([r[case]["loss"] for r in ranks]).mean(), loss)
    for r in ranks:  # DDP averaged the gradients: every rank holds the global ones
        for name, g in grads.items():
            assert_close(r[case]["grads"][name], g, atol=1e-6, rtol=1e-5)


def test_ddp_without_gather_grad_scales_gradients(ddp_results):
    """Documented open_clip behaviour: without gather_with_grad the loss is the same but
    the DDP-averaged tower gradients are 1/world_size of the single-process ones (only the
    local features get gradients); logit_scale, seen whole by every rank, is exact."""
    worker, ranks = ddp_results
    loss, grads = _single_process(worker, "clip")
    for r in ranks:
        assert_close(r["clip"]["loss"], loss)
        for name, g in grads.items():
            factor = 1 if name == "logit_scale" else 2
            assert_close(r["clip"]["grads"][name] * factor, g, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("case", ["clip", "clip_local", "clip_grad", "clip_local_grad", "siglip"])
def test_ddp_ranks_match_open_clip_per_rank(ddp_results, case):
    """open_clip's distributed losses, replayed on each rank's gathered features."""
    worker, ranks = ddp_results
    all_img = torch.cat([r[case]["features"][0] for r in ranks])
    all_txt = torch.cat([r[case]["features"][1] for r in ranks])
    model = worker.make_model(bias=case == "siglip")
    scale = model.logit_scale.detach().exp()
    bias = None if model.logit_bias is None else model.logit_bias.detach()
    b = worker.B_LOCAL
    for rank, r in enumerate(ranks):
        sl = slice(rank * b, (rank + 1) * b)
        if case == "siglip":
            # open_clip's ring exchange = local pairs + negatives against the other rank
            ref = oc_loss.SigLipLoss()
            other = all_txt[(1 - rank) * b : (2 - rank) * b]
            expected = ref._loss(all_img[sl], all_txt[sl], scale, bias) + ref._loss(
                all_img[sl], other, scale, bias, negative_only=True
            )
        else:
            kwargs = worker.CASES[case]
            logits = scale * all_img @ all_txt.T  # (N, N) global logits
            labels = torch.arange(2 * b)
            if kwargs["local_loss"]:  # rows of this rank only
                expected = (
                    F.cross_entropy(logits[sl], labels[sl])
                    + F.cross_entropy(logits.T[sl], labels[sl])
                ) / 2
            else:
                expected = (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels)) / 2
        assert_close(r[case]["loss"], expected, atol=1e-6, rtol=1e-5)
