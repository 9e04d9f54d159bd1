"""SigLIP / SigLIP2 parity: random-init open_clip models (timm image tower, SigLIP text tower)
and transformers ``SiglipModel`` / ``Siglip2Model`` saved in their real on-disk formats,
loaded through ``create_model``, fp32 embeddings and sigmoid logits equal at 1e-4.

One open_clip config per distinct tower shape (the 7 timm ViTs and 9 text towers of the
26 configs, see test_registry.py): full width, depth cut to 2 blocks in both towers, and
the 32k / 250k / 256k-token vocabularies cut to 4096 rows (the embedding is a lookup; the
shape is checked on the meta device for every config in test_convert.py). Each case runs
each tower once on open_clip's model and twice on ours (with and without the inference
fast path); the logits come from those embeddings as ``forward`` computes them."""

from __future__ import annotations

import copy
import functools

import open_clip
import pytest
import timm
import torch
import torch.nn.functional as F
from attn_clip import create_model, save_pretrained
from attn_core import fast_inference
from safetensors.torch import save_file
from torch.testing import assert_close

TOL = {"atol": 1e-4, "rtol": 1e-4}
DEPTH, VOCAB = 2, 4096

# (config, its distinct towers)
CASES = [
    ("ViT-B-16-SigLIP", "B/16 gelu + B text, 32k vocab"),
    ("ViT-B-32-SigLIP2-256", "B/32 gelu_tanh + B SigLIP2 text (gelu_tanh)"),
    ("ViT-SO400M-14-SigLIP-384", "SO400M/14 at 384 px (27 patches, 6 px cut) + SO400M text"),
    ("ViT-L-16-SigLIP-384", "L/16 gelu + L text"),
    ("ViT-L-16-SigLIP2-512", "L/16 gelu_tanh + L SigLIP2 text"),
    ("ViT-SO400M-14-SigLIP", "SO400M text with 16 tokens"),
    ("ViT-SO400M-16-SigLIP-i18n-256", "SO400M/16 + 250k text"),
    ("ViT-B-16-SigLIP-i18n-256", "B text, 250k vocab"),
    ("ViT-gopt-16-SigLIP2-256", "gopt/16 + SO400M v2 text"),
]


def _open_clip_siglip(name: str, monkeypatch) -> tuple[torch.nn.Module, dict]:
    """open_clip's CustomTextCLIP for ``name`` with DEPTH blocks per tower (timm's depth
    passed through its create_model), perturbed norms / biases, in eval mode."""
    cfg = copy.deepcopy(open_clip.get_model_config(name))
    cfg.pop("custom_text")
    text = cfg["text_cfg"]
    text["layers"], text["vocab_size"] = DEPTH, VOCAB
    monkeypatch.setattr(timm, "create_model", functools.partial(timm.create_model, depth=DEPTH))
    torch.manual_seed(0)
    ref = open_clip.model.CustomTextCLIP(**cfg)
    monkeypatch.undo()
    with torch.no_grad():
        for p in ref.parameters():
            if p.ndim <= 1 or p.shape[:2] == (1, 1):  # norms, biases, the MAP latent
                p.add_(torch.randn_like(p) * 0.02)
    overrides = {"vision": {"layers": DEPTH}, "text": {"layers": DEPTH, "vocab_size": VOCAB}}
    return ref.eval(), overrides


