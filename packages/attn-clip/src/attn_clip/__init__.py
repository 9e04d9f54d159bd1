"""attn_clip: CLIP dual encoders, losses, zero-shot and retrieval on attn_core / attn_vision."""
