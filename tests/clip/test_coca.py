"""CoCa (issue 31): parity with open_clip's ``CoCa`` and the proof of the captioning loop.

Each reference is an open_clip ``CoCa`` built with random init at real widths and 2 layers
per tower and in the decoder, every norm perturbed and ``text_decoder.text_projection``
(which open_clip leaves as ``torch.empty``) drawn, saved as ``open_clip_model.safetensors``
+ ``open_clip_config.json`` and loaded with ``attn_clip.create_model(folder)``. Built once
per module (``pair``) and only read (the EOS-biased copies are deep copies).

open_clip's own ``CoCa.generate`` cannot run here (transformers 5), so decoding is checked
against plain loops over open_clip's ``forward`` with no cache: greedy = argmax each step;
beam search = a per-image, list-based beam search (``ref_beam_search``: transformers'
algorithm, every step re-running the whole prefix), each returned beam re-scored from
scratch with one teacher-forced forward.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import pickle
from pathlib import Path

import open_clip
import pytest
import torch
from _support.clip import SMALL_VOCAB, small_vocab
from attn_clip import coca as coca_module
from attn_clip import create_model, save_pretrained
from attn_clip.convert import to_open_clip
from attn_core.hub import CheckpointError, WeightsError
from attn_nlp.generation import GenerationConfig
from safetensors.torch import save_file
from torch.testing import assert_close

TOL = {"atol": 1e-4, "rtol": 1e-4}
LAYERS = 2
NAMES = ["coca_ViT-B-32", "coca_ViT-L-14", "coca_base"]
PAD = 0
CAPTIONS = [
    "a photo of a cat",
    "two dogs playing in the snow next to a red car",
    " ".join(["a very long caption that fills every one of the seventy six positions"] * 8),
]
B = 3  # images in the decoding tests
# every model reads a 4096-row vocabulary (open_clip's captions folded into it: small_vocab):
# each decoding step reads the whole (V, D) projection, 12x less of it than at 49408 rows.
VOCAB = SMALL_VOCAB
# Decoding starts at SOT and ends at EOT of that vocabulary: BASE is CoCa.generation_config()'s
# defaults with those ids (its own would ask for a tokenizer of this vocabulary, which has none)
SOT, EOT = VOCAB - 2, VOCAB - 1
BASE = GenerationConfig(max_length=30, min_length=5, eos_token_id=EOT, pad_token_id=PAD,
                        bos_token_id=SOT, top_k=None)  # fmt: skip


def gen(model, images: torch.Tensor, **options) -> torch.Tensor:
    return model.generate(images, BASE, **options)


def small_cfg(name: str, vocab: int | None = None) -> dict:
    """open_clip's config for ``name`` with 2 layers per tower and in the decoder (and a
    ``vocab``-row vocabulary when given; the widths stay)."""
    cfg = open_clip.get_model_config(name)
    vocab = {} if vocab is None else {"vocab_size": vocab}
    return {
        **cfg,
        "vision_cfg": {**cfg["vision_cfg"], "layers": LAYERS},
        "text_cfg": {**cfg["text_cfg"], "layers": LAYERS, **vocab},
        "multimodal_cfg": {**cfg["multimodal_cfg"], "layers": LAYERS, **vocab},
    }


def open_clip_coca(cfg: dict) -> torch.nn.Module:
    return open_clip.CoCa(**{k: v for k, v in cfg.items() if k != "custom_text"})


CROSS_OUT = ("attn.out_proj.weight", "mlp.c_proj.weight")  # the cross blocks' residual outputs


@torch.no_grad()
def random_reference(name: str, seed: int = 0) -> tuple[torch.nn.Module, dict]:
    torch.manual_seed(seed)
    cfg = small_cfg(name, VOCAB)
    ref = open_clip_coca(cfg).eval()
    for n, p in ref.named_parameters():
        if n == "text_decoder.text_projection":  # torch.empty in open_clip
            p.normal_(0, p.shape[0] ** -0.5)
        elif p.ndim <= 1 and n != "logit_scale":  # norms, biases, the CLS embedding
            p.add_(torch.randn_like(p) * 0.1)
        elif n.startswith("text_decoder.cross_attn.") and n.endswith(CROSS_OUT):
            p.mul_(10.0)  # the image moves the captions (at init they hardly depend on it)
    for n, p in ref.named_parameters():
        assert torch.isfinite(p).all(), n
    return ref, cfg


def save_open_clip_folder(ref: torch.nn.Module, cfg: dict, folder: Path, drop=()) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    sd = {k: v.contiguous() for k, v in ref.state_dict().items() if k not in drop}
    save_file(sd, str(folder / "open_clip_model.safetensors"))
    (folder / "open_clip_config.json").write_text(json.dumps({"model_cfg": cfg}))
    return folder


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """``pair(name)`` -> ``(open_clip reference, ours, small cfg, folder)``, built once."""
    cache: dict[str, tuple] = {}

    def get(name: str):
        if name not in cache:
            ref, cfg = random_reference(name)
            folder = save_open_clip_folder(ref, cfg, tmp_path_factory.mktemp(name))
            cache[name] = (ref, create_model(str(folder)), cfg, folder)
        return cache[name]

    return get


def images_for(cfg: dict, n: int, seed: int = 1) -> torch.Tensor:
    size = cfg["vision_cfg"]["image_size"]
    return torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(seed))


# -- 1. embeddings and teacher-forced logits --------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_parity_with_open_clip(pair, name):
    ref, ours, cfg, _ = pair(name)
    assert type(ours).__name__ == "CoCa"
    texts = open_clip.get_tokenizer(name)(CAPTIONS)
    assert texts.shape == (3, 76)
    assert (texts[:2, -1] == PAD).all() and (texts[2] != PAD).all()  # padded + full length
    folded = small_vocab(texts, VOCAB)
    assert torch.equal(folded == PAD, texts == PAD)  # the padding is where it was
    texts = folded
    images = images_for(cfg, 3)
    with torch.no_grad():
        r = ref(images, texts)
        o = ours(images, texts)
    assert_close(o.image_embeds, r["image_features"], **TOL)
    assert_close(o.text_embeds, r["text_features"], **TOL)
    assert o.logits.shape == (3, 75, VOCAB)
    assert_close(o.logits, r["logits"], **TOL)
    assert torch.equal(o.labels, r["labels"])
    assert_close(o.logit_scale, r["logit_scale"], **TOL)


def test_architecture_name_with_overrides_and_a_weights_file(pair):
    ref, ours, cfg, folder = pair("coca_ViT-B-32")
    model = create_model(
        "coca_ViT-B-32",
        pretrained=folder / "open_clip_model.safetensors",
        vision={"layers": LAYERS},
        text={"layers": LAYERS, "vocab_size": VOCAB},
        multimodal={"layers": LAYERS},
    )
    assert model.config == ours.config
    texts = small_vocab(open_clip.get_tokenizer("coca_ViT-B-32")(CAPTIONS[:2]))
    images = images_for(cfg, 2)
    with torch.no_grad():
        r, o = ref(images, texts), model(images, texts)
    assert_close(o.logits, r["logits"], **TOL)
    assert_close(o.image_embeds, r["image_features"], **TOL)


# -- decoding references ----------------------------------------------------------------------


@torch.no_grad()
def ref_greedy(ref, images: torch.Tensor, steps: int) -> torch.Tensor:
    """argmax of open_clip's forward each step, the whole prefix each time (no cache)."""
    lat, embs = ref._encode_image(images)
    out = torch.full((images.shape[0], 1), SOT)
    for _ in range(steps):
        logits = ref(images, out, image_latent=lat, image_embs=embs, output_labels=False)
        out = torch.cat((out, logits["logits"][:, -1].argmax(-1, keepdim=True)), dim=1)
    return out


