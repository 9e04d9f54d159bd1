"""Initialisation for training a CLIP (or CoCa) from scratch."""

from __future__ import annotations

import os

import torch
from torch import nn

__all__ = ["init_image_trunk_from", "init_vision_like_open_clip"]


@torch.no_grad()
def init_vision_like_open_clip(model: nn.Module) -> None:
    """Re-initialise the image tower of a :class:`attn_clip.CLIP` in place the way open_clip
    initialises its text tower (and class / position embeddings): ``std = width ** -0.5``
    for the class / position embeddings and the qkv weights, ``(2 * width) ** -0.5`` for
    the first MLP layer, and depth-scaled output projections.

    The ViT trunk comes with timm's init (class token ~0, weights ``std=0.02``), meant for
    wide classifiers; in a narrow CLIP tower it makes every image embed almost identically
    at the start (cosine ~0.9999) and the contrastive loss sits at ``ln(batch)`` for a long
    time before it starts to fall.
    """
    if model.config.vision.tower != "vit":
        raise ValueError(
            f"init_vision_like_open_clip re-initialises a ViT image tower; this one is a "
            f"{model.config.vision.tower} (open_clip initialises those as timm / OpenAI do)"
        )
    trunk, width = model.visual.trunk, model.config.vision.width
    layers = model.config.vision.layers
    attn_std, fc_std = width**-0.5, (2 * width) ** -0.5
    proj_std = attn_std * (2 * layers) ** -0.5
    if trunk.cls_token is not None:  # SigLIP-style towers have none
        nn.init.normal_(trunk.cls_token, std=attn_std)
    nn.init.normal_(trunk.pos_embed, std=attn_std)
    for blk in trunk.blocks:
        nn.init.normal_(blk.attn.qkv.weight, std=attn_std)
        nn.init.normal_(blk.attn.proj.weight, std=proj_std)
        nn.init.normal_(blk.mlp.fc1.weight, std=fc_std)
        nn.init.normal_(blk.mlp.fc2.weight, std=proj_std)


@torch.no_grad()
def init_image_trunk_from(model: nn.Module, source: nn.Module | str) -> list[str]:
    """Copy the image tower's trunk (``visual.trunk.*``: patch and position embeddings,
    class token, blocks, norms) of ``source`` into ``model`` in place; returns the names
    copied. ``source``: a model, or what :func:`attn_clip.create_model` loads (a folder, an
    ``hf-hub:`` / ``local-dir:`` name, or a name with its default weights: ``demo-shapes``).

    Meant for a CoCa started from a trained CLIP of the same ViT (the bundled
    ``demo-shapes``): what the trunk feeds (CoCa's attentional pooler, the projections)
    keeps its own init. Every trunk tensor of ``model`` must be in ``source`` with the
    same shape (a ``ValueError`` names those that are not); ``source``'s others are ignored.
    """
    if isinstance(source, str):
        from .factory import create_model

        local = os.path.isdir(source) or source.startswith(("hf-hub:", "local-dir:"))
        source = create_model(source, pretrained=None if local else True)
    ours = {k: v for k, v in model.state_dict().items() if k.startswith("visual.trunk.")}
    theirs = source.state_dict()
    if not ours:
        raise ValueError("init_image_trunk_from: the model has no visual.trunk (a ViT tower)")
    bad = [
        f"{k} {tuple(v.shape)}" + (f" vs {tuple(theirs[k].shape)}" if k in theirs else " (missing)")
        for k, v in ours.items()
        if k not in theirs or theirs[k].shape != v.shape
    ]
    if bad:
        raise ValueError(f"init_image_trunk_from: the image trunks differ: {', '.join(bad[:4])}")
    for k, v in ours.items():
        v.copy_(theirs[k])
    return list(ours)
