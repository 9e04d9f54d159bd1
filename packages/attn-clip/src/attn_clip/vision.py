"""CLIP vision tower: attn_vision's ViT (the ``trunk``) + a bias-free projection.

Shape legend: ``B`` batch, ``C`` channels, ``H`` / ``W`` image size, ``N`` tokens
(class token + patches), ``D`` width, ``E`` joint embedding width.

CLIP's ViT is timm's ``vit_*_clip_*``: a patch embedding without bias, class token,
``ln_pre`` (timm ``norm_pre``) before the blocks, ``ln_post`` (timm ``norm``, or
``fc_norm`` when it runs after pooling) and a linear projection without bias.

SigLIP's is timm's ``vit_*_siglip_*`` (open_clip builds it with timm): no class token, a
patch embedding with bias, no ``norm_pre``, ``norm`` on every token, then the MAP head
(``trunk.attn_pool``: a learned latent query attending over the tokens, then LayerNorm +
MLP) whose output is the embedding itself (no projection).
"""

from __future__ import annotations

import torch
from attn_vision.vit import VisionTransformer, ViTConfig
from torch import nn

from .config import CLIPVisionConfig

__all__ = ["CLIPVisionTower", "vit_config"]


def vit_config(c: CLIPVisionConfig) -> ViTConfig:
    """The attn_vision ``ViTConfig`` of a CLIP vision tower (no classifier head)."""
    return ViTConfig(
        img_size=c.image_size,
        patch_size=c.patch_size,
        num_classes=0,
        global_pool={"tok": "token", "avg": "avg", "map": "map"}[c.pool_type],
        embed_dim=c.width,
        depth=c.layers,
        num_heads=c.heads,
        mlp_ratio=c.mlp_ratio,
        qkv_bias=True,
        class_token=c.class_token,
        pre_norm=not c.no_ln_pre,
        patch_bias=c.patch_bias,  # CLIP: never (CLIPA too, although it has no ln_pre)
        final_norm=True,
        fc_norm=c.final_ln_after_pool,
        norm_eps=c.norm_eps,
        act=c.act,
        init_values=c.ls_init_value,
    )


class CLIPVisionTower(nn.Module):
    """``(B, C, H, W)`` images -> ``(B, E)`` embeddings (not normalized)."""

    def __init__(self, config: CLIPVisionConfig, embed_dim: int, weight_init: bool = True) -> None:
        super().__init__()
        self.config = config
        self.image_size = config.image_size
        self.trunk = VisionTransformer(vit_config(config), weight_init=weight_init)
        self.proj = (
            nn.Linear(config.width, embed_dim, bias=False) if config.proj_type == "linear" else None
        )
        if weight_init and self.proj is not None:
            nn.init.normal_(self.proj.weight, std=config.width**-0.5)

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        self.trunk.set_grad_checkpointing(enable)

    def set_fast_inference(self, enable: bool = True) -> CLIPVisionTower:
        """The trunk's inference fast path (:meth:`VisionTransformer.set_fast_inference`)."""
        self.trunk.set_fast_inference(enable)
        return self

    def prepare(self, images: torch.Tensor) -> torch.Tensor:
        """Images cast to the weights' dtype, cut to whole patches."""
        images = images.to(self.trunk.patch_embed.proj.weight.dtype)  # the first layer's
        if images.ndim != 4:
            return images  # the trunk names what it expected
        p = self.config.patch_size
        H, W = images.shape[-2:]
        return images[..., : H // p * p, : W // p * p]

    def project(self, pooled: torch.Tensor) -> torch.Tensor:
        """``(B, D)`` pooled features -> ``(B, E)`` (SigLIP: no projection)."""
        return self.proj(pooled) if self.proj is not None else pooled

    def forward_features(self, images: torch.Tensor) -> torch.Tensor:
        """``(B, C, H, W)`` -> ``(B, N, D)`` tokens after the last block (and ``ln_post``)."""
        return self.trunk.forward_features(self.prepare(images))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """``(B, C, H, W)`` images (cast to the weights' dtype) -> ``(B, E)``.

        Pixels past the last whole patch are dropped, as the patch convolution of open_clip's
        towers does (``ViT-SO400M-14-SigLIP-384``: 384 px, 27 patches of 14 a side).
        """
        images = self.prepare(images)
        # == trunk.forward_head(trunk.forward_features(x), pre_logits=True), but with [CLS]
        # pooling the fast path computes only that row in the last block
        x = self.trunk.forward_pre_logits(images)  # (B, D) pooled (+ ln_post after pool)
        return self.project(x)  # (B, E)
