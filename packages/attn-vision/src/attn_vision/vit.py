"""Vision Transformer (Dosovitskiy et al. 2020), built from attn_core blocks.

Shape legend: ``B`` batch, ``C`` channels, ``H`` / ``W`` image size, ``p`` patch size,
``gh, gw`` patch grid, ``L = gh * gw`` patches, ``P`` prefix tokens (class, distillation
and register tokens, in that order), ``N = P + L`` tokens, ``D`` embed dim, ``Hd`` heads,
``K`` classes.

The timm variants are config fields: register tokens (``reg_tokens``, DINOv2-reg), the
DeiT distillation token and head (``dist_token``: logits = mean of ``head`` on the class
token and ``head_dist`` on the distillation token), LayerScale (``init_values``), a
position embedding over the patches only (``no_embed_class``), the MAP head
(``global_pool="map"``, :class:`~attn_vision.attention_pool.AttentionPoolLatent`, SigLIP)
and an attention output bias separate from the qkv bias (``proj_bias``); timm ``Eva``'s
residual post-norm blocks (``post_norm``, :class:`ResPostNormBlock`: EVA02-E) and what
Meta's Perception Encoder (timm ``vit_pe_core_*``) adds to EVA02's RoPE: a grid offset and
column-first bands (``rope_grid_offset``, ``rope_grid_indexing="xy"``,
:class:`XYAxialRotaryEmbedding`), a MAP head with its own heads / MLP ratio
(``attn_pool_num_heads``, ``attn_pool_mlp_ratio``) that reads the [CLS] token too
(``pool_include_prefix``); timm's relative-position ViTs (``vit_relpos_*``): no absolute
position embedding (``pos_embed="none"``) and a log-coordinate MLP bias per block
(``rel_pos="mlp"``, :class:`RelPosMlp`, as ``blocks.{i}.attn.rel_pos``) and BEiT's learned
table per block (``rel_pos="beit"``, :class:`~attn_vision.rel_pos.BeitRelPosBias`). For Hugging Face
transformers' ViTs (:mod:`attn_vision.hf.vit`): the in21k pooler, a dense + tanh on the
pooled token (``representation_size``, as ``pre_logits.fc``: old timm's name), and the
position embedding resampled without antialiasing (``pos_embed_antialias=False``).

Inference fast path (``fast_inference``, on by default; switched for a whole model by
:func:`attn_core.fast_inference.enable` / ``disable``): the blocks and the patch embedding run
through :mod:`attn_core.fast_inference` whenever it applies (eval mode, no autograd, CPU
fp32 / bf16); the results equal the plain modules' to float rounding.

Parameter names are timm's (``cls_token``, ``dist_token``, ``reg_token``, ``pos_embed``,
``patch_embed.proj``, ``norm_pre``, ``blocks.{i}.norm1`` / ``attn.qkv`` / ``attn.proj`` /
``ls1.gamma`` / ``norm2`` / ``mlp.fc1`` / ``mlp.fc2`` / ``ls2.gamma``, ``norm``,
``attn_pool``, ``fc_norm``, ``head``, ``head_dist``), so timm checkpoints load with a
near-identity converter (:func:`attn_vision.convert.convert_timm_vit`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from attn_core import AxialRotaryEmbedding, FeedForward, TransformerBlock
from attn_core.fast_inference import fast_path_available, patchify, run_blocks
from torch import nn

from .attention_pool import AttentionPoolLatent
from .patch_embed import PatchEmbed, resample_abs_pos_embed, to_2tuple
from .rel_pos import BeitRelPosBias
from .swin import relative_position_index

__all__ = [
    "AttentionPoolLatent",
    "RelPosMlp",
    "ResPostNormBlock",
    "ViTConfig",
    "VisionTransformer",
    "XYAxialRotaryEmbedding",
]

GLOBAL_POOLS = ("token", "avg", "map", "")
ROPE_GRID_INDEXINGS = ("ij", "xy")
POS_EMBEDS = ("learn", "none")  # a learned absolute position embedding, or none
REL_POS = ("", "mlp", "beit")  # no relative position bias, timm's RelPosMlp, BEiT's table


def _check_pool(global_pool: str, class_token: bool, dist_token: bool) -> None:
    if global_pool not in GLOBAL_POOLS:
        raise ValueError(f"global_pool must be one of {GLOBAL_POOLS}, got {global_pool!r}")
    if global_pool == "token" and not class_token:
        raise ValueError("global_pool='token' needs class_token=True")
    if dist_token and global_pool != "token":
        raise ValueError(
            f"dist_token=True reads the class and distillation tokens: it needs "
            f"global_pool='token', got {global_pool!r}"
        )


class ResPostNormBlock(TransformerBlock):
    """A :class:`~attn_core.TransformerBlock` whose norms close each residual branch
    instead of opening it: ``x + norm1(attn(x))``, then ``x + norm2(mlp(x))`` (timm's
    ``EvaBlockPostNorm``, Swin-V2's "res-post-norm"; EVA02-E). Same arguments and parameter
    names; the attn_core fast path's fused kernels are pre-norm's, so it runs this forward."""

    def _residual(self, x, branch, norm, ls, drop_path):
        return x + drop_path(ls(norm(F.dropout(branch(x), self.dropout, self.training))))

    def fused_supported(self) -> bool:
        return False


class XYAxialRotaryEmbedding(AxialRotaryEmbedding):
    """:class:`~attn_core.AxialRotaryEmbedding` with timm's ``grid_indexing="xy"`` (PE-Core):
    the column frequencies come first in each head (``[x | y]`` bands instead of
    ``[y | x]``); ``ref_grid`` is still ``(rows, cols)``. Computed as the row-first table of
    the transposed grid, transposed back to row-major patch order."""

    def __init__(
        self,
        dim: int,
        base: float = 10000.0,
        ref_grid: tuple[int, int] | None = None,
        grid_offset: float = 0.0,
        interleaved: bool = True,
    ) -> None:
        swapped = tuple(ref_grid[::-1]) if ref_grid is not None else None
        super().__init__(dim, base, swapped, grid_offset, interleaved)

    def cos_sin(
        self, grid: tuple[int, int], dtype: torch.dtype = torch.float32
    ) -> tuple[torch.Tensor, torch.Tensor]:
        gh, gw = grid
        cos, sin = super().cos_sin((gw, gh), dtype)  # (gw * gh, dim): patch (r, c) at c * gh + r

        def row_major(t: torch.Tensor) -> torch.Tensor:
            return t.view(gw, gh, -1).transpose(0, 1).reshape(gh * gw, -1)

        return row_major(cos), row_major(sin)


class RelPosMlp(nn.Module):
    """timm's ``RelPosMlp`` (its ``"cr"`` mode; after Swin-V2): an MLP maps each (dy, dx)
    offset between two patches, as ``sign(d) * log(1 + |d|)``, to an additive attention bias
    per head. ``(gh, gw)`` grid -> ``(1, Hd, P + L, P + L)`` (0 for the ``P`` prefix tokens'
    rows and columns), computed for the grid it is given (any image size)."""

    def __init__(self, num_heads: int, hidden_dim: int = 128) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.mlp = FeedForward(2, hidden_dim, num_heads, act="relu", dropout=0.125)

    def forward(self, grid: tuple[int, int], num_prefix_tokens: int = 0) -> torch.Tensor:
        (gh, gw), w = grid, self.mlp.fc1.weight
        f32 = dict(device=w.device, dtype=torch.float32)
        offsets = [torch.arange(-(n - 1), n, **f32) for n in (gh, gw)]
        coords = torch.stack(torch.meshgrid(*offsets, indexing="ij"), dim=-1)  # (2gh-1, 2gw-1, 2)
        coords = torch.sign(coords) * torch.log(1.0 + coords.abs())
        table = self.mlp(coords.to(w.dtype)).view(-1, self.num_heads)  # (offsets, Hd)
        index = relative_position_index((gh, gw)).to(w.device).view(-1)  # (L * L,)
        bias = table[index].view(gh * gw, gh * gw, -1).permute(2, 0, 1)  # (Hd, L, L)
        P = num_prefix_tokens
        return F.pad(bias, (P, 0, P, 0))[None]  # (1, Hd, N, N)


@dataclass
class ViTConfig:
    """Architecture of a :class:`VisionTransformer` (field names follow timm's kwargs)."""

    img_size: int | tuple[int, int] = 224  # image size the position embedding is laid out for
    patch_size: int = 16  # side of the square patches
    in_chans: int = 3  # input image channels
    num_classes: int = 1000  # classifier outputs; 0 = no head (forward returns pooled features)
    # "token" (class token), "avg" (mean of patch tokens), "map" (attention pool) or ""
    global_pool: str = "token"
    embed_dim: int = 768  # token width D
    depth: int = 12  # transformer blocks
    num_heads: int = 12  # attention heads per block
    mlp_ratio: float = 4.0  # MLP hidden width = mlp_ratio * D
    qkv_bias: bool = True  # bias in the fused qkv projection
    proj_bias: bool = True  # bias in the attention output projection (timm: separate)
    class_token: bool = True  # prepend a learned [CLS] token
    dist_token: bool = False  # DeiT distillation token + head_dist (logits: mean of heads)
    reg_tokens: int = 0  # learned register tokens after the class token (DINOv2-reg)
    no_embed_class: bool = False  # position embedding covers only the patches (DeiT-3 style)
    pre_norm: bool = False  # LayerNorm before the blocks (CLIP's ln_pre; timm's norm_pre)
    patch_bias: bool | None = None  # bias in the patch projection; None = not pre_norm (timm)
    final_norm: bool = True  # LayerNorm after the blocks
    fc_norm: bool | None = None  # norm after pooling instead of before; None = (pool == "avg")
    norm_eps: float = 1e-6  # LayerNorm epsilon (1e-6 for timm ViTs, 1e-5 for CLIP towers)
    act: str = "gelu"  # MLP activation: "gelu", "gelu_tanh" (SigLIP), "quick_gelu" (CLIP), "swiglu"
    mlp_gate_last: bool = True  # swiglu: fc1 gives [x, gate]; False: [gate, x] (timm GluMlp)
    attn_inner_norm: bool = False  # LayerNorm before each attention proj (timm scale_attn_inner)
    mlp_inner_norm: bool = False  # LayerNorm before each fc2 (timm scale_mlp)
    post_norm: bool = False  # res-post-norm blocks: x + norm(branch(x)) (timm Eva use_post_norm)
    rope: bool = False  # 2D axial RoPE on the patch tokens' queries / keys (EVA02)
    rope_ref_grid: tuple[int, int] | None = None  # RoPE positions scaled onto this grid
    rope_grid_offset: float = 0.0  # added to the RoPE row / column indices (PE-Core: 1)
    rope_grid_indexing: str = "ij"  # "ij": RoPE bands [rows | cols]; "xy": [cols | rows] (PE)
    pos_embed: str = "learn"  # "learn" (a learned absolute position embedding) or "none"
    # "mlp": a RelPosMlp bias in every block (timm vit_relpos_*); "beit": a BeitRelPosBias
    # table in every block; "" none
    rel_pos: str = ""
    rel_pos_dim: int = 128  # hidden width of the RelPosMlp
    # "avg" / "map" pools read the prefix tokens too (timm; an Eva's MAP head always does)
    pool_include_prefix: bool = False
    attn_pool_num_heads: int | None = None  # MAP head's attention heads; None = num_heads
    attn_pool_mlp_ratio: float | None = None  # MAP head's MLP ratio; None = mlp_ratio
    init_values: float | None = None  # LayerScale init; None = no layer scale
    # a Linear + tanh after pooling, before the head (transformers' ViTModel pooler); None: none
    representation_size: int | None = None
    # resampling pos_embed to another grid: bicubic antialiased (timm) or not (transformers)
    pos_embed_antialias: bool = True
    dynamic_img_size: bool = True  # accept any size divisible by the patch (pos-embed resampled)
    drop_rate: float = 0.0  # dropout before the classifier
    pos_drop_rate: float = 0.0  # dropout after adding the position embedding
    proj_drop_rate: float = 0.0  # dropout on each block's branch outputs
    attn_drop_rate: float = 0.0  # dropout on the attention weights
    drop_path_rate: float = 0.0  # stochastic depth, linearly increasing to this value

    def __post_init__(self) -> None:
        _check_pool(self.global_pool, self.class_token, self.dist_token)
        if self.dist_token and not self.class_token:
            raise ValueError("dist_token=True needs class_token=True (DeiT: [CLS], [DIST])")
        if self.dist_token and self.representation_size:
            raise ValueError("dist_token=True pools two tokens: expected representation_size None")
        if self.dist_token and self.fc_norm:
            raise ValueError("dist_token=True pools without fc_norm: expected fc_norm None/False")
        if self.post_norm and self.init_values is not None:
            raise ValueError("post_norm=True blocks have no layer scale: expected init_values=None")
        if self.rope_ref_grid is not None:
            self.rope_ref_grid = tuple(self.rope_ref_grid)
        if self.pos_embed not in POS_EMBEDS:
            raise ValueError(f"pos_embed must be one of {POS_EMBEDS}, got {self.pos_embed!r}")
        if self.rel_pos not in REL_POS:
            raise ValueError(f"rel_pos must be one of {REL_POS}, got {self.rel_pos!r}")
        if self.rel_pos == "beit" and (not self.class_token or self.num_prefix_tokens != 1):
            raise ValueError("rel_pos='beit' has bias rows for one [CLS] token: expected "
                             "class_token=True and no distillation / register tokens")  # fmt: skip
        if self.rope_grid_indexing not in ROPE_GRID_INDEXINGS:
            raise ValueError(f"rope_grid_indexing must be one of {ROPE_GRID_INDEXINGS}, got "
                             f"{self.rope_grid_indexing!r}")  # fmt: skip
        if self.rope and (self.embed_dim // self.num_heads) % 4:
            raise ValueError(f"rope=True needs a head width divisible by 4, got {self.embed_dim}"
                             f" / {self.num_heads}")  # fmt: skip
        if not isinstance(self.reg_tokens, int) or self.reg_tokens < 0:
            raise ValueError(f"reg_tokens must be an int >= 0, got {self.reg_tokens!r}")
        if self.embed_dim % self.num_heads:
            raise ValueError(
                f"embed_dim ({self.embed_dim}) must be divisible by num_heads ({self.num_heads})"
            )

    @property
    def num_prefix_tokens(self) -> int:
        """Tokens before the patches: class + distillation + register tokens."""
        return int(self.class_token) + int(self.dist_token) + self.reg_tokens

    @property
    def grid_size(self) -> tuple[int, int]:
        h, w = to_2tuple(self.img_size)
        p = self.patch_size
        return h // p, w // p


class VisionTransformer(nn.Module):
    """ViT: patch embedding, prefix tokens ([CLS], [DIST], registers) + position embedding,
    pre-norm blocks, pool ([CLS], average or MAP head), head (+ ``head_dist``).

    Build from a config (or its fields as keyword arguments). ``weight_init=False`` skips
    the random init, for weights that are loaded right after.
    """

    fast_inference = True  # the inference fast path (attn_core.fast_inference.enable)

    def __init__(
        self, config: ViTConfig | None = None, *, weight_init: bool = True, **kwargs
    ) -> None:
        super().__init__()
        config = config if config is not None else ViTConfig(**kwargs)
        self.config = c = config
        D = c.embed_dim
        norm_layer = partial(nn.LayerNorm, eps=c.norm_eps)
        use_fc_norm = c.global_pool == "avg" if c.fc_norm is None else c.fc_norm
        self.num_classes = c.num_classes
        self.num_prefix_tokens = c.num_prefix_tokens
        self.num_features = D
        self.head_hidden_size = c.representation_size or D  # the head's input width
        self.grad_checkpointing = False

        self.patch_embed = PatchEmbed(
            c.img_size,
            c.patch_size,
            c.in_chans,
            D,
            bias=not c.pre_norm if c.patch_bias is None else c.patch_bias,
            strict_img_size=not c.dynamic_img_size,
            output_fmt="NHWC",
        )
        num_patches = self.patch_embed.num_patches
        self.cls_token = nn.Parameter(torch.zeros(1, 1, D)) if c.class_token else None
        self.dist_token = nn.Parameter(torch.zeros(1, 1, D)) if c.dist_token else None
        self.reg_token = nn.Parameter(torch.zeros(1, c.reg_tokens, D)) if c.reg_tokens else None
        embed_len = num_patches if c.no_embed_class else num_patches + self.num_prefix_tokens
        learned = c.pos_embed == "learn"
        self.pos_embed = nn.Parameter(torch.zeros(1, embed_len, D)) if learned else None
        self.pos_drop = nn.Dropout(c.pos_drop_rate)
        self.norm_pre = norm_layer(D) if c.pre_norm else nn.Identity()

        dpr = torch.linspace(0, c.drop_path_rate, c.depth, device="cpu").tolist()
        block = ResPostNormBlock if c.post_norm else TransformerBlock
        self.blocks = nn.Sequential(
            *[
                block(
                    D,
                    c.num_heads,
                    c.mlp_ratio,
                    bias=c.qkv_bias,
                    proj_bias=c.proj_bias,
                    act=c.act,
                    mlp_gate_last=c.mlp_gate_last,
                    attn_inner_norm=c.attn_inner_norm,
                    mlp_inner_norm=c.mlp_inner_norm,
                    dropout=c.proj_drop_rate,
                    attn_dropout=c.attn_drop_rate,
                    drop_path=dpr[i],
                    layer_scale=c.init_values,
                    norm_layer=norm_layer,
                )
                for i in range(c.depth)
            ]
        )
        if c.rel_pos == "mlp":  # (timm's names: blocks.{i}.attn.rel_pos; the ViT adds it)
            for blk in self.blocks:
                blk.attn.rel_pos = RelPosMlp(c.num_heads, c.rel_pos_dim)
        elif c.rel_pos == "beit":
            for blk in self.blocks:
                blk.attn.rel_pos = BeitRelPosBias(c.num_heads, c.grid_size)
        head_dim = D // c.num_heads
        rope_cls = XYAxialRotaryEmbedding if c.rope_grid_indexing == "xy" else AxialRotaryEmbedding
        self.rope = (
            rope_cls(head_dim, ref_grid=c.rope_ref_grid, grid_offset=c.rope_grid_offset)
            if c.rope
            else None
        )
        self.norm = norm_layer(D) if c.final_norm and not use_fc_norm else nn.Identity()
        self.attn_pool = (
            AttentionPoolLatent(
                D,
                c.attn_pool_num_heads or c.num_heads,
                c.attn_pool_mlp_ratio or c.mlp_ratio,
                norm_layer=norm_layer,
                act=c.act,
            )
            if c.global_pool == "map"
            else None
        )
        self.fc_norm = norm_layer(D) if c.final_norm and use_fc_norm else nn.Identity()
        self.pre_logits = nn.Identity()
        if c.representation_size:  # (timm's old names: pre_logits.fc, pre_logits.act)
            fc = nn.Linear(D, c.representation_size)
            self.pre_logits = nn.Sequential(OrderedDict(fc=fc, act=nn.Tanh()))
        self.head_drop = nn.Dropout(c.drop_rate)
        R = self.head_hidden_size
        self.head = nn.Linear(R, c.num_classes) if c.num_classes > 0 else nn.Identity()
        self.head_dist = None
        if c.dist_token:  # DeiT: a second classifier, on the distillation token
            self.head_dist = nn.Linear(D, c.num_classes) if c.num_classes > 0 else nn.Identity()
        if weight_init:  # skipped when weights are about to be loaded anyway
            self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """timm's default init: truncated normal (std 0.02) Linear / pos-embed / [DIST],
        tiny [CLS] and registers, the MAP latent with std ``D ** -0.5``."""
        if self.pos_embed is not None:
            nn.init.trunc_normal_(self.pos_embed, std=0.02)
        for token in (self.cls_token, self.reg_token):
            if token is not None:
                nn.init.normal_(token, std=1e-6)
        if self.dist_token is not None:
            nn.init.trunc_normal_(self.dist_token, std=0.02)
        if self.attn_pool is not None:
            nn.init.trunc_normal_(self.attn_pool.latent, std=self.config.embed_dim**-0.5)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Recompute each block's activations in backward instead of storing them."""
        self.grad_checkpointing = enable

    def get_classifier(self) -> nn.Module:
        return self.head

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        """Replace the head (and ``head_dist``) with fresh ``num_classes``-way Linears
        (0 = no head). A new ``global_pool`` may drop the MAP head, not add one."""
        if global_pool is not None:
            _check_pool(global_pool, self.cls_token is not None, self.dist_token is not None)
            if global_pool == "map" and self.attn_pool is None:
                raise ValueError("reset_classifier cannot add a MAP head: build with 'map'")
            if global_pool != "map":
                self.attn_pool = None
            self.config.global_pool = global_pool
        self.num_classes = self.config.num_classes = num_classes
        ref = self.pos_embed

        def head() -> nn.Module:
            if num_classes <= 0:
                return nn.Identity()
            return nn.Linear(self.head_hidden_size, num_classes).to(ref.device, ref.dtype)

        self.head = head()
        if self.head_dist is not None:
            self.head_dist = head()

    def _pos_embed(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, gh, gw, D)`` patch tokens -> ``(B, N, D)``: prefix tokens + positions."""
        B, gh, gw, D = x.shape
        x = x.reshape(B, gh * gw, D)  # (B, L, D)
        tokens = (self.cls_token, self.dist_token, self.reg_token)
        prefix = [t.expand(B, -1, -1) for t in tokens if t is not None]  # P x (B, ., D)
        if self.pos_embed is None:  # (relative positions only: the blocks' rel_pos)
            return self.pos_drop(torch.cat(prefix + [x], dim=1))
        pos_embed = resample_abs_pos_embed(  # a no-op at the trained grid size
            self.pos_embed,
            (gh, gw),
            self.patch_embed.grid_size,
            num_prefix_tokens=0 if self.config.no_embed_class else self.num_prefix_tokens,
            antialias=self.config.pos_embed_antialias,
        )
        if self.config.no_embed_class:
            x = torch.cat(prefix + [x + pos_embed], dim=1)
        else:
            x = torch.cat(prefix + [x], dim=1) + pos_embed
        return self.pos_drop(x)  # (B, N, D)

    def _fast(self, x: torch.Tensor) -> bool:
        return self.fast_inference and not self.training and fast_path_available(x)

    def _embed(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, C, H, W)`` image -> ``(B, N, D)`` tokens entering the first block."""
        pe = self.patch_embed
        if self._fast(x) and type(pe) is PatchEmbed:  # pe(x), as one fused product
            pe.check_input(x)
            x = pe.norm(patchify(pe.proj, x))  # (B, gh, gw, D)
        else:
            x = pe(x)  # (B, gh, gw, D)
        return self.norm_pre(self._pos_embed(x))

    def rotary(self, image_size: tuple[int, int]) -> Callable | None:
        """The blocks' 2D RoPE for ``(H, W)`` images (``rotary=`` of each block), or None."""
        if self.rope is None:
            return None
        p = self.config.patch_size
        grid = (image_size[0] // p, image_size[1] // p)
        return partial(self.rope, grid=grid, num_prefix_tokens=self.num_prefix_tokens)

    def rel_pos_bias(self, image_size: tuple[int, int]) -> list[torch.Tensor] | None:
        """Each block's ``(1, Hd, N, N)`` relative position bias for ``(H, W)`` images
        (``rel_pos="mlp"`` / ``"beit"``; the blocks' additive ``attn_mask``), or None."""
        if not self.config.rel_pos:
            return None
        p = self.config.patch_size
        grid = (image_size[0] // p, image_size[1] // p)
        return [blk.attn.rel_pos(grid, self.num_prefix_tokens) for blk in self.blocks]

    def _blocks(
        self,
        x: torch.Tensor,
        rotary: Callable | None = None,
        cls_only: bool = False,
        biases: list[torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """``(B, N, D)`` tokens through the blocks (``biases``: each block's additive
        attention bias, :meth:`rel_pos_bias`) -> ``(B, N, D)``, or with ``cls_only`` only
        token 0 -> ``(B, 1, D)`` (the fast path computes just that row in the last block)."""
        fast = self._fast(x)
        rows = torch.zeros(x.shape[0], dtype=torch.long, device=x.device) if cls_only else None
        if fast and biases is None:
            return run_blocks(self.blocks, x, rows=rows, rotary=rotary)
        last = len(self.blocks) - 1
        for i, blk in enumerate(self.blocks):
            bias = None if biases is None else biases[i]
            if fast:  # (one block at a time: each has its own bias)
                x = run_blocks([blk], x, attn_mask=bias, rows=rows if i == last else None,
                               rotary=rotary)  # fmt: skip
            elif self.grad_checkpointing and torch.is_grad_enabled():
                x = torch.utils.checkpoint.checkpoint(
                    blk, x, attn_mask=bias, rotary=rotary, use_reentrant=False
                )
            else:
                x = blk(x, attn_mask=bias, rotary=rotary)
        return x[:, :1] if cls_only and not fast else x

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, C, H, W)`` -> ``(B, N, D)`` final (normed) tokens."""
        size = x.shape[-2:]
        return self.norm(self._blocks(self._embed(x), self.rotary(size), False,
                                      self.rel_pos_bias(size)))  # fmt: skip

    @property
    def _cls_only(self) -> bool:
        """Whether pooling reads nothing but the [CLS] row of the last block."""
        return self.config.global_pool == "token" and self.dist_token is None

    def forward_pre_logits(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, C, H, W)`` -> ``(B, D)`` pooled features before the head; equals
        ``forward_head(forward_features(x), pre_logits=True)``, but with [CLS] pooling
        passes on only the [CLS] row of the last block."""
        rotary, biases = self.rotary(x.shape[-2:]), self.rel_pos_bias(x.shape[-2:])
        x = self._embed(x)
        if self._cls_only:
            cls = self.norm(self._blocks(x, rotary, cls_only=True, biases=biases))  # (B, 1, D)
            return self.head_drop(self.pre_logits(self.fc_norm(cls[:, 0])))
        return self.forward_head(self.norm(self._blocks(x, rotary, biases=biases)), pre_logits=True)

    def pool(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, N, D)`` -> ``(B, D)``: the [CLS] token, the mean of the patch tokens or
        the MAP head over them (prefix tokens left out unless ``pool_include_prefix``);
        ``""`` = no pool."""
        pool = self.config.global_pool
        if pool == "token":
            return x[:, 0]
        if pool not in ("avg", "map"):
            return x
        if not self.config.pool_include_prefix:
            x = x[:, self.num_prefix_tokens :]
        return x.mean(dim=1) if pool == "avg" else self.attn_pool(x)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """``(B, N, D)`` tokens -> ``(B, K)`` logits (or ``(B, D)`` with ``pre_logits``).

        With a distillation token: the mean of ``head([CLS])`` and ``head_dist([DIST])``
        (timm's inference output; ``pre_logits``: the mean of the two tokens)."""
        if self.head_dist is not None:
            x, x_dist = self.head_drop(x[:, 0]), self.head_drop(x[:, 1])
            if pre_logits:
                return (x + x_dist) / 2
            return (self.head(x) + self.head_dist(x_dist)) / 2
        x = self.head_drop(self.pre_logits(self.fc_norm(self.pool(x))))
        return x if pre_logits else self.head(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, C, H, W)`` -> ``(B, K)`` logits."""
        if self.head_dist is not None:
            return self.forward_head(self.forward_features(x))
        return self.head(self.forward_pre_logits(x))

    @torch.no_grad()
    def get_attention_maps(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Per-layer attention weights for visualisation: ``depth`` tensors ``(B, Hd, N, N)``.

        Row ``i`` of layer ``l`` is the softmax distribution of query token ``i`` over all
        keys. The first ``num_prefix_tokens`` tokens are [CLS], [DIST] and the registers
        (those the model has, in that order); the rest are patches in row-major order on
        the ``gh x gw`` grid. Computed with attn_core's ``math`` backend, the one that
        returns weights.
        """
        maps, rotary = [], self.rotary(x.shape[-2:])
        biases = self.rel_pos_bias(x.shape[-2:]) or [None] * len(self.blocks)
        x = self._embed(x)
        for blk, bias in zip(self.blocks, biases, strict=True):
            x, weights = blk(x, attn_mask=bias, need_weights=True, rotary=rotary)
            maps.append(weights)
        return maps