@pytest.mark.parametrize(("name", "towers"), CASES)
def test_open_clip_siglip_checkpoint_files(tmp_path, monkeypatch, name, towers):
    ref, overrides = _open_clip_siglip(name, monkeypatch)
    size = ref.visual.image_size
    images = torch.randn(2, 3, *size)
    n_ctx = ref.text.context_length
    tokens = torch.randint(0, VOCAB, (3, n_ctx))
    tokens[0, n_ctx // 2 :] = 1  # padded, as the tokenizer pads (pooling takes the last)
    with torch.no_grad():
        ref_image, ref_text = ref.encode_image(images), ref.encode_text(tokens)
        ref_logits = (
            ref.logit_scale.exp()
            * (F.normalize(ref_image, dim=-1) @ F.normalize(ref_text, dim=-1).T)
            + ref.logit_bias
        )  # open_clip's SigLIP logits
    sd = {k: v.contiguous() for k, v in ref.state_dict().items()}
    assert any(k.startswith("visual.trunk.attn_pool.") for k in sd)  # timm's MAP head
    del ref
    # the two files open_clip publishes; alternate between them across the cases
    if len(name) % 2:
        path = tmp_path / "open_clip_model.safetensors"
        save_file(sd, str(path))
    else:
        path = tmp_path / "open_clip_pytorch_model.bin"
        torch.save(sd, path)
    del sd
    ours = create_model(name, pretrained=str(path), **overrides)
    assert ours.config.vision.pool_type == "map" and ours.logit_bias is not None
    with torch.no_grad():
        image, text = ours.encode_image(images), ours.encode_text(tokens)
        per_image, per_text = ours.logits(F.normalize(image, dim=-1), F.normalize(text, dim=-1))
    assert_close(image, ref_image, **TOL)
    assert_close(text, ref_text, **TOL)
    assert_close(per_image, ref_logits, **TOL)
    assert_close(per_text, ref_logits.T, **TOL)
    # the plain modules (no inference fast path) give the same
    fast_inference.disable(ours)
    with torch.no_grad():  # one image is enough here
        assert_close(ours.encode_image(images[:1]), ref_image[:1], **TOL)
        assert_close(ours.encode_text(tokens), ref_text, **TOL)


def test_siglip_save_pretrained_loads_in_open_clip(tmp_path, monkeypatch):
    """save_pretrained writes open_clip's layout: a timm-tower config open_clip builds (the
    preset's depth) whose weights open_clip loads, and that we load back exactly."""
    ref, overrides = _open_clip_siglip("ViT-B-32-SigLIP2-256", monkeypatch)
    path = tmp_path / "w.safetensors"
    save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, str(path))
    ours = create_model("ViT-B-32-SigLIP2-256", pretrained=str(path), **overrides)
    save_pretrained(ours, tmp_path / "saved")
    back = create_model(str(tmp_path / "saved"))
    assert back.config == ours.config
    for k, v in ours.state_dict().items():
        assert torch.equal(back.state_dict()[k], v), k
    # open_clip reads the saved weights into its own model (the shrunk depth comes from
    # timm_model_args, which open_clip itself does not know: build its tower the same way)
    monkeypatch.setattr(timm, "create_model", functools.partial(timm.create_model, depth=DEPTH))
    cfg = copy.deepcopy(open_clip.get_model_config("ViT-B-32-SigLIP2-256"))
    cfg.pop("custom_text")
    cfg["text_cfg"].update(layers=DEPTH, vocab_size=VOCAB)
    twin = open_clip.model.CLIP(**cfg)
    monkeypatch.undo()
    from safetensors.torch import load_file

    twin.load_state_dict(load_file(str(tmp_path / "saved" / "open_clip_model.safetensors")))
    images, tokens = torch.randn(1, 3, 256, 256), torch.randint(0, VOCAB, (2, 64))
    with torch.no_grad():
        assert_close(twin.eval().encode_image(images), ref.encode_image(images), **TOL)
        assert_close(twin.encode_text(tokens), ref.encode_text(tokens), **TOL)


