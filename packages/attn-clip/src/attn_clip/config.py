"""Configs of a CLIP dual encoder: ``CLIPVisionConfig``, ``CLIPTextConfig``, ``CLIPConfig``.

Field names follow open_clip's ``CLIPVisionCfg`` / ``CLIPTextCfg`` so its model configs
(``open_clip.get_model_config("ViT-B-32")``) read directly. ``CLIPConfig.from_open_clip``
and ``CLIPConfig.from_hf`` refuse, with the offending keys named, any feature this
package does not implement -- a model that silently dropped one would give wrong numbers.

Three kinds of image tower (:attr:`CLIPVisionConfig.tower`), as open_clip decides:

* ``"vit"``: open_clip's own ViT, or a timm ``VisionTransformer`` (SigLIP / SigLIP2:
  ``vision_cfg.timm_model_name``, e.g. ``vit_base_patch16_siglip_224``: no class token, a
  patch embedding with bias, no ``ln_pre``, a MAP attention-pool head, no projection), or
  a timm ``Eva`` (EVA-01 / EVA02-CLIP, ``eva02_base_patch16_clip_224``: a ViT with the
  extra fields in :attr:`CLIPVisionConfig.eva` -- 2D RoPE, SwiGLU, inner norms -- whose
  projection is timm's own classifier ``head``, a Linear with bias: ``proj_type="head"``);
* ``"convnext"``: a timm ``ConvNeXt`` trunk (``timm_model_name="convnext_base"``) pooled by
  its own head (average pool + LayerNorm), then open_clip's ``timm_proj`` head: a Linear
  (``"linear"``) or Linear-GELU-Linear (``"mlp"``), biased per ``timm_proj_bias``;
* ``"resnet"``: OpenAI's ModifiedResNet (``vision_cfg.layers`` a list of stage depths).

A timm ViTamin (``timm_model_name="vitamin_small_224"``) is a ``"vit"`` tower too: a ViT on a
conv stem with GeGLU MLPs (:attr:`CLIPVisionConfig.vitamin`: the stem's fields), average
pooled, then open_clip's ``timm_proj="linear"`` head (bias-free, as a ViT's ``proj``).

The timm architecture behind each timm name is read from tables generated from timm
(``timm_vit``, ``timm_convnext``, ``timm_eva``, ``timm_vitamin`` in
``open_clip_registry.json``), so building one never imports timm. A tower whose
architecture differs from its timm name's (e.g. fewer layers) is written with a
``timm_model_args`` entry listing timm's keyword arguments in full (attn_clip's extension;
open_clip itself refuses the key).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any

__all__ = ["CLIPConfig", "CLIPTextConfig", "CLIPVisionConfig", "PreprocessConfig"]

_CONVNEXT_FIELDS = (  # attn_vision ConvNeXtConfig fields that make up the architecture
    "depths", "dims", "patch_size", "kernel_size", "ls_init_value", "conv_mlp", "conv_bias",
    "head_norm_first", "head_hidden_size", "norm_eps",
)  # fmt: skip
# a timm Eva tower's fields beyond a CLIP ViT's: attn_vision ViTConfig fields, with their
# defaults, and timm's ``qkv_fused`` (only the layout of open_clip's checkpoint: one ``qkv``
# with ``q_bias`` / ``v_bias``, or separate ``q_proj`` / ``k_proj`` / ``v_proj``)
EVA_FIELDS: dict[str, Any] = {
    "rope": False,  # 2D axial RoPE on the patch tokens' queries / keys (EVA02)
    "rope_ref_grid": None,  # RoPE positions scaled onto this (h, w) patch grid
    "attn_inner_norm": False,  # LayerNorm before the attention output proj (scale_attn_inner)
    "mlp_inner_norm": False,  # LayerNorm before fc2 (timm's scale_mlp)
    "mlp_gate_last": True,  # swiglu: fc1 gives [x, gate] (timm SwiGLU); False: [gate, x]
    "qkv_fused": True,  # timm's checkpoint layout (see above); no effect on the math
}

# a timm ViTamin tower's fields beyond a CLIP ViT's: attn_vision VitaminConfig fields (the
# conv stem), with its defaults
VITAMIN_FIELDS: dict[str, Any] = {
    "stem_width": 64,  # channels of the stem's two 3x3 convs
    "conv_dims": (64, 128),  # channels of the two MBConv stages
    "conv_depths": (2, 4),  # MBConv blocks per stage
    "pos_embed": "learn",  # "learn" (learned absolute position embedding) or "none"
}

OPENAI_DATASET_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_DATASET_STD = (0.26862954, 0.26130258, 0.27577711)
ACTS = ("gelu", "gelu_tanh", "quick_gelu")
VISION_ACTS = (*ACTS, "swiglu")  # SwiGLU: EVA02 towers
VISION_POOLS = ("tok", "avg", "map")


@dataclass
class CLIPVisionConfig:
    """Vision tower: a ViT with CLIP's ``ln_pre``, class token, ``ln_post`` and projection
    (a timm Eva: ``eva`` set); or a timm ConvNeXt (``convnext``) with open_clip's projection
    head; or OpenAI's ModifiedResNet (``layers`` a tuple). The ViT fields mean nothing to a
    ConvNeXt."""

    image_size: int | tuple[int, int] = 224  # input size the position embedding is laid out for
    patch_size: int = 16  # side of the square patches
    width: int = 768  # token width (ResNet: the stem's; ConvNeXt: set to its last dims entry)
    # transformer blocks; a tuple: bottleneck blocks per stage of a ModifiedResNet
    layers: int | tuple[int, ...] = 12
    head_width: int = 64  # width of one attention head (ResNet: of the attention pool's)
    mlp_ratio: float = 4.0  # MLP hidden width = int(width * mlp_ratio)
    ls_init_value: float | None = None  # LayerScale init; None = no layer scale
    no_ln_pre: bool = False  # drop the LayerNorm before the blocks (CLIPA)
    pool_type: str = "tok"  # "tok" (class token), "avg" (mean of patches), "map" (attention pool)
    final_ln_after_pool: bool = False  # ln_post after pooling instead of on every token
    # MLP activation: "gelu", "gelu_tanh", "quick_gelu" (OpenAI's models) or "swiglu" (EVA02)
    act: str = "gelu"
    norm_eps: float = 1e-5  # LayerNorm epsilon
    class_token: bool = True  # prepend a class token (SigLIP's towers have none)
    patch_bias: bool = False  # bias in the patch embedding (timm's SigLIP and Eva towers)
    # "linear" (ViT: bias-free; ConvNeXt: open_clip's head.proj), "mlp" (ConvNeXt: head.mlp,
    # Linear-GELU-Linear, 2 * embed_dim wide), "head" (timm ViT / Eva: the trunk's own
    # classifier, a Linear with bias, open_clip's timm_proj=None) or "none" (embed_dim == width)
    proj_type: str = "linear"
    proj_bias: bool = False  # bias in a ConvNeXt's projection (open_clip's timm_proj_bias)
    timm_model_name: str | None = None  # the timm model this tower is, as open_clip names it
    convnext: dict[str, Any] | None = None  # a ConvNeXt: its attn_vision ConvNeXtConfig fields
    eva: dict[str, Any] | None = None  # a timm Eva ViT: its EVA_FIELDS (RoPE, inner norms, ...)
    vitamin: dict[str, Any] | None = None  # a timm ViTamin: its VITAMIN_FIELDS (the conv stem)

    def __post_init__(self) -> None:
        if isinstance(self.image_size, list):
            self.image_size = tuple(self.image_size)
        if isinstance(self.layers, list):
            self.layers = tuple(self.layers)
        if self.act not in VISION_ACTS:
            raise ValueError(f"vision act must be one of {VISION_ACTS}, got {self.act!r}")
        if self.proj_type not in ("linear", "mlp", "head", "none"):
            raise ValueError(
                f"vision proj_type must be 'linear', 'mlp', 'head' or 'none', got "
                f"{self.proj_type!r}"
            )
        if (self.eva is not None or self.proj_type == "head") and not self.timm_model_name:
            raise ValueError("eva= and proj_type='head' describe a timm tower: they need a "
                             "timm_model_name")  # fmt: skip
        if self.eva is not None:
            self.eva = _eva_fields(self.eva)
            if self.convnext is not None or isinstance(self.layers, tuple):
                raise ValueError("eva= is for ViT towers (not a ConvNeXt or ResNet)")
            if self.eva["rope"] and self.head_width % 4:
                raise ValueError(f"a RoPE tower needs head_width divisible by 4, got "
                                 f"{self.head_width}")  # fmt: skip
        elif self.act == "swiglu":
            raise ValueError("vision act='swiglu' is for EVA towers (eva=...) only")
        if self.vitamin is not None:
            self.vitamin = _vitamin_fields(self.vitamin)
            if not self.timm_model_name:
                raise ValueError("vitamin= describes a timm tower: it needs a timm_model_name")
            if self.eva is not None or self.convnext is not None or isinstance(self.layers, tuple):
                raise ValueError("vitamin= is for ViT towers (not an EVA, ConvNeXt or ResNet)")
            if self.patch_size != 16 or self.patch_bias or self.proj_type not in ("linear", "none"):
                raise ValueError(
                    f"a ViTamin tower has patch_size 16 (its stem's stride), no patch_bias and "
                    f"proj_type 'linear' or 'none', got {self.patch_size}, {self.patch_bias}, "
                    f"{self.proj_type!r}"
                )
        if self.convnext is not None:
            self.convnext = _convnext_fields(self.convnext)
            self.width = self.convnext["dims"][-1]  # what the projection gets, always
            if self.proj_type not in ("linear", "mlp"):
                raise ValueError("a ConvNeXt tower needs proj_type 'linear' or 'mlp'")
            return
        if self.proj_type == "mlp" or self.proj_bias:
            raise ValueError("proj_type='mlp' and proj_bias=True are for ConvNeXt towers only")
        if self.tower == "resnet":
            if self.proj_type == "head":
                raise ValueError("proj_type='head' is for ViT towers (timm's classifier head)")
            if isinstance(self.image_size, tuple) and len(set(self.image_size)) != 1:
                raise ValueError(f"a ResNet tower needs square images, got {self.image_size}")
            if (self.width * 32) % self.head_width:
                raise ValueError(
                    f"ResNet width * 32 ({self.width * 32}) must be divisible by head_width "
                    f"({self.head_width})"
                )
            return
        if self.pool_type not in VISION_POOLS:
            raise ValueError(
                f"vision pool_type must be one of {VISION_POOLS}, got {self.pool_type!r}"
            )
        if self.pool_type == "tok" and not self.class_token:
            raise ValueError("vision pool_type='tok' needs class_token=True")
        if self.width % self.head_width:
            raise ValueError(
                f"vision width ({self.width}) must be divisible by head_width ({self.head_width})"
            )

    @property
    def tower(self) -> str:
        """``"resnet"`` (OpenAI's ModifiedResNet), ``"convnext"`` (timm's) or ``"vit"``."""
        if self.convnext is not None:
            return "convnext"
        return "resnet" if isinstance(self.layers, tuple) else "vit"

    @property
    def heads(self) -> int:
        """Attention heads (ResNet: of the attention pool over ``32 * width`` channels)."""
        width = self.width * 32 if self.tower == "resnet" else self.width
        return width // self.head_width


def _check_fields(d: dict[str, Any], fields, what: str) -> None:
    unknown = sorted(set(d) - set(fields))
    if unknown:
        raise ValueError(f"unknown {what} field(s): {', '.join(unknown)}; "
                         f"expected some of {list(fields)}")  # fmt: skip


def _convnext_fields(d: dict[str, Any]) -> dict[str, Any]:
    """The ConvNeXt architecture fields, complete and checked (tuples, attn_vision's defaults)."""
    from attn_vision.convnext import ConvNeXtConfig

    _check_fields(d, _CONVNEXT_FIELDS, "ConvNeXt")
    c = ConvNeXtConfig(**d)
    return {k: getattr(c, k) for k in _CONVNEXT_FIELDS}


def _vitamin_fields(d: dict[str, Any]) -> dict[str, Any]:
    """The ViTamin stem fields, complete (``VITAMIN_FIELDS``' defaults) and checked."""
    from attn_vision.vitamin import VitaminConfig

    _check_fields(d, VITAMIN_FIELDS, "ViTamin")
    c = VitaminConfig(**d)
    return {k: getattr(c, k) for k in VITAMIN_FIELDS}


def _eva_fields(d: dict[str, Any]) -> dict[str, Any]:
    """The Eva fields, complete (``EVA_FIELDS``' defaults) and checked; the grid a tuple."""
    _check_fields(d, EVA_FIELDS, "EVA")
    out = {**EVA_FIELDS, **d}
    if out["rope_ref_grid"] is not None:
        out["rope_ref_grid"] = tuple(_to_2tuple(out["rope_ref_grid"]))
    return out


@dataclass
class CLIPTextConfig:
    """Text tower: causal Transformer over BPE tokens, pooled at the end-of-text token."""

    context_length: int = 77  # maximum tokens (learned positions)
    vocab_size: int = 49408  # token embedding rows
    width: int = 512  # token width
    # ALBERT's factorized embedding: a (vocab_size, token_dim) table + Linear(token_dim,
    # width); None = a (vocab_size, width) table (every open_clip / OpenAI / HF model)
    token_dim: int | None = None
    heads: int = 8  # attention heads
    layers: int = 12  # transformer blocks
    mlp_ratio: float = 4.0  # MLP hidden width = int(width * mlp_ratio)
    ls_init_value: float | None = None  # LayerScale init; None = no layer scale
    pool_type: str = "argmax"  # "argmax" (highest id = EOT), "eos" (first eos_id), "first", "last"
    eos_id: int = 2  # end-of-text id for pool_type="eos"
    causal: bool = True  # causal self-attention (open_clip's no_causal_mask inverted)
    proj_bias: bool = False  # bias in the output projection
    proj_type: str = "linear"  # "linear" or "none" (no projection: embed_dim must equal width)
    act: str = "gelu"  # MLP activation: "gelu", "gelu_tanh" (SigLIP2) or "quick_gelu"
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
        if self.token_dim is not None and self.token_dim < 1:
            raise ValueError(f"text token_dim must be None or >= 1, got {self.token_dim}")


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
    "block_type": (None, "default"),
    "qk_norm": False,
    "scaled_cosine_attn": False,
    "scale_heads": False,
    "scale_attn_inner": False,
    "scale_attn": False,
    "scale_fc": False,
}
_TEXT_NOOP = {
    "embed_cls": False,
    "final_ln_after_pool": False,
    "output_tokens": False,
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
# open_clip's own-ViT keys, which it ignores for a timm tower (and so do we)
_OPEN_CLIP_VIT_KEYS = {
    "layers", "width", "head_width", "mlp_ratio", "patch_size", "ls_init_value", "no_ln_pre",
    "pool_type", "final_ln_after_pool", "act_kwargs", "norm_kwargs", "attn_pooler_queries",
    "attn_pooler_heads", *_VISION_NOOP,
}  # fmt: skip
# timm-tower keys that do not change inference: the init of the timm weights, dropout
# and stochastic depth while training
_TIMM_IGNORED = ("timm_model_pretrained", "timm_drop", "timm_drop_path")
# what open_clip's ModifiedResNet reads from vision_cfg (heads = width * 32 // head_width)
_RESNET_KEYS = ("image_size", "layers", "width", "head_width")

# timm ``VisionTransformer`` keyword arguments a timm tower may have, with timm's defaults;
# the ones after ``act_layer`` must keep their default
TIMM_VIT_DEFAULTS: dict[str, Any] = {
    "img_size": 224,
    "patch_size": 16,
    "embed_dim": 768,
    "depth": 12,
    "num_heads": 12,
    "mlp_ratio": 4.0,
    "class_token": True,
    "pre_norm": False,
    "init_values": None,
    "act_layer": None,  # None = GELU
    "global_pool": "token",  # replaced by open_clip's timm_pool
    "qkv_bias": True,
    "final_norm": True,
    "fc_norm": None,
    "no_embed_class": False,
}
_TIMM_FIXED = ("qkv_bias", "final_norm", "fc_norm", "no_embed_class")
_TIMM_ACTS = {None: "gelu", "gelu": "gelu", "gelu_tanh": "gelu_tanh", "quick_gelu": "quick_gelu"}
_TIMM_POOLS = {"token": "tok", "avg": "avg", "map": "map"}
# timm ``ConvNeXt`` keyword arguments, with timm's defaults; the _FIXED ones must keep theirs
TIMM_CONVNEXT_DEFAULTS: dict[str, Any] = {
    "depths": (3, 3, 9, 3),
    "dims": (96, 192, 384, 768),
    "kernel_sizes": 7,
    "ls_init_value": 1e-6,
    "patch_size": 4,
    "head_norm_first": False,
    "conv_mlp": False,
    "conv_bias": True,
    "norm_eps": None,  # None = timm's LayerNorm default, 1e-6
    "head_hidden_size": None,  # (open_clip's head would read dims[-1] features: refused)
    "stem_type": "patch",
    "use_grn": False,
    "act_layer": "gelu",
    "norm_layer": None,
    "output_stride": 32,
    "in_chans": 3,
}
_TIMM_CONVNEXT_FIXED = (
    "head_hidden_size", "stem_type", "use_grn", "act_layer", "norm_layer", "output_stride",
    "in_chans",
)  # fmt: skip
_TIMM_CONVNEXT_IGNORED = ("drop_rate", "drop_path_rate", "head_init_scale")  # training / init
# transformers ``hidden_act`` -> ours
_HF_ACTS = {"gelu": "gelu", "gelu_pytorch_tanh": "gelu_tanh", "quick_gelu": "quick_gelu"}


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


def _to_2tuple(x: Any) -> tuple[int, int]:
    return tuple(x) if isinstance(x, (list, tuple)) else (x, x)


def _shipped_timm_tables() -> dict[str, dict[str, dict[str, Any]]]:
    from .registry import timm_tables  # (registry imports this module)

    return timm_tables()


def timm_vision_config(
    name: str,
    args: dict[str, Any],
    image_size: Any,
    timm_pool: str = "avg",
    timm_proj: str | None = "linear",
    timm_proj_bias: bool = False,
) -> CLIPVisionConfig:
    """The :class:`CLIPVisionConfig` of open_clip's timm tower: timm ViT ``name`` built with
    keyword arguments ``args``, pooled by ``timm_pool``, projected by ``timm_proj``: None
    (timm's own classifier ``head``, ``proj_type="head"``) or ``"none"`` (SigLIP), so
    ``timm_proj_bias`` is moot.

    Raises ``ValueError`` naming each argument attn_clip cannot build.
    """
    a = {**TIMM_VIT_DEFAULTS, **args}
    bad = [f"{k}={v!r}" for k, v in args.items() if k not in TIMM_VIT_DEFAULTS]
    bad += [f"{k}={a[k]!r}" for k in _TIMM_FIXED if a[k] != TIMM_VIT_DEFAULTS[k]]
    if a["act_layer"] not in _TIMM_ACTS:
        bad.append(f"act_layer={a['act_layer']!r}")
    if _to_2tuple(a["img_size"]) != _to_2tuple(image_size):
        bad.append(f"img_size={a['img_size']!r} (vision_cfg.image_size is {image_size!r})")
    if timm_pool not in _TIMM_POOLS:
        bad.append(f"timm_pool={timm_pool!r} (expected one of {list(_TIMM_POOLS)})")
    if timm_proj not in ("none", None):
        bad.append(f"timm_proj={timm_proj!r} (expected None: timm's head, or 'none')")
    if bad:
        raise ValueError(f"timm ViT {name!r} with {', '.join(bad)}")
    pool = _TIMM_POOLS[timm_pool]
    return CLIPVisionConfig(
        image_size=image_size,
        patch_size=a["patch_size"],
        width=a["embed_dim"],
        layers=a["depth"],
        head_width=a["embed_dim"] // a["num_heads"],
        mlp_ratio=a["mlp_ratio"],
        ls_init_value=a["init_values"],
        no_ln_pre=not a["pre_norm"],
        pool_type=pool,
        final_ln_after_pool=pool == "avg",  # timm: fc_norm=None means "after pooling" for avg
        act=_TIMM_ACTS[a["act_layer"]],
        norm_eps=1e-6,
        class_token=a["class_token"],
        patch_bias=not a["pre_norm"],
        proj_type="head" if timm_proj is None else "none",
        timm_model_name=name,
    )


def timm_vit_args(v: CLIPVisionConfig) -> dict[str, Any]:
    """timm ``VisionTransformer`` keyword arguments of a timm tower (inverse of
    :func:`timm_vision_config`); ``ValueError`` if timm's ViT cannot express ``v``."""
    pool = {p: t for t, p in _TIMM_POOLS.items()}[v.pool_type]
    bad = []
    if v.norm_eps != 1e-6:
        bad.append(f"norm_eps={v.norm_eps} (timm's is 1e-6)")
    if v.patch_bias != v.no_ln_pre:
        bad.append(f"patch_bias={v.patch_bias} with no_ln_pre={v.no_ln_pre}")
    if v.final_ln_after_pool != (v.pool_type == "avg"):
        bad.append(f"final_ln_after_pool={v.final_ln_after_pool} with pool_type={v.pool_type!r}")
    if v.proj_type not in ("head", "none"):
        bad.append(f"proj_type={v.proj_type!r}")
    if bad:
        raise ValueError(f"vision tower {v.timm_model_name!r} is not a timm ViT: {', '.join(bad)}")
    return {
        "img_size": list(_to_2tuple(v.image_size)),
        "patch_size": v.patch_size,
        "embed_dim": v.width,
        "depth": v.layers,
        "num_heads": v.heads,
        "mlp_ratio": v.mlp_ratio,
        "class_token": v.class_token,
        "pre_norm": not v.no_ln_pre,
        "init_values": v.ls_init_value,
        "act_layer": v.act,
        "global_pool": pool,
    }


def timm_convnext_config(
    name: str,
    args: dict[str, Any],
    image_size: Any,
    timm_pool: str = "avg",
    timm_proj: str | None = "linear",
    timm_proj_bias: bool = False,
) -> CLIPVisionConfig:
    """The :class:`CLIPVisionConfig` of open_clip's timm ConvNeXt tower: timm ConvNeXt
    ``name`` built with keyword arguments ``args``, its classifier reset (average pool +
    LayerNorm kept), then ``timm_proj``: ``"linear"`` or ``"mlp"``, biased per
    ``timm_proj_bias``. Raises ``ValueError`` naming each argument attn_clip cannot build."""
    a = {**TIMM_CONVNEXT_DEFAULTS, **args}
    known = (*TIMM_CONVNEXT_DEFAULTS, *_TIMM_CONVNEXT_IGNORED)
    bad = [f"{k}={v!r}" for k, v in args.items() if k not in known]
    bad += [f"{k}={a[k]!r}" for k in _TIMM_CONVNEXT_FIXED if a[k] != TIMM_CONVNEXT_DEFAULTS[k]]
    kernel = a["kernel_sizes"]
    if isinstance(kernel, (list, tuple)):
        if len(set(kernel)) != 1:
            bad.append(f"kernel_sizes={kernel!r} (one size for every stage)")
        kernel = kernel[0]
    if timm_pool not in ("", "avg"):
        bad.append(f"timm_pool={timm_pool!r} (expected '' or 'avg')")
    if timm_proj not in ("linear", "mlp"):
        bad.append(f"timm_proj={timm_proj!r} (expected 'linear' or 'mlp')")
    if bad:
        raise ValueError(f"timm ConvNeXt {name!r} with {', '.join(bad)}")
    convnext = {
        "depths": a["depths"],
        "dims": a["dims"],
        "patch_size": a["patch_size"],
        "kernel_size": kernel,
        "ls_init_value": a["ls_init_value"],
        "conv_mlp": a["conv_mlp"],
        "conv_bias": a["conv_bias"],
        "head_norm_first": a["head_norm_first"],
        "norm_eps": 1e-6 if a["norm_eps"] is None else a["norm_eps"],
    }
    return CLIPVisionConfig(
        image_size=image_size,
        width=a["dims"][-1],  # what the pooled, normalized features feed the projection
        pool_type="avg",
        proj_type=timm_proj,
        proj_bias=bool(timm_proj_bias),
        timm_model_name=name,
        convnext=convnext,
    )


def timm_convnext_args(v: CLIPVisionConfig) -> dict[str, Any]:
    """timm ``ConvNeXt`` keyword arguments of a ConvNeXt tower (inverse of
    :func:`timm_convnext_config`)."""
    c = v.convnext
    return {
        "depths": list(c["depths"]),
        "dims": list(c["dims"]),
        "kernel_sizes": c["kernel_size"],
        "ls_init_value": c["ls_init_value"],
        "patch_size": c["patch_size"],
        "head_norm_first": c["head_norm_first"],
        "conv_mlp": c["conv_mlp"],
        "conv_bias": c["conv_bias"],
        "norm_eps": c["norm_eps"],
    }


# ViTConfig fields timm's Eva kwargs may set (attn_vision's ``eva_args``) that a CLIP
# tower has no field for: they must keep these values (EVA's: timm's ViT defaults)
_EVA_FIXED = {
    "qkv_bias": True,
    "proj_bias": True,
    "class_token": True,
    "no_embed_class": False,
    "reg_tokens": 0,
    "pre_norm": False,
    "final_norm": True,
    "fc_norm": None,
    "norm_eps": 1e-6,
}
# ViTConfig field -> CLIPVisionConfig field (the rest of a tower's are EVA_FIELDS)
_EVA_VIT_FIELDS = {
    "patch_size": "patch_size", "embed_dim": "width", "depth": "layers", "mlp_ratio": "mlp_ratio",
    "init_values": "ls_init_value", "act": "act",
}  # fmt: skip
# timm ``Eva``'s defaults for the arguments every tower has
TIMM_EVA_DEFAULTS: dict[str, Any] = {
    "img_size": 224,
    "patch_size": 16,
    "embed_dim": 768,
    "depth": 12,
    "num_heads": 12,
    "mlp_ratio": 4.0,
}


def timm_eva_config(
    name: str,
    args: dict[str, Any],
    image_size: Any,
    timm_pool: str = "avg",
    timm_proj: str | None = "linear",
    timm_proj_bias: bool = False,
) -> CLIPVisionConfig:
    """The :class:`CLIPVisionConfig` of open_clip's timm ``Eva`` tower (EVA-01, EVA02):
    timm Eva ``name`` built with keyword arguments ``args`` (translated by attn_vision's
    ``eva_args``), pooled by ``timm_pool``, projected by timm's own classifier ``head``
    (``timm_proj=None``: ``proj_type="head"``) or not at all (``"none"``).

    Raises ``ValueError`` naming each argument attn_clip cannot build (e.g. EVA02-E's
    ``use_post_norm=True``).
    """
    from attn_vision.timm_table import eva_args  # (imports no timm for these kwargs)

    vit, bad = eva_args({**TIMM_EVA_DEFAULTS, **args})
    qkv_fused = bool(args.get("qkv_fused", True))
    bad += [f"{k}={vit[k]!r}" for k, v in _EVA_FIXED.items() if k in vit and vit[k] != v]
    known = {*_EVA_FIXED, *_EVA_VIT_FIELDS, *EVA_FIELDS, "img_size", "num_heads", "global_pool"}
    bad += [f"{k}={v!r}" for k, v in vit.items() if k not in known]  # (no CLIP tower field)
    if vit.get("act", "gelu") not in VISION_ACTS:
        bad.append(f"act={vit['act']!r}")
    if _to_2tuple(vit["img_size"]) != _to_2tuple(image_size):
        bad.append(f"img_size={vit['img_size']!r} (vision_cfg.image_size is {image_size!r})")
    if timm_pool not in _TIMM_POOLS or timm_pool == "map":
        bad.append(f"timm_pool={timm_pool!r} (expected 'token' or 'avg')")
    if timm_proj not in (None, "none"):
        bad.append(f"timm_proj={timm_proj!r} (expected None: timm's head, or 'none')")
    if bad:
        raise ValueError(f"timm EVA {name!r} with {', '.join(bad)}")
    pool = _TIMM_POOLS[timm_pool]
    eva = {k: vit[k] for k in EVA_FIELDS if k in vit}
    if vit.get("act") != "swiglu":
        eva.pop("mlp_gate_last", None)
    return CLIPVisionConfig(
        **{ours: vit[k] for k, ours in _EVA_VIT_FIELDS.items() if k in vit},
        image_size=image_size,
        head_width=vit["embed_dim"] // vit["num_heads"],
        no_ln_pre=True,
        pool_type=pool,
        final_ln_after_pool=pool == "avg",  # timm Eva: use_fc_norm=None means global_pool == avg
        norm_eps=1e-6,
        patch_bias=True,
        proj_type="head" if timm_proj is None else "none",
        timm_model_name=name,
        eva={**eva, "qkv_fused": qkv_fused},
    )


def timm_eva_args(v: CLIPVisionConfig) -> dict[str, Any]:
    """timm ``Eva`` keyword arguments of an EVA tower (inverse of :func:`timm_eva_config`);
    ``ValueError`` if timm's Eva cannot express ``v``."""
    e = v.eva or EVA_FIELDS
    swiglu = v.act == "swiglu"
    bad = []
    if v.norm_eps != 1e-6:
        bad.append(f"norm_eps={v.norm_eps} (timm's is 1e-6)")
    if not (v.no_ln_pre and v.patch_bias and v.class_token):
        bad.append("no_ln_pre, patch_bias and class_token must be True")
    if v.pool_type not in ("tok", "avg") or v.final_ln_after_pool != (v.pool_type == "avg"):
        bad.append(f"pool_type={v.pool_type!r} with final_ln_after_pool={v.final_ln_after_pool}")
    if v.proj_type not in ("head", "none"):
        bad.append(f"proj_type={v.proj_type!r}")
    if v.act not in ("gelu", "swiglu"):
        bad.append(f"act={v.act!r}")
    if swiglu and e["mlp_gate_last"] != e["mlp_inner_norm"]:  # timm: SwiGLU iff scale_mlp
        bad.append(f"mlp_gate_last={e['mlp_gate_last']} with mlp_inner_norm={e['mlp_inner_norm']}")
    if bad:
        raise ValueError(f"vision tower {v.timm_model_name!r} is not a timm Eva: {', '.join(bad)}")
    out = {
        "img_size": list(_to_2tuple(v.image_size)),
        "patch_size": v.patch_size,
        "embed_dim": v.width,
        "depth": v.layers,
        "num_heads": v.heads,
        "mlp_ratio": v.mlp_ratio,
        "qkv_fused": e["qkv_fused"],
        "swiglu_mlp": swiglu,
        "scale_mlp": e["mlp_inner_norm"],
        "scale_attn_inner": e["attn_inner_norm"],
        "use_rot_pos_emb": e["rope"],
        "init_values": v.ls_init_value,
        "global_pool": "token" if v.pool_type == "tok" else "avg",
    }
    if e["rope_ref_grid"] is not None:
        out["ref_feat_shape"] = list(e["rope_ref_grid"])
    return out


# ViTConfig fields timm's ViTamin kwargs may set (attn_vision's ``vitamin_args``) that a
# CLIP tower has no field for: they must keep these values (timm's ViT defaults)
_VITAMIN_FIXED = {
    "qkv_bias": True,
    "proj_bias": True,
    "no_embed_class": False,
    "reg_tokens": 0,
    "final_norm": True,
    "fc_norm": None,
    "norm_eps": 1e-6,
    "dist_token": False,
}
_VITAMIN_KNOWN = {
    *_VITAMIN_FIXED, *VITAMIN_FIELDS, "img_size", "embed_dim", "depth", "num_heads",
    "mlp_ratio", "class_token", "global_pool", "pre_norm", "init_values", "act",
}  # fmt: skip


def timm_vitamin_config(
    name: str,
    args: dict[str, Any],
    image_size: Any,
    timm_pool: str = "avg",
    timm_proj: str | None = "linear",
    timm_proj_bias: bool = False,
) -> CLIPVisionConfig:
    """The :class:`CLIPVisionConfig` of open_clip's timm ViTamin tower: timm ViTamin
    ``name`` built with keyword arguments ``args`` (translated by attn_vision's
    ``vitamin_args``), its classifier removed (``timm_pool`` ``""``: timm's own pooling,
    average), then open_clip's ``timm_proj``: ``"linear"`` (bias-free) or ``"none"``.

    A tower without position embedding (``vitamin_xlarge_*``) computes the same at any
    image size: built at ``image_size`` (open_clip's ``ViTamin-XL-384`` feeds its 384 px
    trunk 256 px images). Raises ``ValueError`` naming each argument attn_clip cannot build.
    """
    from attn_vision.timm_table import vitamin_args  # (imports no timm for these kwargs)

    defaults = {k: TIMM_VIT_DEFAULTS[k] for k in ("img_size", "embed_dim", "depth", "num_heads")}
    vit, bad = vitamin_args({**defaults, "mlp_ratio": 4.0, **args})
    bad += [f"{k}={vit[k]!r}" for k, v in _VITAMIN_FIXED.items() if k in vit and vit[k] != v]
    bad += [f"{k}={v!r}" for k, v in vit.items() if k not in _VITAMIN_KNOWN]
    if vit.get("act", "gelu") not in ACTS:
        bad.append(f"act={vit['act']!r}")
    pool = timm_pool or vit.get("global_pool", "token")  # "": the trunk's own
    if pool not in ("token", "avg"):
        bad.append(f"timm_pool={timm_pool!r} (expected '', 'token' or 'avg')")
    if vit["pos_embed"] != "none" and _to_2tuple(vit["img_size"]) != _to_2tuple(image_size):
        bad.append(f"img_size={vit['img_size']!r} (vision_cfg.image_size is {image_size!r})")
    if timm_proj not in ("linear", "none") or timm_proj_bias:
        bad.append(f"timm_proj={timm_proj!r}, timm_proj_bias={timm_proj_bias!r} (expected "
                   "'linear' without bias, or 'none')")  # fmt: skip
    if bad:
        raise ValueError(f"timm ViTamin {name!r} with {', '.join(bad)}")
    return CLIPVisionConfig(
        image_size=image_size,
        patch_size=16,
        width=vit["embed_dim"],
        layers=vit["depth"],
        head_width=vit["embed_dim"] // vit["num_heads"],
        mlp_ratio=vit["mlp_ratio"],
        ls_init_value=vit.get("init_values"),
        no_ln_pre=not vit.get("pre_norm", False),
        pool_type=_TIMM_POOLS[pool],
        final_ln_after_pool=pool == "avg",  # timm: fc_norm=None means "after pooling" for avg
        act=vit.get("act", "gelu"),
        norm_eps=1e-6,
        class_token=vit.get("class_token", True),
        proj_type=timm_proj,
        timm_model_name=name,
        vitamin={k: vit[k] for k in VITAMIN_FIELDS},
    )


def timm_vitamin_args(v: CLIPVisionConfig) -> dict[str, Any]:
    """timm ViTamin keyword arguments of a ViTamin tower (inverse of
    :func:`timm_vitamin_config`; ``embed_cfg`` as the dict of timm's ``VitCfg`` fields the
    stem reads)."""
    from attn_vision.timm_table import GEGLU_MLP

    e = v.vitamin
    if v.norm_eps != 1e-6 or v.final_ln_after_pool != (v.pool_type == "avg"):
        raise ValueError(f"vision tower {v.timm_model_name!r} is not a timm ViTamin: norm_eps="
                         f"{v.norm_eps}, final_ln_after_pool={v.final_ln_after_pool} with "
                         f"pool_type={v.pool_type!r}")  # fmt: skip
    return {
        "img_size": list(_to_2tuple(v.image_size)),
        "embed_dim": v.width,
        "depth": v.layers,
        "num_heads": v.heads,
        "mlp_ratio": v.mlp_ratio,
        "mlp_layer": GEGLU_MLP,
        "class_token": v.class_token,
        "global_pool": "token" if v.pool_type == "tok" else "avg",
        "pos_embed": e["pos_embed"],
        "pre_norm": not v.no_ln_pre,
        "init_values": v.ls_init_value,
        "act_layer": v.act,
        "embed_cfg": {
            "embed_dim": [*e["conv_dims"], v.width],
            "depths": [*e["conv_depths"], 1],
            "stem_width": e["stem_width"],
        },
    }


# a table of open_clip_registry.json -> (its timm models' kwargs -> our config, the inverse)
TIMM_FAMILIES = {
    "timm_vit": (timm_vision_config, timm_vit_args),
    "timm_convnext": (timm_convnext_config, timm_convnext_args),
    "timm_eva": (timm_eva_config, timm_eva_args),
    "timm_vitamin": (timm_vitamin_config, timm_vitamin_args),
}


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
        for name, tower in (("text", self.text), ("vision", self.vision)):
            if tower.proj_type == "none" and tower.width != self.embed_dim:
                raise ValueError(
                    f"{name} proj_type='none' needs {name} width ({tower.width}) == embed_dim "
                    f"({self.embed_dim})"
                )

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
        if not self.vision.timm_model_name:
            d["vision"]["act"] = act
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
    def from_open_clip(
        cls, cfg: dict[str, Any], timm_tables: dict[str, dict[str, Any]] | None = None
    ) -> CLIPConfig:
        """Build from an open_clip model config dict (``open_clip.get_model_config(name)``).

        ``timm_tables``: ``{"timm_vit": {name: kwargs}, "timm_convnext": {...}, ...}``, timm's
        keyword arguments of the timm towers (default: the tables shipped with attn_clip).
        Raises ``ValueError`` naming every key that asks for a feature not built here
        (Hugging Face text towers, attentional pooling, CoCa, timm towers other than plain
        ViTs, ConvNeXts, Evas and ViTamins, ...).
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

        vision = None
        timm_name = vcfg.pop("timm_model_name", None)
        if timm_name:  # a timm tower: its architecture comes from timm, not from vision_cfg
            tables = _shipped_timm_tables() if timm_tables is None else timm_tables
            family = next((f for f in TIMM_FAMILIES if timm_name in tables.get(f, {})), None)
            args = vcfg.pop("timm_model_args", None)
            if args is None and family is not None:
                args = tables[family][timm_name]
            for k in _TIMM_IGNORED:
                vcfg.pop(k, None)
            pool, proj = vcfg.pop("timm_pool", "avg"), vcfg.pop("timm_proj", "linear")
            proj_bias = vcfg.pop("timm_proj_bias", False)
            image_size = vcfg.pop("image_size", 224)
            bad += [f"vision_cfg.{k}" for k in vcfg if k not in _OPEN_CLIP_VIT_KEYS]
            if family is None:
                bad.append(
                    f"vision_cfg.timm_model_name={timm_name!r} (not a timm ViT, ConvNeXt or Eva)"
                )
            else:
                try:
                    to_config = TIMM_FAMILIES[family][0]
                    vision = to_config(timm_name, args, image_size, pool, proj, proj_bias)
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
            v_eps = _norm_eps(vcfg, "vision_cfg", bad)
            v_act = _act(act, vcfg, "vision_cfg", bad)
            known_v = {f.name for f in fields(CLIPVisionConfig)} - {"act", "norm_eps"}
            bad += [f"vision_cfg.{k}" for k in vcfg if k not in known_v]

        for k, allowed in _TEXT_NOOP.items():
            if k in tcfg and not _is_noop(tcfg.pop(k), allowed):
                bad.append(f"text_cfg.{k}")
        for k in _TEXT_IGNORED:
            tcfg.pop(k, None)
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
        return cls(
            embed_dim=embed_dim,
            vision=vision,
            text=CLIPTextConfig(**tcfg, act=t_act, norm_eps=t_eps),
            init_logit_scale=init_logit_scale,
            init_logit_bias=init_logit_bias,
        )

    def _timm_vision_cfg(self) -> dict[str, Any]:
        """open_clip's ``vision_cfg`` of a timm tower; ``timm_model_args`` when the tower is
        not exactly its timm name's architecture."""
        v = self.vision
        family = {"convnext": "timm_convnext"}.get(v.tower, "timm_eva" if v.eva else "timm_vit")
        family = "timm_vitamin" if v.vitamin is not None else family
        to_config, to_args = TIMM_FAMILIES[family]
        args = to_args(v)  # raises if timm cannot express it
        pool = args.pop("global_pool", "")  # (a ConvNeXt: its own average pool)
        image_size = list(v.image_size) if isinstance(v.image_size, tuple) else v.image_size
        proj = None if v.proj_type == "head" else v.proj_type  # None: timm's own head
        out = {
            "image_size": image_size,
            "timm_model_name": v.timm_model_name,
            "timm_model_pretrained": False,
            "timm_pool": pool,
            "timm_proj": proj,
            "timm_proj_bias": v.proj_bias,
        }
        preset = _shipped_timm_tables()[family].get(v.timm_model_name)
        try:
            same = (
                preset is not None
                and to_config(v.timm_model_name, preset, v.image_size, pool, proj, v.proj_bias) == v
            )
        except ValueError:
            same = False
        if not same:
            out["timm_model_args"] = args
        return out

    def to_open_clip(self) -> dict[str, Any]:
        """The open_clip model config dict for this architecture (inverse of ``from_open_clip``)."""
        v, t = self.vision, self.text
        quick = t.act == "quick_gelu"
        if not v.timm_model_name and (v.act == "quick_gelu") != quick:
            raise ValueError("open_clip configs have one QuickGELU flag for both towers")
        if v.timm_model_name:
            vision_cfg = self._timm_vision_cfg()
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
                "image_size": (
                    list(v.image_size) if isinstance(v.image_size, tuple) else v.image_size
                ),
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
        out: dict[str, Any] = {
            "embed_dim": self.embed_dim,
            "quick_gelu": quick,
            "vision_cfg": vision_cfg,
            "text_cfg": text_cfg,
            "init_logit_scale": self.init_logit_scale,
        }
        if self.init_logit_bias is not None:
            out["init_logit_bias"] = self.init_logit_bias
        return out

    @classmethod
    def from_hf(cls, cfg: dict[str, Any]) -> CLIPConfig:
        """Build from a transformers ``CLIPConfig``, ``SiglipConfig`` or ``Siglip2Config``
        (the ``config.json`` of ``save_pretrained``).

        Takes the plain dict, so reading a checkpoint does not need transformers.
        """
        model_type = cfg.get("model_type", "clip")
        if model_type in ("siglip", "siglip2"):
            return cls._from_hf_siglip(cfg, model_type)
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
        return cls(
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

    @classmethod
    def _from_hf_siglip(cls, cfg: dict[str, Any], model_type: str) -> CLIPConfig:
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
        return cls(
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
    name = c.get("hidden_act", default)
    if name not in _HF_ACTS:
        raise ValueError(f"{where}.hidden_act={name!r} is not supported; expected {list(_HF_ACTS)}")
    return _HF_ACTS[name]


def _hf_ratio(c: dict[str, Any], width: int, default: int) -> float:
    hidden = c.get("intermediate_size", default)
    r = hidden / width
    if int(width * r) != hidden:
        raise ValueError(f"intermediate_size {hidden} is not int(width * ratio)")
    return r
