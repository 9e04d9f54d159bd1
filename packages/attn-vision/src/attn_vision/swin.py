"""Swin Transformer (Liu et al. 2021): windowed attention, shifted windows, patch merging.

Shape legend: ``B`` batch, ``H`` / ``W`` feature-map height / width (in tokens),
``C`` channels, ``wh, ww`` window size, ``N = wh * ww`` tokens per window,
``nW`` windows per image, ``Hd`` heads, ``hd`` head width, ``K`` classes.

Feature maps are channels-last ``(B, H, W, C)`` throughout, like timm 1.x. Each stage
after the first starts with a :class:`PatchMerging` (``layers.{i}.downsample``) that
halves ``H, W`` and doubles ``C``. Inside a window every token attends to every other
token with a learned relative position bias; every second block shifts the windows by
half a window so information crosses window borders, and a mask stops tokens that
were wrapped around by the cyclic shift from attending each other. Bias and mask are
one additive float ``attn_mask`` handed to :func:`attn_core.attention`.

Parameter names are timm's (``layers.{i}.blocks.{j}.attn.qkv``,
``attn.relative_position_bias_table``, ...), except the classifier: ``head`` here,
``head.fc`` in timm (see :func:`attn_vision.convert.convert_timm_swin`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from attn_core import DropPath, FeedForward, attention
from torch import nn

from .patch_embed import PatchEmbed

__all__ = [
    "PatchMerging",
    "SwinBlock",
    "SwinConfig",
    "SwinStage",
    "SwinTransformer",
    "WindowAttention",
    "relative_position_index",
    "shift_window_mask",
    "window_partition",
    "window_reverse",
]

# Additive score for token pairs the shift mask separates. timm (and the original Swin)
# use -100 rather than -inf; exp(-100) is 0 in float32, and using the same value keeps
# our numbers identical to the reference.
MASK_VALUE = -100.0


@dataclass
class SwinConfig:
    """Architecture of a :class:`SwinTransformer` (field names follow timm's kwargs)."""

    img_size: int | tuple[int, int] = 224  # input size (fixed: the shift masks depend on it)
    patch_size: int = 4  # side of the square patches of the stem
    in_chans: int = 3  # input image channels
    num_classes: int = 1000  # classifier outputs; 0 = no head
    global_pool: str = "avg"  # "avg" over the final feature map, or "" (no pooling)
    embed_dim: int = 96  # channels of stage 0; stage i has embed_dim * 2**i
    depths: tuple[int, ...] = (2, 2, 6, 2)  # blocks per stage
    num_heads: tuple[int, ...] = (3, 6, 12, 24)  # heads per stage
    window_size: int = 7  # attention window side (clamped to small feature maps)
    mlp_ratio: float = 4.0  # MLP hidden width = mlp_ratio * C
    qkv_bias: bool = True  # biases in the qkv projections
    norm_eps: float = 1e-5  # LayerNorm epsilon
    drop_rate: float = 0.0  # dropout before the classifier
    proj_drop_rate: float = 0.0  # dropout on branch outputs
    attn_drop_rate: float = 0.0  # dropout on the attention weights
    drop_path_rate: float = 0.1  # stochastic depth, increasing linearly over all blocks

    def __post_init__(self) -> None:
        self.depths, self.num_heads = tuple(self.depths), tuple(self.num_heads)
        if len(self.depths) != len(self.num_heads):
            raise ValueError(
                f"depths {self.depths} and num_heads {self.num_heads} must have one entry per stage"
            )
        if self.global_pool not in ("avg", ""):
            raise ValueError(f"global_pool must be 'avg' or '', got {self.global_pool!r}")
        for dim, heads in zip(self.stage_dims, self.num_heads, strict=True):
            if dim % heads:
                raise ValueError(f"stage width {dim} is not divisible by its {heads} heads")

    @property
    def stage_dims(self) -> tuple[int, ...]:
        """Channels of each stage: ``embed_dim * 2**i``."""
        return tuple(self.embed_dim * 2**i for i in range(len(self.depths)))


def window_partition(x: torch.Tensor, window: tuple[int, int]) -> torch.Tensor:
    """``(B, H, W, C)`` -> ``(B * nW, wh, ww, C)`` non-overlapping windows, image-major."""
    B, H, W, C = x.shape
    wh, ww = window
    x = x.view(B, H // wh, wh, W // ww, ww, C).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(-1, wh, ww, C)


def window_reverse(windows: torch.Tensor, window: tuple[int, int], H: int, W: int) -> torch.Tensor:
    """Inverse of :func:`window_partition`: ``(B * nW, wh, ww, C)`` -> ``(B, H, W, C)``."""
    wh, ww = window
    C = windows.shape[-1]
    x = windows.view(-1, H // wh, W // ww, wh, ww, C).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(-1, H, W, C)


def relative_position_index(window: tuple[int, int]) -> torch.Tensor:
    """``(N, N)`` index into the ``((2wh-1) * (2ww-1), Hd)`` bias table for each token pair."""
    wh, ww = window
    coords = torch.stack(torch.meshgrid(torch.arange(wh), torch.arange(ww), indexing="ij"))
    coords = coords.flatten(1)  # (2, N)
    rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0)  # (N, N, 2) dy, dx
    rel[:, :, 0] += wh - 1  # shift to start at 0
    rel[:, :, 1] += ww - 1
    return rel[:, :, 0] * (2 * ww - 1) + rel[:, :, 1]


def shift_window_mask(
    H: int,
    W: int,
    window: tuple[int, int],
    shift: tuple[int, int],
    device: torch.device | None = None,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Additive ``(nW, N, N)`` mask for shifted windows on an ``H x W`` map (0 / -100).

    After the cyclic shift a window at the border holds tokens from up to four image
    regions that are not neighbours; label each region and allow attention only
    between tokens with the same label.
    """
    label = torch.zeros(1, H, W, 1, device=device, dtype=dtype)
    cnt = 0
    for hs in (slice(0, -window[0]), slice(-window[0], -shift[0]), slice(-shift[0], None)):
        for ws in (slice(0, -window[1]), slice(-window[1], -shift[1]), slice(-shift[1], None)):
            label[:, hs, ws, :] = cnt
            cnt += 1
    label = window_partition(label, window).reshape(-1, window[0] * window[1])  # (nW, N)
    diff = label[:, None, :] - label[:, :, None]  # (nW, N, N), 0 = same region
    return torch.zeros_like(diff).masked_fill(diff != 0, MASK_VALUE)


class WindowAttention(nn.Module):
    """Multi-head self-attention inside each window, with a relative position bias."""

    def __init__(
        self,
        dim: int,
        num_heads: int,
        window_size: tuple[int, int],
        qkv_bias: bool = True,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
    ) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.window_size = window_size
        self.attn_drop = attn_drop
        wh, ww = window_size
        self.relative_position_bias_table = nn.Parameter(
            torch.zeros((2 * wh - 1) * (2 * ww - 1), num_heads)
        )
        self.register_buffer(
            "relative_position_index", relative_position_index(window_size), persistent=False
        )
        self.qkv = nn.Linear(dim, 3 * dim, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def relative_position_bias(self) -> torch.Tensor:
        """``(Hd, N, N)`` learned bias for every (query, key) offset in the window."""
        N = self.window_size[0] * self.window_size[1]
        bias = self.relative_position_bias_table[self.relative_position_index.view(-1)]
        return bias.view(N, N, -1).permute(2, 0, 1)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """``(B * nW, N, C)`` windows (+ optional ``(nW, N, N)`` shift mask) -> same shape."""
        Bw, N, C = x.shape
        Hd, hd = self.num_heads, self.head_dim
        q, k, v = self.qkv(x).view(Bw, N, 3, Hd, hd).permute(2, 0, 3, 1, 4)  # 3 x (B*nW, Hd, N, hd)
        attn_mask = self.relative_position_bias()[None]  # (1, Hd, N, N)
        dropout_p = self.attn_drop if self.training else 0.0
        if mask is None:
            out = attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p)
        else:
            # Fold the windows into the head dim, (B, nW * Hd, N, hd), so the per-window
            # (nW, Hd, N, N) mask broadcasts over the batch without being copied B times.
            nW = mask.shape[0]
            B = Bw // nW
            attn_mask = (attn_mask + mask[:, None].to(attn_mask.dtype)).reshape(1, nW * Hd, N, N)
            q, k, v = (t.reshape(B, nW * Hd, N, hd) for t in (q, k, v))
            out = attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p)
            out = out.reshape(Bw, Hd, N, hd)
        out = out.transpose(1, 2).reshape(Bw, N, C)
        return self.proj_drop(self.proj(out))


class SwinBlock(nn.Module):
    """``x + attn(norm1(x))`` over (shifted) windows, then ``x + mlp(norm2(x))``."""

    def __init__(
        self,
        dim: int,
        input_resolution: tuple[int, int],
        num_heads: int,
        window_size: int = 7,
        shift: bool = False,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        proj_drop: float = 0.0,
        attn_drop: float = 0.0,
        drop_path: float = 0.0,
        norm_layer=nn.LayerNorm,
    ) -> None:
        super().__init__()
        self.input_resolution = input_resolution
        # A window never exceeds the feature map; a map that fits in one window is not shifted.
        self.window_size = tuple(min(r, window_size) for r in input_resolution)
        self.shift_size = tuple(
            0 if (not shift or r <= w) else window_size // 2
            for r, w in zip(input_resolution, self.window_size, strict=True)
        )
        self.norm1 = norm_layer(dim)
        self.attn = WindowAttention(
            dim, num_heads, self.window_size, qkv_bias, attn_drop=attn_drop, proj_drop=proj_drop
        )
        self.drop_path1 = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm2 = norm_layer(dim)
        self.mlp = FeedForward(dim, int(dim * mlp_ratio), act="gelu", dropout=proj_drop)
        self.mlp_drop = nn.Dropout(proj_drop)
        self.drop_path2 = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def _attn(self, x: torch.Tensor) -> torch.Tensor:
        B, H, W, C = x.shape
        (wh, ww), (sh, sw) = self.window_size, self.shift_size
        shifted = sh or sw
        if shifted:  # cyclic shift up-left by half a window
            x = torch.roll(x, shifts=(-sh, -sw), dims=(1, 2))
        pad_h, pad_w = (wh - H % wh) % wh, (ww - W % ww) % ww  # maps not divisible by the window
        x = F.pad(x, (0, 0, 0, pad_w, 0, pad_h))
        Hp, Wp = H + pad_h, W + pad_w

        windows = window_partition(x, self.window_size).view(-1, wh * ww, C)  # (B*nW, N, C)
        mask = (
            shift_window_mask(Hp, Wp, self.window_size, self.shift_size, x.device, x.dtype)
            if shifted
            else None
        )
        windows = self.attn(windows, mask=mask)
        x = window_reverse(windows.view(-1, wh, ww, C), self.window_size, Hp, Wp)
        x = x[:, :H, :W, :]
        if shifted:
            x = torch.roll(x, shifts=(sh, sw), dims=(1, 2))
        return x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, H, W, C)`` -> ``(B, H, W, C)``."""
        x = x + self.drop_path1(self._attn(self.norm1(x)))
        return x + self.drop_path2(self.mlp_drop(self.mlp(self.norm2(x))))


class PatchMerging(nn.Module):
    """Merge each 2x2 group of tokens: ``(B, H, W, C)`` -> ``(B, H/2, W/2, out_dim)``."""

    def __init__(self, dim: int, out_dim: int | None = None, norm_layer=nn.LayerNorm) -> None:
        super().__init__()
        self.out_dim = out_dim or 2 * dim
        self.norm = norm_layer(4 * dim)
        self.reduction = nn.Linear(4 * dim, self.out_dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, H, W, C = x.shape
        x = F.pad(x, (0, 0, 0, W % 2, 0, H % 2))  # odd sizes: pad one row / column
        H, W = x.shape[1], x.shape[2]
        # (B, H/2, W/2, 2 [dx], 2 [dy], C) -> 4C, in the channel order the weights expect
        x = x.reshape(B, H // 2, 2, W // 2, 2, C).permute(0, 1, 3, 4, 2, 5).flatten(3)
        return self.reduction(self.norm(x))


class SwinStage(nn.Module):
    """Optional :class:`PatchMerging`, then ``depth`` blocks alternating plain / shifted."""

    def __init__(
        self,
        dim: int,
        out_dim: int,
        input_resolution: tuple[int, int],
        depth: int,
        downsample: bool,
        num_heads: int,
        window_size: int,
        mlp_ratio: float,
        qkv_bias: bool,
        proj_drop: float,
        attn_drop: float,
        drop_path: list[float],
        norm_layer,
    ) -> None:
        super().__init__()
        self.grad_checkpointing = False
        if downsample:
            self.downsample = PatchMerging(dim, out_dim, norm_layer)
            resolution = tuple((r + 1) // 2 for r in input_resolution)
        else:
            self.downsample = nn.Identity()
            resolution = input_resolution
        self.output_resolution = resolution
        self.blocks = nn.Sequential(
            *[
                SwinBlock(
                    out_dim,
                    resolution,
                    num_heads,
                    window_size,
                    shift=i % 2 == 1,
                    mlp_ratio=mlp_ratio,
                    qkv_bias=qkv_bias,
                    proj_drop=proj_drop,
                    attn_drop=attn_drop,
                    drop_path=drop_path[i],
                    norm_layer=norm_layer,
                )
                for i in range(depth)
            ]
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.downsample(x)
        for blk in self.blocks:
            if self.grad_checkpointing and torch.is_grad_enabled():
                x = torch.utils.checkpoint.checkpoint(blk, x, use_reentrant=False)
            else:
                x = blk(x)
        return x


class SwinTransformer(nn.Module):
    """Swin: patch stem, four stages of window attention, final norm, avg pool, head.

    Build from a config (or its fields as keyword arguments). ``weight_init=False`` skips
    the random init, for weights that are loaded right after.
    """

    def __init__(
        self, config: SwinConfig | None = None, *, weight_init: bool = True, **kwargs
    ) -> None:
        super().__init__()
        config = config if config is not None else SwinConfig(**kwargs)
        self.config = c = config
        norm_layer = partial(nn.LayerNorm, eps=c.norm_eps)
        self.num_classes = c.num_classes
        self.num_features = c.stage_dims[-1]

        self.patch_embed = PatchEmbed(
            c.img_size,
            c.patch_size,
            c.in_chans,
            c.embed_dim,
            norm_layer=norm_layer,
            strict_img_size=True,
            output_fmt="NHWC",
        )
        dpr = torch.linspace(0, c.drop_path_rate, sum(c.depths), device="cpu").split(list(c.depths))
        resolution = self.patch_embed.grid_size
        stages, in_dim = [], c.embed_dim
        for i, (depth, heads, out_dim) in enumerate(
            zip(c.depths, c.num_heads, c.stage_dims, strict=True)
        ):
            stage = SwinStage(
                in_dim,
                out_dim,
                resolution,
                depth,
                downsample=i > 0,
                num_heads=heads,
                window_size=c.window_size,
                mlp_ratio=c.mlp_ratio,
                qkv_bias=c.qkv_bias,
                proj_drop=c.proj_drop_rate,
                attn_drop=c.attn_drop_rate,
                drop_path=dpr[i].tolist(),
                norm_layer=norm_layer,
            )
            stages.append(stage)
            resolution, in_dim = stage.output_resolution, out_dim
        self.layers = nn.Sequential(*stages)
        self.norm = norm_layer(self.num_features)
        self.head_drop = nn.Dropout(c.drop_rate)
        self.head = (
            nn.Linear(self.num_features, c.num_classes) if c.num_classes > 0 else nn.Identity()
        )
        if weight_init:  # skipped when weights are about to be loaded anyway
            self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """Truncated normal (std 0.02) for Linear weights and the bias tables, zero biases."""
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, WindowAttention):
                nn.init.trunc_normal_(m.relative_position_bias_table, std=0.02)

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Recompute each block's activations in backward instead of storing them."""
        for stage in self.layers:
            stage.grad_checkpointing = enable

    def get_classifier(self) -> nn.Module:
        return self.head

    def reset_classifier(self, num_classes: int) -> None:
        """Replace the head with a fresh ``num_classes``-way Linear (0 = no head)."""
        self.num_classes = self.config.num_classes = num_classes
        ref = self.norm.weight
        self.head = (
            nn.Linear(self.num_features, num_classes).to(ref.device, ref.dtype)
            if num_classes > 0
            else nn.Identity()
        )

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, C_in, H_img, W_img)`` -> ``(B, H, W, C)`` final normed feature map."""
        return self.norm(self.layers(self.patch_embed(x)))

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """``(B, H, W, C)`` -> ``(B, K)`` logits (or pooled ``(B, C)`` with ``pre_logits``)."""
        if self.config.global_pool == "avg":
            x = x.mean(dim=(1, 2))
        x = self.head_drop(x)
        return x if pre_logits else self.head(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, C_in, H_img, W_img)`` -> ``(B, K)`` logits."""
        return self.forward_head(self.forward_features(x))