def _fill_(model: torch.nn.Module) -> torch.nn.Module:
    """Every parameter random (norm scales ~1), SigLIP's scale / bias kept sensible."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1 and "norm" in name and name.endswith("weight"):
                p.normal_(1.0, 0.1)
            elif name.endswith("logit_scale"):
                p.fill_(2.3)
            elif name.endswith("logit_bias"):
                p.fill_(-4.0)
            else:
                p.normal_(0.0, 0.05)
    return model.eval()


HF_TEXT = dict(
    hidden_size=96, intermediate_size=200, num_attention_heads=4, num_hidden_layers=2,
    vocab_size=500, max_position_embeddings=16,
)  # fmt: skip
HF_VISION = dict(
    hidden_size=96, intermediate_size=200, num_attention_heads=4, num_hidden_layers=2,
    patch_size=8,
)  # fmt: skip


@pytest.mark.parametrize("kind", ["siglip", "siglip2"])
def test_transformers_siglip_folder(tmp_path, kind):
    transformers = pytest.importorskip("transformers")
    if kind == "siglip":
        config = transformers.SiglipConfig(
            text_config=HF_TEXT, vision_config={**HF_VISION, "image_size": 32}
        )
        ref = _fill_(transformers.SiglipModel(config))
    else:
        if not hasattr(transformers, "Siglip2Model"):
            pytest.skip("this transformers has no Siglip2Model")
        config = transformers.Siglip2Config(
            text_config=HF_TEXT, vision_config={**HF_VISION, "num_patches": 16}
        )
        ref = _fill_(transformers.Siglip2Model(config))
    ref.save_pretrained(tmp_path)
    images = torch.randn(2, 3, 32, 32)
    tokens = torch.randint(0, 500, (3, 16))
    with torch.no_grad():
        if kind == "siglip":
            out = ref(input_ids=tokens, pixel_values=images)
        else:  # NaFlex input: patches flattened (row, column, channel), a 4 x 4 grid
            patches = images.reshape(2, 3, 4, 8, 4, 8).permute(0, 2, 4, 3, 5, 1)
            out = ref(
                input_ids=tokens,
                pixel_values=patches.reshape(2, 16, 8 * 8 * 3),
                pixel_attention_mask=torch.ones(2, 16, dtype=torch.long),
                spatial_shapes=torch.tensor([[4, 4], [4, 4]]),
            )
    del ref
    ours = create_model(str(tmp_path))
    pre = ours.preprocess_cfg
    assert (pre.size, pre.mean, pre.resize_mode) == (32, (0.5, 0.5, 0.5), "squash")
    assert ours.config.vision.act == ours.config.text.act == "gelu_tanh"
    with torch.no_grad():
        mine = ours(images, tokens)
    assert_close(mine.image_embeds, out.image_embeds, **TOL)
    assert_close(mine.text_embeds, out.text_embeds, **TOL)
    assert_close(mine.logits_per_image, out.logits_per_image, **TOL)
    assert_close(mine.logits_per_text, out.logits_per_text, **TOL)
    # save_pretrained (open_clip layout, attn_clip's tower keys) loads back exactly
    save_pretrained(ours, tmp_path / "saved")
    with torch.no_grad():
        again = create_model(str(tmp_path / "saved"))(images, tokens)
    assert torch.equal(again.logits_per_image, mine.logits_per_image)


def test_transformers_siglip_repo_brings_its_tokenizer(tmp_path, fake_hub_cache):
    """``hf-hub:<SiglipModel repo>`` from the hub cache (no network): the model, SigLIP's
    preprocessing from its preprocessor_config.json, and the repo's own tokenizer."""
    import io
    import json

    transformers = pytest.importorskip("transformers")
    spm = pytest.importorskip("sentencepiece")
    from attn_clip import HFTokenizer, create_model_and_transforms

    config = transformers.SiglipConfig(
        text_config=HF_TEXT, vision_config={**HF_VISION, "image_size": 32}
    )
    _fill_(transformers.SiglipModel(config)).save_pretrained(tmp_path / "saved")
    model_bytes = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(["a photo of a dog", "a cat on a mat"] * 20), vocab_size=16,
        model_writer=model_bytes, model_type="unigram", pad_id=0, eos_id=1, unk_id=2,
        bos_id=-1, minloglevel=2,
    )  # fmt: skip
    files = {p.name: p.read_bytes() for p in (tmp_path / "saved").iterdir()}
    files["preprocessor_config.json"] = json.dumps({"resample": 2, "image_mean": [0.5] * 3,
                                                    "image_std": [0.5] * 3}).encode()  # fmt: skip
    files["spiece.model"] = model_bytes.getvalue()
    files["tokenizer_config.json"] = json.dumps({"tokenizer_class": "T5Tokenizer"}).encode()
    repo = "google/siglip-tiny-test"
    fake_hub_cache(tmp_path / "hub", repo, files)
    model, preprocess, tokenizer = create_model_and_transforms(
        f"hf-hub:{repo}", cache_dir=tmp_path / "hub", local_files_only=True
    )
    assert model.config.text.hf_tokenizer_name == repo and isinstance(tokenizer, HFTokenizer)
    assert (preprocess.cfg.interpolation, preprocess.cfg.resize_mode) == ("bilinear", "squash")
    ids = tokenizer(["a photo of a dog"])
    assert ids.shape == (1, 16) and int(ids.max()) < 16
    with torch.no_grad():
        assert model.encode_text(ids).shape == (1, 96)
