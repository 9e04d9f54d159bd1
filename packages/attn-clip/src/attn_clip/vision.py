"""CLIP vision tower: a ``trunk`` (attn_vision's ViT or ConvNeXt, or OpenAI's
ModifiedResNet) and the projection to the joint embedding space.

Shape legend: ``B`` batch, ``C`` channels, ``H`` / ``W`` image size, ``N`` tokens
(class token + patches), ``D`` width, ``E`` joint embedding width.

CLIP's ViT is timm's ``vit_*_clip_*``: a patch embedding without bias, class token,
``ln_pre`` (timm ``norm_pre``) before the blocks, ``ln_post`` (timm ``norm``, or
``fc_norm`` when it runs after pooling) and a linear projection without bias.

SigLIP's is timm's ``vit_*_siglip_*`` (open_clip builds it with timm): no class token, a
patch embedding with bias, no ``norm_pre``, ``norm`` on every token, then the MAP head
(``trunk.attn_pool``: a learned latent query attending over the tokens, then LayerNorm +
MLP) whose output is the embedding itself (no projection).

EVA-01 / EVA02-CLIP's is timm's ``Eva`` (``eva_giant_patch14_224``,
``eva02_base_patch16_clip_224``, ...): the same ViT with a patch bias and no ``norm_pre``;
EVA02 adds a 2D axial RoPE on the patch tokens (positions scaled onto a 16 x 16 reference
grid), a SwiGLU MLP with a LayerNorm before ``fc2`` and a LayerNorm before the attention
output projection. open_clip builds it with ``num_classes=embed_dim``: the projection is
the trunk's classifier ``trunk.head`` (a Linear with bias, ``proj_type="head"``).

A ViTamin tower (``vitamin_*``) is attn_vision's :class:`~attn_vision.vitamin.Vitamin`, a
ViT whose patch embedding is a conv stem and whose MLPs are GeGLU, average pooled, with
``fc_norm``; open_clip's ``timm_proj="linear"`` head (``visual.head.proj``, no bias) is the
tower's ``proj``.

A ConvNeXt tower is open_clip's ``TimmModel``: timm's ConvNeXt with its classifier removed
(``trunk``: average pool + LayerNorm kept, ``(B, D)``), then ``head.proj`` (a Linear) or
``head.mlp`` (``fc1`` -> GELU -> ``fc2``, ``2 E`` wide) -- open_clip's names. A Swin tower
(``swin_base_patch4_window7_224``) is the same with attn_vision's Swin Transformer as the
trunk (its final LayerNorm'd ``(B, H / 32, W / 32, D)`` map average pooled). A ResNet tower
is OpenAI's ModifiedResNet (:mod:`attn_clip.modified_resnet`), whose attention pool ends in
the projection (``trunk.attnpool.c_proj``).

A MobileCLIP tower (``fastvit_mci*``, ``vit_base_mci_224``) is attn_vision's FastViT / MCi
ViT whose timm classifier ``trunk.head`` is the projection (:mod:`attn_clip.mobileclip`;
``reparameterize()`` folds it for inference).

A CoCa tower (``attentional_pool=True``) is open_clip's ViT whose last block's tokens (no
``ln_post`` on them) go through an :class:`AttentionalPooler`: ``Q`` learned queries, each
an ``embed_dim``-wide token; ``ln_post`` then normalises the ``Q`` outputs, query 0 is
pooled and projected, and the other ``Q - 1`` are the image tokens the captioning decoder
reads (:meth:`CLIPVisionTower.forward_tokens`; without the pooler: the normed patch
tokens).
"""

from __future__ import annotations

from collections import OrderedDict

import torch
from attn_core.mha import MultiHeadAttention
from attn_vision.convnext import ConvNeXt, ConvNeXtConfig
from attn_vision.swin import SwinConfig, SwinTransformer
from attn_vision.vit import VisionTransformer, ViTConfig
from attn_vision.vitamin import Vitamin, VitaminConfig
from torch import nn

from . import mobileclip
from .config import CLIPVisionConfig
from .modified_resnet import ModifiedResNet
from .tower_config import EVA_LAYOUT

__all__ = ["AttentionalPooler", "CLIPVisionTower", "vit_config"]


