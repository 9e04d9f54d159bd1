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
  key bias never changes attention); SwiGLU's ``fc1_x`` / ``fc1_g`` become one ``fc1``
  (``[x, gate]``); ``gamma_1`` / ``gamma_2`` become ``ls1.gamma`` / ``ls2.gamma``.
* ViTamin: timm's names are ours; an open_clip ViTamin checkpoint (what timm's Hub tags
  hold) is read as timm reads it: the ``visual.trunk.*`` tensors, ``visual.head.proj`` as
  the classifier with a zero bias, the text tower left out.
* Swin: non-persistent buffers (``relative_position_index``, ``attn_mask``) are
  dropped; the original Microsoft layout (patch merging at the *end* of a stage) is
  re-indexed to timm's (at the *start*); ``head.fc`` becomes ``head``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

import torch
from attn_core.hub import CheckpointError
from torch import nn

from .convnext import ConvNeXt, ConvNeXtConfig
from .patch_embed import resample_abs_pos_embed
from .resnet import ResNet, ResNetConfig
from .swin import SwinConfig, SwinTransformer
from .vit import VisionTransformer, ViTConfig
from .vitamin import Vitamin, VitaminConfig

__all__ = [
    "check_state_dict",
    "convert_timm_convnext",
    "convert_timm_resnet",
    "convert_timm_swin",
    "convert_timm_vit",
    "convert_timm_vitamin",
    "eva_to_vit",
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
    for head in ("head.weight", "fc.weight"):
        if head in state_dict and head in expected and state_dict[head].shape != expected[head]:
            n = state_dict[head].shape[0]
            lines.append(
                f"  hint: the checkpoint's classifier has {n} classes; pass num_classes={n}"
            )
    if any(k.startswith("blocks.") or k.startswith("layers.") for k in missing + unexpected):
        lines.append("  hint: does depth / depths match the checkpoint?")
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
            if f"{a}q_proj.bias" in out:
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
        if k.startswith("pre_logits."):
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
