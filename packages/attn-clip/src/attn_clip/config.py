"""Configs of a CLIP dual encoder: ``CLIPVisionConfig``, ``CLIPTextConfig``, ``CLIPConfig``.

Field names follow open_clip's ``CLIPVisionCfg`` / ``CLIPTextCfg`` so its model configs
(``open_clip.get_model_config("ViT-B-32")``) read directly. ``CLIPConfig.from_open_clip``
and ``CLIPConfig.from_hf`` refuse, with the offending keys named, any feature this
package does not implement -- a model that silently dropped one would give wrong numbers.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any

__all__ = ["CLIPConfig", "CLIPTextConfig", "CLIPVisionConfig", "PreprocessConfig"]

OPENAI_DATASET_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_DATASET_STD = (0.26862954, 0.26130258, 0.27577711)
ACTS = ("gelu", "quick_gelu")


@dataclass
class CLIPVisionConfig:
    """Vision tower: a ViT with CLIP's ``ln_pre``, class token, ``ln_post`` and projection."""

    image_size: int | tuple[int, int] = 224  # input size the position embedding is laid out for
    patch_size: int = 16  # side of the square patches
    width: int = 768  # token width
    layers: int = 12  # transformer blocks
    head_width: int = 64  # width of one attention head (heads = width // head_width)
    mlp_ratio: float = 4.0  # MLP hidden width = int(width * mlp_ratio)
    ls_init_value: float | None = None  # LayerScale init; None = no layer scale
    no_ln_pre: bool = False  # drop the LayerNorm before the blocks (CLIPA)
    pool_type: str = "tok"  # "tok" (class token) or "avg" (mean of patch tokens)
    final_ln_after_pool: bool = False  # ln_post after pooling instead of on every token
    act: str = "gelu"  # MLP activation: "gelu" or "quick_gelu" (OpenAI's models)
    norm_eps: float = 1e-5  # LayerNorm epsilon

    def __post_init__(self) -> None:
        if isinstance(self.image_size, list):
            self.image_size = tuple(self.image_size)
        if self.pool_type not in ("tok", "avg"):
            raise ValueError(f"vision pool_type must be 'tok' or 'avg', got {self.pool_type!r}")
        if self.act not in ACTS:
            raise ValueError(f"vision act must be one of {ACTS}, got {self.act!r}")
        if self.width % self.head_width:
            raise ValueError(
                f"vision width ({self.width}) must be divisible by head_width ({self.head_width})"
            )

    @property
    def heads(self) -> int:
        return self.width // self.head_width


@dataclass
class CLIPTextConfig:
    """Text tower: causal Transformer over BPE tokens, pooled at the end-of-text token."""

    context_length: int = 77  # maximum tokens (learned positions)
    vocab_size: int = 49408  # token embedding rows
    width: int = 512  # token width
    heads: int = 8  # attention heads
    layers: int = 12  # transformer blocks
    mlp_ratio: float = 4.0  # MLP hidden width = int(width * mlp_ratio)
    ls_init_value: float | None = None  # LayerScale init; None = no layer scale
    pool_type: str = "argmax"  # "argmax" (highest id = EOT), "eos" (first eos_id), "first", "last"
    eos_id: int = 2  # end-of-text id for pool_type="eos"
    causal: bool = True  # causal self-attention (open_clip's no_causal_mask inverted)
    proj_bias: bool = False  # bias in the output projection
    proj_type: str = "linear"  # "linear" or "none" (no projection: embed_dim must equal width)
    act: str = "gelu"  # MLP activation: "gelu" or "quick_gelu"
    norm_eps: float = 1e-5  # LayerNorm epsilon
    hf_tokenizer_name: str | None = None  # a Hugging Face tokenizer instead of OpenAI's BPE
    tokenizer_kwargs: dict[str, Any] | None = None  # extra tokenizer arguments from the config

    def __post_init__(self) -> None:
        if self.pool_type not in ("argmax", "eos", "first", "last"):
            raise ValueError(
                f"text pool_type must be 'argmax', 'eos', 'first' or 'last', got {self.pool_type!r}"
            )
        if self.proj_type not in ("linear", "none"):
            raise ValueError(f"text proj_type must be 'linear' or 'none', got {self.proj_type!r}")
        if self.act not in ACTS:
            raise ValueError(f"text act must be one of {ACTS}, got {self.act!r}")
        if self.width % self.heads:
            raise ValueError(f"text width ({self.width}) must be divisible by heads ({self.heads})")