def vit_config(c: CLIPVisionConfig, embed_dim: int = 0) -> ViTConfig:
    """The attn_vision ``ViTConfig`` (a ViTamin's: ``VitaminConfig``) of a CLIP vision
    tower: no classifier head, except timm's ``head`` to ``embed_dim`` as the projection
    (``proj_type="head"``)."""
    common = dict(
        img_size=c.image_size,
        patch_size=c.patch_size,
        num_classes=embed_dim if c.proj_type == "head" else 0,
        global_pool={"tok": "token", "avg": "avg", "map": "map"}[c.pool_type],
        embed_dim=c.width,
        depth=c.layers,
        num_heads=c.heads,
        mlp_ratio=c.mlp_ratio,
        qkv_bias=c.qkv_bias,
        class_token=c.class_token,
        pre_norm=not c.no_ln_pre,
        final_norm=not c.attentional_pool,  # CoCa: ln_post comes after the pooler
        fc_norm=c.final_ln_after_pool,
        norm_eps=c.norm_eps,
        act=c.act,
        init_values=c.ls_init_value,
    )
    if c.mci is not None:  # MobileCLIP-B's MCi ViT: the conv stem's fields
        return mobileclip.mci_vit_config(common, c.mci)
    if c.vitamin is not None:  # the conv stem's fields
        return VitaminConfig(**common, **c.vitamin)
    eva = {k: v for k, v in (c.eva or {}).items() if k not in EVA_LAYOUT}
    if c.rel_pos_dim is not None:  # timm vit_relpos_*: relative positions only
        eva.update(rel_pos="mlp", rel_pos_dim=c.rel_pos_dim, pos_embed="none")
    return ViTConfig(
        **common,
        patch_bias=c.patch_bias,  # CLIP: never (CLIPA too, although it has no ln_pre)
        **eva,  # EVA: rope, rope_ref_grid, attn_inner_norm, mlp_inner_norm, post_norm, ...
    )


class AttentionalPooler(nn.Module):
    """CoCa's pooler (open_clip's ``AttentionalPooler``): ``(B, N, context_dim)`` tokens ->
    ``(B, Q, dim)``; ``Q`` learned queries (``ln_q``) attend over the tokens (``ln_k``)."""

    def __init__(self, dim: int, context_dim: int, num_heads: int = 8, num_queries: int = 256):
        super().__init__()
        self.query = nn.Parameter(torch.randn(num_queries, dim))
        self.attn = MultiHeadAttention(dim, num_heads, kdim=context_dim, vdim=context_dim)
        self.ln_q = nn.LayerNorm(dim)
        self.ln_k = nn.LayerNorm(context_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.ln_k(x)
        q = self.ln_q(self.query).to(x.dtype).expand(x.shape[0], -1, -1)  # (B, Q, dim)
        return self.attn(q, x, x)[0]


class ProjectionMlp(nn.Module):
    """open_clip's ``timm_proj="mlp"`` head (timm's ``Mlp``): ``fc2(gelu(fc1(x)))``."""

    def __init__(self, dim: int, hidden: int, out_dim: int, bias: bool = False) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)  # always biased, as open_clip builds it
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, out_dim, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


def convnext_head(config: CLIPVisionConfig, embed_dim: int) -> nn.Sequential:
    """open_clip's ``TimmModel.head`` over a ConvNeXt's (or Swin's) ``(B, D)`` pooled
    features."""
    if config.proj_type == "mlp":
        layer = ProjectionMlp(config.width, 2 * embed_dim, embed_dim, bias=config.proj_bias)
        return nn.Sequential(OrderedDict(mlp=layer))
    return nn.Sequential(
        OrderedDict(proj=nn.Linear(config.width, embed_dim, bias=config.proj_bias))
    )


def build_trunk(config: CLIPVisionConfig, embed_dim: int, weight_init: bool = True) -> nn.Module:
    """The tower's trunk: attn_vision's ViT (or ViTamin), ConvNeXt or Swin (no classifier),
    or ModifiedResNet."""
    if config.tower == "resnet":
        size = config.image_size
        size = size[0] if isinstance(size, tuple) else size
        return ModifiedResNet(
            config.layers, embed_dim, config.heads, size, config.width, weight_init=weight_init
        )
    if config.tower == "convnext":
        convnext = ConvNeXtConfig(**config.convnext, num_classes=0)
        return ConvNeXt(convnext, weight_init=weight_init)
    if config.tower == "swin":  # (its image size fixed: the shift masks depend on it)
        swin = SwinConfig(**config.swin, img_size=config.image_size, num_classes=0)
        return SwinTransformer(swin, weight_init=weight_init)
    if config.tower == "fastvit":  # MobileCLIP's FastViT / MCi, timm's head its projection
        return mobileclip.fastvit_trunk(config, embed_dim, weight_init)
    vit_cls = Vitamin if config.vitamin is not None else VisionTransformer
    vit_cls = mobileclip.MciVisionTransformer if config.mci is not None else vit_cls
    return vit_cls(vit_config(config, embed_dim), weight_init=weight_init)


