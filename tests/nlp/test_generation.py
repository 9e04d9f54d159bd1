"""Decoding: same token ids as transformers' generate; cached == uncached; processors."""

from __future__ import annotations

import pytest
import torch
from attn_nlp import GenerationConfig, create_model, generate
from attn_nlp.generation import _Processor, resolve_max_length

PAD = 59  # conftest.PAD
SRC = torch.tensor(
    [
        [5, 6, 7, 8, 9, 10, 11, 0],
        [12, 13, 14, 0, PAD, PAD, PAD, PAD],
        [20, 21, 22, 23, 24, 0, PAD, PAD],
    ]
)

SETTINGS = [
    {},  # the checkpoint's own settings: 4 beams, max_length 24, bad word <pad>, forced EOS
    {"num_beams": 1, "max_new_tokens": 12},
    {"num_beams": 4, "max_new_tokens": 15, "length_penalty": 0.6, "early_stopping": True},
    {"num_beams": 4, "max_length": 20, "length_penalty": 2.0, "early_stopping": "never"},
    {"num_beams": 3, "num_return_sequences": 2, "max_new_tokens": 10},
    {"num_beams": 4, "min_length": 8, "renormalize_logits": True},
    {"num_beams": 1, "min_new_tokens": 3, "bad_words_ids": [[7], [3, 4]]},
    {"num_beams": 1, "max_new_tokens": 14, "repetition_penalty": 1.6},
    {"num_beams": 4, "max_new_tokens": 14, "repetition_penalty": 0.7, "no_repeat_ngram_size": 2},
    {"num_beams": 1, "max_new_tokens": 14, "no_repeat_ngram_size": 1, "bad_words_ids": [[3]]},
    {"num_beams": 3, "num_return_sequences": 3, "no_repeat_ngram_size": 3, "min_length": 6},
]


@pytest.fixture(scope="module")
def ours(marian_dir):
    return create_model(marian_dir)


@pytest.mark.parametrize(
    "settings", SETTINGS, ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()) or "checkpoint"
)
def test_same_token_ids_as_transformers(hf_marian, ours, settings):
    with torch.no_grad():
        expected = hf_marian.generate(SRC, attention_mask=(SRC != PAD).long(), **settings)
    got = ours.generate(SRC, **settings)
    assert got.tolist() == expected.tolist()


def test_parity_cases_exercise_early_eos(hf_marian, ours):
    """The checkpoint's EOS bias makes some hypotheses end before max_length."""
    out = ours.generate(SRC)
    ends = [(row == 0).nonzero()[0].item() if (row == 0).any() else None for row in out]
    assert any(e is not None and e < out.shape[1] - 1 for e in ends)


@pytest.mark.parametrize(
    "settings",
    [
        {"num_beams": 1},
        {"num_beams": 4},
        {"num_beams": 3, "length_penalty": 0.5, "num_return_sequences": 3},
    ],
)
def test_cached_equals_uncached(ours, settings):
    cached = ours.generate(SRC, max_new_tokens=16, **settings)
    uncached = ours.generate(SRC, max_new_tokens=16, use_cache=False, **settings)
    assert torch.equal(cached, uncached)


def test_sampling_cached_equals_uncached_and_is_seeded(ours):
    def sample(use_cache):
        torch.manual_seed(123)
        return ours.generate(
            SRC,
            do_sample=True,
            top_k=10,
            top_p=0.9,
            temperature=0.8,
            max_new_tokens=12,
            use_cache=use_cache,
            num_beams=1,
        )

    a, b = sample(True), sample(False)
    assert torch.equal(a, b)
    torch.manual_seed(7)
    greedy = ours.generate(SRC, num_beams=1, max_new_tokens=12)
    assert not torch.equal(a, greedy)  # sampling really samples


