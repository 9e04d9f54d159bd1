"""Converters from timm checkpoints to attn_vision state dicts: one pure function per family.

Each converter takes a timm-format ``state_dict`` and the target model's config and
returns a new state dict that ``model.load_state_dict(..., strict=True)`` accepts. It
never touches a model: the expected keys and shapes come from building the model on
the ``meta`` device. Anything that does not line up -- missing keys, unexpected keys,
wrong shapes -- raises :class:`attn_core.hub.CheckpointError` (a ``ValueError``) listing
all of them (plus a hint where one helps, e.g. ``num_classes=`` for a head of another
size). Values (finite, dtypes) are checked when the result is loaded
(:func:`attn_core.hub.load_state_dict`).

Fixes applied, as timm applies them when it loads its own checkpoints:

* ViT: a position embedding laid out for another grid is resampled (bicubic,
  antialiased) to the model's ``img_size``; the unused ``pre_logits`` layer is dropped, and
  so is a MAP head (``attn_pool.*``) when the model pools otherwise (timm loads SigLIP
  towers built with another ``global_pool`` that way).
* EVA (timm's ``Eva``): separate ``q_proj`` / ``k_proj`` / ``v_proj`` or a ``qkv`` with
  ``q_bias`` / ``v_bias`` become one ``qkv`` (the key bias is zero: EVA has none, and a
  key bias never changes attention; PE-Core's ``AttentionRope`` has one, kept); SwiGLU's
  ``fc1_x`` / ``fc1_g`` become one ``fc1`` (``[x, gate]``); ``gamma_1`` / ``gamma_2``
  become ``ls1.gamma`` / ``ls2.gamma``.
* ViTamin: timm's names are ours; an open_clip ViTamin checkpoint (what timm's Hub tags
  hold) is read as timm reads it: the ``visual.trunk.*`` tensors, ``visual.head.proj`` as
  the classifier with a zero bias, the text tower left out.
* FastViT / MCi: timm's names are ours. timm's *reparameterized* layout
  (``timm.utils.reparameterize_model``: ``reparam_conv`` keys) is folded the rest of the way,
  as :meth:`attn_vision.fastvit.FastVit.reparameterize` folds: each ConvMlp's BatchNorm into
  its conv, an attention block's BatchNorm pre-norm into its ``qkv`` (which gains a bias), the
  block layer scales into ``mlp.fc2`` / ``token_mixer.proj``. Apple's original layout
  (ml-fastvit's ``network.{i}``, ``rbr_conv``, ...; MobileCLIP's ``image_encoder.model.*``,
  its ``head.proj`` projection as the classifier with a zero bias) is renamed as timm renames
  it, and so is the ``module.visual.trunk.*`` prefix of MobileCLIP training checkpoints.
* MCi ViT (``vit_base_mci_224``): the ViT's fixes; a folded model gets the stem's
  BatchNorms folded into its convs (timm never folds them).
* Swin: non-persistent buffers (``relative_position_index``, ``attn_mask``) are
  dropped; the original Microsoft layout (patch merging at the *end* of a stage) is
  re-indexed to timm's (at the *start*); ``head.fc`` becomes ``head``.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable, Mapping

import torch
from attn_core.hub import CheckpointError
from torch import nn

from .convnext import ConvNeXt, ConvNeXtConfig
from .fastvit import FastVit, FastVitConfig
from .mobileone import bn_scale_shift
from .patch_embed import resample_abs_pos_embed
from .resnet import ResNet, ResNetConfig
from .swin import SwinConfig, SwinTransformer
from .vit import VisionTransformer, ViTConfig
from .vit_mci import MciVisionTransformer, MciViTConfig
from .vitamin import Vitamin, VitaminConfig

__all__ = [
    "check_state_dict",
    "apple_fastvit_to_timm",
    "convert_timm_convnext",
    "convert_timm_fastvit",
    "convert_timm_resnet",
    "convert_timm_swin",
    "convert_timm_vit",
    "convert_timm_vit_mci",
    "convert_timm_vitamin",
    "eva_to_vit",
    "fold_fastvit_reparameterized",
    "expected_state_dict_shapes",
]

StateDict = dict[str, torch.Tensor]


def _unwrap(state_dict: Mapping[str, object]) -> StateDict:
    """``{"state_dict": sd}`` / ``{"model": sd}`` -> ``sd``."""
    for key in ("state_dict", "model"):
        inner = state_dict.get(key)
        if isinstance(inner, Mapping):
            state_dict = inner
    return dict(state_dict)


def expected_state_dict_shapes(
    model_cls: Callable[..., nn.Module], config: object
) -> dict[str, torch.Size]:
    """Keys and shapes of ``model_cls(config).state_dict()``, built cheaply on ``meta``."""
    with torch.device("meta"):
        model = model_cls(config)
    return {k: v.shape for k, v in model.state_dict().items()}


def _first(items: list[str], sep: str = ", ", n: int = 20) -> str:
    more = f"{sep}... and {len(items) - n} more" if len(items) > n else ""
    return sep.join(items[:n]) + more


def check_state_dict(
    state_dict: StateDict, expected: Mapping[str, torch.Size], source: str
) -> None:
    """Raise ``CheckpointError`` listing every missing / unexpected key and shape mismatch."""
    missing = sorted(set(expected) - set(state_dict))
    unexpected = sorted(set(state_dict) - set(expected))
    mismatched = [
        f"{k}: checkpoint {tuple(state_dict[k].shape)} vs model {tuple(expected[k])}"
        for k in expected
        if k in state_dict and tuple(state_dict[k].shape) != tuple(expected[k])
    ]
    if not (missing or unexpected or mismatched):
        return
    lines = [f"{source} checkpoint does not match the model:"]
    if missing:
        lines.append(f"  missing keys ({len(missing)}): {_first(missing)}")
    if unexpected:
        lines.append(f"  unexpected keys ({len(unexpected)}): {_first(unexpected)}")
    if mismatched:
        lines.append(f"  shape mismatches ({len(mismatched)}): {_first(mismatched, '; ')}")
    for head in ("head.weight", "fc.weight", "head.fc.weight"):
        if head in state_dict and head in expected and state_dict[head].shape != expected[head]:
            n = state_dict[head].shape[0]
            lines.append(
                f"  hint: the checkpoint's classifier has {n} classes; pass num_classes={n}"
            )
    if any(k.startswith(("blocks.", "layers.")) for k in missing + unexpected):
        lines.append("  hint: does depth / depths match the checkpoint?")
    elif any(re.match(r"stages\.\d+\.blocks\.", k) for k in missing + unexpected):
        lines.append("  hint: do depths / layers match the checkpoint?")
    raise CheckpointError("\n".join(lines))


def eva_to_vit(sd: StateDict) -> StateDict:
    """timm ``Eva`` block names -> ours (see the module docstring); others pass unchanged.

    Keys only, no config: also what attn_clip applies to open_clip's EVA towers."""
    out = dict(sd)
    blocks = {m.group(1) for k in sd if (m := re.match(r"(blocks\.\d+\.)", k))}
    for p in sorted(blocks):
        a, mlp = f"{p}attn.", f"{p}mlp."
        if f"{a}q_proj.weight" in out:
            parts = [out.pop(f"{a}{n}_proj.weight") for n in "qkv"]
            out[f"{a}qkv.weight"] = torch.cat(parts)
            if f"{a}k_proj.bias" in out:  # timm's AttentionRope (PE): every projection biased
                out[f"{a}qkv.bias"] = torch.cat([out.pop(f"{a}{n}_proj.bias") for n in "qkv"])
            elif f"{a}q_proj.bias" in out:
                out[f"{a}q_bias"], out[f"{a}v_bias"] = (
                    out.pop(f"{a}q_proj.bias"),
                    out.pop(f"{a}v_proj.bias"),
                )
        if f"{a}q_bias" in out:
            q, v = out.pop(f"{a}q_bias"), out.pop(f"{a}v_bias")
            out[f"{a}qkv.bias"] = torch.cat((q, torch.zeros_like(q), v))
        for kind in ("weight", "bias"):
            if f"{mlp}fc1_x.{kind}" in out:
                x, g = out.pop(f"{mlp}fc1_x.{kind}"), out.pop(f"{mlp}fc1_g.{kind}")
                out[f"{mlp}fc1.{kind}"] = torch.cat((x, g))
        for i in (1, 2):
            if f"{p}gamma_{i}" in out:
                out[f"{p}ls{i}.gamma"] = out.pop(f"{p}gamma_{i}")
    return out


