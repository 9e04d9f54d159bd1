"""Image -> patch tokens, and resampling a learned position embedding to a new grid.

Shape legend: ``B`` batch, ``C`` input channels, ``H`` / ``W`` image height / width,
``p`` patch size, ``gh = H // p`` / ``gw = W // p`` patch grid, ``L = gh * gw`` patches,
``D`` embed dim, ``P`` prefix (class / register) tokens.

Names follow timm (``proj``, ``norm``) so converted weights line up.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["PatchEmbed", "resample_abs_pos_embed", "to_2tuple"]


def to_2tuple(x: int | tuple[int, int] | list[int]) -> tuple[int, int]:
    """``224 -> (224, 224)``; a pair is returned as a tuple."""
    if isinstance(x, (tuple, list)):
        if len(x) != 2:
            raise ValueError(f"expected an int or an (h, w) pair, got {x!r}")
        return int(x[0]), int(x[1])
    return int(x), int(x)


class PatchEmbed(nn.Module):
    """Split an image into non-overlapping ``p x p`` patches and project each to ``D``.

    A strided convolution is exactly "flatten each patch, then a shared Linear".

    Args:
        img_size: the image size the model was built for (sets ``grid_size``).
        patch_size: patch side ``p`` (or ``(ph, pw)``).
        in_chans: input channels ``C``.
        embed_dim: output width ``D``.
        norm_layer: optional norm over ``D`` after the projection (Swin uses one).
        bias: bias in the projection (CLIP towers have none).
        strict_img_size: require the input to be exactly ``img_size``; otherwise any size
            divisible by the patch size is accepted.
        output_fmt: ``"NLC"`` -> ``(B, L, D)`` or ``"NHWC"`` -> ``(B, gh, gw, D)``.
    """

    def __init__(
        self,
        img_size: int | tuple[int, int] = 224,
        patch_size: int | tuple[int, int] = 16,
        in_chans: int = 3,
        embed_dim: int = 768,
        *,
        norm_layer: Callable[[int], nn.Module] | None = None,
        bias: bool = True,
        strict_img_size: bool = False,
        output_fmt: str = "NLC",
    ) -> None:
        super().__init__()
        if output_fmt not in ("NLC", "NHWC"):
            raise ValueError(f"output_fmt must be 'NLC' or 'NHWC', got {output_fmt!r}")
        self.img_size = to_2tuple(img_size)
        self.patch_size = to_2tuple(patch_size)
        self.grid_size = (
            self.img_size[0] // self.patch_size[0],
            self.img_size[1] // self.patch_size[1],
        )
        self.num_patches = self.grid_size[0] * self.grid_size[1]
        self.in_chans = in_chans
        self.strict_img_size = strict_img_size
        self.output_fmt = output_fmt
        self.proj = nn.Conv2d(
            in_chans, embed_dim, kernel_size=self.patch_size, stride=self.patch_size, bias=bias
        )
        self.norm = norm_layer(embed_dim) if norm_layer is not None else nn.Identity()

    def check_input(self, x: torch.Tensor) -> None:
        """Raise ``ValueError`` naming expected vs got for a wrong shape, channels or size."""
        if x.ndim != 4:
            raise ValueError(
                f"expected an image batch (B, C, H, W) with C={self.in_chans}, "
                f"got a tensor of shape {tuple(x.shape)}"
            )
        _, C, H, W = x.shape
        if C != self.in_chans:
            raise ValueError(
                f"expected {self.in_chans} input channels, got {C} (shape {tuple(x.shape)})"
            )
        if self.strict_img_size and (H, W) != self.img_size:
            raise ValueError(
                f"expected a {self.img_size[0]}x{self.img_size[1]} image, got {H}x{W}; build the "
                f"model with img_size=({H}, {W}) to change it"
            )
        ph, pw = self.patch_size
        if H % ph or W % pw:
            raise ValueError(
                f"image size {H}x{W} is not divisible by the patch size {ph}x{pw}; "
                f"resize or crop to a multiple of it (e.g. {H // ph * ph}x{W // pw * pw})"
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, C, H, W)`` -> ``(B, L, D)`` (``"NLC"``) or ``(B, gh, gw, D)`` (``"NHWC"``)."""
        self.check_input(x)
        x = self.proj(x)  # (B, D, gh, gw)
        x = x.permute(0, 2, 3, 1)  # (B, gh, gw, D)
        if self.output_fmt == "NLC":
            x = x.flatten(1, 2)  # (B, L, D)
        return self.norm(x)


def resample_abs_pos_embed(
    pos_embed: torch.Tensor,
    new_size: tuple[int, int],
    old_size: tuple[int, int] | None = None,
    num_prefix_tokens: int = 1,
    interpolation: str = "bicubic",
    antialias: bool = True,
) -> torch.Tensor:
    """Resize a learned ``(1, P + gh*gw, D)`` position embedding to a ``new_size`` grid.

    The ``P`` prefix (class) positions are kept as they are; the grid positions are
    treated as a ``D``-channel image and resized (bicubic, antialiased: the same maths
    timm uses, so interpolated models give timm's numbers). ``old_size=None`` assumes
    a square grid. Returns ``(1, P + new_h*new_w, D)`` in the input dtype.
    """
    num_pos = pos_embed.shape[1]
    new_size = to_2tuple(new_size)
    if num_pos == new_size[0] * new_size[1] + num_prefix_tokens:
        if old_size is None and new_size[0] == new_size[1]:
            return pos_embed
        if old_size is not None and tuple(old_size) == new_size:
            return pos_embed
    if old_size is None:
        side = int(math.sqrt(num_pos - num_prefix_tokens))
        old_size = (side, side)
    if old_size[0] * old_size[1] + num_prefix_tokens != num_pos:
        raise ValueError(
            f"pos_embed has {num_pos} positions, which is not {num_prefix_tokens} prefix "
            f"tokens + a {old_size[0]}x{old_size[1]} grid"
        )
    prefix, grid = pos_embed[:, :num_prefix_tokens], pos_embed[:, num_prefix_tokens:]
    D = grid.shape[-1]
    grid = grid.float().reshape(1, old_size[0], old_size[1], D).permute(0, 3, 1, 2)  # (1, D, h, w)
    grid = F.interpolate(grid, size=new_size, mode=interpolation, antialias=antialias)
    grid = grid.permute(0, 2, 3, 1).reshape(1, -1, D).to(pos_embed.dtype)  # (1, h'*w', D)
    return torch.cat([prefix, grid], dim=1)
