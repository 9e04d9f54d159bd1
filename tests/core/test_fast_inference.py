"""attn_core.fast_inference gives the numbers of the plain blocks (fused vs eager), runs only
where it applies, re-packs weights when they change, registers nothing at import, and one
call switches a whole model (every module with a ``fast_inference`` flag)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from attn_core import RotaryEmbedding, TransformerBlock, fast_inference, onednn
from attn_core.fast_inference import (
    block_supported,
    conv_bn_act,
    fast_path_available,
    patchify,
    release_packed_weights,
    run_blocks,
    run_causal_pooled,
)
from torch import nn
from torch.testing import assert_close

TOL = {"atol": 1e-5, "rtol": 1e-5}
D, HEADS = 64, 4


def _blocks(depth: int = 3, **kwargs) -> nn.ModuleList:
    torch.manual_seed(0)
    blocks = nn.ModuleList(TransformerBlock(D, HEADS, **kwargs) for _ in range(depth)).eval()
    with torch.no_grad():  # non-trivial biases, norms and layer scales
        for p in blocks.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return blocks


def _plain(blocks, x, **kwargs) -> torch.Tensor:
    with torch.no_grad():
        for blk in blocks:
            x = blk(x, **kwargs)
    return x


def _fast(blocks, x, **kwargs) -> torch.Tensor:
    """run_blocks, checking that the fused kernels did run (they pack every weight)."""
    release_packed_weights()
    with torch.inference_mode():
        out = run_blocks(blocks, x, **kwargs)
    assert len(onednn._packed) == 4 * len(blocks)
    return out


@pytest.mark.parametrize("act", ["gelu", "gelu_tanh", "quick_gelu", "relu", "silu"])
@pytest.mark.parametrize("layer_scale", [None, 0.1])
@pytest.mark.parametrize("is_causal", [False, True])
def test_fused_blocks_equal_eager(act, layer_scale, is_causal):
    blocks = _blocks(act=act, layer_scale=layer_scale)
    assert all(block_supported(b) for b in blocks)
    x = torch.randn(3, 11, D)
    assert_close(
        _fast(blocks, x, is_causal=is_causal), _plain(blocks, x, is_causal=is_causal), **TOL
    )


def test_masks_and_pooled_rows():
    blocks = _blocks()
    x = torch.randn(3, 9, D)
    may = torch.rand(3, 1, 9, 9) > 0.4
    may |= torch.eye(9, dtype=torch.bool)  # every query sees at least itself
    additive = torch.randn(9, 9)  # a broadcast float mask
    rows = torch.tensor([0, 8, 4])
    for kwargs in ({"attn_mask": may}, {"attn_mask": additive}, {"is_causal": True}, {}):
        full = _plain(blocks, x, **kwargs)
        assert_close(_fast(blocks, x, **kwargs), full, **TOL)
        picked = _fast(blocks, x, rows=rows, **kwargs)  # only one row in the last block
        assert picked.shape == (3, 1, D)
        assert_close(picked[:, 0], full[torch.arange(3), rows], **TOL)


BF16 = pytest.mark.skipif(
    not onednn._ONEDNN_BF16,
    reason="this CPU has no oneDNN bf16 kernels (AVX512 BW/VL/DQ or AVX-NE-CONVERT)",
)


@BF16
def test_bf16_stays_close_to_fp32():
    blocks = _blocks(act="quick_gelu")
    x = torch.randn(2, 50, D)
    ref = _plain(blocks, x, is_causal=True)
    out = _fast(blocks.to(torch.bfloat16), x.bfloat16(), is_causal=True)
    assert out.dtype == torch.bfloat16
    cos = torch.nn.functional.cosine_similarity(out.float(), ref, dim=-1)
    assert cos.min() >= 0.999, cos.min()


def test_bf16_without_onednn_bf16_kernels_runs_the_modules(monkeypatch):
    """On an AVX2-only CPU oneDNN's bf16 weight reorder raises; bf16 then takes the modules."""
    monkeypatch.setattr(onednn, "_ONEDNN_BF16", False)
    blocks = _blocks(depth=2).to(torch.bfloat16)
    x = torch.randn(2, 9, D, dtype=torch.bfloat16)
    release_packed_weights()
    with torch.inference_mode():
        assert not fast_path_available(x) and fast_path_available(x.float())
        out = run_blocks(blocks, x)
    assert not onednn._packed
    assert_close(out, _plain(blocks, x), atol=0, rtol=0)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"norm_first": False},  # post-norm
        {"act": "swiglu"},  # gated MLP
        {"rope": RotaryEmbedding(D // HEADS)},
        {"num_kv_heads": 2, "qk_norm": True},  # supported: GQA and QK-norm run fused
    ],
)
def test_other_blocks_fall_back_or_run_fused(kwargs):
    blocks = _blocks(**kwargs)
    x = torch.randn(2, 7, D)
    with torch.inference_mode():
        out = run_blocks(blocks, x, is_causal=True, rows=torch.tensor([6, 3]))
    full = _plain(blocks, x, is_causal=True)
    assert_close(out[:, 0], full[torch.arange(2), torch.tensor([6, 3])], **TOL)
    assert all(block_supported(b) for b in blocks) == ("num_kv_heads" in kwargs)


