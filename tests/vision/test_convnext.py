"""ConvNeXt: timm parity (Linear and 1x1-conv MLPs, MLP head, norm-first head, eps)."""

from __future__ import annotations

import pytest
import torch
from attn_vision import create_model
from attn_vision.convnext import ConvNeXt, ConvNeXtConfig
from safetensors.torch import load_file

SHRUNK = (1, 1, 2, 1)  # blocks per stage; widths are timm's
CASES = {  # timm name -> our config fields
    "convnext_atto": dict(dims=(40, 80, 160, 320), conv_mlp=True),
    "convnext_tiny": dict(dims=(96, 192, 384, 768)),
    "convnext_tiny_hnf": dict(dims=(96, 192, 384, 768), head_norm_first=True, conv_mlp=True),
    "convnext_large_mlp": dict(dims=(192, 384, 768, 1536), head_hidden_size=1536),
    "convnext_xxlarge": dict(dims=(384, 768, 1536, 3072), norm_eps=1e-5),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_convnext_matches_timm(name, timm_checkpoint, assert_parity):
    ref, path = timm_checkpoint(name, depths=SHRUNK, num_classes=5)
    ours = ConvNeXt(ConvNeXtConfig(depths=SHRUNK, num_classes=5, **CASES[name]), weight_init=False)
    ours.load_state_dict(load_file(str(path)))  # timm's names and shapes, unchanged
    preset = create_model(name, pretrained=path, depths=SHRUNK, num_classes=5)  # the registry
    # the registry builds the table's model with the file's weights: one forward proves both
    assert type(preset) is ConvNeXt and preset.config == ours.config
    preset_sd = preset.state_dict()
    assert preset_sd.keys() == ours.state_dict().keys()
    assert all(torch.equal(preset_sd[k], v) for k, v in ours.state_dict().items())
    assert_parity(ref, preset.eval(), torch.randn(2, 3, 64, 64))


def test_pooled_features_reset_classifier_and_bad_configs(timm_checkpoint):
    ref, path = timm_checkpoint("convnext_atto", depths=SHRUNK, num_classes=5)
    ours = ConvNeXt(ConvNeXtConfig(depths=SHRUNK, num_classes=5, **CASES["convnext_atto"]))
    ours.load_state_dict(load_file(str(path)))
    ours.eval().reset_classifier(0)
    ref.eval().reset_classifier(0)
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), ref(x), atol=1e-4, rtol=1e-4)  # (1, 320) pooled
    assert ours(x).shape == (1, 320)
    with pytest.raises(ValueError, match="4 stages"):
        ConvNeXtConfig(depths=(1, 1, 1))
    with pytest.raises(ValueError, match="image batch"):
        ours(torch.randn(1, 1, 64, 64))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fast_inference_equals_the_plain_modules(dtype):
    """The fast path (oneDNN depthwise conv, fused Linear + GELU) gives the plain forward's
    numbers, runs only without autograd, and fast_inference.disable turns it off."""
    from attn_core import fast_inference

    torch.manual_seed(0)
    model = ConvNeXt(ConvNeXtConfig(depths=SHRUNK, dims=(16, 32, 48, 64), num_classes=3))
    with torch.no_grad():  # LayerScale at 1e-6 would hide the blocks: make them count
        for name, p in model.named_parameters():
            if name.endswith("gamma"):
                p.fill_(0.5)
    model = model.eval().to(dtype)
    x = torch.randn(2, 3, 64, 64, dtype=dtype)
    fast_inference.release_packed_weights()
    with torch.no_grad():
        fast = model(x)
        fused = dtype == torch.float32 or fast_inference._ONEDNN_BF16  # bf16 needs AVX512
        assert (model.stages[0].blocks[0].mlp.fc1.weight in fast_inference._packed) == fused
        plain = fast_inference.disable(model)(x)
    tol = {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 0.05, "rtol": 0.05}
    torch.testing.assert_close(fast.float(), plain.float(), **tol)
    assert not any(getattr(m, "fast_inference", False) for m in model.modules())