class CLIPVisionTower(nn.Module):
    """``(B, C, H, W)`` images -> ``(B, E)`` embeddings (not normalized)."""

    def __init__(self, config: CLIPVisionConfig, embed_dim: int, weight_init: bool = True) -> None:
        super().__init__()
        self.config = config
        self.image_size = config.image_size
        self.trunk = build_trunk(config, embed_dim, weight_init)
        vit = config.tower == "vit"
        pool = config.attentional_pool
        self.attn_pool = (
            AttentionalPooler(
                embed_dim, config.width, config.attn_pooler_heads, config.attn_pooler_queries
            )
            if pool
            else None
        )
        self.ln_post = nn.LayerNorm(embed_dim, eps=config.norm_eps) if pool else None
        self.proj = (
            nn.Linear(embed_dim if pool else config.width, embed_dim, bias=False)
            if vit and config.proj_type == "linear"
            else None
        )  # the ViT's projection (a timm tower's may be trunk.head); a ConvNeXt's is `head`,
        # a ResNet's ends its attention pool
        pooled = config.tower in ("convnext", "swin")  # open_clip's timm_proj head
        self.head = convnext_head(config, embed_dim) if pooled else None
        if weight_init and self.proj is not None:
            nn.init.normal_(self.proj.weight, std=self.proj.in_features**-0.5)

    def reparameterize(self) -> CLIPVisionTower:
        """Fold a MobileCLIP tower for inference, in place (:func:`attn_clip.mobileclip.
        reparameterize`: the multi-branch convolutions, BatchNorms and layer scales; the
        config records it, so ``save_pretrained`` writes the folded tower); a no-op for an
        already folded tower and for every other tower. Returns ``self``."""
        mobileclip.reparameterize(self)
        return self

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        if not hasattr(self.trunk, "set_grad_checkpointing"):
            if enable:
                raise ValueError("gradient checkpointing is not supported by ResNet towers")
            return
        self.trunk.set_grad_checkpointing(enable)

    def prepare(self, images: torch.Tensor) -> torch.Tensor:
        """Images cast to the weights' dtype (a ViT's: cut to whole patches; a ViTamin's
        conv stem takes any size, as open_clip's)."""
        images = images.to(next(self.trunk.parameters()).dtype)
        if images.ndim != 4 or self.config.tower != "vit" or self.config.vitamin is not None:
            return images  # the trunk names what it expected
        p = self.config.patch_size
        H, W = images.shape[-2:]
        return images[..., : H // p * p, : W // p * p]

    def project(self, pooled: torch.Tensor) -> torch.Tensor:
        """``(B, D)`` pooled features -> ``(B, E)`` (SigLIP, ResNet: no projection here)."""
        if self.proj is not None:
            return self.proj(pooled)
        if self.config.proj_type == "head":  # timm's classifier (EVA): Linear with bias
            return self.trunk.head(pooled)
        return self.head(pooled) if self.head is not None else pooled

    def forward_features(self, images: torch.Tensor) -> torch.Tensor:
        """``(B, C, H, W)`` -> a ViT's ``(B, N, D)`` tokens after the last block (and
        ``ln_post``), a ConvNeXt's or ResNet's ``(B, D, H / 32, W / 32)`` feature map, a
        Swin's ``(B, H / 32, W / 32, D)``."""
        return self.trunk.forward_features(self.prepare(images))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """``(B, C, H, W)`` images (cast to the weights' dtype) -> ``(B, E)``.

        Pixels past the last whole patch are dropped, as the patch convolution of open_clip's
        towers does (``ViT-SO400M-14-SigLIP-384``: 384 px, 27 patches of 14 a side).
        """
        images = self.prepare(images)
        if self.attn_pool is not None:
            return self.forward_tokens(images)[0]
        if self.config.tower == "fastvit":
            return self.trunk(images)  # (B, E): timm's head (pool, fc) is the projection
        if self.config.tower != "vit":
            return self.project(self.trunk(images))  # (B, D) pooled -> (B, E)
        # == trunk.forward_head(trunk.forward_features(x), pre_logits=True), but with [CLS]
        # pooling the fast path computes only that row in the last block
        x = self.trunk.forward_pre_logits(images)  # (B, D) pooled (+ ln_post after pool)
        return self.project(x)  # (B, E)

    def forward_tokens(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """CoCa: ``(B, C, H, W)`` -> ``(pooled (B, E), tokens (B, T, W))``: with the
        attentional pool ``T = Q - 1`` pooler outputs ``E`` wide, else the ``N - 1`` patch
        tokens after ``ln_post`` (``W`` = width), as open_clip's ``output_tokens=True``."""
        c = self.config
        if c.tower != "vit" or c.pool_type != "tok" or c.final_ln_after_pool or c.timm_model_name:
            raise ValueError("forward_tokens needs open_clip's own ViT with [CLS] pooling")
        x = self.trunk.forward_features(self.prepare(images))  # (B, N, D)
        if self.attn_pool is not None:
            x = self.ln_post(self.attn_pool(x))  # (B, Q, E)
        return self.project(x[:, 0]), x[:, 1:]
