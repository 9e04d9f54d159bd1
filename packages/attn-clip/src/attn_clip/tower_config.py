"""The towers' configs: ``CLIPVisionConfig``, ``CLIPTextConfig``, and ``PreprocessConfig``.

Field names follow open_clip's ``CLIPVisionCfg`` / ``CLIPTextCfg``, so its model configs
read directly (:mod:`attn_clip.config_open_clip`; transformers' in
:mod:`attn_clip.config_hf`). :class:`~attn_clip.config.CLIPConfig` holds one of each.

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
* ``"swin"``: a timm Swin Transformer trunk (``timm_model_name="swin_base_patch4_window7_224"``,
  :attr:`CLIPVisionConfig.swin`), its final LayerNorm'd map average pooled, then the same
  ``timm_proj`` head as a ConvNeXt's;
* ``"fastvit"``: MobileCLIP's timm FastViT / MCi trunk (``timm_model_name="fastvit_mci2"``,
  :attr:`CLIPVisionConfig.fastvit`), average pooled into timm's own classifier as the
  projection (:mod:`attn_clip.mobileclip`);
* ``"resnet"``: OpenAI's ModifiedResNet (``vision_cfg.layers`` a list of stage depths).

A timm ViTamin (``timm_model_name="vitamin_small_224"``) is a ``"vit"`` tower too: a ViT on a
conv stem with GeGLU MLPs (:attr:`CLIPVisionConfig.vitamin`: the stem's fields), average
pooled, then open_clip's ``timm_proj="linear"`` head (bias-free, as a ViT's ``proj``).
A timm tower's fields come from attn_vision's preset of its timm name
(:mod:`attn_clip.config_timm`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from attn_vision.convnext import ConvNeXtConfig
from attn_vision.patch_embed import to_2tuple
from attn_vision.swin import SwinConfig
from attn_vision.vitamin import VitaminConfig

from .mobileclip import check_vision_config as _check_mobileclip

__all__ = ["CLIPTextConfig", "CLIPVisionConfig", "MultimodalConfig", "PreprocessConfig"]

CONVNEXT_FIELDS = (  # attn_vision ConvNeXtConfig fields that make up the architecture
    "depths", "dims", "patch_size", "kernel_size", "ls_init_value", "conv_mlp", "conv_bias",
    "head_norm_first", "head_hidden_size", "norm_eps",
)  # fmt: skip
SWIN_FIELDS = (  # attn_vision SwinConfig fields that make up the architecture (not img_size:
    # the tower's image_size)
    "patch_size", "embed_dim", "depths", "num_heads", "window_size", "mlp_ratio", "qkv_bias",
    "norm_eps",
)  # fmt: skip
# a timm Eva tower's fields beyond a CLIP ViT's: attn_vision ViTConfig fields, with their
# defaults, and timm's ``qkv_fused`` and ``attn_type`` (EVA_LAYOUT: only the layout of
# open_clip's checkpoint: one ``qkv`` with ``q_bias`` / ``v_bias``, or separate ``q_proj`` /
# ``k_proj`` / ``v_proj``; with "rope", timm's AttentionRope, the biases are in those)
EVA_FIELDS: dict[str, Any] = {
    "rope": False,  # 2D axial RoPE on the patch tokens' queries / keys (EVA02)
    "rope_ref_grid": None,  # RoPE positions scaled onto this (h, w) patch grid
    "attn_inner_norm": False,  # LayerNorm before the attention output proj (scale_attn_inner)
    "mlp_inner_norm": False,  # LayerNorm before fc2 (timm's scale_mlp)
    "mlp_gate_last": True,  # swiglu: fc1 gives [x, gate] (timm SwiGLU); False: [gate, x]
    "post_norm": False,  # res-post-norm blocks, x + norm(branch(x)) (EVA02-E: use_post_norm)
    "rope_grid_offset": 0.0,  # added to the RoPE grid's row / column indices (PE-Core: 1)
    "rope_grid_indexing": "ij",  # RoPE bands [rows | cols]; "xy": [cols | rows] (PE-Core)
    "pool_include_prefix": False,  # the MAP head reads the class token too (an Eva's does)
    "attn_pool_num_heads": None,  # the MAP head's heads (PE-Core: 8); None = the blocks'
    "attn_pool_mlp_ratio": None,  # the MAP head's MLP ratio; None = the blocks'
    "qkv_fused": True,  # timm's checkpoint layout (see above); no effect on the math
    "attn_type": "eva",  # timm's EvaAttention ("eva") or AttentionRope ("rope"): a layout
}
EVA_LAYOUT = ("qkv_fused", "attn_type")  # the EVA_FIELDS that only name checkpoint keys

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
    (a timm Eva: ``eva`` set); or a timm ConvNeXt (``convnext``) or Swin (``swin``) with
    open_clip's projection head; or OpenAI's ModifiedResNet (``layers`` a tuple). The ViT
    fields mean nothing to a ConvNeXt or Swin."""

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
    qkv_bias: bool = True  # bias in the qkv projection (timm vit_medium_*_gap / vit_relpos_*: none)
    # timm vit_relpos_*: a log-coordinate MLP relative position bias of this hidden width in
    # every block, and no absolute position embedding; None = the usual learned positions
    rel_pos_dim: int | None = None
    patch_bias: bool = False  # bias in the patch embedding (timm's SigLIP and Eva towers)
    # "linear" (ViT: bias-free; ConvNeXt: open_clip's head.proj), "mlp" (ConvNeXt: head.mlp,
    # Linear-GELU-Linear, 2 * embed_dim wide), "head" (timm ViT / Eva: the trunk's own
    # classifier, a Linear with bias, open_clip's timm_proj=None) or "none" (embed_dim == width)
    proj_type: str = "linear"
    proj_bias: bool = False  # bias in a ConvNeXt's projection (open_clip's timm_proj_bias)
    timm_model_name: str | None = None  # the timm model this tower is, as open_clip names it
    convnext: dict[str, Any] | None = None  # a ConvNeXt: its attn_vision ConvNeXtConfig fields
    swin: dict[str, Any] | None = None  # a Swin: its attn_vision SwinConfig fields (SWIN_FIELDS)
    eva: dict[str, Any] | None = None  # a timm Eva ViT: its EVA_FIELDS (RoPE, inner norms, ...)
    vitamin: dict[str, Any] | None = None  # a timm ViTamin: its VITAMIN_FIELDS (the conv stem)
    # MobileCLIP (attn_clip.mobileclip): a timm FastViT / MCi's FASTVIT_FIELDS, or the MCi
    # ViT's (vit_base_mci_224, a "vit" tower) conv-stem MCI_FIELDS
    fastvit: dict[str, Any] | None = None
    mci: dict[str, Any] | None = None
    # CoCa's attentional pooler: attn_pooler_queries learned queries (attn_pooler_heads heads)
    # attend over the last block's tokens; query 0 is pooled (ln_post, proj), the others are
    # the image tokens the captioner's decoder reads (open_clip's original CoCa setup)
    attentional_pool: bool = False
    attn_pooler_queries: int = 256
    attn_pooler_heads: int = 8

    def __post_init__(self) -> None:
        if self.attentional_pool and (
            self.tower != "vit" or self.timm_model_name or self.pool_type != "tok"
        ):
            raise ValueError(
                "attentional_pool=True is for open_clip's own ViT with pool_type='tok' (CoCa)"
            )
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
        timm_only = self.proj_type == "head" or not self.qkv_bias or self.rel_pos_dim is not None
        if (self.eva is not None or timm_only) and not self.timm_model_name:
            raise ValueError("eva=, proj_type='head', qkv_bias=False and rel_pos_dim describe a "
                             "timm tower: they need a timm_model_name")  # fmt: skip
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
        if self.fastvit is not None or self.mci is not None:  # MobileCLIP's towers
            _check_mobileclip(self)
            if self.fastvit is not None:
                return
        if self.convnext is not None and self.swin is not None:
            raise ValueError("a tower is a ConvNeXt (convnext=) or a Swin (swin=), not both")
        if self.convnext is not None:
            self.convnext = _convnext_fields(self.convnext)
            self.width = self.convnext["dims"][-1]  # what the projection gets, always
            if self.proj_type not in ("linear", "mlp"):
                raise ValueError("a ConvNeXt tower needs proj_type 'linear' or 'mlp'")
            return
        if self.swin is not None:
            if not self.timm_model_name or self.eva is not None or self.vitamin is not None:
                raise ValueError("swin= describes a timm Swin tower: it needs a timm_model_name "
                                 "(and no eva= or vitamin=)")  # fmt: skip
            self.swin = _swin_fields(self.swin, self.image_size)
            self.width = self.swin["embed_dim"] * 2 ** (len(self.swin["depths"]) - 1)
            if self.proj_type not in ("linear", "mlp"):
                raise ValueError("a Swin tower needs proj_type 'linear' or 'mlp'")
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
        """``"resnet"`` (OpenAI's ModifiedResNet), ``"convnext"`` / ``"swin"`` (timm's) or
        ``"vit"``."""
        if self.convnext is not None:
            return "convnext"
        if self.swin is not None:
            return "swin"
        if self.fastvit is not None:
            return "fastvit"
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
    _check_fields(d, CONVNEXT_FIELDS, "ConvNeXt")
    c = ConvNeXtConfig(**d)
    return {k: getattr(c, k) for k in CONVNEXT_FIELDS}


