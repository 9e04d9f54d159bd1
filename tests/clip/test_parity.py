"""Parity at full width: random-init open_clip / transformers models saved in their real
on-disk formats, loaded by path through ``create_model``, fp32 outputs equal at
atol=rtol=1e-4.

The presets' widths, heads, patch sizes, image sizes, vocabularies and context lengths, with
``DEPTH`` blocks per tower (every block is converted by the same rule, and the names and
shapes of every preset at full depth are checked on the meta device in test_convert.py)."""

from __future__ import annotations

import copy

import open_clip
import pytest
import torch
import torch.nn.functional as F
from attn_clip import create_model, get_tokenizer
from safetensors.torch import save_file
from torch.testing import assert_close

TOL = {"atol": 1e-4, "rtol": 1e-4}
DEPTH = 2
CAPTIONS = ["a photo of a dog", "a diagram of a transformer with many attention heads"]


def _logits(scale: torch.Tensor, image: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
    return scale.exp() * F.normalize(image, dim=-1) @ F.normalize(text, dim=-1).T


def _assert_same(ours, ref_image, ref_text, ref_logits, images, tokens) -> None:
    """Our encode_image / encode_text / logits against the reference's (one forward each)."""
    with torch.no_grad():
        image, text = ours.encode_image(images), ours.encode_text(tokens)
        logits_per_image, logits_per_text = ours.logits(
            F.normalize(image, dim=-1), F.normalize(text, dim=-1)
        )
    assert_close(image, ref_image, **TOL)
    assert_close(text, ref_text, **TOL)
    assert_close(logits_per_image, ref_logits, **TOL)
    assert_close(logits_per_text, ref_logits.T, **TOL)


@pytest.mark.parametrize(
    ("name", "n_images"), [("ViT-B-32", 2), ("ViT-B-16-quickgelu", 1), ("ViT-M-16-alt", 1)]
)
def test_open_clip_checkpoint_files(h, tmp_path, name, n_images):
    cfg = copy.deepcopy(open_clip.get_model_config(name))
    cfg["vision_cfg"]["layers"] = cfg["text_cfg"]["layers"] = DEPTH
    ref = h.perturb_(open_clip.model.CLIP(**cfg))  # what open_clip.create_model builds
    size = ref.visual.image_size
    images = torch.randn(n_images, 3, *size)
    tokens = get_tokenizer(name)(CAPTIONS)
    assert torch.equal(tokens, open_clip.get_tokenizer(name)(CAPTIONS))
    with torch.no_grad():
        ref_image, ref_text = ref.encode_image(images), ref.encode_text(tokens)
        ref_logits = _logits(ref.logit_scale, ref_image, ref_text)  # = open_clip's get_logits
    sd = {k: v.contiguous() for k, v in ref.state_dict().items()}
    del ref
    safetensors_path = tmp_path / "open_clip_model.safetensors"
    save_file(sd, str(safetensors_path))
    bin_path = tmp_path / "open_clip_pytorch_model.bin"
    torch.save(sd, bin_path)
    del sd
    overrides = {"vision": {"layers": DEPTH}, "text": {"layers": DEPTH}}
    ours = create_model(name, pretrained=str(safetensors_path), **overrides)
    assert ours.config.quick_gelu == name.endswith("quickgelu")
    _assert_same(ours, ref_image, ref_text, ref_logits, images, tokens)
    # the .bin state dict loads to exactly the same weights (so the same outputs)
    from_bin = create_model(name, pretrained=str(bin_path), **overrides).state_dict()
    for key, value in ours.state_dict().items():
        assert torch.equal(from_bin[key], value), key


def _hf_config(size: str):
    from transformers import CLIPConfig as HFCLIPConfig

    if size == "small":
        return HFCLIPConfig(
            text_config=dict(
                hidden_size=64, intermediate_size=256, num_attention_heads=4,
                num_hidden_layers=2, max_position_embeddings=77, eos_token_id=49407,
            ),
            vision_config=dict(
                hidden_size=96, intermediate_size=384, num_attention_heads=4,
                num_hidden_layers=2, image_size=64, patch_size=16,
            ),
            projection_dim=48,
        )  # fmt: skip
    # openai/clip-vit-base-patch32's widths (the legacy eos_token_id=2 -> argmax pooling)
    return HFCLIPConfig(
        text_config=dict(hidden_size=512, intermediate_size=2048, num_attention_heads=8,
                         num_hidden_layers=DEPTH, eos_token_id=2),
        vision_config=dict(hidden_size=768, intermediate_size=3072, num_attention_heads=12,
                           num_hidden_layers=DEPTH, image_size=224, patch_size=32),
        projection_dim=512,
    )  # fmt: skip


@pytest.mark.parametrize("size", ["small", "vit_b32"])
def test_transformers_save_pretrained_folder(h, tmp_path, size):
    transformers = pytest.importorskip("transformers")
    try:
        from transformers.initialization import no_init_weights
    except ImportError:  # transformers 4.x
        from transformers.modeling_utils import no_init_weights

    with no_init_weights():  # transformers' own init is slow; every weight is set below
        ref = transformers.CLIPModel(_hf_config(size))
    h.random_fill_(ref)
    ref.save_pretrained(tmp_path)
    image_size = ref.config.vision_config.image_size
    images = torch.randn(2, 3, image_size, image_size)
    # HF pads with EOT (49407); pooling must still pick the first EOT
    tokens = get_tokenizer("ViT-B-32")(CAPTIONS)
    tokens[0, (tokens[0] == 0)] = 49407
    feats = {}  # the projections' outputs: unnormalized embeddings, from the one forward
    for name, proj in (("image", ref.visual_projection), ("text", ref.text_projection)):
        proj.register_forward_hook(lambda m, i, o, name=name: feats.__setitem__(name, o))
    with torch.no_grad():
        out = ref(input_ids=tokens, pixel_values=images)
    ref_image, ref_text = feats["image"], feats["text"]
    assert_close(F.normalize(ref_image, dim=-1), out.image_embeds)
    del ref
    ours = create_model(str(tmp_path))
    assert ours.config.quick_gelu  # transformers' CLIP default hidden_act
    assert ours.config.text.pool_type == ("eos" if size == "small" else "argmax")
    _assert_same(ours, ref_image, ref_text, out.logits_per_image, images, tokens)
