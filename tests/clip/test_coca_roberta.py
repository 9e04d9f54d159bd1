"""open_clip's ``coca_roberta-ViT-B-32`` (issue 31): a CoCa whose text tower is a Hugging Face
RoBERTa (open_clip's ``HFTextEncoder`` with ``output_tokens``), against random-init open_clip.

open_clip builds it as a CoCa over ``HFTextEncoder``: the contrastive text embedding is the
projected mean pool, the decoder reads every last hidden state (``<s>`` included) of a
*bidirectional* encoder, and the decoder projects to ``text_cfg.vocab_size`` -- which the
RoBERTa tower never reads, so it is open_clip's ``CLIPTextCfg`` default (49408), below
RoBERTa's 50,265 ids. The full-size shapes are compared on the meta device; the parity
model is 2 image / 2 RoBERTa / 2 decoder layers, 256 wide (the real 8 decoder heads), on
a tiny local RoBERTa ``config.json`` and a byte-level BPE tokenizer trained here, saved as
``open_clip_model.safetensors`` + ``open_clip_config.json`` (+ the tokenizer's files) and
loaded by ``attn_clip.create_model(folder)``. As for the real model, the decoder's
vocabulary (the tokenizer's ids) is smaller than the encoder's embedding table.

open_clip's ``CoCa.generate`` cannot run here (transformers 5): greedy decoding is checked
against a plain argmax loop over open_clip's ``forward`` (the whole prefix re-encoded each
step, as the bidirectional tower needs).
"""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path

import attn_clip
import open_clip
import pytest
import torch
from _support.models import meta_build, shapes
from attn_clip.convert import to_open_clip
from attn_clip.loss import create_loss
from attn_nlp.hf_configs import hf_config
from PIL import Image
from safetensors.torch import save_file
from torch.testing import assert_close

TOL = {"atol": 1e-4, "rtol": 1e-4}
NAME = "coca_roberta-ViT-B-32"
WIDTH, SIZE = 256, 64  # every tower 256 wide; 64 px images (2 x 2 patches of 32)
CAPTIONS = [
    "a photo of a cat",
    "two dogs playing in the snow next to a red car",
    " ".join(["a very long caption that fills every one of the positions"] * 10),
]
CORPUS = [*CAPTIONS, "a dog on a beach", "a red circle", "the quick brown fox", "Ein Hund"]


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """One intra-op thread: the models are tiny and the machine is shared."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _roberta_config(folder: Path, **changes) -> None:
    """roberta-base's published config.json (attn_nlp's table) with ``changes``, saved by
    transformers' config class (what open_clip's ``AutoConfig`` reads)."""
    from transformers import CONFIG_MAPPING

    hf = hf_config("roberta-base")
    kind = hf.pop("model_type")
    CONFIG_MAPPING[kind].from_dict({**hf, **changes}).save_pretrained(folder)


def _open_clip_cfg(hf_folder: Path, **text) -> dict:
    cfg = copy.deepcopy(open_clip.get_model_config(NAME))
    cfg.pop("custom_text")
    cfg["text_cfg"].update(hf_model_name=str(hf_folder), hf_model_pretrained=False, **text)
    return cfg


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict:
    """The open_clip reference (seeded, norms / biases perturbed, cross-attention outputs
    scaled so that the image moves the captions), its folder, our model loaded from it and
    open_clip's tokenizer of that folder."""
    from open_clip.tokenizer import HFTokenizer as OpenClipHFTokenizer
    from tokenizers import ByteLevelBPETokenizer

    root = tmp_path_factory.mktemp("coca_roberta")
    folder = root / "model"
    folder.mkdir()
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(CORPUS * 5, vocab_size=400, min_frequency=1, show_progress=False,
                            special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])  # fmt: skip
    bpe.save_model(str(folder))
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "RobertaTokenizer"})
    )
    n_ids = bpe.get_vocab_size()
    # the encoder's table is larger than the decoder's vocabulary, as 50,265 > 49,408
    _roberta_config(root / "hf", hidden_size=WIDTH, num_hidden_layers=2, num_attention_heads=4,
                    intermediate_size=4 * WIDTH, max_position_embeddings=80,
                    vocab_size=n_ids + 64)  # fmt: skip
    cfg = _open_clip_cfg(root / "hf", width=WIDTH, vocab_size=n_ids)
    cfg["vision_cfg"].update(layers=2, width=WIDTH, image_size=SIZE)
    cfg["multimodal_cfg"].update(layers=2, width=WIDTH)
    torch.manual_seed(0)
    ref = open_clip.CoCa(**copy.deepcopy(cfg)).eval()
    with torch.no_grad():
        for n, p in ref.named_parameters():
            if n == "text_decoder.text_projection":  # torch.empty in open_clip
                p.normal_(0, p.shape[0] ** -0.5)
            elif p.ndim <= 1 and n != "logit_scale":  # norms, biases
                p.add_(torch.randn_like(p) * 0.1)
            elif n.startswith("text_decoder.cross_attn.") and n.endswith(
                ("attn.out_proj.weight", "mlp.c_proj.weight")
            ):
                p.mul_(10.0)
    save_file({k: v.contiguous() for k, v in ref.state_dict().items()},
              str(folder / "open_clip_model.safetensors"))  # fmt: skip
    (folder / "open_clip_config.json").write_text(json.dumps({"model_cfg": cfg}))
    ours = attn_clip.create_model(str(folder)).eval()
    tokenizer = OpenClipHFTokenizer(str(folder), context_length=77)
    images = torch.randn(3, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(1))
    return {"ref": ref, "ours": ours, "cfg": cfg, "folder": folder, "root": root,
            "tokenizer": tokenizer, "images": images, "n_ids": n_ids}  # fmt: skip