def _swin_fields(d: dict[str, Any], image_size: Any) -> dict[str, Any]:
    """The Swin architecture fields, complete and checked at ``image_size`` (tuples,
    attn_vision's defaults)."""
    _check_fields(d, SWIN_FIELDS, "Swin")
    c = SwinConfig(**d, img_size=image_size, num_classes=0)
    return {k: getattr(c, k) for k in SWIN_FIELDS}


def _vitamin_fields(d: dict[str, Any]) -> dict[str, Any]:
    """The ViTamin stem fields, complete (``VITAMIN_FIELDS``' defaults) and checked."""
    _check_fields(d, VITAMIN_FIELDS, "ViTamin")
    c = VitaminConfig(**d)
    return {k: getattr(c, k) for k in VITAMIN_FIELDS}


def _eva_fields(d: dict[str, Any]) -> dict[str, Any]:
    """The Eva fields, complete (``EVA_FIELDS``' defaults) and checked; the grid a tuple."""
    _check_fields(d, EVA_FIELDS, "EVA")
    out = {**EVA_FIELDS, **d}
    if out["rope_ref_grid"] is not None:
        out["rope_ref_grid"] = to_2tuple(out["rope_ref_grid"])
    return out


@dataclass
class CLIPTextConfig:
    """Text tower: causal Transformer over BPE tokens, pooled at the end-of-text token; or
    (``hf_encoder`` / ``hf_model_name`` set) a Hugging Face text encoder, pooled and
    projected as open_clip's ``HFTextEncoder`` (:mod:`attn_clip.hf_text`)."""

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
    # CoCa: a learned CLS embedding appended after the tokens (one position more), pooled
    # (then ln_final); keys of pad tokens (pad_id) masked as open_clip's pretrained CoCa
    # weights were trained (open_clip's "legacy" mask, shifted by one position)
    embed_cls: bool = False
    pad_id: int = 0
    # a Hugging Face text tower instead (open_clip's HFTextEncoder; attn_clip.hf_text): the
    # model open_clip names (text_cfg.hf_model_name), its architecture as attn_nlp's encoder
    # config ({"model_type": "attn_nlp.roberta", ...}: resolved from hf_model_name when not
    # given, so a saved config needs no network), the pooler and the projection. Of the
    # fields above only context_length (the tokenizer's) and the tokenizer's own apply;
    # width and vocab_size are set to the encoder's
    hf_model_name: str | None = None
    hf_encoder: dict[str, Any] | None = None
    # "mean_pooler", "cls_pooler", "cls_last_hidden_state_pooler"; None = the family's default
    hf_pooler_type: str | None = "mean_pooler"
    hf_proj_type: str | None = "mlp"  # "mlp", "linear" or None (no projection)

    def __post_init__(self) -> None:
        if self.hf_model_name is not None or self.hf_encoder is not None:
            self._check_hf()
            return
        if self.embed_cls and not self.causal:
            raise ValueError("embed_cls=True (CoCa) needs a causal text tower")
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

    @property
    def tower(self) -> str:
        """``"hf"`` (a Hugging Face text tower: ``hf_encoder``) or ``"transformer"``."""
        return "hf" if self.hf_encoder is not None else "transformer"

    def _check_hf(self) -> None:
        """A Hugging Face tower: the encoder config resolved and completed, the pooler and
        projection checked, width and vocab_size set to the encoder's."""
        from . import hf_text

        if self.embed_cls:
            raise ValueError("embed_cls=True (CoCa's text tower) is not a Hugging Face tower's")
        if self.act not in ACTS:  # (the quick_gelu flag of open_clip's config, kept)
            raise ValueError(f"text act must be one of {ACTS}, got {self.act!r}")
        if self.hf_proj_type not in hf_text.PROJ_TYPES:
            raise ValueError(
                f"hf_proj_type must be one of {hf_text.PROJ_TYPES}, got {self.hf_proj_type!r}"
            )
        if self.hf_encoder is None:
            self.hf_encoder = hf_text.encoder_from_hf_name(
                self.hf_model_name, self.hf_pooler_type or "mean_pooler"
            )
        kind = self.hf_encoder.get("model_type")
        enc = hf_text.encoder_config(self.hf_encoder)  # ValueError on unknown kinds / fields
        if self.hf_pooler_type is None:
            self.hf_pooler_type = hf_text.DEFAULT_POOLERS[kind]
        hf_text.check_pooler(self.hf_pooler_type)
        self.hf_encoder = hf_text.with_pooler_layer(
            hf_text.encoder_dict(enc, kind), self.hf_pooler_type
        )
        self.width, self.vocab_size = enc.embed_dim, enc.vocab_size


