"""Why did CLIP match this image to that text? Relevancy heatmaps for the image tower.

Shape legend: ``B`` images, ``Hd`` heads, ``N = P + L`` tokens (``P`` prefix tokens, the
[CLS] token; ``L = gh * gw`` patches), ``E`` joint embedding width, ``H`` / ``W`` pixels.

Two read-outs, both over every block of the vision ViT:

* ``"relevancy"`` (default) -- gradient-weighted attention relevancy (Chefer, Gur & Wolf,
  "Generic Attention-model Explainability for Interpreting Bi-Modal and Encoder-Decoder
  Transformers", ICCV 2021). The score is the cosine similarity between the image
  embedding and a target embedding (a caption's, or a zero-shot classifier column). For
  each block, ``A_bar = mean_heads(relu(dS/dA * A))`` keeps the attention that *raised*
  the score, and the relevancy matrix accumulates along the residual stream:
  ``R <- R + A_bar @ R`` starting from ``R = I``. The pooled token's row of ``R`` over
  the patches is the map. It depends on the text: "a dog" and "a cat" light up
  different regions of the same photo.
* ``"rollout"`` -- attention rollout (Abnar & Zuidema 2020, see
  :func:`attn_vision.visualize.attention_rollout`): how much each patch flows into the
  pooled token. It ignores the text.

Without a [CLS] token (mean pooling, SigLIP's MAP head) the mean of all token rows of
``R`` stands for the pooled token.

:func:`heatmap_overlay` draws a ``(gh, gw)`` map over the *original* image (same size as
the input), mapping it through the model's preprocessing (center crop, padding or
squash); the parts of the image the model never saw (cropped away) are dimmed.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from attn_vision.patch_embed import to_2tuple
from PIL import Image, ImageOps

from .config import PreprocessConfig
from .model import CLIP

__all__ = [
    "explain_image",
    "heatmap_overlay",
    "image_features_with_attention",
    "image_relevancy",
    "input_box",
    "save_explanation",
]

METHODS = ("relevancy", "rollout")


def _vit_trunk(model: CLIP) -> torch.nn.Module:
    """The ViT trunk whose attention is read; ``ValueError`` for ConvNeXt / ResNet towers."""
    tower = model.config.vision.tower
    if tower != "vit":
        raise ValueError(
            f"relevancy heatmaps read a ViT image tower's attention; this model's image "
            f"tower is a {'ConvNeXt' if tower == 'convnext' else 'ResNet'}"
        )
    return model.visual.trunk


def _pooled_rows(R: torch.Tensor, num_prefix: int, pooled_by_token: bool) -> torch.Tensor:
    """``(B, N, N)`` token-to-input relevance -> ``(B, L)`` relevance of each patch."""
    rows = R[:, 0] if pooled_by_token and num_prefix else R[:, num_prefix:].mean(dim=1)
    return rows[:, num_prefix:]


def image_features_with_attention(
    model: CLIP, images: torch.Tensor
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """``encode_image`` block by block: ``(B, E)`` embeddings (not normalized) and every
    block's attention weights ``(B, Hd, N, N)``, all in the autograd graph (the input
    tokens are a leaf that requires grad, so this works for frozen models too)."""
    trunk = _vit_trunk(model)
    images = model.visual.prepare(images)
    rotary = trunk.rotary(images.shape[-2:])  # 2D RoPE (EVA02), or None
    x = trunk._embed(images)  # (B, N, D)
    x = x.detach().requires_grad_(torch.is_grad_enabled())
    maps = []
    for blk in trunk.blocks:
        x, weights = blk(x, need_weights=True, rotary=rotary)  # weights (B, Hd, N, N)
        maps.append(weights)
    pooled = trunk.forward_head(trunk.norm(x), pre_logits=True)  # (B, D)
    return model.visual.project(pooled), maps


def image_relevancy(
    model: CLIP,
    images: torch.Tensor,
    target: torch.Tensor | None = None,
    *,
    method: str = "relevancy",
    start_layer: int = 0,
) -> torch.Tensor:
    """Patch relevance ``(B, gh, gw)`` in ``[0, 1]`` for preprocessed ``(B, 3, H, W)`` images.

    Args:
        model: an attn_clip :class:`CLIP` (any ViT vision tower).
        images: preprocessed images, as ``encode_image`` takes them.
        target: ``(E,)`` or ``(B, E)`` embeddings to explain the similarity to (a caption's
            ``encode_text`` output or a zero-shot classifier column); needed by
            ``"relevancy"``, ignored by ``"rollout"``.
        method: ``"relevancy"`` (Chefer et al., text-specific) or ``"rollout"``.
        start_layer: first block whose attention enters the map (``0`` = all blocks;
            ``-1`` = only the last one, as Chefer et al.'s CLIP notebook does).
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    trunk = _vit_trunk(model)
    images = model.visual.prepare(images)  # (the weights' dtype, whole patches)
    B, _, H, W = images.shape
    ph, pw = trunk.patch_embed.patch_size
    gh, gw = H // ph, W // pw
    P = trunk.num_prefix_tokens
    pooled_by_token = trunk.config.global_pool == "token"
    first = start_layer % len(trunk.blocks)

    if method == "rollout":
        from attn_vision.visualize import attention_rollout

        maps = trunk.get_attention_maps(images)[first:]
        rel = _pooled_rows(attention_rollout(maps), P, pooled_by_token)
    else:
        if target is None:
            raise ValueError("method='relevancy' needs a target embedding (E,) or (B, E)")
        target = target.to(images.device, torch.float32)
        target = target.expand(B, -1) if target.ndim == 1 else target
        with torch.enable_grad():
            emb, maps = image_features_with_attention(model, images)
            emb = F.normalize(emb.float(), dim=-1)  # (B, E)
            score = (emb * F.normalize(target, dim=-1)).sum()  # images are independent
            grads = torch.autograd.grad(score, maps[first:])
        N = maps[0].shape[-1]
        R = torch.eye(N, device=images.device).expand(B, N, N).clone()  # (B, N, N)
        for attn, grad in zip(maps[first:], grads, strict=True):
            cam = (grad.float() * attn.detach().float()).clamp(min=0).mean(dim=1)  # (B, N, N)
            R = R + cam @ R
        rel = _pooled_rows(R, P, pooled_by_token)
    rel = rel.reshape(B, gh, gw).float()
    lo = rel.amin(dim=(1, 2), keepdim=True)
    hi = rel.amax(dim=(1, 2), keepdim=True)
    return ((rel - lo) / (hi - lo).clamp_min(1e-12)).detach()


def input_box(
    image_size: tuple[int, int], cfg: PreprocessConfig
) -> tuple[float, float, float, float]:
    """The ``(left, top, right, bottom)`` region of a ``(width, height)`` image that the
    model input covers after :func:`attn_clip.image_transform` (inference) with ``cfg``.

    ``shortest``: a centered crop (inside the image); ``longest``: the padded input
    (extends past the image); ``squash``: the whole image.
    """
    w, h = image_size
    th, tw = to_2tuple(cfg.size)
    if cfg.resize_mode == "squash":
        return 0.0, 0.0, float(w), float(h)
    pick = max if cfg.resize_mode == "shortest" else min
    scale = pick(th / h, tw / w)  # original pixels -> model-input pixels
    bw, bh = tw / scale, th / scale
    left, top = (w - bw) / 2, (h - bh) / 2
    return left, top, left + bw, top + bh


def heatmap_overlay(
    image: Image.Image,
    heat: torch.Tensor | np.ndarray,
    cfg: PreprocessConfig | None = None,
    *,
    alpha: float = 0.6,
) -> Image.Image:
    """Blend a ``(gh, gw)`` map in ``[0, 1]`` over ``image``; returns RGB of the same size.

    The map is placed where the model input came from (:func:`input_box` of ``cfg``;
    default: the whole image) and drawn with the "jet" colormap, with opacity from
    ``alpha / 4`` (relevance 0) to ``alpha`` (relevance 1); pixels the model did not see
    are dimmed.
    """
    from attn_vision.visualize import apply_colormap

    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    base = np.asarray(image.convert("RGB"), dtype=np.float32)  # (H, W, 3)
    h, w = base.shape[:2]
    left, top, right, bottom = input_box((w, h), cfg) if cfg else (0.0, 0.0, w, h)
    x0, y0 = round(left), round(top)
    bw, bh = max(round(right) - x0, 1), max(round(bottom) - y0, 1)
    heat = torch.as_tensor(np.asarray(heat, dtype=np.float32))
    # upsample to the covered box, then cut out the part that lies on the image
    up = F.interpolate(heat[None, None], size=(bh, bw), mode="bilinear", align_corners=False)
    up = up[0, 0].clamp(0, 1).numpy()  # (bh, bw)
    canvas = np.zeros((h, w), dtype=np.float32)
    seen = np.zeros((h, w), dtype=bool)
    sx, sy = max(-x0, 0), max(-y0, 0)  # offsets into the box where the image starts
    ix, iy = max(x0, 0), max(y0, 0)
    cw, ch = min(bw - sx, w - ix), min(bh - sy, h - iy)
    canvas[iy : iy + ch, ix : ix + cw] = up[sy : sy + ch, sx : sx + cw]
    seen[iy : iy + ch, ix : ix + cw] = True
    colored = apply_colormap(canvas).astype(np.float32)
    a = (alpha * (0.25 + 0.75 * canvas))[..., None]  # hot regions opaque, cold ones see-through
    out = np.where(seen[..., None], (1 - a) * base + a * colored, 0.4 * base)
    return Image.fromarray(out.round().clip(0, 255).astype(np.uint8))


def explain_image(
    model: CLIP,
    image: Image.Image,
    target: torch.Tensor | str | None = None,
    *,
    method: str = "relevancy",
    transform: Callable[[Image.Image], torch.Tensor] | None = None,
    tokenizer: Callable[[list[str]], torch.Tensor] | None = None,
    alpha: float = 0.6,
    start_layer: int = 0,
    max_size: int | None = 1024,
) -> Image.Image:
    """The heatmap of ``target`` (a caption, or an ``(E,)`` embedding) over ``image``.

    Returns an RGB image of the size of ``image``, scaled down (aspect kept) to fit in
    ``max_size`` x ``max_size`` when larger (None: never): the overlay is drawn on that
    display copy, so its memory does not grow with the photo. ``transform`` / ``tokenizer``
    default to the model's own (:func:`attn_clip.image_transform`, :func:`get_tokenizer`).
    """
    from .tokenizer import get_tokenizer
    from .transforms import image_transform

    _vit_trunk(model)
    device = model.logit_scale.device
    transform = transform or image_transform(model.preprocess_cfg)
    x = transform(image.convert("RGB"))[None].to(device)  # (1, 3, H, W)
    if isinstance(target, str):
        tokenizer = tokenizer or get_tokenizer(model.config)
        with torch.no_grad():
            target = model.encode_text(tokenizer([target]).to(device))[0]  # (E,)
    heat = image_relevancy(model, x, target, method=method, start_layer=start_layer)
    if max_size is not None and max(image.size) > max_size:  # input_box is scale-invariant
        image = ImageOps.contain(image, (max_size, max_size))
    return heatmap_overlay(image, heat[0].cpu(), model.preprocess_cfg, alpha=alpha)


def save_explanation(
    model: CLIP,
    image: Image.Image,
    target: torch.Tensor | str | None,
    path: str | os.PathLike,
    **kwargs,
) -> Image.Image:
    """:func:`explain_image` written to ``path`` as a PNG (``kwargs`` are passed on)."""
    out = explain_image(model, image, target, **kwargs)
    out.save(path, format="PNG")
    return out
