"""open_clip's model configs (``open_clip.get_model_config(name)``, the JSON of its
``model_configs/``) <-> the fields of a :class:`~attn_clip.config.CLIPConfig`.

:func:`from_open_clip` refuses, with the offending keys named, any feature attn_clip does
not implement -- a model that silently dropped one would give wrong numbers. A timm image
tower (``vision_cfg.timm_model_name``) is attn_vision's preset of that name
(:mod:`attn_clip.config_timm`); one whose architecture differs from its name's (e.g. fewer
layers) is written with a ``timm_model_args`` entry: the timm keyword arguments that
differ, as ``timm.create_model(timm_model_name, **timm_model_args)`` takes them
(attn_clip's extension; open_clip itself refuses the key).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import fields
from typing import Any

from .config_timm import timm_vision_cfg, timm_vision_config
from .tower_config import CLIPTextConfig, CLIPVisionConfig, MultimodalConfig

__all__ = ["from_open_clip", "to_open_clip"]

# open_clip config keys we accept only at these (default / no-op) values.
_VISION_NOOP = {
    "patch_dropout": 0.0,
    "pos_embed_type": "learnable",
    "block_type": (None, "default"),
    "qk_norm": False,
    "scaled_cosine_attn": False,
    "scale_heads": False,
    "scale_attn_inner": False,
    "scale_attn": False,
    "scale_fc": False,
}
_TEXT_NOOP = {
    "final_ln_after_pool": False,
    "block_type": (None, "default"),
    "qk_norm": False,
    "scaled_cosine_attn": False,
    "scale_heads": False,
    "scale_attn_inner": False,
    "scale_attn": False,
    "scale_fc": False,
    "tokenizer_mode": None,
}
# output_tokens only makes a tower also return its tokens (CoCa's always do)
_TEXT_IGNORED = ("output_tokens",)
# a Hugging Face text tower (hf_model_name): the fields it reads (hf_encoder: attn_clip's
# own, the architecture of hf_model_name; open_clip refuses the key), and those it ignores:
# hf_model_pretrained only says whether open_clip's random init starts from the hub's
# weights, which a checkpoint replaces; output_tokens only adds the tokens to its output
# (HFTextTower.forward_tokens)
_HF_TEXT_KEYS = ("hf_model_name", "hf_encoder", "hf_tokenizer_name", "hf_pooler_type",
                 "hf_proj_type", "context_length", "tokenizer_kwargs")  # fmt: skip
_HF_TEXT_IGNORED = ("hf_model_pretrained", "output_tokens")
_VISION_IGNORED = ("output_tokens",)
# CoCa's multimodal_cfg: what open_clip's MultimodalTransformer reads; it ignores the rest
# (its MLPs are 4x wide whatever mlp_ratio says; the vocabulary is the text tower's)
_MULTIMODAL_KEYS = ("width", "layers", "heads", "context_length", "ls_init_value")
_MULTIMODAL_IGNORED = ("vocab_size", "dim_head", "n_queries", "attn_pooler_heads")
_TOP_IGNORED = ("custom_text", "nonscalar_logit_scale")  # state-dict layout only
# open_clip's CLIPTextCfg.vocab_size default: the rows of a CoCa decoder over a Hugging
# Face tower whose text_cfg states none (open_clip's CoCa projects to text_cfg.vocab_size,
# which the Hugging Face tower itself never reads)
_OPEN_CLIP_VOCAB = 49408
# open_clip's own-ViT keys, which it ignores for a timm tower (and so do we)
_OPEN_CLIP_VIT_KEYS = {
    "layers", "width", "head_width", "mlp_ratio", "patch_size", "ls_init_value", "no_ln_pre",
    "pool_type", "final_ln_after_pool", "act_kwargs", "norm_kwargs", "attn_pooler_queries",
    "attn_pooler_heads", "attentional_pool", *_VISION_IGNORED, *_VISION_NOOP,
}  # fmt: skip
# timm-tower keys that do not change inference: the init of the timm weights, dropout
# and stochastic depth while training
_TIMM_IGNORED = ("timm_model_pretrained", "timm_drop", "timm_drop_path")
# what open_clip's ModifiedResNet reads from vision_cfg (heads = width * 32 // head_width)
_RESNET_KEYS = ("image_size", "layers", "width", "head_width")


def _is_noop(value: Any, allowed: Any) -> bool:
    return value in allowed if isinstance(allowed, tuple) else value == allowed


def _norm_eps(cfg: dict[str, Any], where: str, bad: list[str]) -> float:
    kwargs = cfg.pop("norm_kwargs", None) or {}
    if set(kwargs) - {"eps"}:
        bad.append(f"{where}.norm_kwargs={kwargs}")
    return float(kwargs.get("eps", 1e-5))


def _act(act: str, cfg: dict[str, Any], where: str, bad: list[str]) -> str:
    """open_clip's activation: QuickGELU or GELU, ``act_kwargs={"approximate": "tanh"}``."""
    kwargs = cfg.pop("act_kwargs", None) or {}
    if not kwargs or kwargs == {"approximate": "none"}:
        return act
    if kwargs == {"approximate": "tanh"} and act == "gelu":
        return "gelu_tanh"
    bad.append(f"{where}.act_kwargs={kwargs}")
    return act