@dataclass
class PreprocessConfig:
    """How images are turned into model inputs (comes with the pretrained weights)."""

    size: int | tuple[int, int] = 224  # output (H, W) or a square side
    mean: tuple[float, float, float] = OPENAI_DATASET_MEAN  # per-channel mean after [0, 1] scaling
    std: tuple[float, float, float] = OPENAI_DATASET_STD  # per-channel std
    interpolation: str = "bicubic"  # "bicubic" or "bilinear"
    resize_mode: str = "shortest"  # "shortest" (+ center crop), "longest" (+ pad), "squash"
    fill_color: int = 0  # padding value for resize_mode="longest"

    def __post_init__(self) -> None:
        if isinstance(self.size, list):
            self.size = tuple(self.size)
        self.mean, self.std = tuple(self.mean), tuple(self.std)
        if self.interpolation not in ("bicubic", "bilinear"):
            raise ValueError(
                f"interpolation must be 'bicubic' or 'bilinear', got {self.interpolation!r}"
            )
        if self.resize_mode not in ("shortest", "longest", "squash"):
            raise ValueError(
                f"resize_mode must be 'shortest', 'longest' or 'squash', got {self.resize_mode!r}"
            )


# open_clip config keys we accept only at these (default / no-op) values.
_VISION_NOOP = {
    "patch_dropout": 0.0,
    "attentional_pool": False,
    "pos_embed_type": "learnable",
    "output_tokens": False,
    "act_kwargs": None,
    "block_type": (None, "default"),
    "qk_norm": False,
    "scaled_cosine_attn": False,
    "scale_heads": False,
    "scale_attn_inner": False,
    "scale_attn": False,
    "scale_fc": False,
    "timm_model_name": None,
}
_TEXT_NOOP = {
    "embed_cls": False,
    "final_ln_after_pool": False,
    "output_tokens": False,
    "act_kwargs": None,
    "block_type": (None, "default"),
    "qk_norm": False,
    "scaled_cosine_attn": False,
    "scale_heads": False,
    "scale_attn_inner": False,
    "scale_attn": False,
    "scale_fc": False,
    "hf_model_name": None,
    "tokenizer_mode": None,
}
_TEXT_IGNORED = ("pad_id", "hf_model_pretrained", "hf_proj_type", "hf_pooler_type")
_TOP_IGNORED = ("custom_text", "nonscalar_logit_scale")  # state-dict layout only


def _is_noop(value: Any, allowed: Any) -> bool:
    return value in allowed if isinstance(allowed, tuple) else value == allowed


def _norm_eps(cfg: dict[str, Any], where: str, bad: list[str]) -> float:
    kwargs = cfg.pop("norm_kwargs", None) or {}
    if set(kwargs) - {"eps"}:
        bad.append(f"{where}.norm_kwargs={kwargs}")
    return float(kwargs.get("eps", 1e-5))