def pad_after_eot(ids: torch.Tensor) -> torch.Tensor:
    """Rows cut after their first EOT and padded with PAD; the length of the longest."""
    ids, ends = ids.clone(), []
    for row in ids:
        hit = (row == EOT).nonzero()
        end = int(hit[0]) + 1 if len(hit) else len(row)
        row[end:] = PAD
        ends.append(end)
    return ids[:, : max(ends)]


@torch.no_grad()
def next_log_probs(ref, encoded, seqs: list[list[int]]) -> torch.Tensor:
    """open_clip's next-token log-probabilities after each of ``seqs`` (the whole prefix)."""
    image, lat, embs = encoded
    n = len(seqs)
    out = ref(image.expand(n, -1, -1, -1), torch.tensor(seqs), image_latent=lat.expand(n, -1),
              image_embs=embs.expand(n, -1, -1), output_labels=False)  # fmt: skip
    return out["logits"][:, -1].float().log_softmax(-1)


def encode(ref, image: torch.Tensor):
    """``(C, H, W)`` -> ``(image (1, C, H, W), open_clip's latent, its image tokens)``."""
    with torch.no_grad():
        return (image[None], *ref._encode_image(image[None]))


@torch.no_grad()
def ref_beam_search(ref, image, K: int, max_length: int, lp: float, min_length: int):
    """transformers' beam search for one image, on lists, re-running the whole prefix with
    open_clip's forward every step -> ``[(score, ids)]`` best first (``score`` = summed
    log-probability / generated length ** ``lp``; early_stopping=False)."""
    encoded = encode(ref, image)
    running = [(0.0, [SOT])]
    finished: list[tuple[float, list[int]]] = []
    for cur_len in range(1, max_length):
        logp = next_log_probs(ref, encoded, [s for _, s in running])
        if cur_len < min_length:
            logp[:, EOT] = -float("inf")
        total = torch.tensor([s for s, _ in running])[:, None] + logp
        V = total.shape[-1]
        vals, idx = total.flatten().topk(2 * K)
        last = cur_len + 1 >= max_length
        new = []
        for rank, (v, i) in enumerate(zip(vals.tolist(), idx.tolist(), strict=True)):
            beam, tok = divmod(i, V)
            seq = [*running[beam][1], tok]
            if tok == EOT or last:
                if rank < K:
                    finished.append((v / cur_len**lp, seq))  # cur_len tokens generated
            elif len(new) < K:
                new.append((v, seq))
        finished = sorted(finished, key=lambda f: -f[0])[:K]
        running = new
        if last:
            break
        if len(finished) == K and running[0][0] / cur_len**lp <= finished[-1][0]:
            break  # no running beam can beat the worst finished one
    return finished


