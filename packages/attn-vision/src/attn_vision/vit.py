"""Vision Transformer (Dosovitskiy et al. 2020), built from attn_core blocks.

Shape legend: ``B`` batch, ``C`` channels, ``H`` / ``W`` image size, ``p`` patch size,
``gh, gw`` patch grid, ``L = gh * gw`` patches, ``P`` prefix tokens (1 with a class
token, else 0), ``N = P + L`` tokens, ``D`` embed dim, ``Hd`` heads, ``K`` classes.

Inference fast path: under ``torch.no_grad()`` / ``torch.inference_mode()`` in eval mode on
CPU (fp32 / bf16), :func:`inference_block_forward` runs each block with oneDNN's linear
kernel (bias and GELU / ReLU / SiLU fused into the matrix product) instead of ``F.linear``
(MKL), on the very same parameters (nothing is cached or copied); the patch embedding is
the same kernel on flattened patches; :meth:`VisionTransformer.forward_pre_logits`
computes only the [CLS] row in the last block when that is all the pooling reads. The
results equal the plain path to float rounding; ``model.fast_inference = False`` turns
it off.

Parameter names are timm's (``cls_token``, ``pos_embed``, ``patch_embed.proj``,
``norm_pre``, ``blocks.{i}.norm1`` / ``attn.qkv`` / ``attn.proj`` / ``norm2`` /
``mlp.fc1`` / ``mlp.fc2``, ``norm``, ``fc_norm``, ``head``), so timm checkpoints load
with a near-identity converter (:func:`attn_vision.convert.convert_timm_vit`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from attn_core import LayerScale, QuickGELU, TransformerBlock, attention
from torch import nn

from .patch_embed import PatchEmbed, resample_abs_pos_embed, to_2tuple

__all__ = [
    "ViTConfig",
    "VisionTransformer",
    "fast_block_supported",
    "fast_inference_available",
    "fused_linear",
    "inference_block_forward",
]

# ---------------------------------------------------------------------------------------
# Inference fast path (no autograd): oneDNN linear kernels with fused epilogues.
# ---------------------------------------------------------------------------------------

_ONEDNN = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


if _ONEDNN and hasattr(torch.library, "custom_op"):
    # The same kernel as an opaque op for torch.compile: Inductor cannot lower
    # mkldnn._linear_pointwise with non-constant weights, but it fuses everything around
    # a custom op (and would otherwise pick MKL's sgemm, slower here).
    @torch.library.custom_op("attn_vision::onednn_linear", mutates_args=())
    def _onednn_linear_op(
        x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, attr: str, alg: str
    ) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, attr, [], alg)

    @_onednn_linear_op.register_fake
    def _(x, weight, bias, attr, alg):
        return x.new_empty(x.shape[:-1] + weight.shape[:1])
else:
    _onednn_linear_op = None


def fast_inference_available(x: torch.Tensor) -> bool:
    """Whether :func:`inference_block_forward` can run on ``x``: CPU fp32 / bf16 and no
    autograd graph being recorded (inside ``torch.compile`` only with the custom op)."""
    return (
        _ONEDNN
        and x.device.type == "cpu"
        and x.dtype in (torch.float32, torch.bfloat16)
        and not torch.is_grad_enabled()
        and (_onednn_linear_op is not None or not torch.compiler.is_compiling())
    )


def _onednn_act(act: nn.Module) -> tuple[str, str] | None:
    """oneDNN post-op ``(attr, algorithm)`` computing ``act`` exactly, or None."""
    if type(act) is nn.GELU:
        return "gelu", act.approximate  # "none" (erf) or "tanh"
    if type(act) is nn.ReLU:
        return "relu", ""
    if type(act) is nn.SiLU:
        return "swish", ""
    return None


def _linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, act: nn.Module | None
) -> torch.Tensor:
    fused = _onednn_act(act) if act is not None else ("none", "")
    if fast_inference_available(x) and weight.dtype == x.dtype and fused is not None:
        if torch.compiler.is_compiling():
            return _onednn_linear_op(x, weight, bias, fused[0], fused[1])
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, fused[0], [], fused[1])
    out = F.linear(x, weight, bias)
    return act(out) if act is not None else out


def fused_linear(
    linear: nn.Linear,
    x: torch.Tensor,
    *,
    act: nn.Module | None = None,
    residual: torch.Tensor | None = None,
) -> torch.Tensor:
    """``act(linear(x)) (+ residual)``, for inference (no autograd).

    On CPU this is one oneDNN call with the bias and activation fused: oneDNN reads the
    ordinary ``(out, in)`` weight as it is (no packed copy that could go stale), and on
    x86 its kernels beat ``F.linear``'s MKL sgemm at every size a ViT uses. Falls back
    to plain PyTorch ops elsewhere.
    """
    out = _linear(x, linear.weight, linear.bias, act)
    # (oneDNN's fused "add" epilogue measured slower than this in-place add)
    return out if residual is None else out.add_(residual)


def _quick_gelu_(x: torch.Tensor) -> torch.Tensor:
    return x.mul_(torch.sigmoid(1.702 * x))  # QuickGELU in place: x * sigmoid(1.702 x)


def fast_block_supported(blk: nn.Module) -> bool:
    """Whether :func:`inference_block_forward` runs ``blk`` itself (rather than ``blk(x)``):
    a pre-norm self-attention :class:`TransformerBlock` with plain ``nn.Linear`` layers (not,
    e.g., dynamically quantized ones), a fused ``qkv``, no RoPE and no gated MLP."""
    if not isinstance(blk, TransformerBlock):
        return False
    attn = blk.attn
    linears = (getattr(attn, "qkv", None), attn.proj, blk.mlp.fc1, blk.mlp.fc2)
    return (
        all(type(m) is nn.Linear for m in linears)
        and blk.norm_first
        and blk.cross_attn is None
        and attn.fused_qkv
        and attn.rope is None
        and not blk.mlp.gated
        and isinstance(blk.ls1, (nn.Identity, LayerScale))
        and isinstance(blk.ls2, (nn.Identity, LayerScale))
    )


def inference_block_forward(
    blk: TransformerBlock,
    x: torch.Tensor,
    *,
    is_causal: bool = False,
    rows: torch.Tensor | None = None,
    attn_mask: torch.Tensor | None = None,
    prefix: tuple[torch.Tensor, torch.Tensor] | None = None,
    keep_kv: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
) -> torch.Tensor:
    """A pre-norm self-attention :class:`TransformerBlock` in eval mode, without autograd.

    Args:
        x: ``(B, N, D)`` tokens.
        is_causal: causal self-attention (ignored when ``attn_mask`` is given).
        rows: ``(B,)``: compute the output only at token ``rows[b]`` of each sequence,
            ``(B, 1, D)`` -- keys and values still come from all tokens (with
            ``is_causal``, only tokens ``<= rows[b]``), so the result equals row
            ``rows[b]`` of the full block. What the last block of a model that pools one
            token (ViT's [CLS], CLIP text's EOT) needs.
        attn_mask: bool ``(B, 1, N, P + N)`` "may attend" mask over the prefix and own keys.
        prefix: ``(k, v)``, each ``(B, Hkv, P, hd)``: keys / values of ``P`` earlier
            tokens (already through this block's projections), attended before ``x``'s own.
        keep_kv: a list that receives this block's own ``(k, v)`` (for later ``prefix``).

    Blocks with cross-attention, RoPE, post-norm or a gated MLP fall back to ``blk(x)``
    (without ``prefix`` / ``keep_kv``). Call under ``torch.no_grad()``.
    """
    if not fast_block_supported(blk):
        if prefix is not None or keep_kv is not None:
            raise ValueError("prefix / keep_kv need a plain pre-norm self-attention block")
        out = blk(x, is_causal=is_causal, attn_mask=attn_mask)
        return out if rows is None else out[torch.arange(x.shape[0]), rows][:, None]
    attn = blk.attn
    B, N, D = x.shape
    H, Hkv, hd = attn.num_heads, attn.num_kv_heads, attn.head_dim
    qkv = fused_linear(attn.qkv, blk.norm1(x))  # (B, N, (H + 2 Hkv) hd)
    q, k, v = qkv.split((H * hd, Hkv * hd, Hkv * hd), dim=-1)
    k = attn.k_norm(k.view(B, N, Hkv, hd).transpose(1, 2))  # (B, Hkv, N, hd)
    v = v.view(B, N, Hkv, hd).transpose(1, 2)
    if keep_kv is not None:
        keep_kv.append((k, v))
    if prefix is not None:
        k, v = torch.cat((prefix[0], k), dim=2), torch.cat((prefix[1], v), dim=2)
    mask = attn_mask
    if mask is not None:
        is_causal = False
    if rows is not None:
        batch = torch.arange(B, device=x.device)
        q, x = q[batch, rows][:, None], x[batch, rows][:, None]  # (B, 1, H hd), (B, 1, D)
        if mask is not None:
            mask = mask[batch, :, rows][:, :, None]  # (B, 1, 1, P + N)
        elif is_causal:  # the kept query (own position rows[b]) sees keys <= rows[b] + P
            P = k.shape[2] - N
            mask = torch.arange(k.shape[2], device=x.device) <= rows[:, None] + P
            mask = mask[:, None, None, :]  # (B, 1, 1, P + N)
        is_causal = False
    Lq = q.shape[1]
    q = attn.q_norm(q.view(B, Lq, H, hd).transpose(1, 2))  # (B, H, Lq, hd)
    o = attention(q, k, v, attn_mask=mask, is_causal=is_causal, backend=attn.backend)
    o = o.transpose(1, 2).reshape(B, Lq, H * hd)  # (B, Lq, E)
    if isinstance(blk.ls1, LayerScale):
        x = x + blk.ls1(fused_linear(attn.proj, o))
    else:
        x = fused_linear(attn.proj, o, residual=x)

    mlp = blk.mlp
    h = blk.norm2(x)
    if isinstance(mlp.act, QuickGELU):
        h = _quick_gelu_(fused_linear(mlp.fc1, h))
    else:
        h = fused_linear(mlp.fc1, h, act=mlp.act)
    if isinstance(blk.ls2, LayerScale):
        return x + blk.ls2(fused_linear(mlp.fc2, h))
    return fused_linear(mlp.fc2, h, residual=x)


@dataclass
class ViTConfig:
    """Architecture of a :class:`VisionTransformer` (field names follow timm's kwargs)."""

    img_size: int | tuple[int, int] = 224  # image size the position embedding is laid out for
    patch_size: int = 16  # side of the square patches
    in_chans: int = 3  # input image channels
    num_classes: int = 1000  # classifier outputs; 0 = no head (forward returns pooled features)
    global_pool: str = "token"  # "token" (class token), "avg" (mean of patch tokens) or ""
    embed_dim: int = 768  # token width D
    depth: int = 12  # transformer blocks
    num_heads: int = 12  # attention heads per block
    mlp_ratio: float = 4.0  # MLP hidden width = mlp_ratio * D
    qkv_bias: bool = True  # biases in the attention projections
    class_token: bool = True  # prepend a learned [CLS] token
    no_embed_class: bool = False  # position embedding covers only the patches (DeiT-3 style)
    pre_norm: bool = False  # LayerNorm before the blocks (CLIP's ln_pre; timm's norm_pre)
    patch_bias: bool | None = None  # bias in the patch projection; None = not pre_norm (timm)
    final_norm: bool = True  # LayerNorm after the blocks
    fc_norm: bool | None = None  # norm after pooling instead of before; None = (pool == "avg")
    norm_eps: float = 1e-6  # LayerNorm epsilon (1e-6 for timm ViTs, 1e-5 for CLIP towers)
    act: str = "gelu"  # MLP activation: "gelu", "quick_gelu" (OpenAI CLIP), ...
    init_values: float | None = None  # LayerScale init; None = no layer scale
    dynamic_img_size: bool = True  # accept any size divisible by the patch (pos-embed resampled)
    drop_rate: float = 0.0  # dropout before the classifier
    pos_drop_rate: float = 0.0  # dropout after adding the position embedding
    proj_drop_rate: float = 0.0  # dropout on each block's branch outputs
    attn_drop_rate: float = 0.0  # dropout on the attention weights
    drop_path_rate: float = 0.0  # stochastic depth, linearly increasing to this value

    def __post_init__(self) -> None:
        if self.global_pool not in ("token", "avg", ""):
            raise ValueError(f"global_pool must be 'token', 'avg' or '', got {self.global_pool!r}")
        if self.global_pool == "token" and not self.class_token:
            raise ValueError("global_pool='token' needs class_token=True")
        if self.embed_dim % self.num_heads:
            raise ValueError(
                f"embed_dim ({self.embed_dim}) must be divisible by num_heads ({self.num_heads})"
            )

    @property
    def num_prefix_tokens(self) -> int:
        return 1 if self.class_token else 0

    @property
    def grid_size(self) -> tuple[int, int]:
        h, w = to_2tuple(self.img_size)
        p = self.patch_size
        return h // p, w // p


class VisionTransformer(nn.Module):
    """ViT: patch embedding, [CLS] + position embedding, pre-norm blocks, pool, head.

    Build from a config (or its fields as keyword arguments). ``weight_init=False`` skips
    the random init, for weights that are loaded right after.
    """

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
        self.grad_checkpointing = False
        self.fast_inference = True  # see inference_block_forward; False = plain blocks

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
        embed_len = num_patches if c.no_embed_class else num_patches + self.num_prefix_tokens
        self.pos_embed = nn.Parameter(torch.zeros(1, embed_len, D))
        self.pos_drop = nn.Dropout(c.pos_drop_rate)
        self.norm_pre = norm_layer(D) if c.pre_norm else nn.Identity()

        dpr = torch.linspace(0, c.drop_path_rate, c.depth, device="cpu").tolist()
        self.blocks = nn.Sequential(
            *[
                TransformerBlock(
                    D,
                    c.num_heads,
                    c.mlp_ratio,
                    bias=c.qkv_bias,
                    act=c.act,
                    dropout=c.proj_drop_rate,
                    attn_dropout=c.attn_drop_rate,
                    drop_path=dpr[i],
                    layer_scale=c.init_values,
                    norm_layer=norm_layer,
                )
                for i in range(c.depth)
            ]
        )
        self.norm = norm_layer(D) if c.final_norm and not use_fc_norm else nn.Identity()
        self.fc_norm = norm_layer(D) if c.final_norm and use_fc_norm else nn.Identity()
        self.head_drop = nn.Dropout(c.drop_rate)
        self.head = nn.Linear(D, c.num_classes) if c.num_classes > 0 else nn.Identity()
        if weight_init:  # skipped when weights are about to be loaded anyway
            self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """timm's default init: truncated normal (std 0.02) Linear / pos-embed, tiny [CLS]."""
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        if self.cls_token is not None:
            nn.init.normal_(self.cls_token, std=1e-6)
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
        """Replace the head with a fresh ``num_classes``-way Linear (0 = no head)."""
        if global_pool is not None:
            if global_pool not in ("token", "avg", ""):
                raise ValueError(f"global_pool must be 'token', 'avg' or '', got {global_pool!r}")
            if global_pool == "token" and self.cls_token is None:
                raise ValueError("global_pool='token' needs a class token")
            self.config.global_pool = global_pool
        self.num_classes = self.config.num_classes = num_classes
        ref = self.pos_embed
        self.head = (
            nn.Linear(self.num_features, num_classes).to(ref.device, ref.dtype)
            if num_classes > 0
            else nn.Identity()
        )

    def _pos_embed(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, gh, gw, D)`` patch tokens -> ``(B, N, D)`` with [CLS] and positions added."""
        B, gh, gw, D = x.shape
        pos_embed = resample_abs_pos_embed(  # a no-op at the trained grid size
            self.pos_embed,
            (gh, gw),
            self.patch_embed.grid_size,
            num_prefix_tokens=0 if self.config.no_embed_class else self.num_prefix_tokens,
        )
        x = x.reshape(B, gh * gw, D)  # (B, L, D)
        cls = [self.cls_token.expand(B, -1, -1)] if self.cls_token is not None else []
        if self.config.no_embed_class:
            x = torch.cat(cls + [x + pos_embed], dim=1)
        else:
            x = torch.cat(cls + [x], dim=1) + pos_embed
        return self.pos_drop(x)  # (B, N, D)

    def _patchify(self, x: torch.Tensor) -> torch.Tensor:
        """The patch embedding as one matrix product on flattened patches (fast path):
        ``(B, C, H, W)`` -> ``(B, gh, gw, D)``, equal to the strided convolution."""
        pe = self.patch_embed
        pe.check_input(x)
        B, C, H, W = x.shape
        (ph, pw), (gh, gw) = pe.patch_size, (H // pe.patch_size[0], W // pe.patch_size[1])
        x = x.reshape(B, C, gh, ph, gw, pw).permute(0, 2, 4, 1, 3, 5)  # (B, gh, gw, C, ph, pw)
        x = x.reshape(B, gh, gw, C * ph * pw)
        weight = pe.proj.weight.reshape(pe.proj.out_channels, -1)  # (D, C ph pw)
        return pe.norm(_linear(x, weight, pe.proj.bias, None))

    def _embed(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, C, H, W)`` image -> ``(B, N, D)`` tokens entering the first block."""
        pe = self.patch_embed
        if (
            self._fast(x)
            and type(pe) is PatchEmbed
            and pe.output_fmt == "NHWC"
            and pe.proj.kernel_size == pe.proj.stride == pe.patch_size
            and pe.proj.padding == (0, 0)
            and pe.proj.groups == 1
        ):
            x = self._patchify(x)
        else:
            x = pe(x)
        return self.norm_pre(self._pos_embed(x))

    def _fast(self, x: torch.Tensor) -> bool:
        return self.fast_inference and not self.training and fast_inference_available(x)

    def _blocks(self, x: torch.Tensor, last_rows: torch.Tensor | None = None) -> torch.Tensor:
        """Run the blocks on ``(B, N, D)`` tokens; ``last_rows`` ``(B,)`` keeps one token per
        image in the last block (fast path only) -> ``(B, 1, D)``."""
        if self._fast(x):
            for i, blk in enumerate(self.blocks):
                last = i == len(self.blocks) - 1
                x = inference_block_forward(blk, x, rows=last_rows if last else None)
            return x
        for blk in self.blocks:
            if self.grad_checkpointing and torch.is_grad_enabled():
                x = torch.utils.checkpoint.checkpoint(blk, x, use_reentrant=False)
            else:
                x = blk(x)
        return x if last_rows is None else x[torch.arange(x.shape[0]), last_rows][:, None]

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, C, H, W)`` -> ``(B, N, D)`` final (normed) tokens."""
        return self.norm(self._blocks(self._embed(x)))

    def forward_pre_logits(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, C, H, W)`` -> ``(B, D)`` pooled features before the head; equals
        ``forward_head(forward_features(x), pre_logits=True)``. With [CLS] pooling the
        fast inference path computes only the [CLS] row in the last block."""
        x = self._embed(x)
        if self.config.global_pool == "token" and len(self.blocks) and self._fast(x):
            zeros = torch.zeros(x.shape[0], dtype=torch.long, device=x.device)
            cls = self.norm(self._blocks(x, last_rows=zeros))  # (B, 1, D)
            return self.head_drop(self.fc_norm(cls[:, 0]))
        return self.forward_head(self.norm(self._blocks(x)), pre_logits=True)

    def pool(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, N, D)`` -> ``(B, D)`` ([CLS] token or mean of patch tokens); ``""`` = no pool."""
        if self.config.global_pool == "token":
            return x[:, 0]
        if self.config.global_pool == "avg":
            return x[:, self.num_prefix_tokens :].mean(dim=1)
        return x

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """``(B, N, D)`` tokens -> ``(B, K)`` logits (or ``(B, D)`` with ``pre_logits``)."""
        x = self.head_drop(self.fc_norm(self.pool(x)))
        return x if pre_logits else self.head(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, C, H, W)`` -> ``(B, K)`` logits."""
        return self.head(self.forward_pre_logits(x))

    @torch.no_grad()
    def get_attention_maps(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Per-layer attention weights for visualisation: ``depth`` tensors ``(B, Hd, N, N)``.

        Row ``i`` of layer ``l`` is the softmax distribution of query token ``i`` over all
        keys (token 0 is [CLS] when there is one; the rest are patches in row-major
        order on the ``gh x gw`` grid). Computed with attn_core's ``math`` backend, the
        one that returns weights.
        """
        maps = []
        x = self._embed(x)
        for blk in self.blocks:
            x, weights = blk(x, need_weights=True)
            maps.append(weights)
        return maps
