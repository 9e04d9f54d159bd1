"""open_clip's Hugging Face text-tower CLIPs (``text_cfg.hf_model_name``: XLM-R, RoBERTa,
NLLB, mT5) against attn_clip: random-init open_clip models saved in open_clip's layouts,
loaded by ``create_model(folder)``, fp32 image and text embeddings equal at 1e-4.

Each of the 9 configs keeps its text tower's family and settings (pooler, projection,
``quick_gelu``, embed_dim) but points ``hf_model_name`` at a tiny local ``config.json``
made from the published one (attn_nlp's table) with 2 layers, 64 wide, a 1000-token
vocabulary, saved by transformers' config class -- what open_clip's ``AutoConfig`` reads
(with ``hf_model_pretrained=False``: no hub). Image towers are cut to 1 block at 2 x 2
patches (the SigLIP ones, timm towers: ``timm.create_model`` gets ``depth`` / ``embed_dim``
/ ``img_size``, our folder the same as ``timm_model_args``; embed_dim 64 so that timm's
trunk is the projection-free embedding open_clip's ``timm_proj="none"`` asks for). Two
variants add the poolers and projection no config uses (a RoBERTa's ``cls_pooler`` through
its pooler layer, ``cls_last_hidden_state_pooler`` without projection)."""

from __future__ import annotations

import copy
import functools
import json
import pickle
import re
from pathlib import Path

import open_clip
import pytest
import timm
import torch
from _support.models import meta_build, shapes
from attn_clip import CLIPConfig, create_model, save_pretrained, save_weights
from attn_clip.convert import to_open_clip
from attn_clip.hf_text import HFTextTower, convert_open_clip_text
from attn_core.hub import WeightsError
from attn_nlp.hf_configs import hf_config
from safetensors.torch import save_file
from torch.testing import assert_close

TOL = {"atol": 1e-4, "rtol": 1e-4}
VOCAB, L = 1000, 12
# the tiny config.json of each family: the published one with these sizes
SHRINK = {
    "roberta": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                    intermediate_size=128, max_position_embeddings=80),
    "mt5": dict(d_model=64, d_kv=16, num_heads=4, d_ff=96, num_layers=2, num_decoder_layers=1),
    "m2m_100": dict(d_model=64, encoder_layers=2, num_hidden_layers=2, decoder_layers=1,
                    encoder_attention_heads=4,
                    decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128,
                    max_position_embeddings=80),
}  # fmt: skip
SHRINK["xlm-roberta"] = SHRINK["roberta"]

CONFIGS = [
    "xlm-roberta-base-ViT-B-32",
    "xlm-roberta-large-ViT-H-14",
    "roberta-ViT-B-32",  # RoBERTa's byte-BPE vocabulary, QuickGELU image tower
    "nllb-clip-base",  # M2M100: cls_pooler (no pooler layer: position 0), linear projection
    "nllb-clip-large",
    "nllb-clip-base-siglip",  # + a timm SigLIP image tower and a logit bias
    "nllb-clip-large-siglip",
    "mt5-base-ViT-B-32",  # T5 encoder stack: relative positions, RMSNorm, gated GELU
    "mt5-xl-ViT-H-14",
]
# (config, text_cfg changes, embed_dim): what no open_clip config uses
VARIANTS = {
    "xlm-roberta-base-ViT-B-32+cls_pooler": ({"hf_pooler_type": "cls_pooler",
                                              "hf_proj_type": "linear"}, None),
    "mt5-base-ViT-B-32+cls_last": ({"hf_pooler_type": "cls_last_hidden_state_pooler",
                                    "hf_proj_type": None}, 64),
}  # fmt: skip


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """One intra-op thread: these models are tiny, and on a busy 2-core machine two threads
    spend ~5x the time waiting on each other (pytest -n gives each worker one anyway)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _tiny_hf_folder(hf_model_name: str, folder: Path) -> int:
    """The published config.json of ``hf_model_name`` shrunk (SHRINK), saved by
    transformers' config class into ``folder``; returns its pad id."""
    from transformers import CONFIG_MAPPING

    hf = hf_config(hf_model_name)
    kind = hf.pop("model_type")
    hf.update(SHRINK[kind], vocab_size=VOCAB)
    config = CONFIG_MAPPING[kind].from_dict(hf)
    config.save_pretrained(folder)
    return config.pad_token_id