def test_runs_only_where_it_applies():
    x = torch.randn(2, 5, D)
    with torch.no_grad():
        assert fast_path_available(x)
        assert not fast_path_available(x.half())
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert not fast_path_available(x)
    assert not fast_path_available(x)  # autograd on
    blocks = _blocks(depth=1).train()
    assert not block_supported(blocks[0])  # training mode: dropout and drop path apply
    release_packed_weights()
    out = run_blocks(blocks, x)  # with autograd: the plain blocks, differentiable
    out.sum().backward()
    assert len(onednn._packed) == 0
    assert all(p.grad is not None for p in blocks.parameters())


def test_packed_weights_follow_weight_changes():
    blocks = _blocks(depth=2)
    x = torch.randn(2, 6, D)
    fast = _fast(blocks, x)

    other = _blocks(depth=2)
    with torch.no_grad():
        for p in other.parameters():
            p.mul_(-1.5)
    blocks.load_state_dict(other.state_dict())  # copy_ into the same parameters
    with torch.inference_mode():
        after_load = run_blocks(blocks, x)
    assert not torch.allclose(after_load, fast)
    assert_close(after_load, _plain(blocks, x), **TOL)

    optimizers = (
        lambda ps: torch.optim.SGD(ps, lr=0.01),
        lambda ps: torch.optim.AdamW(ps, lr=0.01),  # foreach
        lambda ps: torch.optim.Adam(ps, lr=0.01, fused=True),  # no version-counter bump
    )
    for make in optimizers:
        optimizer = make(blocks.parameters())
        blocks.train()
        run_blocks(blocks, x).square().mean().backward()  # autograd: the plain blocks
        optimizer.step()
        optimizer.zero_grad()
        blocks.eval()
        with torch.inference_mode():
            assert_close(run_blocks(blocks, x), _plain(blocks, x), **TOL)

    with torch.inference_mode():  # in-place writes inside inference mode count too
        blocks[0].mlp.fc1.weight.mul_(2.0)
        assert_close(run_blocks(blocks, x), _plain(blocks, x), **TOL)

    blocks.to(torch.bfloat16)  # new storage and dtype
    with torch.inference_mode():
        out = run_blocks(blocks, x.bfloat16())
    ref = _plain(blocks, x.bfloat16()).float()
    assert torch.nn.functional.cosine_similarity(out.float(), ref, dim=-1).min() >= 0.999

    release_packed_weights(blocks)
    assert not any(p in onednn._packed for p in blocks.parameters())


def _prompts() -> tuple[torch.Tensor, torch.Tensor]:
    """(B, L) ids with shared prefixes and ragged lengths, and each row's last position."""
    g = torch.Generator().manual_seed(0)
    heads = [[5, 6, 7, 8], [5, 6, 9], [11, 12, 13, 14, 15]]
    rows = [heads[i % 3] + torch.randint(20, 90, (i % 5,), generator=g).tolist() + [99]
            for i in range(24)]  # fmt: skip
    L = max(map(len, rows)) + 3
    tokens = torch.tensor([r + [0] * (L - len(r)) for r in rows])
    return tokens, torch.tensor([len(r) - 1 for r in rows])