def convert_timm_vit(state_dict: Mapping[str, torch.Tensor], config: ViTConfig) -> StateDict:
    """timm ``VisionTransformer`` (or ``Eva``) state dict ->
    :class:`~attn_vision.vit.VisionTransformer`."""
    return _vit_state_dict(eva_to_vit(_unwrap(state_dict)), config, VisionTransformer, "timm ViT")


def _vit_state_dict(
    sd: StateDict, config: ViTConfig, model_cls: type[nn.Module], source: str
) -> StateDict:
    """timm ViT names (ours) checked against ``model_cls(config)``, with timm's load-time
    fixes: unused ``pre_logits`` / MAP head dropped, ``pos_embed`` resampled to the grid."""
    expected = expected_state_dict_shapes(model_cls, config)
    out: StateDict = {}
    for k, v in sd.items():
        if k.startswith("pre_logits.") and not config.representation_size:
            continue  # representation layer of old in21k checkpoints; unused (timm drops it too)
        if k.startswith("attn_pool.") and config.global_pool != "map":
            continue  # a SigLIP tower's MAP head, unused by this model's pooling (as in timm)
        if k == "pos_embed" and k in expected and v.shape != expected[k] and v.is_floating_point():
            v = resample_abs_pos_embed(
                v,
                config.grid_size,
                num_prefix_tokens=0 if config.no_embed_class else config.num_prefix_tokens,
            )
        out[k] = v
    check_state_dict(out, expected, source)
    return out


