"""CoCa decoding on the inference fast path (``MultimodalDecoder.fast_inference`` and the text
tower's flag, on by default) gives the tokens of the plain module calls: one row per step
(the blocks' module calls, the vocabulary projection fused), several rows (the
self-attention blocks fused with the KV cache as their prefix), beams, uncached; the
teacher-forced logits agree; the caches reserve ``max_length - 1`` positions.

A tiny random CoCa (no open_clip): parity with open_clip's CoCa is tests/clip/test_coca.py."""

from __future__ import annotations

import pytest
import torch
from attn_clip import CLIPConfig, create_model
from attn_clip.coca import CaptionDecoder
from attn_core import fast_inference, onednn
from torch.testing import assert_close

from benchmarks.caption import TINY_COCA_CFG

TINY = TINY_COCA_CFG  # the benchmark's tiny coca_ViT-B-32 layout

with torch.no_grad():
    _FAST = fast_inference.fast_path_available(torch.zeros(1))
pytestmark = pytest.mark.skipif(not _FAST, reason="no oneDNN fast path here")


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    m = create_model(CLIPConfig.from_open_clip(TINY)).eval()
    with torch.no_grad():  # norms and biases off their init, a wider spread of logits
        for p in m.parameters():
            p.add_(torch.randn_like(p) * (0.1 if p.ndim <= 1 else 0.02))
    return m


def _packed(model) -> set[str]:
    """Names of the parameters that have a oneDNN pack."""
    packed = {id(w) for w in onednn._packed.keys()}
    return {n for n, p in model.named_parameters() if id(p) in packed}


GREEDY = dict(min_length=0, max_length=12, eos_token_id=None)


@pytest.mark.parametrize(
    "batch, options",
    [
        (1, GREEDY),  # one row per step
        (3, GREEDY),  # three rows
        (1, dict(num_beams=3, max_length=10)),
        (2, dict(num_beams=2, num_return_sequences=2, max_length=10)),
        (2, {**GREEDY, "use_cache": False}),  # the whole prefix every step
    ],
    ids=["greedy-1", "greedy-3", "beams", "beams-2-returned", "uncached"],
)
def test_fast_path_gives_the_plain_tokens(model, batch, options):
    images = torch.randn(batch, 3, 32, 32, generator=torch.Generator().manual_seed(batch))
    onednn.release_packed_weights()
    fast = model.generate(images, **options)
    packed = _packed(model)
    assert "text_decoder.proj.weight" in packed  # the projection ran fused
    rows = batch * options.get("num_beams", 1)
    fused_blocks = {"text.blocks.0.attn.qkv.weight", "text_decoder.blocks.1.mlp.fc2.weight"}
    if rows > 1 or not options.get("use_cache", True):
        assert fused_blocks <= packed
    else:  # one row: matrix-vector products through the modules
        assert not fused_blocks & packed
    with fast_inference.disabled(model):
        plain = model.generate(images, **options)
    assert torch.equal(fast, plain)


def test_teacher_forced_logits_and_cache_room(model):
    images = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(7))
    texts = torch.randint(1, 49406, (2, 9), generator=torch.Generator().manual_seed(8))
    texts[:, 0], texts[1, 6:] = 49406, 0  # start token; a padded caption
    with torch.no_grad():
        fast = model(images, texts).logits
        with fast_inference.disabled(model):
            plain = model(images, texts).logits
    assert fast.shape == (2, 8, 49408)
    assert_close(fast, plain, atol=1e-5, rtol=1e-5)
    with torch.no_grad():
        _, tokens = model.encode_image_tokens(images)
        decoder = CaptionDecoder(model, tokens, 1, max_length=12)
    assert {c.capacity for c in [*decoder.text_caches, *decoder.decoder_caches]} == {11}
