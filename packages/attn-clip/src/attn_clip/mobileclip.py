"""MobileCLIP / MobileCLIP2 image towers (Vasu et al. 2024, 2025) inside a CLIP: timm's
FastViT / MCi trunks and the MCi ViT, as open_clip builds them.

Shape legend: ``B`` batch, ``C`` channels, ``H`` / ``W`` image size, ``D`` the trunk's
feature width, ``E`` joint embedding width.

open_clip's ``MobileCLIP-S1`` / ``-S2`` and ``MobileCLIP2-S0`` ... ``-S4`` name a timm
``fastvit_mci0`` ... ``fastvit_mci4`` tower, ``MobileCLIP-B`` / ``MobileCLIP2-B`` the MCi
ViT ``vit_base_mci_224``, each with ``timm_proj=None``: open_clip builds
``timm.create_model(name, num_classes=embed_dim, global_pool=timm_pool)``, so timm's own
classifier is the projection (a Linear with bias; ``proj_type="head"``):

* a FastViT tower (:attr:`CLIPVisionConfig.fastvit`: attn_vision's ``FastVitConfig``
  fields, :data:`FASTVIT_FIELDS`) is attn_vision's :class:`~attn_vision.fastvit.FastVit`
  whose ``head`` (average pool, ``fc`` to ``E``) ends the tower: ``(B, 3, H, W)`` ->
  ``(B, E)``; the ``D = cls_ratio * embed_dims[-1]`` pooled features are the tower's width;
* the MCi ViT (:attr:`CLIPVisionConfig.mci`: the conv stem's fields, :data:`MCI_FIELDS`) is
  a ``"vit"`` tower whose trunk is attn_vision's
  :class:`~attn_vision.vit_mci.MciVisionTransformer` (the 4-2-2 conv stem, a class token,
  no position embedding on it), pooled at the class token, then timm's ``head``.

Inference: :func:`reparameterize` (``model.visual.reparameterize()``, the one switch) folds,
in place, every multi-branch MobileOne block, BatchNorm and layer scale of a FastViT trunk
(:meth:`attn_vision.fastvit.FastVit.reparameterize`; the MCi ViT: its stem's BatchNorms)
and records it in the tower's config (``inference_mode=True`` in ``fastvit`` / ``mci``, the
same object as the model's ``config.vision``), so ``save_pretrained`` writes it
(``timm_model_args: {"inference_mode": true}``) and the folder loads back folded. The fused
model gives the unfused outputs to float rounding and runs on the oneDNN fast path (its
convolutions through :func:`attn_core.fast_inference.conv_bn_act`). Checkpoints:
:func:`convert_trunk` reads open_clip's (timm's unfolded layout) into an unfolded tower and
timm's ``reparameterize_model`` layout or ours into a folded one.

Nothing here imports open_clip or timm.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from attn_core.hub import CheckpointError
from attn_vision.convert import convert_timm_fastvit
from attn_vision.fastvit import FastVit, FastVitConfig
from attn_vision.vit_mci import MciVisionTransformer, MciViTConfig
from torch import nn

__all__ = [
    "FASTVIT_FIELDS",
    "MCI_FIELDS",
    "MciVisionTransformer",
    "check_vision_config",
    "convert_trunk",
    "fastvit_config",
    "fastvit_trunk",
    "is_folded",
    "mci_vit_config",
    "reparameterize",
]

# attn_vision FastVitConfig fields that make up a FastViT tower's architecture (not the
# head, which the CLIP config sets: average pool, fc to embed_dim; not dropout rates)
FASTVIT_FIELDS = (
    "layers", "embed_dims", "mlp_ratios", "token_mixers", "downsamples", "se_downsamples",
    "pos_embs", "repmixer_kernel_size", "down_patch_size", "down_stride",
    "layer_scale_init_value", "lkc_use_act", "stem_use_scale_branch", "norm_layer", "norm_eps",
    "cls_ratio", "inference_mode",
)  # fmt: skip
# the MCi ViT's fields beyond a CLIP ViT's (attn_vision MciViTConfig), with their defaults
MCI_FIELDS: dict[str, Any] = {
    "stem_width": 192,  # channels of the conv stem's first two convs
    "inference_mode": False,  # the stem's BatchNorms folded into its convs
}
FASTVIT_PROJ_TYPES = ("head", "none")  # timm's fc to embed_dim, or the pooled features


def _check_keys(d: Mapping[str, Any], names, what: str) -> None:
    unknown = sorted(set(d) - set(names))
    if unknown:
        raise ValueError(f"unknown {what} field(s): {', '.join(unknown)}; "
                         f"expected some of {list(names)}")  # fmt: skip


def _fastvit_fields(d: Mapping[str, Any]) -> dict[str, Any]:
    """A FastViT tower's fields, complete (attn_vision's defaults) and checked."""
    _check_keys(d, FASTVIT_FIELDS, "FastViT")
    c = FastVitConfig(**d, num_classes=0)  # (ValueError on inconsistent stages)
    return {k: getattr(c, k) for k in FASTVIT_FIELDS}


def _mci_fields(d: Mapping[str, Any]) -> dict[str, Any]:
    """The MCi ViT stem's fields, complete (:data:`MCI_FIELDS`' defaults) and checked."""
    _check_keys(d, MCI_FIELDS, "MCi ViT")
    out = {**MCI_FIELDS, **d}
    if not isinstance(out["stem_width"], int) or out["stem_width"] < 1:
        raise ValueError(f"MCi ViT stem_width must be a positive int, got {out['stem_width']!r}")
    out["inference_mode"] = bool(out["inference_mode"])
    return out


def check_vision_config(v: Any) -> None:
    """Complete and check the ``fastvit`` / ``mci`` fields of a ``CLIPVisionConfig``, in
    place (its ``__post_init__`` calls this): a FastViT tower's width is set to its pooled
    features'. ``ValueError`` naming what does not fit."""
    if v.fastvit is not None and v.mci is not None:
        raise ValueError("a tower is a FastViT (fastvit=) or an MCi ViT (mci=), not both")
    others = [k for k in ("convnext", "swin", "eva", "vitamin") if getattr(v, k) is not None]
    if others or isinstance(v.layers, tuple) or v.attentional_pool:
        what = others or ["attentional_pool" if v.attentional_pool else "ResNet layers"]
        raise ValueError(f"fastvit= / mci= describe a MobileCLIP tower, not one with "
                         f"{', '.join(what)}")  # fmt: skip
    if not v.timm_model_name:
        raise ValueError("fastvit= / mci= describe a timm tower: they need a timm_model_name")
    if v.mci is not None:
        v.mci = _mci_fields(v.mci)
        if v.patch_size != 16 or v.patch_bias or v.proj_type not in ("head", "none", "linear"):
            raise ValueError(
                f"an MCi ViT tower has patch_size 16 (its stem's stride), no patch_bias and "
                f"proj_type 'head', 'none' or 'linear', got {v.patch_size}, {v.patch_bias}, "
                f"{v.proj_type!r}"
            )
        return
    v.fastvit = _fastvit_fields(v.fastvit)
    v.width = FastVitConfig(**v.fastvit).num_features  # what the head pools and projects
    if v.pool_type != "avg" or v.proj_type not in FASTVIT_PROJ_TYPES:
        raise ValueError(
            f"a FastViT tower is average pooled into timm's head: pool_type 'avg' and "
            f"proj_type one of {FASTVIT_PROJ_TYPES}, got {v.pool_type!r}, {v.proj_type!r}"
        )


