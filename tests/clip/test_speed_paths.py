"""The fast inference paths give the numbers of the plain ones (correctness only, no timings):
text truncation + shared prefixes + length groups, the oneDNN block path of both towers
(attn_core.fast_inference), bf16 weights, and the O(L * w) sliding window at smaller
versions of the benchmark shapes."""

from __future__ import annotations

import pytest
import torch
from attn_clip import (
    IMAGENET_CLASSNAMES,
    OPENAI_IMAGENET_TEMPLATES,
    CLIPConfig,
    Tokenizer,
    create_model,
    load_checkpoint,
)
from attn_core import attention, fast_inference, sliding_window_attention, sliding_window_mask
from attn_core.fast_inference import _length_groups, _shared_prefixes, block_supported
from torch.testing import assert_close

CTX = 24  # the 80 ImageNet prompts of these classes fit in 24 tokens
TOL4 = {"atol": 1e-4, "rtol": 1e-4}


def _model(h, precision: str = "fp32", text_cfg: dict | None = None):
    torch.manual_seed(0)
    cfg = h.oc_cfg(text_cfg={"context_length": CTX, **(text_cfg or {})})
    model = create_model(CLIPConfig.from_open_clip(cfg))
    h.random_fill_(model)
    if precision != "fp32":
        bf16 = create_model(CLIPConfig.from_open_clip(cfg), precision=precision)
        return model, load_checkpoint(bf16, model.state_dict())
    return model


def _prompts(n_classes: int) -> torch.Tensor:
    names = IMAGENET_CLASSNAMES[:n_classes]
    return Tokenizer(CTX)([t(c) for c in names for t in OPENAI_IMAGENET_TEMPLATES])


def _plain(model, fn):
    """Run ``fn`` with the fast inference paths off (the reference blocks)."""
    with fast_inference.disabled(model):
        return fn()


@pytest.mark.parametrize(
    "text_cfg",
    [
        {},  # argmax (EOT) pooling, GELU
        {"ls_init_value": 0.1},  # LayerScale in every block
        {"pool_type": "eos", "eos_id": 49407},  # first-EOT pooling
    ],
)
def test_truncated_text_encoding_equals_full_length(h, text_cfg):
    model = _model(h, text_cfg=text_cfg)
    tokens = _prompts(3)  # 240 prompts: several length groups and shared prefixes
    seqs = [r[:n] for r, n in zip(tokens.tolist(), (tokens.argmax(-1) + 1).tolist(), strict=True)]
    assert _shared_prefixes(seqs) is not None  # the prefix cache is exercised
    with torch.no_grad():
        fast = model.encode_text(tokens)  # truncated, shared prefixes, length groups, oneDNN
        full = _plain(model, lambda: model.encode_text(tokens, truncate=False))
        cut = _plain(model, lambda: model.encode_text(tokens))
    assert_close(fast, full, atol=1e-5, rtol=1e-5)
    assert_close(cut, full, atol=1e-5, rtol=1e-5)
    with torch.enable_grad():  # autograd path: truncated too, plain blocks
        grad_path = model.encode_text(tokens)
    assert_close(grad_path, full, atol=1e-5, rtol=1e-5)


def test_text_matches_open_clip_with_quick_gelu(h):
    cfg = h.oc_cfg(text_cfg={"context_length": CTX}, quick_gelu=True)
    ref = h.make_open_clip(cfg)
    model = create_model(CLIPConfig.from_open_clip(cfg))
    load_checkpoint(model, ref.state_dict())
    tokens = _prompts(2)
    with torch.no_grad():
        assert_close(model.encode_text(tokens), ref.encode_text(tokens), atol=1e-5, rtol=1e-5)


def test_bidirectional_text_tower_is_not_truncated(h):
    model = _model(h, text_cfg={"no_causal_mask": True, "pool_type": "last"})
    tokens = _prompts(1)
    with torch.no_grad():
        assert_close(
            model.encode_text(tokens),
            _plain(model, lambda: model.encode_text(tokens, truncate=False)),
            atol=1e-5,
            rtol=1e-5,
        )