def _build(case: str, root: Path) -> dict:
    """open_clip's model for ``case`` (seeded, norms / biases perturbed, eval), its config,
    our folder config and the tiny HF folder."""
    name, _, variant = case.partition("+")
    cfg = copy.deepcopy(open_clip.get_model_config(name))
    cfg.pop("custom_text", None)
    if variant:
        text_changes, embed_dim = VARIANTS[case]
        cfg["text_cfg"].update(text_changes)
        cfg["embed_dim"] = embed_dim or cfg["embed_dim"]
    hf_dir = root / "hf"
    pad = _tiny_hf_folder(cfg["text_cfg"]["hf_model_name"], hf_dir)
    cfg["text_cfg"].update(hf_model_name=str(hf_dir), hf_model_pretrained=False)
    v, ours_cfg = cfg["vision_cfg"], None
    torch.manual_seed(0)
    if "timm_model_name" in v:
        patch = int(re.search(r"patch(\d+)", v["timm_model_name"]).group(1))
        args = {"depth": 1, "embed_dim": 64, "num_heads": 2, "img_size": 2 * patch}
        v["image_size"], cfg["embed_dim"] = 2 * patch, 64
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(timm, "create_model", functools.partial(timm.create_model, **args))
            ref = open_clip.model.CustomTextCLIP(**copy.deepcopy(cfg))
        ours_cfg = copy.deepcopy(cfg)
        ours_cfg["vision_cfg"]["timm_model_args"] = args  # (attn_clip's key)
    else:
        v.update(layers=1, width=64, head_width=32, image_size=2 * v["patch_size"])
        ref = open_clip.model.CustomTextCLIP(**copy.deepcopy(cfg))
    with torch.no_grad():
        for p in ref.parameters():
            if p.ndim <= 1:  # norms and biases start as constants
                p.add_(torch.randn_like(p) * 0.02)
    return {"ref": ref.eval(), "cfg": cfg, "ours_cfg": ours_cfg or cfg, "hf_dir": hf_dir,
            "pad": pad, "root": root}  # fmt: skip


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """``built(case)``: :func:`_build`, once per case for the module."""
    cache: dict[str, dict] = {}

    def get(case: str) -> dict:
        if case not in cache:
            cache[case] = _build(case, tmp_path_factory.mktemp(case.replace("+", "_")))
        return cache[case]

    return get