@dataclass
class MultimodalConfig:
    """CoCa's multimodal text decoder: ``layers`` pairs of a causal self-attention block
    and a cross-attention block over the image tokens, then LayerNorm and the projection to
    the vocabulary (open_clip's ``MultimodalTransformer``; its MLPs are always 4x wide)."""

    width: int = 512  # token width (= the image tokens' width)
    layers: int = 12  # (self-attention block, cross-attention block) pairs
    heads: int = 8
    context_length: int = 76  # longest caption the decoder reads
    ls_init_value: float | None = None  # LayerScale init; None = no layer scale
    act: str = "gelu"  # "gelu" or "quick_gelu" (open_clip's quick_gelu flag)
    # rows of the vocabulary projection; None = the text tower's vocab_size. open_clip
    # projects to text_cfg.vocab_size, which a Hugging Face tower does not read: for
    # coca_roberta-ViT-B-32 that is open_clip's default 49408, not RoBERTa's 50265
    vocab_size: int | None = None

    def __post_init__(self) -> None:
        if self.act not in ACTS:
            raise ValueError(f"multimodal act must be one of {ACTS}, got {self.act!r}")
        if self.vocab_size is not None and self.vocab_size < 1:
            raise ValueError(f"multimodal vocab_size must be None or >= 1, got {self.vocab_size}")
        if self.width % self.heads:
            raise ValueError(
                f"multimodal width ({self.width}) must be divisible by heads ({self.heads})"
            )


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