@torch.no_grad()
def rescore(ref, encoded, row: torch.Tensor, lp: float) -> float:
    """One teacher-forced forward of open_clip: summed log-probability of the generated
    tokens (through the first EOT) / their count ** ``lp``."""
    row = pad_after_eot(row[None])[0]
    hit = (row == EOT).nonzero()
    row = row[: int(hit[0]) + 1] if len(hit) else row
    image, lat, embs = encoded
    logits = ref(image, row[None], image_latent=lat, image_embs=embs, output_labels=True)
    logits = logits["logits"][0].float()
    logp = logits.log_softmax(-1).gather(-1, row[1:, None]).sum()
    return float(logp) / (len(row) - 1) ** lp


@pytest.fixture(scope="module")
def biased(pair):
    """Deep copies of the B-32 pair whose EOT projection row is 1.02 x another token's, so
    EOT wins wherever that token would (positive logit): some rows end early, not all."""
    ref, ours, cfg, _ = pair("coca_ViT-B-32")
    images = images_for(cfg, B)
    plain = ref_greedy(ref, images, 8)
    for token in plain[0, 2:].tolist():
        if (plain[1:] == token).any(dim=1).all():
            continue  # rows 1.. would all end too
        ref_b, ours_b = copy.deepcopy(ref), copy.deepcopy(ours)
        with torch.no_grad():
            ref_b.text_decoder.text_projection[:, EOT] = (
                1.02 * ref.text_decoder.text_projection[:, token]
            )
            ours_b.text_decoder.proj.weight[EOT] = 1.02 * ours.text_decoder.proj.weight[token]
        return ref_b, ours_b, images
    raise AssertionError("no token of row 0 that another row lacks")


# -- 2. greedy ---------------------------------------------------------------------------------


def test_greedy_is_the_plain_loop_over_open_clips_forward(pair):
    ref, ours, cfg, _ = pair("coca_ViT-B-32")
    images = images_for(cfg, B)
    expected = ref_greedy(ref, images, 30)
    got = gen(ours, images, max_length=31, min_length=0, eos_token_id=None)
    assert got.shape == (B, 31)
    assert torch.equal(got, expected)
    assert len(set(map(tuple, got.tolist()))) == B  # the images decode differently


def test_greedy_with_rows_ending_early(biased):
    ref, ours, images = biased
    expected = pad_after_eot(ref_greedy(ref, images, 30))
    got = gen(ours, images, max_length=31, min_length=0)
    ends = [(row == EOT).nonzero() for row in got]
    assert any(len(e) for e in ends), "no row ended"
    assert len({int(e[0]) if len(e) else 31 for e in ends}) > 1, "all rows ended together"
    assert torch.equal(got, expected)


# -- 3. beam search ----------------------------------------------------------------------------