def convert_timm_vitamin(
    state_dict: Mapping[str, torch.Tensor], config: VitaminConfig
) -> StateDict:
    """timm ``vitamin_*`` state dict (or open_clip's ViTamin checkpoint) -> :class:`Vitamin`."""
    sd, trunk = _unwrap(state_dict), "visual.trunk."
    if any(k.startswith(trunk) for k in sd):  # open_clip's CLIP: timm keeps the image tower
        proj = sd.get("visual.head.proj.weight")
        sd = {k[len(trunk) :]: v for k, v in sd.items() if k.startswith(trunk)}
        if proj is not None and config.num_classes > 0:  # the projection as the classifier
            sd["head.weight"], sd["head.bias"] = proj, proj.new_zeros(proj.shape[0])
    return _vit_state_dict(sd, config, Vitamin, "timm ViTamin")


def convert_timm_swin(state_dict: Mapping[str, torch.Tensor], config: SwinConfig) -> StateDict:
    """timm (or original Microsoft) Swin state dict -> :class:`SwinTransformer`."""
    expected = expected_state_dict_shapes(SwinTransformer, config)
    state_dict = _unwrap(state_dict)
    # the original release merges patches at the end of stage i; timm at the start of i + 1
    ms_layout = "layers.0.downsample.reduction.weight" in state_dict
    out: StateDict = {}
    for k, v in state_dict.items():
        if k.endswith(("relative_position_index", "attn_mask")):
            continue  # buffers the model rebuilds
        if ms_layout:
            k = re.sub(
                r"^layers\.(\d+)\.downsample", lambda m: f"layers.{int(m[1]) + 1}.downsample", k
            )
        elif k.startswith("head.fc."):
            k = "head." + k[len("head.fc.") :]
        out[k] = v
    check_state_dict(out, expected, "timm Swin")
    return out


def convert_timm_resnet(state_dict: Mapping[str, torch.Tensor], config: ResNetConfig) -> StateDict:
    """timm ``ResNet`` state dict -> :class:`ResNet` (the names are the same)."""
    out = _unwrap(state_dict)
    check_state_dict(out, expected_state_dict_shapes(ResNet, config), "timm ResNet")
    return out


def convert_timm_convnext(
    state_dict: Mapping[str, torch.Tensor], config: ConvNeXtConfig
) -> StateDict:
    """timm ``ConvNeXt`` state dict -> :class:`ConvNeXt` (the names are the same)."""
    out = _unwrap(state_dict)
    check_state_dict(out, expected_state_dict_shapes(ConvNeXt, config), "timm ConvNeXt")
    return out


# --- FastViT / MCi -------------------------------------------------------------------------
_BN_KEYS = ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")