def _inputs(b: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """Two images; three captions of random non-pad ids, two padded at the tower's pad id."""
    gen = torch.Generator().manual_seed(1)
    size = b["ref"].visual.image_size
    images = torch.randn(2, 3, *(size if isinstance(size, tuple) else (size, size)), generator=gen)
    tokens = torch.randint(3, VOCAB, (3, L), generator=gen)
    tokens[1, 7:] = tokens[2, 3:] = b["pad"]
    return images, tokens


def _folder(b: dict, weights: str) -> Path:
    """open_clip's folder layout: ``open_clip_config.json`` + ``weights`` (safetensors or
    open_clip's pickled ``.bin``, as ``torch.save`` writes it)."""
    folder = b["root"] / weights.split(".")[-1]
    folder.mkdir(exist_ok=True)
    sd = {k: v.contiguous() for k, v in b["ref"].state_dict().items()}
    if weights.endswith(".safetensors"):
        save_file(sd, str(folder / weights))
    else:
        torch.save(sd, folder / weights)
    (folder / "open_clip_config.json").write_text(json.dumps({"model_cfg": b["ours_cfg"]}))
    return folder


@pytest.mark.parametrize("case", [*CONFIGS, *VARIANTS])
def test_open_clip_hf_text_clip(built, case):
    b = built(case)
    ref, images, tokens = b["ref"], *_inputs(built(case))
    with torch.no_grad():
        want_image, want_text = ref.encode_image(images), ref.encode_text(tokens)
        ref.text.output_tokens = True
        want_pooled, want_tokens = ref.text(tokens)
        ref.text.output_tokens = False
    sd = {k: v.clone() for k, v in ref.state_dict().items()}

    # open_clip's pickled .bin (read as tensors only) and its safetensors
    pickled = create_model(str(_folder(b, "open_clip_pytorch_model.bin")))
    ours = create_model(str(_folder(b, "open_clip_model.safetensors")))
    assert isinstance(ours.text, HFTextTower)
    with torch.no_grad():
        assert_close(pickled.encode_text(tokens), want_text, **TOL)
        assert_close(ours.encode_image(images), want_image, **TOL)
        assert_close(ours.encode_text(tokens), want_text, **TOL)
        assert_close(ours.encode_text(tokens, truncate=False), want_text, **TOL)
        pooled, hidden = ours.text.forward_tokens(tokens)
    # output_tokens=True: the same tokens (position 0 dropped for cls_pooler), compared
    # where the caption is not padding
    assert_close(pooled, want_pooled, **TOL)
    keep = tokens != b["pad"]
    keep = keep[:, 1:] if ours.config.text.hf_pooler_type == "cls_pooler" else keep
    assert hidden.shape == want_tokens.shape
    assert_close(hidden[keep], want_tokens[keep], **TOL)

    # our export is open_clip's layout: open_clip's own loader takes it strictly
    path = save_weights(ours, b["root"] / "export.safetensors")
    with torch.no_grad():
        for p in ref.parameters():
            p.zero_()
    open_clip.load_checkpoint(ref, str(path), strict=True)
    for k, v in ref.state_dict().items():
        assert torch.equal(v, sd[k]), k

    # save_pretrained is self-contained: it loads back without the HF config folder
    saved = save_pretrained(ours, b["root"] / "saved")
    moved = b["hf_dir"].rename(b["root"] / "hf-moved")
    try:
        back = create_model(str(saved))
    finally:
        moved.rename(b["hf_dir"])
    assert back.config == ours.config
    for k, v in ours.state_dict().items():
        assert torch.equal(back.state_dict()[k], v), k


def test_folder_with_its_tokenizer_end_to_end(built):
    """A model folder with its tokenizer files (a byte-level BPE, RoBERTa's kind):
    ``create_model_and_transforms`` gives the tokenizer open_clip's ``get_tokenizer`` would,
    and captions in any language embed as open_clip embeds its own tokenization."""
    import warnings

    from attn_clip import create_model_and_transforms
    from open_clip.tokenizer import HFTokenizer as OpenClipHFTokenizer
    from tokenizers import ByteLevelBPETokenizer

    b = built("roberta-ViT-B-32")
    folder = _folder(b, "open_clip_model.safetensors")
    corpus = ["a photo of a dog", "ein Foto eines Hundes", "一只狗的照片", "صورة كلب"]
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(corpus * 5, vocab_size=400, min_frequency=1, show_progress=False,
                            special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])  # fmt: skip
    bpe.save_model(str(folder))
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "RobertaTokenizer"})
    )
    texts = ["a photo of a dog", "Ein Foto eines Hundes!", "一只狗的照片", "", "dog " * 100]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want_tokens = OpenClipHFTokenizer(str(folder), context_length=77)(texts)
    model, _, tokenizer = create_model_and_transforms(str(folder))
    tokens = tokenizer(texts)
    assert torch.equal(tokens, want_tokens)
    assert (tokens == model.text.pad_id).any()  # padded, at the tower's pad id
    with torch.no_grad():
        assert_close(model.encode_text(tokens), b["ref"].encode_text(want_tokens), **TOL)


def test_pretrained_tag_from_the_hub_cache(built, tmp_path, fake_hub_cache):
    """``create_model(name, tag)`` reads the tag's repo (here a fake hub cache, offline);
    roberta-ViT-B-32's config says QuickGELU while its tag keeps the registry's default
    flag: the weights were trained as the config says, as open_clip builds them."""
    b = built("roberta-ViT-B-32")
    folder = _folder(b, "open_clip_model.safetensors")
    files = {"open_clip_model.safetensors": (folder / "open_clip_model.safetensors").read_bytes()}
    fake_hub_cache(tmp_path / "hub", "laion/CLIP-ViT-B-32-roberta-base-laion2B-s12B-b32k", files)
    small = create_model(str(folder)).config
    vision = {k: getattr(small.vision, k) for k in ("layers", "width", "head_width", "image_size")}
    model = create_model("roberta-ViT-B-32", "laion2b_s12b_b32k", cache_dir=tmp_path / "hub",
                         local_files_only=True, vision=vision,
                         text={"hf_encoder": small.text.hf_encoder})  # fmt: skip
    assert model.config.quick_gelu and b["cfg"]["quick_gelu"]
    images, tokens = _inputs(b)
    with torch.no_grad():
        assert_close(model.encode_image(images), b["ref"].encode_image(images), **TOL)
        assert_close(model.encode_text(tokens), b["ref"].encode_text(tokens), **TOL)