# -- the config: open_clip's, at full size -----------------------------------------------------


def test_full_size_state_dict_and_config_are_open_clip_s(tmp_path):
    """Built by name (the shipped table: roberta-base's architecture, no network), our model
    has open_clip's state dict at full size, its decoder projecting to open_clip's default
    text vocabulary, not RoBERTa's; the config survives open_clip's format and back."""
    config = attn_clip.get_model_config(NAME)
    assert config.is_coca and config.text.tower == "hf"
    assert config.multimodal.vocab_size == open_clip.model.CLIPTextCfg().vocab_size
    assert config.text.vocab_size == hf_config("roberta-base")["vocab_size"]
    assert config.text.width == config.multimodal.width
    _roberta_config(tmp_path)
    with meta_build():
        ref = open_clip.CoCa(**{k: v for k, v in _open_clip_cfg(tmp_path).items()})
        ours = attn_clip.create_model(NAME)
    assert isinstance(ours, attn_clip.coca.CoCa)
    ours_sd = to_open_clip(ours.state_dict(), ours.config.vision, ours.config.text)
    assert shapes(ours_sd) == shapes(ref)
    back = attn_clip.CLIPConfig.from_open_clip(config.to_open_clip())
    assert back == config
    assert attn_clip.CLIPConfig.from_dict(config.to_dict()) == config
    # open_clip's own text tower: the decoder's vocabulary is the tower's, nothing else
    coca = attn_clip.get_model_config("coca_ViT-B-32")
    other = dataclasses.replace(coca, multimodal=dataclasses.replace(coca.multimodal, vocab_size=9))
    with pytest.raises(ValueError, match="multimodal vocab_size 9 has no open_clip config"):
        other.to_open_clip()
    bad = _open_clip_cfg(tmp_path)
    bad["text_cfg"]["width"] = 512
    with pytest.raises(ValueError, match=r"text_cfg\.width=512 \(.* has width 768\)"):
        attn_clip.CLIPConfig.from_open_clip(bad)


# -- parity ----------------------------------------------------------------------------------


def test_embeddings_and_teacher_forced_logits(built):
    ref, ours, images = built["ref"], built["ours"], built["images"]
    texts = built["tokenizer"](CAPTIONS)
    pad = ref.text.config.pad_token_id
    assert (texts[:2, -1] == pad).all() and (texts[2] != pad).all()  # padded + full length
    _, _, our_tokenizer = attn_clip.create_model_and_transforms(str(built["folder"]))
    assert torch.equal(our_tokenizer(CAPTIONS), texts)  # the folder's tokenizer
    with torch.no_grad():
        r = ref(images, texts)
        o = ours(images, texts)
        assert_close(o.image_embeds, r["image_features"], **TOL)
        assert_close(o.text_embeds, r["text_features"], **TOL)
        assert o.logits.shape == (3, texts.shape[1] - 1, built["n_ids"])
        assert_close(o.logits, r["logits"], **TOL)
        assert torch.equal(o.labels, r["labels"])
        assert_close(ours.encode_text(texts, normalize=True), ref.encode_text(texts), **TOL)
        # bidirectional as open_clip's: a later token moves an earlier row's logits
        later = texts.clone()
        later[1, 5] = texts[1, 6]
        moved = ours(images, later).logits[1, 2]
        assert not torch.allclose(moved, o.logits[1, 2], **TOL)
        assert_close(moved, ref(images, later)["logits"][1, 2], **TOL)


def _plain_loop(ref, images, start: int, steps: int, eos: int | None = None, min_len: int = 0):
    """open_clip's forward, argmax each step over the whole prefix (no cache); with ``eos``:
    it is barred while shorter than ``min_len`` (with the start token) and ends a row."""
    out = torch.full((images.shape[0], 1), start, dtype=torch.long)
    with torch.no_grad():
        latent, embs = ref._encode_image(images)
        for _ in range(steps):
            logits = ref(images, out, image_latent=latent, image_embs=embs,
                         output_labels=False)["logits"][:, -1]  # fmt: skip
            if eos is not None and out.shape[1] < min_len:
                logits[:, eos] = float("-inf")
            out = torch.cat([out, logits.argmax(-1, keepdim=True)], dim=1)
    if eos is None:
        return out.tolist()
    rows = []
    for row in out.tolist():
        rows.append(row[: row.index(eos) + 1] if eos in row else row)
    return rows