def test_causal_pooled_equals_the_full_causal_run():
    blocks = _blocks(act="quick_gelu", layer_scale=0.5)
    vocab, pos = torch.randn(100, D), torch.randn(32, D)

    def embed(ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return vocab[ids] + pos[positions]

    tokens, pooled = _prompts()
    seqs = [r[: n + 1] for r, n in zip(tokens.tolist(), pooled.tolist(), strict=True)]
    assert fast_inference._shared_prefixes(seqs) is not None  # the prefix cache is exercised
    L = tokens.shape[1]
    full = _plain(blocks, embed(tokens, torch.arange(L).expand_as(tokens)), is_causal=True)
    ref = full[torch.arange(len(tokens)), pooled]
    with torch.inference_mode():
        assert_close(run_causal_pooled(blocks, tokens, pooled, embed), ref, **TOL)
    with torch.no_grad():  # unsupported blocks: one batch cut after the last pooled token
        blocks[1].norm_first = False
        full = _plain(blocks, embed(tokens, torch.arange(L).expand_as(tokens)), is_causal=True)
        out = run_causal_pooled(blocks, tokens, pooled, embed)
    assert_close(out, full[torch.arange(len(tokens)), pooled], **TOL)


@pytest.mark.parametrize("bias", [False, True])
def test_patch_embed_equals_the_convolution(bias):
    conv = nn.Conv2d(3, D, 8, stride=8, bias=bias)
    x = torch.randn(2, 3, 32, 24)
    with torch.inference_mode():
        ref = conv(x).permute(0, 2, 3, 1)  # (B, gh, gw, D)
        release_packed_weights()
        assert_close(patchify(conv, x), ref, **TOL)
        assert conv.weight in onednn._packed
        overlapping = nn.Conv2d(3, D, 8, stride=4)  # not a patch embedding: the conv itself
        assert_close(patchify(overlapping, x), overlapping(x).permute(0, 2, 3, 1))


def _conv_bn(cin=8, cout=16, k=3, stride=1, groups=1, bias=False):
    torch.manual_seed(0)
    conv = nn.Conv2d(cin, cout, k, stride=stride, padding=k // 2, groups=groups, bias=bias)
    bn = nn.BatchNorm2d(cout).eval()
    with torch.no_grad():  # statistics and affine far from the identity
        bn.running_mean.normal_(0, 0.5), bn.running_var.uniform_(0.2, 3.0)
        bn.weight.uniform_(0.5, 1.5), bn.bias.normal_(0, 0.2)
    return conv, bn


@pytest.mark.parametrize(
    "case",
    [
        dict(k=3, act=nn.ReLU()),
        dict(k=1, stride=2, act=None),
        dict(k=3, bias=True, act=nn.GELU()),
        dict(k=7, cin=16, groups=16, act=None, bn=False),  # a depthwise conv with bias, no BN
        dict(k=1, act=nn.ReLU(inplace=True), residual=True),
    ],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_conv_bn_act_equals_the_modules(case, dtype):
    case = dict(case)
    act, residual, use_bn = case.pop("act"), case.pop("residual", False), case.pop("bn", True)
    conv, bn = _conv_bn(**case)
    conv, bn = conv.to(dtype), bn.to(dtype)
    bn = bn if use_bn else None
    x = torch.randn(2, conv.in_channels, 15, 13, dtype=dtype)
    with torch.no_grad():
        y = conv(x) if bn is None else bn(conv(x))
        r = torch.randn_like(y) if residual else None
        ref = y + r if residual else y
        ref = ref if act is None else act(ref.clone())
        release_packed_weights()
        out = conv_bn_act(conv, bn, x, act, residual=r)
        fast = fast_path_available(x)
    assert fast == (conv.weight in onednn._folded)
    tol = TOL if dtype == torch.float32 else {"atol": 0.05, "rtol": 0.02}
    assert_close(out.float(), ref.float(), **tol)
    if fast:
        assert out.is_contiguous(memory_format=torch.channels_last)


def test_conv_bn_act_on_inference_tensors_folds_without_a_cache():
    with torch.inference_mode():  # weights made here have no version counter
        conv, bn = _conv_bn()
        conv, bn = conv.to(torch.bfloat16), bn.to(torch.bfloat16)
        x = torch.randn(1, 8, 9, 9, dtype=torch.bfloat16)
        release_packed_weights()
        out = conv_bn_act(conv, bn, x, nn.ReLU())
        assert conv.weight not in onednn._folded
        assert_close(out.float(), torch.relu(bn(conv(x))).float(), atol=0.05, rtol=0.02)


def test_conv_bn_act_refolds_when_weights_or_statistics_change():
    conv, bn = _conv_bn()
    x = torch.randn(1, 8, 9, 9)
    with torch.no_grad():
        before = conv_bn_act(conv, bn, x)
        bn.running_var.mul_(4.0)  # as a train-mode forward or load_state_dict would
        assert_close(conv_bn_act(conv, bn, x), bn(conv(x)), **TOL)
        conv.weight.add_(1.0)
        assert_close(conv_bn_act(conv, bn, x), bn(conv(x)), **TOL)
        assert not torch.allclose(before, conv_bn_act(conv, bn, x))
    bn.train()  # training: batch statistics, through the modules (and autograd)
    x.requires_grad_(True)
    out = conv_bn_act(conv, bn, x, nn.ReLU())
    assert_close(out, torch.relu(bn(conv(x))))
    out.sum().backward()
    assert x.grad is not None
    bn.eval()
    with torch.no_grad():  # disabled: the modules
        assert_close(conv_bn_act(conv, bn, x, enabled=False), bn(conv(x)))


def test_importing_the_models_registers_nothing_with_torch():
    code = (
        "import torch, attn_core, attn_vision, attn_clip\n"
        "from attn_core import onednn\n"
        "x = torch.randn(1, 3, 32, 32)\n"
        "with torch.no_grad(): attn_vision.create_model('vit_tiny_patch16_224', img_size=32,"
        " num_classes=0).eval()(x)\n"
        "for ns in ('attn_core', 'attn_vision'):\n"
        "    try:\n"
        "        getattr(getattr(torch.ops, ns), 'onednn_linear')\n"
        "        print('registered', ns)\n"
        "    except (AttributeError, RuntimeError):\n"
        "        pass\n"
        "print(onednn._compile_op_registered)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "False", out.stdout


class _Tower(nn.Module):
    """A model with fast-path flags at two depths (as a CLIP with its towers)."""

    fast_inference = True

    def __init__(self) -> None:
        super().__init__()
        self.blocks = _blocks(depth=2)
        self.inner = nn.Sequential(nn.Linear(D, D))
        self.inner.fast_inference = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fast_inference and fast_path_available(x):
            return run_blocks(self.blocks, x)
        return _plain(self.blocks, x)


def test_one_switch_for_a_whole_model():
    model = _Tower().eval()
    flags = lambda: (model.fast_inference, model.inner.fast_inference)  # noqa: E731
    x = torch.randn(2, 5, D)
    release_packed_weights()
    with torch.no_grad():
        fast = model(x)
    assert fast_inference.is_enabled(model) and len(onednn._packed) == 8
    assert fast_inference.disable(model) is model and flags() == (False, False)
    assert not onednn._packed and not fast_inference.is_enabled(model)  # freed
    with torch.no_grad():
        assert_close(model(x), fast, **TOL)
    assert not onednn._packed  # the plain modules ran
    assert fast_inference.enable(model) is model and flags() == (True, True)
    model.inner.fast_inference = False
    with fast_inference.disabled(model) as plain:
        assert plain is model and flags() == (False, False)
    assert flags() == (True, False)  # each flag restored
    assert fast_inference.enable(model, on=False) is model and flags() == (False, False)
    assert fast_inference.enable(nn.Linear(2, 2)) is not None  # nothing to switch: no-op
    with pytest.raises(ValueError, match="expected an nn.Module"):
        fast_inference.disable("model")