@pytest.mark.parametrize("K", [3, 6])
@pytest.mark.parametrize("lp", [0.0, 1.0])
def test_beam_search_against_brute_force(biased, K, lp):
    ref, ours, images = biased
    images = images[:2]
    n, max_length, min_length = 2, 8, 3
    opts = dict(num_beams=K, num_return_sequences=n, length_penalty=lp,
                max_length=max_length, min_length=min_length)  # fmt: skip
    got = gen(ours, images, **opts)
    assert torch.equal(gen(ours, images, use_cache=False, **opts), got)
    assert got.shape[0] == 2 * n
    greedy = gen(ours, images, max_length=max_length, min_length=min_length)
    for b in range(2):
        encoded = encode(ref, images[b])
        expected = ref_beam_search(ref, images[b], K, max_length, lp, min_length)[:n]
        rows = got[b * n : (b + 1) * n]
        for (score, seq), row in zip(expected, rows, strict=True):
            want = torch.full((got.shape[1],), PAD)
            want[: len(seq)] = torch.tensor(seq)
            assert torch.equal(row, want), (row.tolist(), seq)
            assert rescore(ref, encoded, row, lp) == pytest.approx(score, abs=1e-4)
        scores = [rescore(ref, encoded, row, lp) for row in rows]
        assert scores == sorted(scores, reverse=True)
        assert scores[0] >= rescore(ref, encoded, greedy[b], lp) - 1e-5


def test_beams_end_at_different_lengths(biased):
    """The brute-force comparison above covers finished beams of several lengths."""
    _, ours, images = biased
    got = gen(ours, images[:2], num_beams=6, num_return_sequences=6, max_length=10,
                        min_length=3, length_penalty=0.0)  # fmt: skip
    lengths = {int((row != PAD).sum()) for row in got}
    assert len(lengths) > 1 and (got == EOT).any()


# -- 4. cached == uncached for every mode ------------------------------------------------------

FIELDS = {f.name for f in dataclasses.fields(GenerationConfig)}
MODES = {
    "greedy": {},
    "beams": {"num_beams": 4, "num_return_sequences": 2},
    "top_k": {"do_sample": True, "top_k": 20, "seed": 3, "num_return_sequences": 2},
    "top_p": {"do_sample": True, "top_k": None, "top_p": 0.9, "temperature": 0.7, "seed": 4},
    "beam_sample": {"do_sample": True, "num_beams": 3, "top_k": 30, "seed": 5},
    "repetition_penalty": {"repetition_penalty": 1.5},
    "no_repeat_ngram": {"no_repeat_ngram_size": 2},
    "beams_ngram_penalty": {"num_beams": 3, "no_repeat_ngram_size": 2, "repetition_penalty": 1.3},
}


@pytest.mark.parametrize("mode", list(MODES))
def test_cached_equals_uncached(biased, mode):
    _, ours, images = biased
    opts = MODES[mode]
    missing = sorted(set(opts) - FIELDS)
    if missing:
        pytest.skip(f"GenerationConfig has no {missing} yet")
    images = images[:2]
    opts = {"max_length": 10, "min_length": 2, **opts}
    cached = gen(ours, images, **opts)
    assert torch.equal(gen(ours, images, use_cache=False, **opts), cached)
    if opts.get("do_sample"):  # the seed alone decides the samples
        torch.manual_seed(123)
        assert torch.equal(gen(ours, images, **opts), cached)


def test_repetition_options_change_the_tokens(biased):
    _, ours, images = biased
    if "no_repeat_ngram_size" not in FIELDS:
        pytest.skip("GenerationConfig has no no_repeat_ngram_size yet")
    plain = gen(ours, images, max_length=12, min_length=0, eos_token_id=None)
    banned = gen(ours, images, max_length=12, min_length=0, eos_token_id=None,
                           no_repeat_ngram_size=1)  # fmt: skip
    assert all(len(set(row)) == len(row) for row in banned.tolist())  # no token twice
    assert not torch.equal(plain, banned)


# -- 5. the image is encoded once per image ----------------------------------------------------


def test_image_encoded_once_and_context_kv_per_image(pair, monkeypatch):
    _, ours, cfg, _ = pair("coca_ViT-B-32")
    images = images_for(cfg, 2)
    calls: list[int] = []
    # every pass through the image tower embeds patches once, whatever the entry point
    hook = ours.visual.trunk.norm_pre.register_forward_hook(
        lambda m, args, out: calls.append(args[0].shape[0])
    )
    encode_calls: list[int] = []
    original = ours.encode_image_tokens

    def counting(x):
        encode_calls.append(x.shape[0])
        return original(x)

    decoders = []

    class Recording(coca_module.CaptionDecoder):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            decoders.append(self)

    monkeypatch.setattr(ours, "encode_image_tokens", counting)
    monkeypatch.setattr(coca_module, "CaptionDecoder", Recording)
    try:
        out = gen(ours, images, num_beams=6, max_length=10, min_length=0)
    finally:
        hook.remove()
    assert out.shape[0] == 2
    assert encode_calls == [2]
    assert calls == [2]  # one batch of B images through the image tower, never B * beams
    assert len(decoders) == 1 and decoders[0].rows == 6
    kv = decoders[0].context_kv
    assert len(kv) == LAYERS
    for k, v in kv:
        assert k.shape[0] == 2 and v.shape[0] == 2, (k.shape, v.shape)


