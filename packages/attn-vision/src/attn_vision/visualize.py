"""Where does a ViT look? Attention maps as a heatmap over the input image.

Shape legend: ``B`` batch, ``Hd`` heads, ``N = P + L`` tokens (``P`` prefix tokens:
[CLS], DeiT's [DIST], registers; ``L = gh * gw`` patches), ``H`` / ``W`` image size in pixels.

Two standard read-outs of :meth:`VisionTransformer.get_attention_maps`:

* **attention rollout** (Abnar & Zuidema 2020): average the heads, add the identity
  for the residual connection, renormalise, and multiply the layers together -- how
  much each input patch flows into the [CLS] token through the whole network.
* **last-layer [CLS] attention**: the [CLS] query's weights over the patches in the
  final block (averaged over heads), sharper but one layer only.

:func:`save_attention_heatmap` draws either over the image with PIL and a small
built-in colormap (no matplotlib).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

__all__ = [
    "apply_colormap",
    "attention_heatmap",
    "attention_rollout",
    "cls_attention",
    "save_attention_heatmap",
]

# "jet": dark blue -> blue -> cyan -> yellow -> red -> dark red
_JET = (
    (0.0, (0.0, 0.0, 0.5)),
    (0.125, (0.0, 0.0, 1.0)),
    (0.375, (0.0, 1.0, 1.0)),
    (0.625, (1.0, 1.0, 0.0)),
    (0.875, (1.0, 0.0, 0.0)),
    (1.0, (0.5, 0.0, 0.0)),
)


def attention_rollout(maps: Sequence[torch.Tensor], discard_ratio: float = 0.0) -> torch.Tensor:
    """Attention rollout: ``depth`` maps ``(B, Hd, N, N)`` -> ``(B, N, N)`` token-to-input flow.

    ``discard_ratio`` zeroes that fraction of the weakest weights per layer (not the
    diagonal) before renormalising, which sharpens the result.
    """
    result = None
    for attn in maps:
        a = attn.float().mean(dim=1)  # (B, N, N) heads fused by averaging
        if discard_ratio > 0:
            B, N, _ = a.shape
            flat = a.reshape(B, -1)
            k = int(flat.shape[1] * discard_ratio)
            if k:
                idx = flat.topk(k, dim=-1, largest=False).indices
                flat = flat.scatter(1, idx, 0.0)
            a = flat.view(B, N, N)
        eye = torch.eye(a.shape[-1], device=a.device, dtype=a.dtype)
        a = 0.5 * a + 0.5 * eye  # the residual path carries half of each token through
        a = a / a.sum(dim=-1, keepdim=True)
        result = a if result is None else a @ result
    if result is None:
        raise ValueError("attention_rollout needs at least one attention map")
    return result


def cls_attention(maps: Sequence[torch.Tensor], layer: int = -1) -> torch.Tensor:
    """Query-0 ([CLS]) attention of one layer, averaged over heads: ``(B, N)``."""
    return maps[layer][:, :, 0, :].float().mean(dim=1)


def attention_heatmap(
    model: torch.nn.Module, x: torch.Tensor, method: str = "rollout", **kwargs
) -> torch.Tensor:
    """``(B, C, H, W)`` model input -> ``(B, gh, gw)`` patch relevance scaled to ``[0, 1]``.

    ``method``: ``"rollout"`` or ``"cls"`` (last-layer [CLS] attention). Models without
    a class token (GAP, MAP / SigLIP, register-only) use the mean over the patch queries
    instead of the [CLS] row. The ``P`` prefix tokens' columns ([CLS], [DIST], registers)
    are dropped: the map covers the patches only.
    """
    if not hasattr(model, "get_attention_maps"):
        raise TypeError(f"{type(model).__name__} has no get_attention_maps(); use a ViT")
    maps = model.get_attention_maps(x)
    P = model.num_prefix_tokens
    has_cls = getattr(model, "cls_token", None) is not None  # token 0 is [CLS]
    gh, gw = (
        x.shape[-2] // model.patch_embed.patch_size[0],
        x.shape[-1] // model.patch_embed.patch_size[1],
    )
    if method == "rollout":
        flow = attention_rollout(maps, **kwargs)  # (B, N, N)
        rel = flow[:, 0] if has_cls else flow[:, P:].mean(dim=1)  # (B, N)
    elif method == "cls":
        if has_cls:
            rel = cls_attention(maps, **kwargs)  # (B, N)
        else:
            rel = maps[kwargs.get("layer", -1)][:, :, P:].float().mean(dim=(1, 2))  # (B, N)
    else:
        raise ValueError(f"method must be 'rollout' or 'cls', got {method!r}")
    rel = rel[:, P:].reshape(-1, gh, gw)  # patches only, on the grid
    lo = rel.amin(dim=(1, 2), keepdim=True)
    hi = rel.amax(dim=(1, 2), keepdim=True)
    return (rel - lo) / (hi - lo).clamp_min(1e-12)


def apply_colormap(values: np.ndarray) -> np.ndarray:
    """``(H, W)`` floats in ``[0, 1]`` -> ``(H, W, 3)`` uint8 RGB with the "jet" colormap."""
    v = np.clip(values, 0.0, 1.0)
    stops = np.array([s for s, _ in _JET])
    colors = np.array([c for _, c in _JET])
    rgb = np.stack([np.interp(v, stops, colors[:, i]) for i in range(3)], axis=-1)
    return (rgb * 255).round().astype(np.uint8)


def _to_pil(x: torch.Tensor, mean: Sequence[float], std: Sequence[float]) -> Image.Image:
    """Undo normalisation of a ``(3, H, W)`` tensor and return it as an RGB image."""
    m = torch.tensor(mean).view(-1, 1, 1)
    s = torch.tensor(std).view(-1, 1, 1)
    img = (x.float().cpu() * s + m).clamp(0, 1)
    return Image.fromarray((img.permute(1, 2, 0).numpy() * 255).round().astype(np.uint8))


@torch.no_grad()
def save_attention_heatmap(
    model: torch.nn.Module,
    image: Image.Image | str | os.PathLike,
    path: str | os.PathLike,
    *,
    method: str = "rollout",
    alpha: float = 0.5,
    transform: Callable[[Image.Image], torch.Tensor] | None = None,
    **kwargs,
) -> Image.Image:
    """Save a ViT's attention as a heatmap PNG blended over the image it saw.

    Args:
        model: a :class:`~attn_vision.vit.VisionTransformer` (e.g. from ``create_model``).
        image: a PIL image or a path to one.
        path: where to write the PNG.
        method: ``"rollout"`` (attention rollout, all layers) or ``"cls"`` (last-layer
            [CLS] attention).
        alpha: heatmap opacity (0 = only the image, 1 = only the heatmap).
        transform: preprocessing; default :func:`attn_vision.create_transform` (model).
        **kwargs: passed to the read-out (``discard_ratio=`` for rollout, ``layer=`` for cls).

    Returns the blended image (the model's center-cropped input with the heatmap on top).
    """
    from .images import open_image, to_rgb
    from .transforms import create_transform, resolve_data_config

    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    if not isinstance(image, Image.Image):
        image = open_image(image)  # the one decoder: EXIF rotation, alpha on white
    transform = transform or create_transform(model)
    x = transform(to_rgb(image))[None]  # (1, 3, H, W)
    ref = next(model.parameters())
    was_training = model.training
    model.eval()
    try:
        heat = attention_heatmap(model, x.to(ref.device, ref.dtype), method, **kwargs)
    finally:
        model.train(was_training)
    H, W = x.shape[-2:]
    heat = F.interpolate(heat[:, None], size=(H, W), mode="bilinear", align_corners=False)
    heat_rgb = Image.fromarray(apply_colormap(heat[0, 0].cpu().numpy()))
    cfg = resolve_data_config(model)
    base = _to_pil(x[0], cfg["mean"], cfg["std"])
    out = Image.blend(base, heat_rgb, alpha)
    out.save(path, format="PNG")
    return out