def _pop_bn(sd: StateDict, prefix: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Remove BatchNorm ``prefix`` from ``sd``; its ``(scale, shift)`` (float64)."""
    bn = {k: sd.pop(prefix + k, None) for k in _BN_KEYS}
    missing = [prefix + k for k in _BN_KEYS[:4] if bn[k] is None]
    if missing:
        raise CheckpointError(f"BatchNorm {prefix[:-1]!r} is incomplete: missing {missing}")
    return bn_scale_shift(bn["weight"], bn["bias"], bn["running_mean"], bn["running_var"])


def _fold_conv_bn(sd: StateDict, conv: str, bn: str) -> None:
    """``{conv}weight`` (no bias) followed by BatchNorm ``bn`` -> ``{conv}weight`` / ``bias``."""
    scale, shift = _pop_bn(sd, bn)
    weight = sd[conv + "weight"]
    sd[conv + "weight"] = (weight.double() * scale[:, None, None, None]).to(weight.dtype)
    sd[conv + "bias"] = shift.to(weight.dtype)


def _scale_outputs(sd: StateDict, layer: str, gamma: torch.Tensor) -> None:
    """Layer ``layer``'s outputs (a conv's or Linear's) times ``gamma``, in its tensors."""
    gamma = gamma.double().flatten()
    for kind in ("weight", "bias"):
        t = sd[layer + kind]
        sd[layer + kind] = (t.double() * gamma.view(-1, *[1] * (t.ndim - 1))).to(t.dtype)


_LAYER_SCALE_TARGETS = {"": "mlp.fc2.", "_1": "token_mixer.proj.", "_2": "mlp.fc2."}


def fold_fastvit_reparameterized(state_dict: Mapping[str, torch.Tensor]) -> StateDict:
    """timm's reparameterized FastViT state dict -> ours (what
    :meth:`~attn_vision.fastvit.FastVit.reparameterize` folds beyond timm): ConvMlp
    BatchNorms into their convs, BatchNorm pre-norms into ``qkv``, block layer scales
    into ``mlp.fc2`` / ``token_mixer.proj``. Other keys pass unchanged (so does our own
    folded layout)."""
    sd = dict(state_dict)
    block = r"(stages\.\d+\.blocks\.\d+\.)"
    for key in sorted(state_dict):
        if m := re.fullmatch(r"(.*\.mlp\.conv\.)bn\.running_mean", key):
            _fold_conv_bn(sd, m[1] + "conv.", m[1] + "bn.")
        elif m := re.fullmatch(block + r"norm\.running_mean", key):  # qkv(x * scale + shift)
            scale, shift = _pop_bn(sd, m[1] + "norm.")
            qkv = m[1] + "token_mixer.qkv."
            weight = sd[qkv + "weight"]
            bias = weight.double() @ shift
            if qkv + "bias" in sd:
                bias = bias + sd[qkv + "bias"].double()
            sd[qkv + "weight"] = (weight.double() * scale).to(weight.dtype)
            sd[qkv + "bias"] = bias.to(weight.dtype)
    for key in sorted(state_dict):
        if m := re.fullmatch(block + r"layer_scale(|_1|_2)\.gamma", key):
            _scale_outputs(sd, m[1] + _LAYER_SCALE_TARGETS[m[2]], sd.pop(key))
    return sd


# Apple's names -> timm's (the order matters: ``se.reduce`` before anything else touches it)
_APPLE_NAMES = (
    ("patch_embed", "stem"),
    ("rbr_conv", "conv_kxk"),
    ("rbr_scale", "conv_scale"),
    ("rbr_skip", "identity"),
    ("conv_exp", "final_conv"),
    ("lkb_origin", "large_conv"),
    ("convffn", "mlp"),
    ("se.reduce", "se.fc1"),
    ("se.expand", "se.fc2"),
)


def apple_fastvit_to_timm(state_dict: Mapping[str, torch.Tensor], num_classes: int) -> StateDict:
    """Apple's FastViT layout (ml-fastvit; MobileCLIP's ``image_encoder.model.*``) -> timm's,
    as timm's ``checkpoint_filter_fn`` renames it: the flat ``network.{n}`` list becomes
    ``stages.{i}`` (a ``network.{n}.proj`` entry starts a stage: its ``downsample``; ``pe``:
    its ``pos_emb.pos_enc``; the rest its ``blocks``). MobileCLIP's ``head.proj`` ``(C, K)``
    projection becomes ``head.fc`` with a zero bias (dropped when ``num_classes`` is 0)."""
    sd = dict(state_dict)
    prefix = "image_encoder.model."
    if any(k.startswith(prefix) for k in sd):
        sd = {k[len(prefix) :]: v for k, v in sd.items() if k.startswith(prefix)}
    ends = sorted({int(m[1]) for k in sd if (m := re.match(r"network\.(\d+)\.proj", k))})
    out: StateDict = {}
    for key, value in sd.items():
        for old, new in _APPLE_NAMES:
            key = key.replace(old, new)
        key = re.sub(r"layer_scale(_\d)?$", r"layer_scale\1.gamma", key)
        if key == "head.proj":
            if num_classes > 0:
                out["head.fc.weight"] = value.T.contiguous()
                out["head.fc.bias"] = value.new_zeros(value.shape[1])
            continue
        if key.startswith("head."):
            key = "head.fc." + key[len("head.") :]
        if m := re.match(r"network\.(\d+)\.", key):
            n, rest = int(m[1]), key[m.end() :]
            stage = f"stages.{bisect.bisect_right(ends, n)}."
            if rest.startswith("proj."):
                key = stage + "downsample." + rest
            elif rest.startswith("pe."):
                key = stage + "pos_emb.pos_enc." + rest[len("pe.") :]
            else:
                key = stage + "blocks." + rest
        out[key] = value
    return out


def convert_timm_fastvit(
    state_dict: Mapping[str, torch.Tensor], config: FastVitConfig
) -> StateDict:
    """timm ``FastVit`` state dict (unfolded, or reparameterized), Apple's original or
    our own folded one -> :class:`~attn_vision.fastvit.FastVit`. The checkpoint's layout
    must be the model's: ``reparam_conv`` keys need ``inference_mode=True``, and the
    branches ``inference_mode=False`` (fold the loaded model with ``reparameterize()``)."""
    sd, trunk = _unwrap(state_dict), "module.visual.trunk."
    if any(k.startswith(trunk) for k in sd):  # a MobileCLIP training checkpoint (as timm)
        sd = {k[len(trunk) :]: v for k, v in sd.items() if k.startswith(trunk)}
    if "stem.0.conv_kxk.0.conv.weight" not in sd and any(
        k.startswith(("network.", "image_encoder.model.")) for k in sd
    ):
        sd = apple_fastvit_to_timm(sd, config.num_classes)
    folded = any(".reparam_conv." in k for k in sd)
    if folded != config.inference_mode:
        layout = "reparameterized (reparam_conv)" if folded else "multi-branch (unfolded)"
        fix = ("build the model with inference_mode=True" if folded else
               "build it with inference_mode=False, then call model.reparameterize()")  # fmt: skip
        raise CheckpointError(
            f"timm FastViT checkpoint is {layout} but the model has inference_mode="
            f"{config.inference_mode}: {fix}"
        )
    if folded:
        sd = fold_fastvit_reparameterized(sd)
    check_state_dict(sd, expected_state_dict_shapes(FastVit, config), "timm FastViT")
    return sd


def convert_timm_vit_mci(state_dict: Mapping[str, torch.Tensor], config: MciViTConfig) -> StateDict:
    """timm ``vit_base_mci_224`` state dict -> :class:`~attn_vision.vit_mci.MciVisionTransformer`
    (the stem's BatchNorms folded into its convs when the model is folded)."""
    sd, stem = _unwrap(state_dict), "patch_embed.backbone."
    has_bn = f"{stem}0.bn.running_mean" in sd
    if config.inference_mode and has_bn:
        for i in (0, 1):
            _fold_conv_bn(sd, f"{stem}{i}.conv.", f"{stem}{i}.bn.")
    elif not config.inference_mode and not has_bn and f"{stem}0.conv.bias" in sd:
        raise CheckpointError("the MCi ViT checkpoint has its stem folded (no BatchNorms): build "
                              "the model with inference_mode=True")  # fmt: skip
    return _vit_state_dict(sd, config, MciVisionTransformer, "timm MCi ViT")
