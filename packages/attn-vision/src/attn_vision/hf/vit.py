"""transformers' ViT, DeiT and DINOv2 checkpoints -> :class:`~attn_vision.vit.VisionTransformer`.

Reads the ``config.json`` + weights that ``save_pretrained`` writes for ``ViTModel`` /
``ViTForImageClassification`` (``model_type`` ``"vit"``), ``DeiTModel`` /
``DeiTForImageClassification`` / ``DeiTForImageClassificationWithTeacher`` (``"deit"``),
``Dinov2Model`` / ``Dinov2ForImageClassification`` (``"dinov2"``) and
``Dinov2WithRegistersModel`` / ``...ForImageClassification`` (``"dinov2_with_registers"``).
The layouts, transformers' names on the left (the bare ``*Model`` with or without its
prefix ``vit.`` / ``deit.`` / ``dinov2.`` / ``dinov2_with_registers.``)::

    embeddings.cls_token / distillation_token   cls_token / dist_token
    embeddings.register_tokens                  reg_token
    embeddings.position_embeddings              pos_embed
    embeddings.patch_embeddings.projection      patch_embed.proj
    embeddings.mask_token                       (dropped: masked-image pretraining only)
    encoder.layer.{i}.attention.attention.query / key / value   blocks.{i}.attn.qkv (fused)
    encoder.layer.{i}.attention.output.dense    blocks.{i}.attn.proj
    encoder.layer.{i}.layernorm_before / _after blocks.{i}.norm1 / norm2      (ViT, DeiT)
    encoder.layer.{i}.intermediate.dense / output.dense   blocks.{i}.mlp.fc1 / fc2
    encoder.layer.{i}.norm1 / norm2 / mlp.fc1 / mlp.fc2   the same names   (DINOv2)
    encoder.layer.{i}.layer_scale1 / 2.lambda1  blocks.{i}.ls1 / ls2.gamma    (DINOv2)
    encoder.layer.{i}.mlp.weights_in / weights_out  blocks.{i}.mlp.fc1 / fc2  (SwiGLU: giant)
    layernorm                                   norm
    pooler.dense                                pre_logits.fc  (+ tanh: ViTModel / DeiTModel)
    classifier                                  head
    cls_classifier / distillation_classifier    head / head_dist   (DeiT with teacher)

(transformers 5's in-memory names -- ``layers.{i}.attention.q_proj``, ``o_proj``,
``mlp.fc1``, SwiGLU's ``mlp.gate_proj`` / ``up_proj`` / ``down_proj`` -- are read too.)
The model math that differs from timm's ViT and is read
from the config: ``layer_norm_eps`` (1e-12 in ViT / DeiT), ``hidden_act``, ``qkv_bias``,
``intermediate_size`` / ``mlp_ratio``, ``image_size``, ``patch_size``, ``num_channels``,
``layerscale_value``, ``use_swiglu_ffn`` (DINOv2-giant: SwiGLU, two thirds of the hidden
width rounded up to 8, ``[gate, x]``), ``num_register_tokens``, ``pooler_output_size`` /
``pooler_act`` (tanh only). Training-only fields (dropouts, ``drop_path_rate``) are kept in
the config, identity in eval; ``use_mask_token`` / ``mask_token`` (masked-image pretraining)
is dropped. DINOv2 with registers adds the [CLS]
position embedding before the registers are inserted; it is folded into ``cls_token``
(the class position is never resampled) and the model built with ``no_embed_class``, as
timm converts these checkpoints.

Position embeddings at another image size: transformers' DINOv2 interpolates the stored
grid on every forward (bicubic; DINOv2 without antialiasing, DINOv2-with-registers with
it); ViT / DeiT do the same only with ``interpolate_pos_encoding=True`` (else they refuse
the size), without antialiasing. Our ViT resamples on every forward when the grid differs
(bicubic, float32), antialiased or not as ``ViTConfig.pos_embed_antialias`` says: False
for all of these but DINOv2-with-registers.

``Dinov2ForImageClassification``'s head reads ``cat([CLS], mean of the patch tokens)``:
:class:`Dinov2LinearClassifier` (family ``"dinov2_linear"``).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from typing import Any

import torch
from attn_core.activations import hf_activation
from attn_core.hub import CheckpointError
from torch import nn

from ..convert import check_state_dict, expected_state_dict_shapes
from ..patch_embed import resample_abs_pos_embed, to_2tuple
from ..vit import VisionTransformer, ViTConfig
from ._keys import check_architectures

__all__ = [
    "ARCHITECTURES",
    "MODEL_TYPES",
    "REFUSED_ARCHITECTURES",
    "Dinov2LinearClassifier",
    "config_from_hf",
    "convert_hf",
    "convert_dinov2_linear",
]

MODEL_TYPES = ("vit", "deit", "dinov2", "dinov2_with_registers")
# model_type -> the transformers classes whose checkpoints load
ARCHITECTURES = {
    "vit": ("ViTModel", "ViTForImageClassification"),
    "deit": ("DeiTModel (without its pooler)", "DeiTForImageClassificationWithTeacher"),
    "dinov2": ("Dinov2Model", "Dinov2ForImageClassification"),
    "dinov2_with_registers": (
        "Dinov2WithRegistersModel",
        "Dinov2WithRegistersForImageClassification",
    ),
}
_MIM = "a masked-image-modeling pretraining head (decoder): load its encoder as *Model instead"
_BACKBONE = "a detection / segmentation feature-map backbone (out_features stages)"
_DEIT_ONE = (
    "one head on [CLS] with a distillation token in the sequence (fine-tuning without the "
    "teacher); our distilled ViT averages two heads -- DeiTForImageClassificationWithTeacher loads"
)
_DEIT_POOLER = (
    "a dense + tanh pooler on [CLS] of a distilled ViT, whose pooled features are the mean of "
    "[CLS] and [DIST]; save it with add_pooling_layer=False"
)
REFUSED_ARCHITECTURES = {
    "ViTForMaskedImageModeling": _MIM,
    "DeiTForMaskedImageModeling": _MIM,
    "DeiTForImageClassification": _DEIT_ONE,
    "Dinov2Backbone": _BACKBONE,
    "Dinov2WithRegistersBackbone": _BACKBONE,
}
_PREFIXES = ("vit.", "deit.", "dinov2_with_registers.", "dinov2.")


def _dinov2(model_type: str) -> bool:
    return model_type.startswith("dinov2")


def _strip(key: str) -> str:
    """A checkpoint key without the ``*ForImageClassification`` prefix of its ``*Model``."""
    for prefix in _PREFIXES:
        if key.startswith(prefix):
            return key[len(prefix) :]
    return key


def _field(hf: Mapping[str, Any], name: str, default: Any) -> Any:
    value = hf.get(name)
    return default if value is None else value


def _act(hf: Mapping[str, Any]) -> str:
    return hf_activation(_field(hf, "hidden_act", "gelu"), "hidden_act")


def _square_patch(hf: Mapping[str, Any]) -> int:
    patch = _field(hf, "patch_size", 14 if _dinov2(hf["model_type"]) else 16)
    ph, pw = to_2tuple(patch)
    if ph != pw:
        raise ValueError(f"patch_size={patch!r} is not supported: expected square patches")
    return ph


def _num_labels(hf: Mapping[str, Any]) -> int:
    """transformers' ``num_labels``: ``len(id2label)``, else ``num_labels``, else 2."""
    id2label = hf.get("id2label")
    if id2label:
        return len(id2label)
    return int(_field(hf, "num_labels", 2))


