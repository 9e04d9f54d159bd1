"""Losses (CLIP, SigLIP, CoCa): values and gradients equal open_clip's; 2-process DDP equals
one process."""

from __future__ import annotations

import importlib
import socket
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
import torch.nn.functional as F
from attn_clip import ClipLoss, CoCaLoss, SigLipLoss
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


def _caption_inputs(n: int = 6, length: int = 5, vocab: int = 11):
    """Caption logits ``(n, length, vocab)`` and labels with trailing pads (id 0), one row
    all pads, some real tokens equal to 0's neighbours."""
    logits = torch.randn(n, length, vocab).requires_grad_()
    labels = torch.randint(1, vocab, (n, length))
    lengths = torch.tensor([5, 3, 1, 0, 4, 2])[:n]
    labels = labels.masked_fill(torch.arange(length)[None] >= lengths[:, None], 0)
    return logits, labels


def _coca_terms_and_grads(loss_fn, img, txt, scale, logits, labels):
    leaves = [t.detach().clone().requires_grad_() for t in (img, txt, scale, logits)]
    clip, caption = loss_fn(leaves[0], leaves[1], leaves[3], labels, leaves[2].exp())
    (clip + caption).backward()
    return [clip.detach(), caption.detach()], [t.grad for t in leaves]


@pytest.mark.parametrize(("caption_w", "clip_w"), [(2.0, 1.0), (1.0, 0.0), (0.0, 0.5)])
def test_coca_loss_matches_open_clip(caption_w, clip_w):
    img, txt, scale, _ = _inputs()
    logits, labels = _caption_inputs()
    ours = _coca_terms_and_grads(CoCaLoss(caption_w, clip_w), img, txt, scale, logits, labels)
    ref_fn = oc_loss.CoCaLoss(caption_loss_weight=caption_w, clip_loss_weight=clip_w)
    ref_terms = ref_fn(img, txt, logits, labels, scale.exp())  # values; grads: where defined
    for term, r in zip(ours[0], ref_terms, strict=True):
        assert_close(term, r.to(term.dtype))
    if clip_w:  # open_clip's zero clip term is a constant: its features get no gradient
        ref = _coca_terms_and_grads(ref_fn, img, txt, scale, logits, labels)
        for g, r in zip(ours[1], ref[1], strict=True):
            assert_close(g, r)
    else:  # ours keeps the graph with zero gradients (DDP needs every parameter used)
        assert all(torch.equal(g, torch.zeros_like(g)) for g in ours[1][:3])
        assert_close(ours[1][3], torch.autograd.grad(ref_terms[1], logits)[0])
    out = CoCaLoss(caption_w, clip_w)(img, txt, logits, labels, 10.0, output_dict=True)
    assert set(out) == {"contrastive_loss", "caption_loss"}


def test_coca_caption_loss_ignores_pads_and_adds_up_over_micro_batches():
    logits, labels = _caption_inputs()
    loss = CoCaLoss(1.0, 1.0)
    keep = labels != 0
    by_hand = F.cross_entropy(logits[keep], labels[keep])  # pads (id 0) are not scored
    assert_close(loss.captioning(logits, labels), by_hand)
    # pad_id is the ignored id: with pad_id 3, id 0 is a real token and 3 is skipped
    keep3 = labels != 3
    assert_close(CoCaLoss(1.0, 1.0, pad_id=3).captioning(logits, labels),
                 F.cross_entropy(logits[keep3], labels[keep3]))  # fmt: skip
    n = loss.count_tokens(labels)
    assert n == int(keep.sum()) == 15
    halves = [
        loss.captioning(logits[s], labels[s], num_tokens=n) for s in (slice(0, 2), slice(2, 6))
    ]
    assert_close(halves[0] + halves[1], by_hand)  # two micro-batches = the whole batch
    with pytest.raises(ValueError, match=r"\(b, L, V\)"):
        loss.captioning(logits, labels[:, :-1])


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


def test_ddp_coca_ranks_match_open_clip_and_one_process(ddp_results):
    """CoCaLoss under DDP: on each rank, open_clip's CoCaLoss on the gathered features
    (contrastive term) and the rank's own caption logits (caption term: a local mean); with
    equal token counts per rank, the DDP-averaged gradients equal one process's."""
    worker, ranks = ddp_results
    all_img = torch.cat([r["coca"]["features"][0] for r in ranks])
    all_txt = torch.cat([r["coca"]["features"][1] for r in ranks])
    labels = worker.caption_labels(2)
    torch.manual_seed(7)
    model = worker.CaptionTowers()
    scale = model.logit_scale.detach().exp()
    ref = oc_loss.CoCaLoss(**worker.COCA_WEIGHTS)  # world_size 1, over the gathered batch
    b = worker.B_LOCAL
    for rank, r in enumerate(ranks):
        sl = slice(rank * b, (rank + 1) * b)
        expected = ref(all_img, all_txt, r["coca"]["logits"], labels[sl], scale)
        for term, e in zip(r["coca"]["loss"], expected, strict=True):
            assert_close(term, e, atol=1e-6, rtol=1e-5)

    img, txt, scale, logits = model(*worker.data(2))
    clip, caption = worker.make_loss("coca", rank=0, world_size=1)(img, txt, logits, labels, scale)
    (clip + caption).backward()
    for r in ranks:
        for name, p in model.named_parameters():
            assert_close(r["coca"]["grads"][name], p.grad, atol=1e-6, rtol=1e-5)