# -- 6. save_pretrained and the open_clip export -----------------------------------------------


def test_save_pretrained_round_trip_and_open_clip_export(pair, tmp_path):
    _, ours, cfg, _ = pair("coca_ViT-B-32")
    images = images_for(cfg, 2)
    texts = small_vocab(open_clip.get_tokenizer("coca_ViT-B-32")(CAPTIONS[:2]))
    with torch.no_grad():
        want = ours(images, texts)
    back = create_model(str(save_pretrained(ours, tmp_path / "saved")))
    assert type(back).__name__ == "CoCa" and back.config == ours.config
    with torch.no_grad():
        got = back(images, texts)
    for field in ("image_embeds", "text_embeds", "logits"):
        assert torch.equal(getattr(got, field), getattr(want, field)), field
    ids = gen(ours, images, num_beams=3, max_length=10)
    assert torch.equal(gen(back, images, num_beams=3, max_length=10), ids)

    # the export: open_clip's names for open_clip's CoCa, strict, from the config it writes
    exported = open_clip_coca(ours.config.to_open_clip()).eval()
    sd = to_open_clip(ours.state_dict(), ours.config.vision)
    assert sorted(sd) == sorted(exported.state_dict())
    exported.load_state_dict(sd, strict=True)
    with torch.no_grad():
        r = exported(images, texts)
    assert_close(r["logits"], want.logits, **TOL)
    assert_close(r["image_features"], want.image_embeds, **TOL)
    assert_close(r["text_features"], want.text_embeds, **TOL)
    # open_clip's own loader reads the saved file (strict) into a fresh model
    with torch.no_grad():
        for p in exported.parameters():
            p.zero_()
    open_clip.load_checkpoint(exported, str(tmp_path / "saved" / "open_clip_model.safetensors"))
    with torch.no_grad():
        assert_close(exported(images, texts)["logits"], want.logits, **TOL)


# -- 7. hostile and incomplete checkpoints -----------------------------------------------------


class _Payload:
    """Unpickling calls ``open(marker, "w")``: the marker file exists iff the code ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_hostile_pickle_is_refused_without_running(tmp_path):
    marker = tmp_path / "payload-ran.marker"
    cfg = small_cfg("coca_ViT-B-32")
    for i, write in enumerate((torch.save, lambda obj, path: path.write_bytes(pickle.dumps(obj)))):
        folder = tmp_path / f"folder{i}"
        folder.mkdir()
        path = folder / "open_clip_pytorch_model.bin"
        write({"state_dict": {"text_decoder.ln_final.weight": _Payload(marker)}}, path)
        (folder / "open_clip_config.json").write_text(json.dumps({"model_cfg": cfg}))
        with pytest.raises(WeightsError) as err:
            create_model(str(folder))
        assert "weights_only=False" not in str(err.value)
        with pytest.raises(WeightsError):
            create_model("coca_ViT-B-32", pretrained=path, vision={"layers": LAYERS},
                         text={"layers": LAYERS, "vocab_size": VOCAB},
                         multimodal={"layers": LAYERS})  # fmt: skip
        assert not marker.exists(), "the pickle's code ran"


def test_missing_decoder_key_is_named(pair, tmp_path):
    ref, _, cfg, _ = pair("coca_ViT-B-32")
    key = "text_decoder.ln_final.weight"
    folder = save_open_clip_folder(ref, cfg, tmp_path / "missing", drop=(key,))
    with pytest.raises(CheckpointError) as err:
        create_model(str(folder))
    assert key in str(err.value)


# -- 8. bad input ------------------------------------------------------------------------------


def test_bad_input(pair):
    _, ours, cfg, _ = pair("coca_ViT-B-32")
    images = images_for(cfg, 1)
    with pytest.raises(ValueError, match=r"\(B, C, H, W\)"):
        gen(ours, images[0])
    with pytest.raises(TypeError, match="beam_size"):
        gen(ours, images, beam_size=3)