def config_from_hf(hf: Mapping[str, Any], state_dict_keys: Collection[str]) -> tuple[str, Any]:
    """``config.json`` of a ViT / DeiT / DINOv2 checkpoint (and its weights' keys) ->
    ``(family, ViTConfig)``: family ``"vit"``, or ``"dinov2_linear"`` for a
    ``Dinov2ForImageClassification`` head. ``ValueError`` names a field we cannot build."""
    model_type = check_architectures(hf, MODEL_TYPES, REFUSED_ARCHITECTURES)
    keys = {_legacy(_strip(k)) for k in state_dict_keys}
    dinov2 = _dinov2(model_type)
    D = int(_field(hf, "hidden_size", 768))
    heads = int(_field(hf, "num_attention_heads", 12))
    act = _act(hf)
    swiglu = dinov2 and bool(hf.get("use_swiglu_ffn"))
    if dinov2:
        hidden = int(D * float(_field(hf, "mlp_ratio", 4)))
        if swiglu:  # transformers' Dinov2SwiGLUFFN: 2/3 of the width, rounded up to 8
            hidden, act = (int(hidden * 2 / 3) + 7) // 8 * 8, "swiglu"
    else:
        hidden = int(_field(hf, "intermediate_size", 3072))
    mlp_ratio = hidden / D
    if int(D * mlp_ratio) != hidden:
        raise ValueError(f"an MLP width of {hidden} is not expressible as a ratio of {D}")
    pooler = None
    if "pooler.dense.weight" in keys:  # ViTModel / DeiTModel: dense + pooler_act on [CLS]
        if _field(hf, "pooler_act", "tanh") != "tanh":
            raise ValueError(f"pooler_act={hf['pooler_act']!r} is not supported: expected 'tanh'")
        pooler = int(_field(hf, "pooler_output_size", D))
    registers = int(_field(hf, "num_register_tokens", 0)) if model_type.endswith("registers") else 0
    teacher = "cls_classifier.weight" in keys or "distillation_classifier.weight" in keys
    classifier = teacher or "classifier.weight" in keys
    if model_type == "deit" and not teacher and "embeddings.distillation_token" in keys:
        dist = True  # DeiTModel / DeiTForImageClassification: the token, read by no head
    else:
        dist = teacher
    if dist and not teacher and classifier:
        raise ValueError(f"architecture DeiTForImageClassification is not supported: {_DEIT_ONE}")
    if dist and pooler:
        raise ValueError(f"DeiTModel with its pooler is not supported: {_DEIT_POOLER}")
    args: dict[str, Any] = dict(
        img_size=to_2tuple(_field(hf, "image_size", 224)),
        patch_size=_square_patch(hf),
        in_chans=int(_field(hf, "num_channels", 3)),
        num_classes=_num_labels(hf) if classifier else 0,
        global_pool="token",
        embed_dim=D,
        depth=int(_field(hf, "num_hidden_layers", 12)),
        num_heads=heads,
        mlp_ratio=mlp_ratio,
        qkv_bias=bool(_field(hf, "qkv_bias", True)),
        dist_token=dist,
        reg_tokens=registers,
        no_embed_class=registers > 0,
        patch_bias=True,
        norm_eps=float(_field(hf, "layer_norm_eps", 1e-6 if dinov2 else 1e-12)),
        act=act,
        mlp_gate_last=not swiglu,  # weights_in = [gate, x]: silu(gate) * x
        init_values=float(_field(hf, "layerscale_value", 1.0)) if dinov2 else None,
        representation_size=pooler,
        # transformers resamples bicubic without antialiasing, but for DINOv2-with-registers
        pos_embed_antialias=model_type == "dinov2_with_registers",
        # training only (identity in eval): transformers' dropouts and stochastic depth
        pos_drop_rate=float(_field(hf, "hidden_dropout_prob", 0.0)),
        proj_drop_rate=float(_field(hf, "hidden_dropout_prob", 0.0)),
        attn_drop_rate=float(_field(hf, "attention_probs_dropout_prob", 0.0)),
        drop_path_rate=float(_field(hf, "drop_path_rate", 0.0)) if dinov2 else 0.0,
    )
    if D % heads:
        raise ValueError(f"hidden_size={D} is not divisible by num_attention_heads={heads}")
    family = "dinov2_linear" if dinov2 and classifier else "vit"
    return family, ViTConfig(**args)


