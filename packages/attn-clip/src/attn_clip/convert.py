"""Checkpoint converters: pure ``state_dict -> state_dict`` functions into attn_clip's names.

Sources (detected from tell-tale keys by :func:`detect_format`):

* ``open_clip``  -- open_clip ``CLIP`` / OpenAI CLIP (``visual.conv1.weight``,
  ``transformer.resblocks.0.attn.in_proj_weight``, ``text_projection``, ...). Also what
  OpenAI's TorchScript ``.pt`` archives hold once their ``state_dict()`` is taken,
  open_clip's ``CustomTextCLIP`` layout (the same keys under ``text.``), its timm
  image towers (SigLIP, ConvNeXt, ViTamin: ``visual.trunk.*``, timm's names, which are
  ours, and ``visual.head.proj`` / ``visual.head.mlp``, ours too -- a ViTamin's
  ``head.proj`` is its ViT tower's ``proj``, renamed by :func:`fit_to_model`; EVA: timm
  ``Eva``'s block names, converted by attn_vision's
  :func:`~attn_vision.convert.eva_to_vit`: ``q_proj`` / ``k_proj`` / ``v_proj`` or ``qkv`` +
  ``q_bias`` / ``v_bias`` fused into one ``qkv`` with a zero key bias, SwiGLU's ``fc1_x`` /
  ``fc1_g`` into one ``fc1``, ``gamma_1`` / ``gamma_2`` into ``ls1`` / ``ls2``), and
  OpenAI's ResNets (``visual.conv1`` ... ``visual.attnpool.*``,
  ours under ``visual.trunk.``), and its Hugging Face text towers (``text.transformer.*``:
  the transformers encoder's own keys, converted by the attn_nlp family's ``convert_hf``
  against the model's text config into ours under ``text.encoder.``; ``text.proj.*`` are
  ours: :mod:`attn_clip.hf_text`).
* ``hf``         -- transformers ``CLIPModel`` (``text_model.*``, ``vision_model.*``,
  separate ``q_proj`` / ``k_proj`` / ``v_proj`` that are fused into one ``qkv``).
* ``hf_siglip``  -- transformers ``SiglipModel`` / ``Siglip2Model`` (the same, plus
  ``vision_model.head.*``, the MAP head, and ``text_model.head``, the text projection).
* ``attn_clip``  -- our own names (``visual.trunk.*``, ``text.blocks.*`` or
  ``text.encoder.*``): identity.

BatchNorm's ``num_batches_tracked`` counters (ResNet towers) that a checkpoint leaves out are
filled in as zeros by :func:`fit_to_model`, as ``torch.nn.BatchNorm2d`` does; they change
nothing in eval mode.

Every converter consumes each input key exactly once; a key no rule knows raises
``ValueError`` naming it. :func:`attn_core.hub.load_state_dict` then compares against the
model: missing / unexpected keys, shapes, dtypes and non-finite values in one error.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import torch
from attn_vision.convert import eva_to_vit

from .hf_text import convert_open_clip_text, to_open_clip_text

if TYPE_CHECKING:
    from .config import CLIPTextConfig, CLIPVisionConfig

__all__ = [
    "convert_hf_clip",
    "convert_hf_siglip",
    "convert_open_clip",
    "detect_format",
    "fit_to_model",
    "to_attn_clip",
    "to_open_clip",
]

StateDict = dict[str, torch.Tensor]

# Per-block names: open_clip ResidualAttentionBlock -> attn_core TransformerBlock.
_OPEN_CLIP_BLOCK = {
    "ln_1.weight": "norm1.weight",
    "ln_1.bias": "norm1.bias",
    "attn.in_proj_weight": "attn.qkv.weight",
    "attn.in_proj_bias": "attn.qkv.bias",
    "attn.out_proj.weight": "attn.proj.weight",
    "attn.out_proj.bias": "attn.proj.bias",
    "ls_1.gamma": "ls1.gamma",
    "ln_2.weight": "norm2.weight",
    "ln_2.bias": "norm2.bias",
    "mlp.c_fc.weight": "mlp.fc1.weight",
    "mlp.c_fc.bias": "mlp.fc1.bias",
    "mlp.c_proj.weight": "mlp.fc2.weight",
    "mlp.c_proj.bias": "mlp.fc2.bias",
    "ls_2.gamma": "ls2.gamma",
}
# CoCa's decoder: open_clip cross-attention ResidualAttentionBlock -> CrossAttentionBlock
_OPEN_CLIP_CROSS_BLOCK = {
    **{k: v for k, v in _OPEN_CLIP_BLOCK.items()},
    "ln_1_kv.weight": "norm_context.weight",
    "ln_1_kv.bias": "norm_context.bias",
}
# CoCa's attentional pooler: nn.MultiheadAttention(kdim=vdim=width) -> MultiHeadAttention
_POOLER_ATTN = {
    "in_proj_weight": "qkv.weight",
    "q_proj_weight": "q_proj.weight",
    "k_proj_weight": "k_proj.weight",
    "v_proj_weight": "v_proj.weight",
    "out_proj.weight": "proj.weight",
    "out_proj.bias": "proj.bias",
}
# transformers CLIPEncoderLayer -> TransformerBlock (q/k/v handled separately: fused).
_HF_BLOCK = {
    "layer_norm1.weight": "norm1.weight",
    "layer_norm1.bias": "norm1.bias",
    "self_attn.out_proj.weight": "attn.proj.weight",
    "self_attn.out_proj.bias": "attn.proj.bias",
    "layer_norm2.weight": "norm2.weight",
    "layer_norm2.bias": "norm2.bias",
    "mlp.fc1.weight": "mlp.fc1.weight",
    "mlp.fc1.bias": "mlp.fc1.bias",
    "mlp.fc2.weight": "mlp.fc2.weight",
    "mlp.fc2.bias": "mlp.fc2.bias",
}


def _strip_prefixes(sd: Mapping[str, torch.Tensor]) -> StateDict:
    """Drop DDP's ``module.`` and torch.compile's ``_orig_mod.`` prefixes."""
    out = {}
    for k, v in sd.items():
        for p in ("module.", "_orig_mod."):
            if k.startswith(p):
                k = k[len(p) :]
        out[k] = v
    return out


def detect_format(sd: Mapping[str, torch.Tensor]) -> str:
    """``"open_clip"``, ``"hf"``, ``"hf_siglip"`` or ``"attn_clip"`` from the keys;
    ``ValueError`` otherwise."""
    keys = set(_strip_prefixes(sd))
    if any(k.startswith("visual.trunk.") for k in keys) and any(
        k.startswith(("text.blocks.", "text.encoder.")) for k in keys
    ):
        return "attn_clip"
    if any(k.startswith("text_model.") for k in keys) and any(
        k.startswith("vision_model.") for k in keys
    ):
        siglip = "vision_model.head.probe" in keys or "text_model.head.weight" in keys
        return "hf_siglip" if siglip else "hf"
    text = "positional_embedding" in keys or "text.positional_embedding" in keys
    text = text or any(k.startswith("text.transformer.") for k in keys)  # + a HF text tower
    # open_clip's own ViT or ResNet (visual.conv1), or a timm tower (visual.trunk.*)
    if text and any(k == "visual.conv1.weight" or k.startswith("visual.trunk.") for k in keys):
        return "open_clip"
    sample = sorted(keys)[:8]
    raise ValueError(
        f"unrecognised CLIP checkpoint: none of the open_clip / OpenAI (visual.conv1.weight), "
        f"transformers (text_model.*, vision_model.*) or attn_clip (visual.trunk.*) keys found; "
        f"first keys: {sample}"
    )


class _Consumer:
    """Pops keys from a source dict; whatever is left at the end is reported."""

    def __init__(self, sd: StateDict, source: str) -> None:
        self.sd, self.source, self.out = dict(sd), source, {}

    def move(self, src: str, dst: str, fn: Callable[[torch.Tensor], torch.Tensor] | None = None):
        if src in self.sd:
            t = self.sd.pop(src)
            self.out[dst] = fn(t) if fn is not None else t

    def prefix(self, src: str, dst: str) -> None:
        """Rename every ``{src}*`` key to ``{dst}*`` (the model's strict load checks them)."""
        for key in [k for k in self.sd if k.startswith(src)]:
            self.out[dst + key[len(src) :]] = self.sd.pop(key)

    def blocks(self, prefix: str, dst_prefix: str, names: Mapping[str, str]) -> None:
        """Rename ``{prefix}{i}.{name}`` to ``{dst_prefix}{i}.{names[name]}``."""
        for key in [k for k in self.sd if k.startswith(prefix)]:
            idx, _, name = key[len(prefix) :].partition(".")
            if idx.isdigit() and name in names:
                self.out[f"{dst_prefix}{idx}.{names[name]}"] = self.sd.pop(key)

    def finish(self, ignore: tuple[str, ...] = ()) -> StateDict:
        left = sorted(k for k in self.sd if k not in ignore)
        if left:
            shown = ", ".join(left[:12]) + (f", ... ({len(left)} in all)" if len(left) > 12 else "")
            raise ValueError(f"{self.source} checkpoint has keys no converter rule knows: {shown}")
        return self.out


def _transpose(t: torch.Tensor) -> torch.Tensor:
    return t.T.contiguous()


def _pos_2d(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(1, *t.shape[-2:]) if t.ndim == 2 else t


def _hf_text_keys(sd: StateDict, text: CLIPTextConfig | None) -> tuple[StateDict, StateDict]:
    """Split off a Hugging Face text tower's keys (open_clip's ``text.transformer.*`` of a
    transformers encoder, ``text.proj.*``), converted to ours: ``(the rest, ours)``."""
    hf = [k for k in sd if k.startswith("text.transformer.")
          and not k.startswith("text.transformer.resblocks.")]  # fmt: skip
    if not hf:
        return sd, {}
    if text is None or text.hf_encoder is None:
        raise ValueError(
            "this open_clip checkpoint has a Hugging Face text tower (text.transformer."
            f"{hf[0][len('text.transformer.') :]}, ...); it converts against a text config "
            "with hf_encoder (the model's: load it into a model built for it)"
        )
    tower = {k: v for k, v in sd.items() if k.startswith(("text.transformer.", "text.proj."))}
    rest = {k: v for k, v in sd.items() if k not in tower}
    return rest, convert_open_clip_text(tower, text.hf_encoder)


def convert_open_clip(
    sd: Mapping[str, torch.Tensor], text: CLIPTextConfig | None = None
) -> StateDict:
    """open_clip / OpenAI CLIP state dict -> attn_clip state dict.

    ``text``: the model's text config, needed for a Hugging Face text tower (whose keys
    convert per encoder family: :func:`attn_clip.hf_text.convert_open_clip_text`).
    """
    sd, hf_text = _hf_text_keys(_strip_prefixes(sd), text)
    if any(k.startswith("text.") for k in sd):  # CustomTextCLIP layout: text tower under text.
        sd = {(k[5:] if k.startswith("text.") else k): v for k, v in sd.items()}
    c = _Consumer(sd, "open_clip")
    # text tower
    c.move("token_embedding.weight", "text.token_embedding.weight")
    c.move("token_proj.weight", "text.token_proj.weight")  # attn_clip's factorized table
    c.move("positional_embedding", "text.positional_embedding")
    c.blocks("transformer.resblocks.", "text.blocks.", _OPEN_CLIP_BLOCK)
    c.move("ln_final.weight", "text.ln_final.weight")
    c.move("ln_final.bias", "text.ln_final.bias")
    c.move("text_projection", "text.proj.weight", _transpose)  # (D, E) -> Linear's (E, D)
    c.move("text_projection.weight", "text.proj.weight")
    c.move("text_projection.bias", "text.proj.bias")
    c.move("cls_emb", "text.cls_emb")  # CoCa's appended CLS embedding
    # CoCa's multimodal decoder
    d = "text_decoder."
    c.blocks(d + "resblocks.", d + "blocks.", _OPEN_CLIP_BLOCK)
    c.blocks(d + "cross_attn.", d + "cross_blocks.", _OPEN_CLIP_CROSS_BLOCK)
    c.move(d + "ln_final.weight", d + "ln_final.weight")
    c.move(d + "ln_final.bias", d + "ln_final.bias")
    c.move(d + "text_projection", d + "proj.weight", _transpose)  # (D, V) -> (V, D)
    # CoCa's attentional pooler (ln_post after it: see fit_to_model)
    p = "visual.attn_pool."
    for name in ("query", "ln_q.weight", "ln_q.bias", "ln_k.weight", "ln_k.bias"):
        c.move(p + name, p + name)
    for src, dst in _POOLER_ATTN.items():
        c.move(f"{p}attn.{src}", f"{p}attn.{dst}")
    if p + "attn.in_proj_bias" in c.sd:
        bias = c.sd.pop(p + "attn.in_proj_bias")
        if p + "attn.qkv.weight" in c.out:
            c.out[p + "attn.qkv.bias"] = bias
        else:
            for n, part in zip("qkv", bias.chunk(3), strict=True):
                c.out[f"{p}attn.{n}_proj.bias"] = part
    # vision tower
    v = "visual.trunk."
    if "visual.attnpool.c_proj.weight" in c.sd:  # OpenAI's ModifiedResNet: names are ours
        for key in [k for k in c.sd if k.startswith("visual.")]:
            c.out[v + key[len("visual.") :]] = c.sd.pop(key)
    c.move("visual.conv1.weight", v + "patch_embed.proj.weight")
    c.move("visual.class_embedding", v + "cls_token", lambda t: t.reshape(1, 1, -1))
    c.move("visual.positional_embedding", v + "pos_embed", _pos_2d)
    c.move("visual.ln_pre.weight", v + "norm_pre.weight")
    c.move("visual.ln_pre.bias", v + "norm_pre.bias")
    c.blocks("visual.transformer.resblocks.", v + "blocks.", _OPEN_CLIP_BLOCK)
    # ln_post is timm's `norm` (on every token) -- or `fc_norm` when it runs after pooling;
    # check_state_dict's fix-up below renames it to whichever the model has.
    c.move("visual.ln_post.weight", v + "norm.weight")
    c.move("visual.ln_post.bias", v + "norm.bias")
    c.move("visual.proj", "visual.proj.weight", _transpose)
    # a timm tower (SigLIP, ConvNeXt, EVA): timm's names are attn_vision's, the MAP head
    # and an EVA's classifier head (its projection) included, once an EVA's blocks are
    # fused; a ConvNeXt's projection head (head.proj or head.mlp) is ours too
    trunk = {k[len(v) :]: c.sd.pop(k) for k in [k for k in c.sd if k.startswith(v)]}
    try:
        trunk = eva_to_vit(trunk)
    except KeyError as e:
        raise ValueError(
            f"open_clip checkpoint: an EVA block lacks visual.trunk.{e.args[0]}"
        ) from None
    c.out.update({v + k: t for k, t in trunk.items()})
    c.prefix("visual.head.proj.", "visual.head.proj.")
    c.prefix("visual.head.mlp.fc", "visual.head.mlp.fc")
    # temperature / bias: open_clip may store them as (1,) tensors
    c.move("logit_scale", "logit_scale", lambda t: t.reshape(()))
    c.move("logit_bias", "logit_bias", lambda t: t.reshape(()))
    # OpenAI TorchScript archives carry these as buffers; the text tower's causal mask
    # is a non-persistent buffer in open_clip but older checkpoints saved it.
    out = c.finish(ignore=("input_resolution", "context_length", "vocab_size", "attn_mask"))
    return {**out, **hf_text}


def _hf_blocks(c: _Consumer) -> None:
    """Both towers' encoder layers, q / k / v fused into one ``qkv``."""
    for tower, dst in (("text_model", "text.blocks."), ("vision_model", "visual.trunk.blocks.")):
        prefix = f"{tower}.encoder.layers."
        idxs = sorted({int(k[len(prefix) :].split(".")[0]) for k in c.sd if k.startswith(prefix)})
        for i in idxs:
            p = f"{prefix}{i}.self_attn."
            for kind in ("weight", "bias"):
                parts = [f"{p}{n}_proj.{kind}" for n in "qkv"]
                if all(k in c.sd for k in parts):
                    fused = torch.cat([c.sd.pop(k) for k in parts], dim=0)
                    c.out[f"{dst}{i}.attn.qkv.{kind}"] = fused
        c.blocks(prefix, dst, _HF_BLOCK)


def _hf_text(c: _Consumer) -> None:
    t = "text_model."
    c.move(t + "embeddings.token_embedding.weight", "text.token_embedding.weight")
    c.move(t + "embeddings.position_embedding.weight", "text.positional_embedding")
    c.move(t + "final_layer_norm.weight", "text.ln_final.weight")
    c.move(t + "final_layer_norm.bias", "text.ln_final.bias")


def convert_hf_clip(sd: Mapping[str, torch.Tensor]) -> StateDict:
    """transformers ``CLIPModel`` state dict -> attn_clip state dict (q/k/v fused into qkv)."""
    c = _Consumer(_strip_prefixes(sd), "transformers CLIPModel")
    _hf_blocks(c)
    _hf_text(c)
    t, v = "text_model.", "vision_model."
    c.move("text_projection.weight", "text.proj.weight")
    vt = "visual.trunk."
    c.move(v + "embeddings.class_embedding", vt + "cls_token", lambda x: x.reshape(1, 1, -1))
    c.move(v + "embeddings.patch_embedding.weight", vt + "patch_embed.proj.weight")
    c.move(v + "embeddings.position_embedding.weight", vt + "pos_embed", _pos_2d)
    c.move(v + "pre_layrnorm.weight", vt + "norm_pre.weight")  # (sic: transformers' name)
    c.move(v + "pre_layrnorm.bias", vt + "norm_pre.bias")
    c.move(v + "post_layernorm.weight", vt + "norm.weight")
    c.move(v + "post_layernorm.bias", vt + "norm.bias")
    c.move("visual_projection.weight", "visual.proj.weight")
    c.move("logit_scale", "logit_scale", lambda x: x.reshape(()))
    return c.finish(ignore=(t + "embeddings.position_ids", v + "embeddings.position_ids"))


def _linear_patches(w: torch.Tensor) -> torch.Tensor:
    """SigLIP2's patch ``Linear`` ``(D, p*p*C)`` (patches flattened row, column, channel)
    -> the equivalent ``Conv2d`` weight ``(D, C, p, p)``; a conv weight is kept."""
    if w.ndim == 4:
        return w
    p = math.isqrt(w.shape[1] // 3)
    if 3 * p * p != w.shape[1]:
        raise ValueError(f"patch_embedding.weight {tuple(w.shape)} is not (D, p * p * 3)")
    return w.reshape(w.shape[0], p, p, 3).permute(0, 3, 1, 2).contiguous()


def convert_hf_siglip(sd: Mapping[str, torch.Tensor]) -> StateDict:
    """transformers ``SiglipModel`` / ``Siglip2Model`` state dict -> attn_clip state dict.

    The MAP head's ``nn.MultiheadAttention`` (``in_proj`` = q, k, v stacked) becomes timm's
    ``attn_pool.q`` + ``attn_pool.kv``; SigLIP2's patch ``Linear`` becomes a convolution.
    """
    c = _Consumer(_strip_prefixes(sd), "transformers SiglipModel")
    _hf_blocks(c)
    _hf_text(c)
    t, v, vt = "text_model.", "vision_model.", "visual.trunk."
    c.move(t + "head.weight", "text.proj.weight")
    c.move(t + "head.bias", "text.proj.bias")
    c.move(v + "embeddings.patch_embedding.weight", vt + "patch_embed.proj.weight", _linear_patches)
    c.move(v + "embeddings.patch_embedding.bias", vt + "patch_embed.proj.bias")
    c.move(v + "embeddings.position_embedding.weight", vt + "pos_embed", _pos_2d)
    c.move(v + "post_layernorm.weight", vt + "norm.weight")
    c.move(v + "post_layernorm.bias", vt + "norm.bias")
    h, ap = v + "head.", vt + "attn_pool."
    c.move(h + "probe", ap + "latent")
    for kind in ("weight", "bias"):
        key = f"{h}attention.in_proj_{kind}"
        if key in c.sd:
            qkv = c.sd.pop(key)
            dim = qkv.shape[0] // 3
            c.out[f"{ap}q.{kind}"], c.out[f"{ap}kv.{kind}"] = qkv[:dim], qkv[dim:]
        c.move(f"{h}attention.out_proj.{kind}", f"{ap}proj.{kind}")
        c.move(f"{h}layernorm.{kind}", f"{ap}norm.{kind}")
        for fc in ("fc1", "fc2"):
            c.move(f"{h}mlp.{fc}.{kind}", f"{ap}mlp.{fc}.{kind}")
    c.move("logit_scale", "logit_scale", lambda x: x.reshape(()))
    c.move("logit_bias", "logit_bias", lambda x: x.reshape(()))
    return c.finish(ignore=(t + "embeddings.position_ids", v + "embeddings.position_ids"))


_CONVERTERS = {
    "open_clip": convert_open_clip,
    "hf": convert_hf_clip,
    "hf_siglip": convert_hf_siglip,
}


def to_attn_clip(
    sd: Mapping[str, torch.Tensor], fmt: str | None = None, text: CLIPTextConfig | None = None
) -> StateDict:
    """Convert any supported state dict (format detected unless ``fmt`` is given).

    ``text``: the model's text config (an open_clip checkpoint with a Hugging Face text
    tower converts against it).
    """
    fmt = fmt or detect_format(sd)
    if fmt == "attn_clip":
        return _strip_prefixes(sd)
    if fmt not in _CONVERTERS:
        raise ValueError(
            f"unknown checkpoint format {fmt!r}; expected one of {[*_CONVERTERS, 'attn_clip']}"
        )
    if fmt == "open_clip":
        return convert_open_clip(sd, text)
    return _CONVERTERS[fmt](sd)


# attn_clip name -> (open_clip name, tensor fix-up) for everything outside the blocks.
_TO_OPEN_CLIP: dict[str, tuple[str, Callable[[torch.Tensor], torch.Tensor] | None]] = {
    "text.token_embedding.weight": ("token_embedding.weight", None),
    "text.token_proj.weight": ("token_proj.weight", None),  # (token_dim set: open_clip has none)
    "text.positional_embedding": ("positional_embedding", None),
    "text.ln_final.weight": ("ln_final.weight", None),
    "text.ln_final.bias": ("ln_final.bias", None),
    "text.proj.bias": ("text_projection.bias", None),
    "text.cls_emb": ("cls_emb", None),
    "text_decoder.ln_final.weight": ("text_decoder.ln_final.weight", None),
    "text_decoder.ln_final.bias": ("text_decoder.ln_final.bias", None),
    "text_decoder.proj.weight": ("text_decoder.text_projection", _transpose),
    "visual.ln_post.weight": ("visual.ln_post.weight", None),
    "visual.ln_post.bias": ("visual.ln_post.bias", None),
    "visual.trunk.patch_embed.proj.weight": ("visual.conv1.weight", None),
    "visual.trunk.cls_token": ("visual.class_embedding", lambda t: t.reshape(-1)),
    "visual.trunk.pos_embed": ("visual.positional_embedding", lambda t: t[0]),
    "visual.trunk.norm_pre.weight": ("visual.ln_pre.weight", None),
    "visual.trunk.norm_pre.bias": ("visual.ln_pre.bias", None),
    "visual.trunk.norm.weight": ("visual.ln_post.weight", None),
    "visual.trunk.norm.bias": ("visual.ln_post.bias", None),
    "visual.trunk.fc_norm.weight": ("visual.ln_post.weight", None),
    "visual.trunk.fc_norm.bias": ("visual.ln_post.bias", None),
    "visual.proj.weight": ("visual.proj", _transpose),
    "logit_scale": ("logit_scale", None),
    "logit_bias": ("logit_bias", None),
}
_BLOCK_PREFIXES = {
    "text.blocks.": "transformer.resblocks.",
    "visual.trunk.blocks.": "visual.transformer.resblocks.",
    "text_decoder.blocks.": "text_decoder.resblocks.",
    "text_decoder.cross_blocks.": "text_decoder.cross_attn.",
}


def _vit_to_eva(sd: StateDict, vision: CLIPVisionConfig) -> StateDict:
    """Our ViT blocks -> timm ``Eva``'s (inverse of ``eva_to_vit``): ``qkv`` split into
    ``q_proj`` / ``k_proj`` / ``v_proj`` (or kept, with ``q_bias`` / ``v_bias``, when timm
    fuses it: ``qkv_fused``), the key bias dropped (exact: adding one vector to every key
    shifts each query's scores by a constant, which the softmax cancels), SwiGLU's ``fc1``
    split into ``fc1_x`` / ``fc1_g``, ``ls1`` / ``ls2`` renamed ``gamma_1`` / ``gamma_2``.
    timm's ``AttentionRope`` (``attn_type="rope"``, PE-Core) keeps the key bias: in ``qkv``,
    or in ``k_proj``."""
    eva, out = vision.eva, {}
    split_fc1 = vision.act == "swiglu" and eva["mlp_gate_last"]  # (timm's packed GluMlp: kept)
    rope_attn = eva["attn_type"] == "rope"
    for k, t in sd.items():
        m = re.match(r"(visual\.trunk\.blocks\.\d+\.)(.*)", k)
        p, name = (m.group(1), m.group(2)) if m else ("", "")
        if name in ("attn.qkv.weight", "attn.qkv.bias"):
            q, key, val = t.chunk(3)
            if rope_attn and eva["qkv_fused"]:
                out[k] = t
            elif rope_attn:
                kind = name.rsplit(".", 1)[1]
                for n, part in zip("qkv", (q, key, val), strict=True):
                    out[f"{p}attn.{n}_proj.{kind}"] = part
            elif name.endswith("bias"):
                out[f"{p}attn.q_bias" if eva["qkv_fused"] else f"{p}attn.q_proj.bias"] = q
                out[f"{p}attn.v_bias" if eva["qkv_fused"] else f"{p}attn.v_proj.bias"] = val
            elif eva["qkv_fused"]:
                out[k] = t
            else:
                for n, part in zip("qkv", (q, key, val), strict=True):
                    out[f"{p}attn.{n}_proj.weight"] = part
        elif split_fc1 and name in ("mlp.fc1.weight", "mlp.fc1.bias"):
            x, gate = t.chunk(2)
            kind = name.rsplit(".", 1)[1]
            out[f"{p}mlp.fc1_x.{kind}"], out[f"{p}mlp.fc1_g.{kind}"] = x, gate
        elif name in ("ls1.gamma", "ls2.gamma"):
            out[f"{p}gamma_{name[2]}"] = t
        else:
            out[k] = t
    return out


def to_open_clip(
    sd: Mapping[str, torch.Tensor],
    vision: CLIPVisionConfig | None = None,
    text: CLIPTextConfig | None = None,
) -> StateDict:
    """attn_clip state dict -> open_clip ``CLIP`` names (what open_clip's loader reads).

    A Hugging Face text tower (``text``: the model's text config, with ``hf_encoder``)
    takes open_clip's ``HFTextEncoder`` names: ``text.transformer.<the transformers
    encoder's keys>``, ``text.proj.*`` (:func:`attn_clip.hf_text.to_open_clip_text`).

    An image tower without class token, or with a patch bias, a MAP head (SigLIP) or its
    trunk's classifier as projection (MobileCLIP2-L-14), or a ConvNeXt keeps timm's names
    under ``visual.trunk.``, as open_clip's timm towers have them; a ResNet's are
    open_clip's under ``visual.``. An EVA tower's blocks take timm ``Eva``'s layout, which
    only its config tells (``vision``: the model's :class:`~attn_clip.config.CLIPVisionConfig`;
    without it they keep our names, which attn_clip reads back but open_clip does not).
    """
    if vision is not None and vision.eva is not None:
        sd = _vit_to_eva(dict(sd), vision)
    hf_text: StateDict = {}
    if text is not None and text.hf_encoder is not None:
        hf_text = {k: v for k, v in sd.items() if k.startswith(("text.encoder.", "text.proj."))}
        sd = {k: v for k, v in sd.items() if k not in hf_text}
        hf_text = to_open_clip_text(hf_text, text.hf_encoder)
    inv_block = {v: k for k, v in _OPEN_CLIP_CROSS_BLOCK.items()}
    inv_pool = {f"visual.attn_pool.attn.{v}": f"visual.attn_pool.attn.{k}"
                for k, v in _POOLER_ATTN.items()}  # fmt: skip
    pool_bias = [sd[f"visual.attn_pool.attn.{n}_proj.bias"] for n in "qkv"
                 if f"visual.attn_pool.attn.{n}_proj.bias" in sd]  # fmt: skip
    has_text_bias = "text.proj.bias" in sd
    resnet = "visual.trunk.attnpool.c_proj.weight" in sd
    timm_tower = not resnet and (
        "visual.trunk.cls_token" not in sd
        or "visual.trunk.patch_embed.proj.bias" in sd
        or "visual.trunk.attn_pool.latent" in sd
        or "visual.trunk.head.weight" in sd  # the trunk's classifier as projection (timm_proj=None)
        or (vision is not None and vision.timm_model_name is not None)
    )
    out: StateDict = {}
    for k, t in sd.items():
        prefix = next((p for p in _BLOCK_PREFIXES if k.startswith(p)), None)
        if resnet and k.startswith("visual.trunk."):
            out["visual." + k[len("visual.trunk.") :]] = t
        elif timm_tower and k.startswith(("visual.trunk.", "visual.head.")):
            out[k] = t
        elif timm_tower and k == "visual.proj.weight":
            out["visual.head.proj.weight"] = t
        elif prefix is not None:
            idx, _, name = k[len(prefix) :].partition(".")
            out[f"{_BLOCK_PREFIXES[prefix]}{idx}.{inv_block[name]}"] = t
        elif k == "text.proj.weight":  # a bare (D, E) matrix unless the projection has a bias
            out["text_projection.weight" if has_text_bias else "text_projection"] = (
                t if has_text_bias else _transpose(t)
            )
        elif k in _TO_OPEN_CLIP:
            name, fn = _TO_OPEN_CLIP[k]
            out[name] = fn(t) if fn is not None else t
        elif k in inv_pool:
            out[inv_pool[k]] = t
        elif k == "visual.attn_pool.attn.qkv.bias":
            out["visual.attn_pool.attn.in_proj_bias"] = t
        elif k.startswith("visual.attn_pool.attn.") and k.endswith("_proj.bias"):
            pass  # one in_proj_bias below
        elif k.startswith("visual.attn_pool."):  # query, ln_q, ln_k: open_clip's names
            out[k] = t
        else:
            raise ValueError(f"attn_clip key {k!r} has no open_clip name")
    if pool_bias:
        out["visual.attn_pool.attn.in_proj_bias"] = torch.cat(pool_bias)
    if "text.cls_emb" in sd:  # CoCa: open_clip's CoCa keeps its text tower under text.
        out = {("text." + k if k.startswith(_OPEN_CLIP_TEXT) else k): t for k, t in out.items()}
    return {**out, **hf_text}


# the text tower's top-level open_clip names (CLIP's layout), moved under text. for CoCa
_OPEN_CLIP_TEXT = ("token_embedding.", "token_proj.", "positional_embedding", "transformer.",
                   "ln_final.", "text_projection", "cls_emb")  # fmt: skip


def fit_to_model(sd: StateDict, expected: Mapping[str, torch.Tensor]) -> StateDict:
    """Rename ``ln_post`` to ``fc_norm`` when the model normalizes after pooling (to the
    tower's own ``ln_post`` after a CoCa's attentional pooler), and
    open_clip's timm-tower ``head.proj`` to a ViT tower's ``proj`` (ViTamin); fill in
    BatchNorm ``num_batches_tracked`` counters the checkpoint left out (zeros, as torch's
    BatchNorm does; unused in eval mode).

    Everything else (missing / unexpected keys, shapes, dtypes, finite values) is checked
    by :func:`attn_core.hub.load_state_dict`.
    """
    sd = dict(sd)
    renames = [(f"visual.trunk.norm.{k}", f"visual.trunk.fc_norm.{k}") for k in ("weight", "bias")]
    renames += [(f"visual.trunk.norm.{k}", f"visual.ln_post.{k}") for k in ("weight", "bias")]
    for src, dst in [*renames, ("visual.head.proj.weight", "visual.proj.weight")]:
        if src in sd and src not in expected and dst in expected:
            sd[dst] = sd.pop(src)
    for key, t in expected.items():
        if key.endswith(".num_batches_tracked") and key not in sd:
            sd[key] = torch.zeros((), dtype=t.dtype)
    return sd
