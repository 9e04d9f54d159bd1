"""MobileCLIP's ViT-B image encoder: timm's ``vit_base_mci_224`` (Vasu et al. 2024,
"MobileCLIP: Fast Image-Text Models through Multi-Modal Reinforced Training").

Shape legend: ``B`` batch, ``C`` channels, ``H`` / ``W`` image size, ``gh = H / 16``,
``gw = W / 16`` token grid, ``D`` token width.

A :class:`~attn_vision.vit.VisionTransformer` whose patch embedding is a small conv stem
(timm's ``ConvStem`` inside a ``HybridEmbed`` without projection):
4x4 stride-4 conv + BatchNorm + GELU, 2x2 stride-2 conv + BatchNorm + GELU, 2x2 stride-2
conv (with bias) to ``D``: one token per 16 x 16 pixels. The rest is the ViT: a class
token, a learned position embedding over the patches only (``no_embed_class``), pre-norm
blocks, class-token pooling, ``head``.

:meth:`MciVisionTransformer.reparameterize` folds the stem's BatchNorms into its convs
(``config.inference_mode``, saved with the model); timm's ``reparameterize_model`` leaves
this model as it is, so its checkpoints are always the unfolded layout, which
:func:`attn_vision.convert.convert_timm_vit_mci` folds when the model is folded. Parameter
names are timm's (``patch_embed.backbone.{0,1}.conv`` / ``.bn``,
``patch_embed.backbone.2.conv``, then the ViT's), so timm checkpoints load unchanged.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import nn

from .mobileone import ConvNorm
from .patch_embed import to_2tuple
from .vit import VisionTransformer, ViTConfig

__all__ = ["ConvStemEmbed", "MciViTConfig", "MciVisionTransformer"]

STRIDE = 16  # the conv stem's total stride (4, 2, 2)


@dataclass
class MciViTConfig(ViTConfig):
    """Architecture of a :class:`MciVisionTransformer`: the :class:`ViTConfig` fields
    (defaults: ``vit_base_mci_224``) plus the conv stem's. ``patch_size`` is the stem's
    total stride, 16; ``patch_bias`` has no meaning (the stem's last conv has a bias)."""

    no_embed_class: bool = True
    stem_width: int = 192  # channels of the stem's first two convs (timm: 768 // 4)
    inference_mode: bool = False  # the stem's BatchNorms folded (reparameterize() sets it)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.patch_size != STRIDE:
            raise ValueError(f"the MCi conv stem has stride {STRIDE}: patch_size must be "
                             f"{STRIDE}, got {self.patch_size}")  # fmt: skip
        unused = [f for f in ("patch_bias", "rope_ref_grid") if getattr(self, f) is not None]
        unused += [f for f in ("rope",) if getattr(self, f)]
        if unused:
            raise ValueError(f"{', '.join(unused)}: not used by the MCi ViT (conv stem)")


class ConvStemEmbed(nn.Module):
    """The ViT's ``patch_embed``: ``(B, C, H, W)`` -> ``(B, H / 16, W / 16, D)`` tokens
    through ``backbone`` (conv 4x4/4 + BN + GELU, conv 2x2/2 + BN + GELU, conv 2x2/2)."""

    def __init__(self, c: MciViTConfig) -> None:
        super().__init__()
        self.img_size = to_2tuple(c.img_size)
        self.patch_size = (STRIDE, STRIDE)
        self.grid_size = c.grid_size  # the grid the position embedding is laid out for
        self.num_patches = self.grid_size[0] * self.grid_size[1]
        self.in_chans = c.in_chans
        self.strict_img_size = not c.dynamic_img_size
        w, fused = c.stem_width, c.inference_mode
        self.backbone = nn.Sequential(
            ConvNorm(c.in_chans, w, 4, 4, padding=0, act=True, inference_mode=fused),
            ConvNorm(w, w, 2, 2, padding=0, act=True, inference_mode=fused),
            ConvNorm(w, c.embed_dim, 2, 2, padding=0, norm=False),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.ndim != 4 or x.shape[1] != self.in_chans:
            raise ValueError(
                f"expected an image batch (B, {self.in_chans}, H, W), got {tuple(x.shape)}"
            )
        if self.strict_img_size and tuple(x.shape[-2:]) != self.img_size:
            raise ValueError(f"expected a {self.img_size[0]}x{self.img_size[1]} image, got "
                             f"{x.shape[-2]}x{x.shape[-1]}")  # fmt: skip
        return self.backbone(x).permute(0, 2, 3, 1)  # (B, gh, gw, D)


class MciVisionTransformer(VisionTransformer):
    """The MCi ViT: :class:`VisionTransformer` on the conv stem (see the module docstring).
    Build from a config (or its fields as keyword arguments); ``weight_init=False`` skips
    the random init."""

    def __init__(
        self, config: MciViTConfig | None = None, *, weight_init: bool = True, **kwargs
    ) -> None:
        config = config if config is not None else MciViTConfig(**kwargs)
        super().__init__(config, weight_init=False)
        self.patch_embed = ConvStemEmbed(config)
        if weight_init:
            self.init_weights()

    @torch.no_grad()
    def reparameterize(self) -> MciVisionTransformer:
        """Fold the stem's BatchNorms into its convs, in place; sets
        ``config.inference_mode`` (a no-op on a folded model); returns ``self``."""
        for layer in self.patch_embed.backbone:
            layer.reparameterize()
        self.config = dataclasses.replace(self.config, inference_mode=True)  # (a new config)
        return self