# transformers 5's in-memory names -> the checkpoint names save_pretrained writes
_NEW_NAMES = (
    (r"^layers\.(\d+)\.", r"encoder.layer.\1."),
    (r"\.attention\.([qkv])_proj\.", r".attention.attention.\1_proj."),
    (r"\.attention\.o_proj\.", r".attention.output.dense."),
)
_QKV = {"q_proj": "query", "k_proj": "key", "v_proj": "value"}
# separate projections -> our fused one, concatenated in this order (SwiGLU: [gate, x])
_FUSED = {
    "attention.attention.query": "attn.qkv",
    "attention.attention.key": "attn.qkv",
    "attention.attention.value": "attn.qkv",
    "mlp.gate_proj": "mlp.fc1",  # (transformers 5's in-memory SwiGLU names)
    "mlp.up_proj": "mlp.fc1",
}
_LAYER = {  # (legacy) per-layer names -> ours
    "attention.output.dense": "attn.proj",
    "layernorm_before": "norm1",
    "layernorm_after": "norm2",
    "intermediate.dense": "mlp.fc1",
    "output.dense": "mlp.fc2",
    "norm1": "norm1",
    "norm2": "norm2",
    "mlp.fc1": "mlp.fc1",
    "mlp.fc2": "mlp.fc2",
    "mlp.weights_in": "mlp.fc1",
    "mlp.weights_out": "mlp.fc2",
    "mlp.down_proj": "mlp.fc2",
    "layer_scale1": "ls1",
    "layer_scale2": "ls2",
}
_TOP = {
    "embeddings.cls_token": "cls_token",
    "embeddings.distillation_token": "dist_token",
    "embeddings.register_tokens": "reg_token",
    "embeddings.position_embeddings": "pos_embed",
    "embeddings.patch_embeddings.projection.weight": "patch_embed.proj.weight",
    "embeddings.patch_embeddings.projection.bias": "patch_embed.proj.bias",
    "pooler.dense.weight": "pre_logits.fc.weight",
    "pooler.dense.bias": "pre_logits.fc.bias",
    "layernorm.weight": "norm.weight",
    "layernorm.bias": "norm.bias",
    "classifier.weight": "head.weight",
    "classifier.bias": "head.bias",
    "cls_classifier.weight": "head.weight",
    "cls_classifier.bias": "head.bias",
    "distillation_classifier.weight": "head_dist.weight",
    "distillation_classifier.bias": "head_dist.bias",
}
_DROPPED = ("embeddings.mask_token",)  # masked-image pretraining's token; unused here