def test_greedy_is_a_plain_loop_over_open_clip_and_the_cache_changes_nothing(built):
    ref, ours, images = built["ref"], built["ours"], built["images"]
    start = built["tokenizer"](["x"])[0, 0].item()  # <s>
    want = _plain_loop(ref, images, start, 10)
    options = {"max_length": 11, "min_length": 0, "eos_token_id": None}
    got = ours.generate(images, **options)
    assert got.tolist() == want
    assert len({tuple(r[1:]) for r in want}) == 3  # the images give different captions
    assert torch.equal(ours.generate(images, **options, use_cache=False), got)
    beams = {"num_beams": 3, "num_return_sequences": 2, "max_length": 8}
    assert torch.equal(
        ours.generate(images, **beams), ours.generate(images, **beams, use_cache=False)
    )
    image_tokens = ours.encode_image_tokens(images)[1]
    decoder = attn_clip.coca.CaptionDecoder(ours, image_tokens, 1, use_cache=True)
    assert not decoder.use_cache  # every row changes with each new token: nothing to keep


def test_caption_defaults_are_the_tokenizer_s_ids(built):
    """``caption()`` with ``generation_config()``'s defaults: start at ``<s>``, end at
    ``</s>``, pad with ``<pad>`` (the folder's tokenizer, not CLIP's 49406 / 49407), at least
    5 tokens (here at most 12) -- the plain loop with those rules, decoded by open_clip's
    tokenizer."""
    ref, ours, images, tok = built["ref"], built["ours"], built["images"], built["tokenizer"]
    ids = tok(["a cat"])[0].tolist()
    pad = tok.tokenizer.pad_token_id
    start, eos = ids[0], [i for i in ids if i != pad][-1]
    config = ours.generation_config()
    assert (config.bos_token_id, config.eos_token_id, config.pad_token_id) == (start, eos, pad)
    assert config.min_length == 5
    assert create_loss(ours).pad_id == pad == 1  # the caption loss ignores RoBERTa's <pad>
    # </s> made likely (its projection row 1.5x that of a token greedy picks early for
    # image 0), so that captions end, some where min_length still bars it
    early = _plain_loop(ref, images, start, 2)[0][2]
    ref, ours = copy.deepcopy(ref), copy.deepcopy(ours)
    with torch.no_grad():
        ref.text_decoder.text_projection[:, eos] = 1.5 * ref.text_decoder.text_projection[:, early]
        ours.text_decoder.proj.weight[eos] = 1.5 * ours.text_decoder.proj.weight[early]
    want = _plain_loop(ref, images, start, 11, eos=eos, min_len=5)
    assert any(w[-1] == eos for w in want) and {len(w) for w in want} != {12}
    unbarred = _plain_loop(ref, images, start, 11, eos=eos, min_len=0)
    assert any(len(u) < 5 for u in unbarred)  # min_length mattered
    got = ours.generate(images, max_length=12)
    for row, w in zip(got.tolist(), want, strict=True):
        assert row[: len(w)] == w and set(row[len(w) :]) <= {pad}
    texts = [tok.tokenizer.decode(w, skip_special_tokens=True).strip() for w in want]
    assert ours.caption(images, max_length=12) == texts


def test_caption_app_on_the_folder(built, tmp_path, capsys):
    """apps/caption.py with the open_clip folder: the library's captions."""
    import caption as app  # apps/caption.py

    path = tmp_path / "image.png"
    Image.new("RGB", (48, 40), "red").save(path)
    code = app.main([str(path), "--model", str(built["folder"]), "--max-tokens", "6",
                     "--device", "cpu"])  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 0 and err == "", err
    model, preprocess, _ = attn_clip.create_model_and_transforms(str(built["folder"]))
    x = preprocess(Image.open(path).convert("RGB"))[None]
    assert out == f"{path}\t{model.caption(x, max_new_tokens=6)[0]}\n"


def test_save_pretrained_round_trip(built, tmp_path):
    ours = built["ours"]
    saved = attn_clip.save_pretrained(ours, tmp_path / "saved")
    moved = built["root"] / "hf-moved"
    (built["root"] / "hf").rename(moved)  # the folder needs neither the HF config again
    try:
        back = attn_clip.create_model(str(saved)).eval()
    finally:
        moved.rename(built["root"] / "hf")
    # (the tokenizer's files were copied along: the saved folder is its tokenizer's now)
    assert back.config.text.hf_tokenizer_name == str(saved)
    text = dataclasses.replace(
        back.config.text, hf_tokenizer_name=ours.config.text.hf_tokenizer_name
    )
    assert dataclasses.replace(back.config, text=text) == ours.config
    for k, v in ours.state_dict().items():
        assert torch.equal(back.state_dict()[k], v), k
    assert back.pad_id == ours.pad_id == built["tokenizer"].tokenizer.pad_token_id
