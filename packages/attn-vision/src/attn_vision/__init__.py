"""attn_vision: ViT, Swin and channel/spatial attention on attn_core."""