def fastvit_config(v: Any, embed_dim: int) -> FastVitConfig:
    """The attn_vision ``FastVitConfig`` of FastViT tower ``v``: average pooled, its ``fc``
    to ``embed_dim`` (``proj_type="head"``) or none (``"none"``)."""
    num_classes = embed_dim if v.proj_type == "head" else 0
    return FastVitConfig(**v.fastvit, num_classes=num_classes, global_pool="avg")


def fastvit_trunk(v: Any, embed_dim: int, weight_init: bool = True) -> FastVit:
    """The trunk of FastViT tower ``v``: ``(B, 3, H, W)`` -> ``(B, E)`` (with ``"none"``:
    ``(B, D)``)."""
    return FastVit(fastvit_config(v, embed_dim), weight_init=weight_init)


def mci_vit_config(common: dict[str, Any], mci: Mapping[str, Any]) -> MciViTConfig:
    """The attn_vision ``MciViTConfig`` of an MCi ViT tower: ``common`` (the ViT fields
    :func:`attn_clip.vision.vit_config` sets) and the stem's fields ``mci``."""
    return MciViTConfig(**common, no_embed_class=True, **mci)


def is_folded(v: Any) -> bool:
    """True when MobileCLIP tower config ``v`` is the folded (reparameterized) layout."""
    fields = v.fastvit if v.fastvit is not None else v.mci
    return bool(fields and fields["inference_mode"])


@torch.no_grad()
def reparameterize(tower: nn.Module) -> bool:
    """Fold a MobileCLIP image tower (an ``attn_clip.vision.CLIPVisionTower``) for
    inference, in place (see the module docstring); its config (the model's
    ``config.vision``) records ``inference_mode=True``. Returns whether there was anything
    to fold: False for an already folded tower and for every other kind of tower."""
    v = tower.config
    if (v.fastvit is None and v.mci is None) or is_folded(v):
        return False
    tower.trunk.reparameterize()  # (FastVit / MciVisionTransformer: sets its own config)
    if v.fastvit is not None:
        v.fastvit = {**v.fastvit, "inference_mode": True}
    else:
        v.mci = {**v.mci, "inference_mode": True}
    return True


def convert_trunk(sd: Mapping[str, torch.Tensor], v: Any, embed_dim: int) -> dict:
    """An attn_clip-named state dict whose ``visual.trunk.*`` keys a FastViT tower ``v``
    loads: timm's unfolded layout (open_clip's checkpoints) into an unfolded tower, timm's
    ``reparameterize_model`` layout (folded the rest of the way by
    :func:`attn_vision.convert.convert_timm_fastvit`) or ours into a folded one. A layout
    that is not the tower's is a ``CheckpointError`` naming the fix. Other towers: ``sd``
    unchanged."""
    if v.fastvit is None:
        return dict(sd)
    prefix = "visual.trunk."
    trunk = {k[len(prefix) :]: t for k, t in sd.items() if k.startswith(prefix)}
    rest = {k: t for k, t in sd.items() if not k.startswith(prefix)}
    folded = any(".reparam_conv." in k for k in trunk)
    if folded != v.fastvit["inference_mode"]:
        fix = (
            "build the model with vision={'fastvit': {'inference_mode': True}}"
            if folded
            else "load it into an unfolded model, then call model.visual.reparameterize()"
        )
        layout = "reparameterized (reparam_conv)" if folded else "multi-branch (unfolded)"
        raise CheckpointError(f"the FastViT image tower's checkpoint is {layout}, the model's "
                              f"tower is {'folded' if v.fastvit['inference_mode'] else 'not'}"
                              f": {fix}")  # fmt: skip
    trunk = convert_timm_fastvit(trunk, fastvit_config(v, embed_dim))
    return {**rest, **{prefix + k: t for k, t in trunk.items()}}
