"""transformers' configs (the ``config.json`` of ``save_pretrained``: ``CLIPConfig``,
``SiglipConfig``, ``Siglip2Config``) -> the fields of a :class:`~attn_clip.config.CLIPConfig`.

Takes the plain dict, so reading a checkpoint does not need transformers.
"""

from __future__ import annotations

import math
from typing import Any

from attn_core.activations import hf_activation

from .tower_config import CLIPTextConfig, CLIPVisionConfig

__all__ = ["from_hf"]

# the transformers ``hidden_act`` names our CLIP / SigLIP towers take (others are refused)
_HF_ACTS = ("gelu", "gelu_pytorch_tanh", "quick_gelu")


def from_hf(cfg: dict[str, Any]) -> dict[str, Any]:
    """The :class:`~attn_clip.config.CLIPConfig` fields of a transformers ``CLIPConfig``,
    ``SiglipConfig`` or ``Siglip2Config`` dict."""
    model_type = cfg.get("model_type", "clip")
    if model_type in ("siglip", "siglip2"):
        return _from_hf_siglip(cfg, model_type)
    if model_type != "clip":
        raise ValueError(
            f"expected a transformers CLIP, SigLIP or SigLIP2 config (model_type 'clip', "
            f"'siglip' or 'siglip2'), got {model_type!r}"
        )
    tc, vc = cfg.get("text_config") or {}, cfg.get("vision_config") or {}
    t_width = tc.get("hidden_size", 512)
    v_width = vc.get("hidden_size", 768)
    v_heads = vc.get("num_attention_heads", 12)
    if v_width % v_heads:
        raise ValueError(f"vision hidden_size {v_width} not divisible by {v_heads} heads")
    eos = tc.get("eos_token_id", 2)
    return dict(
        embed_dim=cfg.get("projection_dim", 512),
        vision=CLIPVisionConfig(
            image_size=vc.get("image_size", 224),
            patch_size=vc.get("patch_size", 32),
            width=v_width,
            layers=vc.get("num_hidden_layers", 12),
            head_width=v_width // v_heads,
            mlp_ratio=_hf_ratio(vc, v_width, 3072),
            act=_hf_act(vc, "vision_config", "quick_gelu"),
            norm_eps=vc.get("layer_norm_eps", 1e-5),
        ),
        text=CLIPTextConfig(
            context_length=tc.get("max_position_embeddings", 77),
            vocab_size=tc.get("vocab_size", 49408),
            width=t_width,
            heads=tc.get("num_attention_heads", 8),
            layers=tc.get("num_hidden_layers", 12),
            mlp_ratio=_hf_ratio(tc, t_width, 2048),
            # transformers: eos_token_id == 2 is the legacy "argmax" pooling
            pool_type="argmax" if eos == 2 else "eos",
            eos_id=eos,
            act=_hf_act(tc, "text_config", "quick_gelu"),
            norm_eps=tc.get("layer_norm_eps", 1e-5),
        ),
        init_logit_scale=cfg.get("logit_scale_init_value", 2.6592),
    )


def _from_hf_siglip(cfg: dict[str, Any], model_type: str) -> dict[str, Any]:
    """transformers ``SiglipModel`` / ``Siglip2Model``: a ViT without class token or
    ``ln_pre`` pooled by a MAP head (its output is the image embedding), and a
    bidirectional text tower pooled at the last position with a biased ``head``.

    SigLIP2's NaFlex image tower takes any patch grid, its ``num_patches`` position
    embeddings resized to each image's; here it is built for the square grid those
    embeddings are laid out for (``sqrt(num_patches) * patch_size`` pixels a side),
    where the resize is the identity.
    """
    tc, vc = cfg.get("text_config") or {}, cfg.get("vision_config") or {}
    if not vc.get("vision_use_head", True):
        raise ValueError("vision_config.vision_use_head=False is not supported (no MAP head)")
    if vc.get("num_channels", 3) != 3:
        raise ValueError(f"vision_config.num_channels must be 3, got {vc['num_channels']}")
    t_width, v_width = tc.get("hidden_size", 768), vc.get("hidden_size", 768)
    embed_dim = tc.get("projection_size") or t_width
    if embed_dim != v_width:
        raise ValueError(
            f"text_config.projection_size ({embed_dim}) must equal the vision hidden_size "
            f"({v_width}): the MAP head's output is the image embedding"
        )
    v_heads = vc.get("num_attention_heads", 12)
    if v_width % v_heads:
        raise ValueError(f"vision hidden_size {v_width} not divisible by {v_heads} heads")
    patch = vc.get("patch_size", 16)
    if isinstance(patch, (list, tuple)):
        if len(set(patch)) != 1:
            raise ValueError(f"vision_config.patch_size must be square, got {patch}")
        patch = patch[0]
    if model_type == "siglip2":
        num_patches = vc.get("num_patches", 256)
        side = math.isqrt(num_patches)
        if side * side != num_patches:
            raise ValueError(f"vision_config.num_patches ({num_patches}) is not a square grid")
        image_size = side * patch
    else:
        image_size = vc.get("image_size", 224)
    return dict(
        embed_dim=embed_dim,
        vision=CLIPVisionConfig(
            image_size=image_size,
            patch_size=patch,
            width=v_width,
            layers=vc.get("num_hidden_layers", 12),
            head_width=v_width // v_heads,
            mlp_ratio=_hf_ratio(vc, v_width, 3072),
            no_ln_pre=True,
            pool_type="map",
            act=_hf_act(vc, "vision_config", "gelu_pytorch_tanh"),
            norm_eps=vc.get("layer_norm_eps", 1e-6),
            class_token=False,
            patch_bias=True,
            proj_type="none",
        ),
        text=CLIPTextConfig(
            context_length=tc.get("max_position_embeddings", 64),
            vocab_size=tc.get("vocab_size", 32000),
            width=t_width,
            heads=tc.get("num_attention_heads", 12),
            layers=tc.get("num_hidden_layers", 12),
            mlp_ratio=_hf_ratio(tc, t_width, 3072),
            pool_type="last",
            causal=False,
            proj_bias=True,
            act=_hf_act(tc, "text_config", "gelu_pytorch_tanh"),
            norm_eps=tc.get("layer_norm_eps", 1e-6),
        ),
        init_logit_scale=math.log(10.0),  # SigLIP's init (the weights bring their own)
        init_logit_bias=-10.0,
    )


def _hf_act(c: dict[str, Any], where: str, default: str) -> str:
    return hf_activation(c.get("hidden_act", default), f"{where}.hidden_act", _HF_ACTS)


def _hf_ratio(c: dict[str, Any], width: int, default: int) -> float:
    hidden = c.get("intermediate_size", default)
    r = hidden / width
    if int(width * r) != hidden:
        raise ValueError(f"intermediate_size {hidden} is not int(width * ratio)")
    return r
