"""CLIP (Radford et al. 2021): an image tower and a text tower in one embedding space.

Shape legend: ``B`` images, ``T`` captions, ``C`` channels, ``H`` / ``W`` image size,
``L`` tokens per caption, ``E`` joint embedding width.

``logits_per_image[i, j] = exp(logit_scale) * <img_i, txt_j> (+ logit_bias)`` on
L2-normalized embeddings; ``logits_per_text`` is its transpose. ``logit_bias`` exists
for SigLIP-style (sigmoid-loss) models.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from attn_core.fast_inference import compile_module
from torch import nn

from .config import CLIPConfig, PreprocessConfig
from .hf_text import HFTextTower
from .text import TextTransformer
from .vision import CLIPVisionTower

__all__ = ["CLIP", "CLIPOutput", "LOGIT_SCALE_MAX"]

LOGIT_SCALE_MAX = math.log(100.0)  # open_clip clamps the temperature to at most 100


class CLIPOutput(NamedTuple):
    """What ``CLIP.forward`` returns (fields are None for a tower that got no input)."""

    logits_per_image: torch.Tensor | None  # (B, T)
    logits_per_text: torch.Tensor | None  # (T, B)
    image_embeds: torch.Tensor | None  # (B, E), L2-normalized
    text_embeds: torch.Tensor | None  # (T, E), L2-normalized
    logit_scale: torch.Tensor  # exp(logit_scale), a scalar
    logit_bias: torch.Tensor | None  # scalar or None


class CLIP(nn.Module):
    """Dual encoder: ``visual`` (attn_vision ViT + proj; SigLIP: MAP head, no proj),
    ``text`` (Transformer + proj; causal for CLIP, bidirectional for SigLIP; or a Hugging
    Face encoder, pooled and projected: :class:`~attn_clip.hf_text.HFTextTower`)."""

    def __init__(self, config: CLIPConfig, weight_init: bool = True) -> None:
        """``weight_init=False`` skips the random init (weights are about to be loaded)."""
        super().__init__()
        self.config = config
        self.visual = CLIPVisionTower(config.vision, config.embed_dim, weight_init)
        if config.text.tower == "hf":  # open_clip's HFTextEncoder (XLM-R, mT5, NLLB, ...)
            self.text = HFTextTower(config.text, config.embed_dim, weight_init)
        else:
            self.text = TextTransformer(config.text, config.embed_dim, weight_init)
        self.logit_scale = nn.Parameter(torch.tensor(float(config.init_logit_scale)))
        if config.init_logit_bias is not None:
            self.logit_bias = nn.Parameter(torch.tensor(float(config.init_logit_bias)))
        else:
            self.logit_bias = None
        self.preprocess_cfg = PreprocessConfig(size=config.vision.image_size)

    def to_empty(self, *, device: str | torch.device | None, recurse: bool = True) -> CLIP:
        """``nn.Module.to_empty``: uninitialized storage on ``device`` for every tensor.

        Allocates with ``torch.empty`` rather than torch's ``empty_like``, whose meta-tensor
        path imports sympy (~0.6 s) the first time a model built on ``meta`` is moved.
        """

        def empty(t: torch.Tensor) -> torch.Tensor:
            return torch.empty(t.shape, dtype=t.dtype, device=device)

        return self._apply(empty, recurse=recurse)

    @property
    def context_length(self) -> int:
        return self.config.text.context_length

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        self.visual.set_grad_checkpointing(enable)
        self.text.set_grad_checkpointing(enable)

    @torch.no_grad()
    def clamp_logit_scale_(self) -> None:
        """Clamp ``logit_scale`` into ``[0, ln 100]`` in place (call after each optimizer step)."""
        self.logit_scale.clamp_(0, LOGIT_SCALE_MAX)

    def encode_image(self, images: torch.Tensor, normalize: bool = False) -> torch.Tensor:
        """``(B, C, H, W)`` preprocessed images -> ``(B, E)`` embeddings (``self.visual``)."""
        features = self.visual(images)
        return F.normalize(features, dim=-1) if normalize else features

    def encode_text(
        self, texts: torch.Tensor, normalize: bool = False, *, truncate: bool = True
    ) -> torch.Tensor:
        """``(T, L)`` token ids (see :mod:`attn_clip.tokenizer`) -> ``(T, E)`` embeddings.

        ``truncate=True`` encodes only up to the longest caption's pooled (EOT) token:
        exact with the causal text tower, and much faster on short prompts than all ``L``
        columns (``False``); a Hugging Face tower drops the columns that are padding in
        every caption (exact too: their keys are masked).
        """
        features = self.text(texts, truncate=truncate)
        return F.normalize(features, dim=-1) if normalize else features

    def compile_encoders(self, **compile_kwargs: Any) -> CLIP:
        """``torch.compile`` both towers in place (``nn.Module.compile``); returns ``self``.

        ``encode_image`` / ``encode_text`` then run the compiled ``visual`` / ``text``, with
        ``dynamic=True`` by default so new batch sizes and caption lengths do not
        recompile. The first calls compile (tens of seconds on a CPU); results equal the
        eager model's to float rounding. On CPU the fused oneDNN product stays visible to
        the compiler (:func:`attn_core.fast_inference.compile_module`), but the eager fast
        path is as fast or faster: it has pre-packed weights, and only eager text shares
        prompt prefixes (a Python planner over token lists; compiled text runs the batch
        cut after its longest caption). The gain is on GPUs. Keyword arguments go to
        ``torch.compile``.
        """
        kwargs = {"dynamic": True, **compile_kwargs}
        compile_module(self.visual, **kwargs)
        compile_module(self.text, **kwargs)
        return self

    def scale(self) -> torch.Tensor:
        """``exp(logit_scale)``; while training the exponent is clamped to ``ln 100``."""
        s = self.logit_scale.clamp(max=LOGIT_SCALE_MAX) if self.training else self.logit_scale
        return s.exp()

    def logits(
        self, image_embeds: torch.Tensor, text_embeds: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Normalized ``(B, E)``, ``(T, E)`` -> ``(logits_per_image (B, T), logits_per_text)``."""
        logits = self.scale() * image_embeds @ text_embeds.T
        if self.logit_bias is not None:
            logits = logits + self.logit_bias
        return logits, logits.T

    def forward(
        self, images: torch.Tensor | None = None, texts: torch.Tensor | None = None
    ) -> CLIPOutput:
        """Embed images and/or captions; with both, also the image-text logits."""
        image_embeds = self.encode_image(images, normalize=True) if images is not None else None
        text_embeds = self.encode_text(texts, normalize=True) if texts is not None else None
        per_image = per_text = None
        if image_embeds is not None and text_embeds is not None:
            per_image, per_text = self.logits(image_embeds, text_embeds)
        return CLIPOutput(
            per_image, per_text, image_embeds, text_embeds, self.scale(), self.logit_bias
        )