def _act_kwargs(act: str) -> dict[str, str] | None:
    return {"approximate": "tanh"} if act == "gelu_tanh" else None


def _multimodal(cfg: dict[str, Any] | None, act: str, bad: list[str]) -> MultimodalConfig | None:
    """CoCa's ``multimodal_cfg`` -> :class:`~attn_clip.tower_config.MultimodalConfig`."""
    if cfg is None:
        return None
    cfg = dict(cfg)
    if cfg.pop("mlp_ratio", 4) != 4:
        bad.append("multimodal_cfg.mlp_ratio (open_clip's decoder is always 4x wide)")
    for key in _MULTIMODAL_IGNORED:
        cfg.pop(key, None)
    bad += [f"multimodal_cfg.{k}" for k in cfg if k not in _MULTIMODAL_KEYS]
    return MultimodalConfig(**{k: v for k, v in cfg.items() if k in _MULTIMODAL_KEYS}, act=act)


def from_open_clip(cfg: dict[str, Any]) -> dict[str, Any]:
    """The :class:`~attn_clip.config.CLIPConfig` fields of an open_clip model config dict.

    Raises ``ValueError`` naming every key that asks for a feature not built here (timm
    towers that are not attn_vision presets, open_clip's work-in-progress options such as
    ``attentional_pool="parallel"``, ...).
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
    multimodal = _multimodal(cfg.pop("multimodal_cfg", None), act, bad)
    bad += [f"{k}={v!r}" for k, v in cfg.items()]

    vision = None
    timm_name = vcfg.pop("timm_model_name", None)
    if timm_name:  # a timm tower: its architecture is attn_vision's preset of that name
        args = vcfg.pop("timm_model_args", None) or {}
        for k in _TIMM_IGNORED:
            vcfg.pop(k, None)
        pool, proj = vcfg.pop("timm_pool", "avg"), vcfg.pop("timm_proj", "linear")
        proj_bias = vcfg.pop("timm_proj_bias", False)
        image_size = vcfg.pop("image_size", 224)
        bad += [f"vision_cfg.{k}" for k in vcfg if k not in _OPEN_CLIP_VIT_KEYS]
        try:
            vision = timm_vision_config(timm_name, args, image_size, pool, proj, proj_bias)
        except ValueError as e:
            bad.append(f"vision_cfg.timm_model_name={timm_name!r} ({e})")
    elif isinstance(vcfg.get("layers"), (list, tuple)):  # OpenAI's ModifiedResNet
        for k, allowed in _VISION_NOOP.items():
            if k in vcfg and not _is_noop(vcfg.pop(k), allowed):
                bad.append(f"vision_cfg.{k}")
        vcfg.pop("patch_size", None)  # (None in open_clip's RN configs; unused)
        bad += [f"vision_cfg.{k} (ResNet tower)" for k in vcfg if k not in _RESNET_KEYS]
        if not bad:
            vision = CLIPVisionConfig(**vcfg, act=act)
    else:
        for k, allowed in _VISION_NOOP.items():
            if k in vcfg and not _is_noop(vcfg.pop(k), allowed):
                bad.append(f"vision_cfg.{k}")
        vcfg = {k: v for k, v in vcfg.items() if not k.startswith("timm_")}
        for k in _VISION_IGNORED:
            vcfg.pop(k, None)
        if not vcfg.get("attentional_pool", False):  # open_clip reads these only with it
            vcfg.pop("attentional_pool", None)
            vcfg.pop("attn_pooler_queries", None)
            vcfg.pop("attn_pooler_heads", None)
        elif not isinstance(vcfg["attentional_pool"], bool):  # "parallel" / "cascade": WIP
            bad.append(f"vision_cfg.attentional_pool={vcfg.pop('attentional_pool')!r}")
        v_eps = _norm_eps(vcfg, "vision_cfg", bad)
        v_act = _act(act, vcfg, "vision_cfg", bad)
        known_v = {f.name for f in fields(CLIPVisionConfig)} - {"act", "norm_eps"}
        bad += [f"vision_cfg.{k}" for k in vcfg if k not in known_v]

    if tcfg.get("hf_model_name") or "hf_encoder" in tcfg:  # open_clip: `if hf_model_name:`
        coca_vocab = tcfg.pop("vocab_size", _OPEN_CLIP_VOCAB) if multimodal else None
        if multimodal is not None:  # CoCa: text_cfg.vocab_size is the decoder's
            multimodal = dataclasses.replace(multimodal, vocab_size=coca_vocab)
        text = _hf_text(tcfg, act, bad)
        if bad:
            raise ValueError(
                "open_clip config uses features attn_clip does not implement: " + ", ".join(bad)
            )
        if vision is None:
            vision = CLIPVisionConfig(**vcfg, act=v_act, norm_eps=v_eps)
        return {
            "embed_dim": embed_dim,
            "vision": vision,
            "text": text,
            "init_logit_scale": init_logit_scale,
            "init_logit_bias": init_logit_bias,
            "multimodal": multimodal,
        }
    for k, allowed in _TEXT_NOOP.items():
        if k in tcfg and not _is_noop(tcfg.pop(k), allowed):
            bad.append(f"text_cfg.{k}")
    for k in ("hf_model_name", "hf_model_pretrained", "hf_proj_type", "hf_pooler_type"):
        tcfg.pop(k, None)  # (a falsy hf_model_name: open_clip builds its own tower)
    for k in _TEXT_IGNORED:
        tcfg.pop(k, None)
    if not tcfg.get("embed_cls", False):  # the pad mask is CoCa's alone
        tcfg.pop("embed_cls", None)
        tcfg.pop("pad_id", None)
    t_eps = _norm_eps(tcfg, "text_cfg", bad)
    t_act = _act(act, tcfg, "text_cfg", bad)
    tcfg["causal"] = not tcfg.pop("no_causal_mask", False)
    known_t = {f.name for f in fields(CLIPTextConfig)} - {"act", "norm_eps"}
    bad += [f"text_cfg.{k}" for k in tcfg if k not in known_t]
    if bad:
        raise ValueError(
            "open_clip config uses features attn_clip does not implement: " + ", ".join(bad)
        )
    if vision is None:
        vision = CLIPVisionConfig(**vcfg, act=v_act, norm_eps=v_eps)
    return {
        "embed_dim": embed_dim,
        "vision": vision,
        "text": CLIPTextConfig(**tcfg, act=t_act, norm_eps=t_eps),
        "init_logit_scale": init_logit_scale,
        "init_logit_bias": init_logit_bias,
        "multimodal": multimodal,
    }


def _hf_text(tcfg: dict[str, Any], act: str, bad: list[str]) -> CLIPTextConfig | None:
    """A Hugging Face text tower's ``text_cfg`` -> :class:`CLIPTextConfig` (None when
    refused: the reasons appended to ``bad``). ``act`` is the config's ``quick_gelu`` flag,
    kept as the text act so the flag round-trips (the Hugging Face encoder has its own).
    A CoCa's ``vocab_size`` (its decoder's) is taken out before."""
    name = tcfg.get("hf_model_name")
    kw = {k: tcfg.pop(k) for k in _HF_TEXT_KEYS if k in tcfg}
    for k in _HF_TEXT_IGNORED:
        tcfg.pop(k, None)
    for k, allowed in _TEXT_NOOP.items():
        if k in tcfg and not _is_noop(tcfg.pop(k), allowed):
            bad.append(f"text_cfg.{k}")
    stated = {k: tcfg.pop(k) for k in ("width", "vocab_size") if k in tcfg}  # (CoCa: width)
    bad += [f"text_cfg.{k} (a Hugging Face tower's architecture is hf_model_name's)"
            for k in tcfg]  # fmt: skip
    try:
        text = CLIPTextConfig(**kw, act=act)
    except ValueError as e:
        bad.append(f"text_cfg.hf_model_name={name!r} ({e})")
        return None
    for k, v in stated.items():  # (CoCa's configs state the width their decoder reads)
        if v != getattr(text, k):
            bad.append(f"text_cfg.{k}={v!r} ({name!r} has {k} {getattr(text, k)})")
    return text


def _hf_text_cfg(t: CLIPTextConfig) -> dict[str, Any]:
    """open_clip's ``text_cfg`` of a Hugging Face tower (+ attn_clip's ``hf_encoder``)."""
    out: dict[str, Any] = {"hf_model_name": t.hf_model_name} if t.hf_model_name else {}
    if t.hf_tokenizer_name:
        out["hf_tokenizer_name"] = t.hf_tokenizer_name
    out.update(hf_pooler_type=t.hf_pooler_type, hf_proj_type=t.hf_proj_type,
               context_length=t.context_length, hf_encoder=dict(t.hf_encoder))  # fmt: skip
    if t.tokenizer_kwargs:
        out["tokenizer_kwargs"] = dict(t.tokenizer_kwargs)
    return out


def to_open_clip(config: Any) -> dict[str, Any]:
    """The open_clip model config dict of a :class:`~attn_clip.config.CLIPConfig` (inverse
    of :func:`from_open_clip`)."""
    v, t = config.vision, config.text
    quick = t.act == "quick_gelu"
    if not v.timm_model_name and (v.act == "quick_gelu") != quick:
        raise ValueError("open_clip configs have one QuickGELU flag for both towers")
    if v.timm_model_name:
        vision_cfg = timm_vision_cfg(v)
    elif v.tower == "resnet":
        vision_cfg = {
            "image_size": v.image_size,
            "layers": list(v.layers),
            "width": v.width,
            "head_width": v.head_width,
            "patch_size": None,
        }
    else:
        vision_cfg = {
            "image_size": (list(v.image_size) if isinstance(v.image_size, tuple) else v.image_size),
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
        if _act_kwargs(v.act):
            vision_cfg["act_kwargs"] = _act_kwargs(v.act)
        # attn_clip's own (SigLIP-style towers from transformers): open_clip refuses them
        for name, default in (("class_token", True), ("patch_bias", False)):
            if getattr(v, name) != default:
                vision_cfg[name] = getattr(v, name)
        if v.proj_type != "linear":
            vision_cfg["proj_type"] = v.proj_type
        if v.attentional_pool:
            vision_cfg.update(attentional_pool=True, attn_pooler_queries=v.attn_pooler_queries,
                              attn_pooler_heads=v.attn_pooler_heads)  # fmt: skip
    if t.tower == "hf":
        text_cfg = _hf_text_cfg(t)
    else:
        text_cfg = _text_cfg(t)
    out: dict[str, Any] = {
        "embed_dim": config.embed_dim,
        "quick_gelu": quick,
        "vision_cfg": vision_cfg,
        "text_cfg": text_cfg,
        "init_logit_scale": config.init_logit_scale,
    }
    if config.init_logit_bias is not None:
        out["init_logit_bias"] = config.init_logit_bias
    m = config.multimodal
    if m is not None:
        out["multimodal_cfg"] = {"width": m.width, "layers": m.layers, "heads": m.heads,
                                 "context_length": m.context_length,
                                 "ls_init_value": m.ls_init_value}  # fmt: skip
        # open_clip's CoCa reads the towers' tokens: without it they return embeddings only
        vision_cfg["output_tokens"] = text_cfg["output_tokens"] = True
        if t.tower == "hf":  # its decoder projects to text_cfg.vocab_size (default 49408)
            text_cfg["vocab_size"] = m.vocab_size or t.vocab_size
        elif m.vocab_size not in (None, t.vocab_size):
            raise ValueError(
                f"open_clip's CoCa decoder projects to the text tower's vocabulary "
                f"({t.vocab_size}); multimodal vocab_size {m.vocab_size} has no open_clip config"
            )
    return out


def _text_cfg(t: CLIPTextConfig) -> dict[str, Any]:
    """open_clip's ``text_cfg`` of its own (causal Transformer) text tower."""
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
    if _act_kwargs(t.act):
        text_cfg["act_kwargs"] = _act_kwargs(t.act)
    if t.token_dim is not None:  # attn_clip's own: open_clip refuses it
        text_cfg["token_dim"] = t.token_dim
    if t.hf_tokenizer_name:
        text_cfg["hf_tokenizer_name"] = t.hf_tokenizer_name
    if t.tokenizer_kwargs:
        text_cfg["tokenizer_kwargs"] = dict(t.tokenizer_kwargs)
    if t.embed_cls:
        text_cfg.update(embed_cls=True, pad_id=t.pad_id)
    return text_cfg