def test_kv_cache_logits_equal_full_forward(ours):
    memory = ours.encode(SRC)
    mask = SRC == PAD
    tgt = torch.tensor([[PAD, 3, 4, 5, 6, 7]] * 3)
    full = ours.decode(tgt, memory, mask)
    caches = ours.decoder.new_caches()
    steps = [ours.decode(tgt[:, :2], memory, mask, caches=caches)]
    for t in range(2, tgt.shape[1]):
        steps.append(ours.decode(tgt[:, t : t + 1], memory, mask, start_pos=t, caches=caches))
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)


class Scripted:
    """A fake decoder: row r prefers token 4 + r, and EOS (1) once it has ``r + 2`` tokens."""

    def __call__(self, tokens):
        n, t = tokens.shape
        logits = torch.zeros(n, 8)
        for r in range(n):
            logits[r, 1 if t >= r + 2 else 4 + r] = 5.0
        return logits

    def reorder(self, index):
        pass


def test_greedy_pads_finished_rows_and_stops_when_all_are_done():
    cfg = GenerationConfig(eos_token_id=1, pad_token_id=0, max_new_tokens=10)
    out = generate(Scripted(), torch.full((3, 1), 7), cfg)
    assert out.tolist() == [[7, 4, 1, 0, 0], [7, 5, 5, 1, 0], [7, 6, 6, 6, 1]]


def test_processors_match_transformers_warpers():
    from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

    scores = torch.randn(4, 50)
    tokens = torch.zeros(4, 3, dtype=torch.long)
    ours = _Processor(GenerationConfig(do_sample=True, top_k=7, top_p=1.0), 1, 20, beams=1)
    assert torch.equal(ours(tokens, scores), TopKLogitsWarper(7)(tokens, scores))
    ours = _Processor(GenerationConfig(do_sample=True, top_k=None, top_p=0.8), 1, 20, beams=1)
    assert torch.equal(ours(tokens, scores), TopPLogitsWarper(0.8)(tokens, scores))


def test_forced_eos_and_bad_words():
    cfg = GenerationConfig(forced_eos_token_id=2, eos_token_id=2, bad_words_ids=[[5], [1, 6], [2]])
    proc = _Processor(cfg, 1, max_length=6, beams=1)
    scores = torch.zeros(2, 8)
    tokens = torch.tensor([[0, 1], [0, 3]])
    out = proc(tokens, scores)
    assert out[:, 5].eq(-float("inf")).all()  # always banned
    assert out[0, 6] == -float("inf") and out[1, 6] == 0  # banned only after token 1
    assert out[:, 2].eq(0).all()  # a bad word equal to EOS is ignored, as in transformers
    forced = proc(torch.zeros(2, 5, dtype=torch.long), scores)  # cur_len == max_length - 1
    assert forced[:, 2].eq(0).all() and forced[:, :2].eq(-float("inf")).all()


def test_max_length_validation():
    cfg = GenerationConfig()
    assert resolve_max_length(cfg, 1, 64) == 21  # 20 new tokens by default, as transformers
    assert resolve_max_length(cfg, 1, 10) == 10  # ... capped by the positions
    with pytest.raises(ValueError, match="decoder positions"):
        resolve_max_length(cfg.update(max_new_tokens=100), 1, 64)
    with pytest.raises(ValueError, match="no room"):
        resolve_max_length(cfg.update(max_length=1), 1, 64)
    with pytest.raises(TypeError, match="unknown generation option"):
        cfg.update(beams=3)


def test_unsupported_checkpoint_option_warns():
    with pytest.warns(UserWarning, match="encoder_no_repeat_ngram_size"):
        GenerationConfig.from_dict({"encoder_no_repeat_ngram_size": 3, "num_beams": 2})


def test_repetition_options_load_from_a_checkpoint_without_warning(recwarn):
    cfg = GenerationConfig.from_dict(
        {"no_repeat_ngram_size": 3, "repetition_penalty": 1.2, "typical_p": None}
    )
    assert (cfg.no_repeat_ngram_size, cfg.repetition_penalty) == (3, 1.2)
    assert not [w for w in recwarn if issubclass(w.category, UserWarning)]
