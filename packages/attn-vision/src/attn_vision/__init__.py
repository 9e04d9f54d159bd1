"""attn_vision: ViT, Swin and channel/spatial attention on attn_core, loading timm weights.

Quick start::

    import attn_vision
    model = attn_vision.create_model("vit_base_patch16_224", pretrained=True).eval()
    transform = attn_vision.create_transform(model)
    logits = model(transform(image)[None])

See docs/vision.md.
"""

from .channel_attention import (
    CBAM,
    ChannelAttention,
    CoordinateAttention,
    EfficientChannelAttention,
    SpatialAttention,
    SqueezeExcite,
    create_attn,
)
from .convert import convert_timm_resnet, convert_timm_swin, convert_timm_vit
from .patch_embed import PatchEmbed, resample_abs_pos_embed
from .pretrained import (
    PretrainedLocation,
    WeightsUnavailableError,
    download_pretrained,
    load_state_dict_file,
    resolve_pretrained,
)
from .registry import create_model, get_model_config, list_models, register_model
from .resnet import ResNet, ResNetConfig
from .swin import SwinConfig, SwinTransformer
from .transforms import create_transform, resolve_data_config
from .visualize import attention_heatmap, attention_rollout, cls_attention, save_attention_heatmap
from .vit import VisionTransformer, ViTConfig

__version__ = "0.1.0"

__all__ = [
    "CBAM",
    "ChannelAttention",
    "CoordinateAttention",
    "EfficientChannelAttention",
    "PatchEmbed",
    "PretrainedLocation",
    "ResNet",
    "ResNetConfig",
    "SpatialAttention",
    "SqueezeExcite",
    "SwinConfig",
    "SwinTransformer",
    "ViTConfig",
    "VisionTransformer",
    "WeightsUnavailableError",
    "attention_heatmap",
    "attention_rollout",
    "cls_attention",
    "convert_timm_resnet",
    "convert_timm_swin",
    "convert_timm_vit",
    "create_attn",
    "create_model",
    "create_transform",
    "download_pretrained",
    "get_model_config",
    "list_models",
    "load_state_dict_file",
    "register_model",
    "resample_abs_pos_embed",
    "resolve_data_config",
    "resolve_pretrained",
    "save_attention_heatmap",
]