@dataclass
class CLIPConfig:
    """A CLIP model: two towers projecting to a shared ``embed_dim`` space + logit scale/bias."""

    embed_dim: int = 512  # shared image/text embedding width
    vision: CLIPVisionConfig = field(default_factory=CLIPVisionConfig)
    text: CLIPTextConfig = field(default_factory=CLIPTextConfig)
    init_logit_scale: float = math.log(1 / 0.07)  # learnable log temperature at init
    init_logit_bias: float | None = None  # SigLIP-style learnable logit bias (None = none)

    def __post_init__(self) -> None:
        if isinstance(self.vision, dict):
            self.vision = CLIPVisionConfig(**self.vision)
        if isinstance(self.text, dict):
            self.text = CLIPTextConfig(**self.text)
        if self.text.proj_type == "none" and self.text.width != self.embed_dim:
            raise ValueError(
                f"text proj_type='none' needs text width ({self.text.width}) == embed_dim "
                f"({self.embed_dim})"
            )

    @property
    def quick_gelu(self) -> bool:
        """True when both towers use QuickGELU (OpenAI-trained weights)."""
        return self.vision.act == "quick_gelu" and self.text.act == "quick_gelu"

    def with_act(self, quick_gelu: bool) -> CLIPConfig:
        """A copy with both towers' activation set to QuickGELU (True) or GELU (False)."""
        act = "quick_gelu" if quick_gelu else "gelu"
        d = self.to_dict()
        d["vision"]["act"] = d["text"]["act"] = act
        return CLIPConfig.from_dict(d)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CLIPConfig:
        """Inverse of :meth:`to_dict`; unknown keys raise ``ValueError`` naming them."""
        unknown = sorted(set(d) - {f.name for f in fields(cls)})
        for key, sub in (("vision", CLIPVisionConfig), ("text", CLIPTextConfig)):
            names = {f.name for f in fields(sub)}
            unknown += [f"{key}.{k}" for k in sorted(set(d.get(key) or {}) - names)]
        if unknown:
            raise ValueError(f"unknown CLIPConfig key(s): {', '.join(unknown)}")
        return cls(**{**d, "vision": dict(d["vision"]), "text": dict(d["text"])})

    @classmethod
    def from_open_clip(cls, cfg: dict[str, Any]) -> CLIPConfig:
        """Build from an open_clip model config dict (``open_clip.get_model_config(name)``).

        Raises ``ValueError`` naming every key that asks for a feature not built here
        (timm / Hugging Face towers, ResNets, attentional pooling, CoCa, ...).
        """
        cfg = {k: v for k, v in cfg.items()}
        vcfg, tcfg = dict(cfg.pop("vision_cfg")), dict(cfg.pop("text_cfg"))
        bad: list[str] = []
        act = "quick_gelu" if cfg.pop("quick_gelu", False) else "gelu"
        embed_dim = cfg.pop("embed_dim")
        init_logit_scale = cfg.pop("init_logit_scale", math.log(1 / 0.07))
        init_logit_bias = cfg.pop("init_logit_bias", None)
        for key in _TOP_IGNORED:
            cfg.pop(key, None)
        bad += [f"{k}={v!r}" for k, v in cfg.items()]  # multimodal_cfg (CoCa) and the like

        for k, allowed in _VISION_NOOP.items():
            if k in vcfg and not _is_noop(vcfg.pop(k), allowed):
                bad.append(f"vision_cfg.{k}")
        if isinstance(vcfg.get("layers"), (list, tuple)):
            bad.append("vision_cfg.layers (ResNet tower)")
            vcfg.pop("layers")
        vcfg = {k: v for k, v in vcfg.items() if not k.startswith("timm_")}
        v_eps = _norm_eps(vcfg, "vision_cfg", bad)

        for k, allowed in _TEXT_NOOP.items():
            if k in tcfg and not _is_noop(tcfg.pop(k), allowed):
                bad.append(f"text_cfg.{k}")
        for k in _TEXT_IGNORED:
            tcfg.pop(k, None)
        t_eps = _norm_eps(tcfg, "text_cfg", bad)
        tcfg["causal"] = not tcfg.pop("no_causal_mask", False)

        known_v = {f.name for f in fields(CLIPVisionConfig)}
        known_t = {f.name for f in fields(CLIPTextConfig)}
        bad += [f"vision_cfg.{k}" for k in vcfg if k not in known_v]
        bad += [f"text_cfg.{k}" for k in tcfg if k not in known_t]
        if bad:
            raise ValueError(
                "open_clip config uses features attn_clip does not implement: " + ", ".join(bad)
            )
        return cls(
            embed_dim=embed_dim,
            vision=CLIPVisionConfig(**vcfg, act=act, norm_eps=v_eps),
            text=CLIPTextConfig(**tcfg, act=act, norm_eps=t_eps),
            init_logit_scale=init_logit_scale,
            init_logit_bias=init_logit_bias,
        )

    def to_open_clip(self) -> dict[str, Any]:
        """The open_clip model config dict for this architecture (inverse of ``from_open_clip``)."""
        v, t = self.vision, self.text
        if v.act != t.act:
            raise ValueError("open_clip configs have one activation for both towers")
        vision_cfg = {
            "image_size": list(v.image_size) if isinstance(v.image_size, tuple) else v.image_size,
            "patch_size": v.patch_size,
            "width": v.width,
            "layers": v.layers,
            "head_width": v.head_width,
            "mlp_ratio": v.mlp_ratio,
            "ls_init_value": v.ls_init_value,
            "no_ln_pre": v.no_ln_pre,
            "pool_type": v.pool_type,
            "final_ln_after_pool": v.final_ln_after_pool,
            "norm_kwargs": {"eps": v.norm_eps},
        }
        text_cfg = {
            "context_length": t.context_length,
            "vocab_size": t.vocab_size,
            "width": t.width,
            "heads": t.heads,
            "layers": t.layers,
            "mlp_ratio": t.mlp_ratio,
            "ls_init_value": t.ls_init_value,
            "pool_type": t.pool_type,
            "eos_id": t.eos_id,
            "no_causal_mask": not t.causal,
            "proj_bias": t.proj_bias,
            "proj_type": t.proj_type,
            "norm_kwargs": {"eps": t.norm_eps},
        }
        if t.hf_tokenizer_name:
            text_cfg["hf_tokenizer_name"] = t.hf_tokenizer_name
        if t.tokenizer_kwargs:
            text_cfg["tokenizer_kwargs"] = dict(t.tokenizer_kwargs)
        out: dict[str, Any] = {
            "embed_dim": self.embed_dim,
            "quick_gelu": v.act == "quick_gelu",
            "vision_cfg": vision_cfg,
            "text_cfg": text_cfg,
            "init_logit_scale": self.init_logit_scale,
        }
        if self.init_logit_bias is not None:
            out["init_logit_bias"] = self.init_logit_bias
        return out

    @classmethod
    def from_hf(cls, cfg: dict[str, Any]) -> CLIPConfig:
        """Build from a transformers ``CLIPConfig`` (the ``config.json`` of ``save_pretrained``).

        Takes the plain dict, so reading a checkpoint does not need transformers.
        """
        if cfg.get("model_type", "clip") != "clip":
            raise ValueError(
                f"expected a CLIP config (model_type 'clip'), got {cfg['model_type']!r}"
            )
        tc, vc = cfg.get("text_config") or {}, cfg.get("vision_config") or {}

        def act(c: dict[str, Any], where: str) -> str:
            name = c.get("hidden_act", "quick_gelu")
            if name not in ACTS:
                raise ValueError(f"{where}.hidden_act={name!r} is not supported; expected {ACTS}")
            return name

        def ratio(c: dict[str, Any], width: int, default: int) -> float:
            hidden = c.get("intermediate_size", default)
            r = hidden / width
            if int(width * r) != hidden:
                raise ValueError(f"intermediate_size {hidden} is not int(width * ratio)")
            return r

        t_width = tc.get("hidden_size", 512)
        v_width = vc.get("hidden_size", 768)
        v_heads = vc.get("num_attention_heads", 12)
        if v_width % v_heads:
            raise ValueError(f"vision hidden_size {v_width} not divisible by {v_heads} heads")
        eos = tc.get("eos_token_id", 2)
        return cls(
            embed_dim=cfg.get("projection_dim", 512),
            vision=CLIPVisionConfig(
                image_size=vc.get("image_size", 224),
                patch_size=vc.get("patch_size", 32),
                width=v_width,
                layers=vc.get("num_hidden_layers", 12),
                head_width=v_width // v_heads,
                mlp_ratio=ratio(vc, v_width, 3072),
                act=act(vc, "vision_config"),
                norm_eps=vc.get("layer_norm_eps", 1e-5),
            ),
            text=CLIPTextConfig(
                context_length=tc.get("max_position_embeddings", 77),
                vocab_size=tc.get("vocab_size", 49408),
                width=t_width,
                heads=tc.get("num_attention_heads", 8),
                layers=tc.get("num_hidden_layers", 12),
                mlp_ratio=ratio(tc, t_width, 2048),
                # transformers: eos_token_id == 2 is the legacy "argmax" pooling
                pool_type="argmax" if eos == 2 else "eos",
                eos_id=eos,
                act=act(tc, "text_config"),
                norm_eps=tc.get("layer_norm_eps", 1e-5),
            ),
            init_logit_scale=cfg.get("logit_scale_init_value", 2.6592),
        )