def _legacy(key: str) -> str:
    for pattern, repl in _NEW_NAMES:
        key = re.sub(pattern, repl, key)
    m = re.match(r"(encoder\.layer\.\d+\.attention\.attention\.)([qkv]_proj)(\..*)", key)
    return f"{m[1]}{_QKV[m[2]]}{m[3]}" if m else key


def _rename(key: str) -> str:
    """One transformers key (prefix stripped, legacy names) -> ours; unknown keys unchanged,
    so the strict check names them."""
    if key in _TOP:
        return _TOP[key]
    m = re.match(r"encoder\.layer\.(\d+)\.(.+)\.(weight|bias|lambda1)$", key)
    if m and m[2] in _LAYER:
        return f"blocks.{m[1]}.{_LAYER[m[2]]}.{'gamma' if m[3] == 'lambda1' else m[3]}"
    return key


def convert_hf(
    state_dict: Mapping[str, torch.Tensor], hf: Mapping[str, Any]
) -> dict[str, torch.Tensor]:
    """A transformers ViT / DeiT / DINOv2 state dict (``config.json`` ``hf``) -> ours for
    the model :func:`config_from_hf` builds (strict: a
    :class:`~attn_core.hub.CheckpointError` lists every missing, unexpected or mis-shaped
    key)."""
    family, config = config_from_hf(hf, state_dict.keys())
    sd: dict[str, torch.Tensor] = {}
    fused: dict[tuple[str, str, str], dict[str, torch.Tensor]] = {}  # (layer, ours, kind)
    for key, value in state_dict.items():
        key = _legacy(_strip(key))
        if key in _DROPPED:
            continue
        m = re.match(r"encoder\.layer\.(\d+)\.(.+)\.(weight|bias)$", key)
        if m and m[2] in _FUSED:
            fused.setdefault((m[1], _FUSED[m[2]], m[3]), {})[m[2]] = value
            continue
        sd[_rename(key)] = value
    for (i, ours, kind), parts in fused.items():
        names = [n for n, target in _FUSED.items() if target == ours]  # in fusing order
        missing = [f"encoder.layer.{i}.{n}.{kind}" for n in names if n not in parts]
        if missing:
            raise CheckpointError(f"transformers {hf['model_type']} checkpoint: missing keys "
                                  f"{', '.join(missing)}")  # fmt: skip
        sd[f"blocks.{i}.{ours}.{kind}"] = torch.cat([parts[n] for n in names])
    if config.reg_tokens and "pos_embed" in sd and "cls_token" in sd:
        pos = sd["pos_embed"]  # (1, 1 + L, D): [CLS] position first, registers have none
        sd["cls_token"] = sd["cls_token"] + pos[:, :1]
        sd["pos_embed"] = pos[:, 1:]
    model_cls = Dinov2LinearClassifier if family == "dinov2_linear" else VisionTransformer
    return _checked(sd, config, model_cls, f"transformers {hf['model_type']}")