def test_prefix_plan_and_length_groups():
    seqs = [[1, 2, 3, 4, 5, 9], [1, 2, 3, 4, 6, 9], [1, 2, 3, 4, 7, 8, 9], [5, 9]]
    cluster, prefix_len = _shared_prefixes(seqs)
    assert cluster == [0, 0, 0, -1] and prefix_len == [4]
    assert _shared_prefixes([[1, 9], [2, 9]]) is None  # nothing shared
    assert _shared_prefixes([[1, 2, 9], [1, 2, 9]]) is None  # every row keeps its last token
    ends = _length_groups([3] * 100 + [20])
    assert ends[-1] == 101 and all(a < b for a, b in zip(ends, ends[1:], strict=False))


@pytest.mark.parametrize("updates", [{}, {"quick_gelu": True}])
def test_image_fast_path_equals_plain_blocks_and_open_clip(h, updates):
    cfg = h.oc_cfg(**updates)
    ref = h.make_open_clip(cfg)
    model = create_model(CLIPConfig.from_open_clip(cfg))
    load_checkpoint(model, ref.state_dict())
    assert all(block_supported(b) for b in model.visual.trunk.blocks)
    images = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        fast = model.encode_image(images)  # patchify + oneDNN blocks + [CLS]-only last block
        plain = _plain(model, lambda: model.encode_image(images))
        assert_close(fast, plain, atol=1e-5, rtol=1e-5)
        assert_close(fast, ref.encode_image(images), atol=1e-5, rtol=1e-5)
        tokens = model.visual.trunk.forward_features(images)  # every token, fast blocks
        plain_tokens = _plain(model, lambda: model.visual.trunk.forward_features(images))
        assert_close(tokens, plain_tokens, atol=1e-5, rtol=1e-5)
        assert torch.equal(model.visual(images), fast)  # one code path for both


# Inductor compiles 3 small graphs (image: 1; text: 2, as the cut at the pooled token is
# data-dependent), most of the time importing and warming up the compiler and its C++
# toolchain: the slowest test here (one layer per tower, one call each: the smallest model
# that runs every compiled path; 62 s with a cold compiler cache at load ~7 on 2 cores, 49 s
# warm at load ~9, where the old one took 264 s)
@pytest.mark.slow
def test_compiled_encoders_equal_eager(h):
    torch.manual_seed(0)
    cfg = h.oc_cfg(vision_cfg={"layers": 1}, text_cfg={"context_length": CTX, "layers": 1})
    model = h.random_fill_(create_model(CLIPConfig.from_open_clip(cfg)))
    images, tokens = torch.randn(2, 3, 32, 32), _prompts(1)[::20]  # 4 prompts, ragged
    with torch.no_grad():  # eager: the fast path
        image, text = model.encode_image(images), model.encode_text(tokens)
    keys = model.state_dict().keys()
    assert model.compile_encoders() is model
    with torch.no_grad():  # compiled: the fast path's oneDNN product as the compiler's op
        assert_close(model.encode_image(images), image, **TOL4)
        assert_close(model.encode_text(tokens), text, **TOL4)
    assert model.state_dict().keys() == keys  # compiled in place


def test_bf16_weights_stay_close_to_fp32(h):
    model, bf16 = _model(h, precision="bf16")
    assert bf16.visual.trunk.blocks[0].attn.qkv.weight.dtype == torch.bfloat16
    images, tokens = torch.randn(4, 3, 32, 32), _prompts(1)
    with torch.no_grad():
        for encode, x in (("encode_image", images), ("encode_text", tokens)):
            ref = getattr(model, encode)(x)
            got = getattr(bf16, encode)(x)
            assert got.dtype == torch.bfloat16
            cos = torch.nn.functional.cosine_similarity(got.float(), ref, dim=-1)
            assert cos.min() >= 0.999, (encode, cos.min())


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize(("L", "window", "g"), [(1024, 128, 0), (1000, 64, 0), (777, 96, 5)])
def test_sliding_window_equals_dense_masked_attention(causal, L, window, g):
    # the benchmark's L=8192 / w=256 / H=8 / D=64, scaled down (and uneven lengths)
    q, k, v = (torch.randn(1, 4, L, 64) for _ in range(3))
    dense = attention(q, k, v, attn_mask=sliding_window_mask(L, window, causal, global_tokens=g))
    out = sliding_window_attention(q, k, v, window, causal=causal, global_tokens=g)
    assert_close(out, dense, atol=1e-5, rtol=1e-5)