class _Payload:
    """Unpickling calls ``open(marker, "w")``: the marker exists iff the code ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_hostile_pickle_is_refused_without_running(tmp_path):
    marker = tmp_path / "payload-ran.marker"
    model = create_model(_small_config(tmp_path))
    cfg = model.config.to_open_clip()
    for i, write in enumerate((torch.save, lambda obj, path: path.write_bytes(pickle.dumps(obj)))):
        folder = tmp_path / f"folder{i}"
        folder.mkdir()
        path = folder / "open_clip_pytorch_model.bin"
        write({"state_dict": {"text.transformer.embeddings.LayerNorm.weight": _Payload(marker)}},
              path)  # fmt: skip
        (folder / "open_clip_config.json").write_text(json.dumps({"model_cfg": cfg}))
        for target in (str(folder), f"local-dir:{folder}"):
            with pytest.raises(WeightsError) as err:
                create_model(target)
            assert "weights_only=False" not in str(err.value)
        with pytest.raises(WeightsError):
            create_model(model.config, pretrained=path)
        assert not marker.exists(), "the pickle's code ran"


def _small_config(tmp_path: Path) -> CLIPConfig:
    """xlm-roberta-base-ViT-B-32 over a tiny XLM-R (no open_clip model built)."""
    _tiny_hf_folder("xlm-roberta-base", tmp_path / "hf")
    cfg = copy.deepcopy(open_clip.get_model_config("xlm-roberta-base-ViT-B-32"))
    cfg["text_cfg"]["hf_model_name"] = str(tmp_path / "hf")
    cfg["vision_cfg"].update(layers=1, width=64, head_width=32, image_size=64)
    return CLIPConfig.from_open_clip(cfg)


@pytest.mark.parametrize(
    ("case", "unlocked", "freeze_ln"),
    [("xlm-roberta-base-ViT-B-32", 1, False), ("xlm-roberta-base-ViT-B-32+cls_pooler", 0, False),
     ("mt5-base-ViT-B-32", 1, False), ("nllb-clip-base", 0, True)],
)  # fmt: skip
def test_lock_freezes_what_open_clip_freezes(built, case, unlocked, freeze_ln):
    """``HFTextTower.lock`` = open_clip's ``HFTextEncoder.lock`` (compared per transformers
    name: our flags exported like weights). open_clip's walk needs a ``layer_attr``, which
    its M2M100 entry lacks: there only the full lock."""
    b = built(case)
    ref, ours = b["ref"], create_model(str(_folder(b, "open_clip_model.safetensors")))
    ref.text.lock(unlocked, freeze_ln)
    ours.text.lock(unlocked, freeze_ln)
    want = {k: p.requires_grad for k, p in ref.named_parameters() if k.startswith("text.")}
    flags = {k: torch.full(p.shape, float(p.requires_grad)) for k, p in ours.named_parameters()}
    got = to_open_clip(flags, ours.config.vision, ours.config.text)
    got = {k: bool(t.all()) for k, t in got.items() if k.startswith("text.")}
    assert got == want
    assert not all(want.values()) and any(want.values())
    for p in ref.parameters():
        p.requires_grad_(True)


def test_grad_checkpointing_gives_the_same_gradients(tmp_path):
    model = create_model(_small_config(tmp_path))  # eval: no dropout, grads still on
    tokens = torch.randint(3, VOCAB, (2, 6))
    tokens[1, 4:] = 1

    def grads() -> dict[str, torch.Tensor]:
        model.zero_grad()
        model.encode_text(tokens).square().sum().backward()
        return {k: p.grad.clone() for k, p in model.text.named_parameters()}

    plain = grads()
    model.set_grad_checkpointing(True)
    assert_close(grads(), plain, atol=1e-6, rtol=1e-5)
    model.text.set_grad_checkpointing(False)
    assert all("forward" not in vars(b) for b in model.text.encoder.blocks)


def test_full_size_text_towers_have_open_clip_tensors(tmp_path):
    """Each config's text tower at full size, on the meta device: open_clip's
    ``HFTextEncoder`` over the published config.json (saved by transformers' config class:
    its ``AutoConfig`` reads the folder) converts onto ours name for name, shape for shape."""
    from attn_clip import get_model_config
    from open_clip.model import _build_text_tower
    from transformers import CONFIG_MAPPING

    for name in CONFIGS:
        oc = copy.deepcopy(open_clip.get_model_config(name))
        tcfg = oc["text_cfg"]
        hf = hf_config(tcfg["hf_model_name"])
        folder = tmp_path / name
        CONFIG_MAPPING[hf.pop("model_type")].from_dict(hf).save_pretrained(folder)
        tcfg.update(hf_model_name=str(folder), hf_model_pretrained=False)
        config = get_model_config(name)  # from attn_nlp's table
        with meta_build():
            ref = _build_text_tower(oc["embed_dim"], tcfg)
            ours = HFTextTower(config.text, config.embed_dim)
        sd = {f"text.{k}": v for k, v in ref.state_dict().items()}
        sd = convert_open_clip_text(sd, config.text.hf_encoder)  # strict: every key mapped
        assert shapes(sd) == {f"text.{k}": s for k, s in shapes(ours).items()}, name


def test_configs_build_from_the_shipped_table_with_open_clip_settings():
    """Each of the 9 configs by name: no network, the architecture of its hf_model_name."""
    from attn_clip import get_model_config

    kinds = {"xlm": "roberta", "roberta": "roberta", "nllb": "m2m100", "mt5": "t5"}
    for name in CONFIGS:
        oc = open_clip.get_model_config(name)
        config = get_model_config(name)
        t = config.text
        assert t.tower == "hf" and t.hf_model_name == oc["text_cfg"]["hf_model_name"]
        assert t.hf_encoder["model_type"] == f"attn_nlp.{kinds[name.split('-')[0]]}"
        assert t.hf_pooler_type == oc["text_cfg"].get("hf_pooler_type", "mean_pooler")
        assert t.hf_proj_type == oc["text_cfg"].get("hf_proj_type", "mlp")
        assert t.hf_tokenizer_name == oc["text_cfg"]["hf_tokenizer_name"]
        published = hf_config(t.hf_model_name)
        assert t.width == published.get("hidden_size", published.get("d_model"))
        assert t.vocab_size == published["vocab_size"]
        assert config.quick_gelu == oc.get("quick_gelu", False)
        assert CLIPConfig.from_open_clip(config.to_open_clip()) == config


def test_refused_by_name(tmp_path):
    base = copy.deepcopy(open_clip.get_model_config("xlm-roberta-base-ViT-B-32"))

    def refused(match: str, **text_cfg) -> None:
        cfg = copy.deepcopy(base)
        cfg["text_cfg"].update(text_cfg)
        with pytest.raises(ValueError, match=match):
            CLIPConfig.from_open_clip(cfg)

    refused("hf_pooler_type='max_pooler'.*masked_fill", hf_pooler_type="max_pooler")
    refused("hf_pooler_type must be one of", hf_pooler_type="attention_pooler")
    refused("hf_proj_type must be one of", hf_proj_type="none")
    refused(
        r"hf_proj_type=None needs the encoder width \(768\) == embed_dim \(512\)", hf_proj_type=None
    )
    refused(r"text_cfg\.layers \(a Hugging Face tower's architecture", layers=2)
    refused(r"text_cfg\.width=512 \('xlm-roberta-base' has width 768\)", width=512)
    refused("'not-a/model'.*nor a local folder", hf_model_name="not-a/model")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    refused("is a 'gpt2' model", hf_model_name=str(tmp_path))
    with pytest.raises(ValueError, match="unknown"):  # an unknown field of the encoder config
        CLIPConfig.from_dict({**(d := CLIPConfig.from_open_clip(base).to_dict()),
                              "text": {**d["text"], "hf_encoder": {**d["text"]["hf_encoder"],
                                                                  "rotary": True}}})  # fmt: skip


def test_overriding_hf_model_name_rebuilds_its_architecture():
    from attn_clip import get_model_config
    from attn_clip.factory import _with_overrides

    base = get_model_config("xlm-roberta-base-ViT-B-32")
    large = _with_overrides(base, {"text": {"hf_model_name": "xlm-roberta-large"}})
    assert large.text.width == 1024 and large.text.hf_encoder["depth"] == 24
    assert base.text.width == 768
