"""The config of a CLIP dual encoder: :class:`CLIPConfig` (two towers' configs, from
:mod:`attn_clip.tower_config`, projecting to a shared ``embed_dim`` space).

Read from an open_clip model config (``CLIPConfig.from_open_clip``, written back by
``to_open_clip``: :mod:`attn_clip.config_open_clip`, whose timm image towers are
attn_vision presets: :mod:`attn_clip.config_timm`) or a transformers one
(``CLIPConfig.from_hf``: :mod:`attn_clip.config_hf`); both refuse, with the offending keys
named, any feature this package does not implement -- a model that silently dropped one
would give wrong numbers.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from . import config_hf, config_open_clip
from .tower_config import (
    OPENAI_DATASET_MEAN,
    OPENAI_DATASET_STD,
    CLIPTextConfig,
    CLIPVisionConfig,
    MultimodalConfig,
    PreprocessConfig,
)

__all__ = [
    "OPENAI_DATASET_MEAN",
    "OPENAI_DATASET_STD",
    "CLIPConfig",
    "CLIPTextConfig",
    "CLIPVisionConfig",
    "MultimodalConfig",
    "PreprocessConfig",
]


@dataclass
class CLIPConfig:
    """A CLIP model: two towers projecting to a shared ``embed_dim`` space + logit scale/bias."""

    embed_dim: int = 512  # shared image/text embedding width
    vision: CLIPVisionConfig = field(default_factory=CLIPVisionConfig)
    text: CLIPTextConfig = field(default_factory=CLIPTextConfig)
    init_logit_scale: float = math.log(1 / 0.07)  # learnable log temperature at init
    init_logit_bias: float | None = None  # SigLIP-style learnable logit bias (None = none)
    # a CoCa captioner's multimodal decoder (attn_clip.coca.CoCa); None = a dual encoder
    multimodal: MultimodalConfig | None = None

    def __post_init__(self) -> None:
        if isinstance(self.vision, dict):
            self.vision = CLIPVisionConfig(**self.vision)
        if isinstance(self.text, dict):
            self.text = CLIPTextConfig(**self.text)
        if isinstance(self.multimodal, dict):
            self.multimodal = MultimodalConfig(**self.multimodal)
        if self.multimodal is not None:
            self._check_coca()
        t = self.text
        if t.tower == "hf" and t.hf_proj_type is None and t.width != self.embed_dim:
            raise ValueError(
                f"text hf_proj_type=None needs the encoder width ({t.width}) == embed_dim "
                f"({self.embed_dim})"
            )
        for name, tower in (("text", self.text), ("vision", self.vision)):
            if tower.proj_type == "none" and tower.width != self.embed_dim:
                raise ValueError(
                    f"{name} proj_type='none' needs {name} width ({tower.width}) == embed_dim "
                    f"({self.embed_dim})"
                )

    def _check_coca(self) -> None:
        v, t, m = self.vision, self.text, self.multimodal
        if t.tower != "hf" and not t.embed_cls:  # (a Hugging Face tower: its mean / CLS pool)
            raise ValueError("a CoCa config (multimodal=...) needs text embed_cls=True")
        if v.tower != "vit" or not v.class_token:
            raise ValueError("a CoCa config needs a ViT image tower with a class token")
        tokens = self.embed_dim if v.attentional_pool else v.width
        if tokens != m.width:
            raise ValueError(
                f"the CoCa decoder reads image tokens {tokens} wide (embed_dim with an "
                f"attentional pool, else the vision width): multimodal width must be {tokens}, "
                f"got {m.width}"
            )
        if t.width != m.width:
            raise ValueError(
                f"CoCa text width ({t.width}) must equal the multimodal width ({m.width})"
            )

    @property
    def is_coca(self) -> bool:
        """True for a CoCa captioner (a multimodal decoder beside the two towers)."""
        return self.multimodal is not None

    @property
    def quick_gelu(self) -> bool:
        """True when the towers use QuickGELU (OpenAI-trained weights). A timm image tower
        has its own activation, as in open_clip: there the text tower's counts."""
        v = self.vision
        return self.text.act == "quick_gelu" and (bool(v.timm_model_name) or v.act == "quick_gelu")

    def with_act(self, quick_gelu: bool) -> CLIPConfig:
        """A copy with the towers' activation set to QuickGELU (True) or GELU (False) (a
        timm image tower keeps its own, as open_clip's ``quick_gelu`` flag does)."""
        act = "quick_gelu" if quick_gelu else "gelu"
        d = self.to_dict()
        d["text"]["act"] = act
        if d.get("multimodal") is not None:
            d["multimodal"]["act"] = act
        if not self.vision.timm_model_name:
            d["vision"]["act"] = act
        return CLIPConfig.from_dict(d)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CLIPConfig:
        """Inverse of :meth:`to_dict`; unknown keys raise ``ValueError`` naming them."""
        unknown = sorted(set(d) - {f.name for f in fields(cls)})
        subs = (("vision", CLIPVisionConfig), ("text", CLIPTextConfig))
        for key, sub in (*subs, ("multimodal", MultimodalConfig)):
            names = {f.name for f in fields(sub)}
            unknown += [f"{key}.{k}" for k in sorted(set(d.get(key) or {}) - names)]
        if unknown:
            raise ValueError(f"unknown CLIPConfig key(s): {', '.join(unknown)}")
        m = d.get("multimodal")
        return cls(**{**d, "vision": dict(d["vision"]), "text": dict(d["text"]),
                      "multimodal": dict(m) if m is not None else None})  # fmt: skip

    @classmethod
    def from_open_clip(cls, cfg: dict[str, Any]) -> CLIPConfig:
        """Build from an open_clip model config dict (``open_clip.get_model_config(name)``).

        Raises ``ValueError`` naming every key that asks for a feature not built here
        (Hugging Face text towers, attentional pooling, CoCa, timm towers that are not
        attn_vision ViT, Eva, ViTamin or ConvNeXt presets, ...).
        """
        return cls(**config_open_clip.from_open_clip(cfg))

    def to_open_clip(self) -> dict[str, Any]:
        """The open_clip model config dict for this architecture (inverse of ``from_open_clip``)."""
        return config_open_clip.to_open_clip(self)

    @classmethod
    def from_hf(cls, cfg: dict[str, Any]) -> CLIPConfig:
        """Build from a transformers ``CLIPConfig``, ``SiglipConfig`` or ``Siglip2Config``
        (the ``config.json`` of ``save_pretrained``).

        Takes the plain dict, so reading a checkpoint does not need transformers.
        """
        return cls(**config_hf.from_hf(cfg))
