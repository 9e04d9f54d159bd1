"""Fixtures for attn_vision tests: random-init timm models saved in their real on-disk format."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import timm
import torch
from safetensors.torch import save_file
from torch import nn

TOL = dict(atol=1e-4, rtol=1e-4)


@torch.no_grad()
def randomize_(model: nn.Module, reinit: bool) -> nn.Module:
    """Give every parameter and BN statistic random, non-default values.

    Norm weights stop being all-ones and biases all-zeros, so a converter that swapped,
    dropped or mis-shaped any tensor changes the outputs. ``reinit=True`` draws every
    tensor afresh (for timm models built with ``weight_init="skip"``, whose embeddings
    are uninitialised memory); otherwise the existing init is perturbed.
    """
    for name, p in model.named_parameters():
        if not reinit:
            p.add_(torch.randn_like(p) * 0.02)
        elif p.ndim >= 2:
            p.normal_(0.0, 0.02)
        elif name.endswith("weight"):
            p.normal_(1.0, 0.1)
        else:
            p.normal_(0.0, 0.05)
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.running_mean.copy_(torch.randn_like(m.running_mean) * 0.1)
            m.running_var.copy_(torch.rand_like(m.running_var) + 0.5)
    return model


@pytest.fixture
def timm_checkpoint(tmp_path: Path) -> Callable[..., tuple[nn.Module, Path]]:
    """``make(name, **kwargs) -> (timm_model.eval(), path)``: random timm model + its safetensors.

    ViT, DeiT and Swin skip timm's (slow, truncated-normal) init and are drawn by ``randomize_``.
    """

    def make(name: str, **kwargs) -> tuple[nn.Module, Path]:
        # (timm's Eva, e.g. vit_pe_core_*, takes no weight_init)
        eva = timm.models.model_entrypoint(name).__module__.endswith(".eva")
        skip = name.startswith(("vit_", "deit", "swin_")) and not eva
        if skip:
            kwargs.setdefault("weight_init", "skip")
        model = timm.create_model(name, pretrained=False, **kwargs)
        model = randomize_(model, reinit=skip).eval()
        path = tmp_path / f"{name}.safetensors"
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
        return model, path

    return make


@pytest.fixture
def assert_parity() -> Callable[[nn.Module, nn.Module, torch.Tensor], None]:
    """``check(reference, ours, x)``: same ``forward_features``, ``forward_head`` and
    ``forward`` outputs (fp32, 1e-4)."""

    @torch.no_grad()
    def check(reference: nn.Module, ours: nn.Module, x: torch.Tensor) -> None:
        ref_feats = reference.forward_features(x)
        our_feats = ours.forward_features(x)
        torch.testing.assert_close(our_feats, ref_feats, **TOL)
        torch.testing.assert_close(
            ours.forward_head(our_feats), reference.forward_head(ref_feats), **TOL
        )
        torch.testing.assert_close(ours(x), reference(x), **TOL)

    return check


@pytest.fixture
def randomize() -> Callable[..., nn.Module]:
    """The ``randomize_(module, reinit)`` helper, for tests that build modules themselves."""
    return randomize_