def _checked(
    sd: dict[str, torch.Tensor], config: ViTConfig, model_cls: type[nn.Module], source: str
) -> dict[str, torch.Tensor]:
    expected = expected_state_dict_shapes(model_cls, config)
    pos = sd.get("pos_embed")
    if pos is not None and "pos_embed" in expected and pos.shape != expected["pos_embed"]:
        prefix = 0 if config.no_embed_class else config.num_prefix_tokens
        sd["pos_embed"] = resample_abs_pos_embed(pos, config.grid_size, num_prefix_tokens=prefix)
    check_state_dict(sd, expected, source)
    return sd


class Dinov2LinearClassifier(VisionTransformer):
    """transformers' ``Dinov2ForImageClassification`` (and the with-registers one): a DINOv2
    ViT whose linear head reads ``cat([CLS], mean of the patch tokens)`` -- ``(B, 2D)``,
    after the final norm; registers are in neither. ``forward_pre_logits`` returns that
    ``(B, 2D)`` vector; everything else is :class:`~attn_vision.vit.VisionTransformer`'s.
    Built from a :class:`~attn_vision.vit.ViTConfig` with ``global_pool="token"``, no
    distillation token and no ``representation_size``."""

    def __init__(
        self, config: ViTConfig | None = None, *, weight_init: bool = True, **kwargs
    ) -> None:
        config = config if config is not None else ViTConfig(**kwargs)
        if config.global_pool != "token" or config.dist_token or config.representation_size:
            raise ValueError(
                "Dinov2LinearClassifier reads [CLS] and the patch mean: expected "
                "global_pool='token', dist_token=False and representation_size=None, got "
                f"{config.global_pool!r} / {config.dist_token} / {config.representation_size}"
            )
        super().__init__(config, weight_init=False)
        self.head_hidden_size = 2 * config.embed_dim
        K = config.num_classes
        self.head = nn.Linear(self.head_hidden_size, K) if K > 0 else nn.Identity()
        if weight_init:
            self.init_weights()

    @property
    def _cls_only(self) -> bool:
        return False  # the head reads every patch token too

    def pool(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, N, D)`` -> ``(B, 2D)``: ``[CLS]`` and the mean of the ``L`` patch tokens."""
        return torch.cat([x[:, 0], x[:, self.num_prefix_tokens :].mean(dim=1)], dim=-1)


def convert_dinov2_linear(
    state_dict: Mapping[str, torch.Tensor], config: ViTConfig
) -> dict[str, torch.Tensor]:
    """Our own :class:`Dinov2LinearClassifier` state dict (a ``save_pretrained`` folder),
    checked against ``config``."""
    return _checked(dict(state_dict), config, Dinov2LinearClassifier, "Dinov2LinearClassifier")
