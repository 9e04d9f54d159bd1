"""Repetition penalty, no-repeat n-grams, seeded sampling and decoder-only (CoCa-style)
prompts in attn_nlp's decoding loop.

* the processors against transformers' own ``LogitsProcessorList``, built by its
  ``_get_logits_processor``, on random scores and repetitive token histories;
* greedy decoding of a toy captioner (bigram table + a per-image bias) against a plain
  per-row Python loop written here;
* a random tiny GPT-2 driven from a one-token prompt (``[[start]]``, EOS, pad 0, as CoCa
  calls it) against transformers' ``generate``: greedy, beams, returned sequences,
  min / max new tokens, and seeded top-k / top-p / beam sampling against
  ``torch.manual_seed(seed)`` + transformers;
* ``seed``: the same seed gives the same ids whatever the global RNG does, and leaves it alone.
"""

from __future__ import annotations

import pytest
import torch
from attn_nlp.generation import GenerationConfig, _Processor, generate

V, START, EOS, PAD = 40, 38, 39, 0  # the GPT-2's vocabulary; pad 0 is an ordinary id
POSITIONS = 32


@pytest.fixture(scope="module")
def gpt2():
    """A random 2-layer GPT-2 whose EOS is likely enough that rows end at varied lengths
    and whose id 0 (the pad) is unlikely, so padding is visible in the outputs."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=V,
        n_positions=POSITIONS,
        n_embd=32,
        n_layer=2,
        n_head=4,
        bos_token_id=START,
        eos_token_id=EOS,
        tie_word_embeddings=False,
        initializer_range=0.3,
    )
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = GPT2LMHeadModel(config).eval()
        with torch.no_grad():
            hidden = model.transformer(torch.randint(1, START, (64, 10))).last_hidden_state
            mean = hidden.reshape(-1, 32).mean(0)
            direction = mean / mean.norm() ** 2  # logit 1 on the average hidden state
            model.lm_head.weight[EOS] = 2.5 * direction
            model.lm_head.weight[PAD] = -3.0 * direction
    return model


class HFDecoder:
    """The decoding-loop view of a transformers causal LM (whole prefix every step)."""

    def __init__(self, model):
        self.model = model

    def __call__(self, tokens):
        return self.model(tokens, use_cache=False).logits[:, -1]

    def reorder(self, index):
        pass


# -- the processors, score for score -------------------------------------------------------


def hf_processors(model, settings, prompt_len, rows):
    """transformers' processor list for ``settings``, built as its ``generate`` builds it."""
    from transformers import GenerationConfig as HFGenerationConfig
    from transformers import LogitsProcessorList

    hf_config = HFGenerationConfig(**settings)
    model._prepare_special_tokens(hf_config, True, device="cpu")
    return model._get_logits_processor(
        hf_config,
        input_ids_seq_length=prompt_len,
        encoder_input_ids=None,
        prefix_allowed_tokens_fn=None,
        logits_processor=LogitsProcessorList(),
        device="cpu",
        model_kwargs={"attention_mask": torch.ones(rows, prompt_len, dtype=torch.long)},
    )


PROCESSOR_CASES = [
    {"repetition_penalty": 1.7},
    {"repetition_penalty": 0.6},
    {"no_repeat_ngram_size": 1},
    {"no_repeat_ngram_size": 2},
    {"no_repeat_ngram_size": 3},
    {"repetition_penalty": 1.3, "no_repeat_ngram_size": 2, "bad_words_ids": [[4], [2, 5]],
     "min_length": 12, "eos_token_id": 3},
    {"repetition_penalty": 1.3, "no_repeat_ngram_size": 3, "min_new_tokens": 7,
     "eos_token_id": [3, 5], "forced_eos_token_id": 3, "max_length": 10},
    {"do_sample": True, "temperature": 0.7, "top_k": 5, "top_p": 0.8, "repetition_penalty": 1.2,
     "no_repeat_ngram_size": 3, "eos_token_id": 3, "renormalize_logits": True},
    {"do_sample": True, "num_beams": 3, "top_k": 2, "top_p": 0.5, "repetition_penalty": 0.9,
     "no_repeat_ngram_size": 2, "eos_token_id": [3, 5], "min_length": 11},
]  # fmt: skip


@pytest.mark.parametrize(
    "settings", PROCESSOR_CASES, ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items())
)
def test_processors_give_transformers_scores(gpt2, settings):
    gen = torch.Generator().manual_seed(len(settings))
    N, T, prompt_len = 6, 9, 3
    tokens = torch.randint(0, 6, (N, T), generator=gen)  # few ids: n-grams repeat
    tokens[0, 0] = V + 3  # an id past the output vocabulary (a larger embedding table)
    scores = 3 * torch.randn(N, 12, generator=gen)
    beams = settings.get("num_beams", 1)
    if beams > 1:
        scores = scores.log_softmax(dim=-1)  # beam search processes log-probabilities
    max_length = settings.get("max_length", 20)
    expected = hf_processors(gpt2, {**settings, "max_length": max_length}, prompt_len, N)(
        tokens, scores.clone()
    )
    config = GenerationConfig(**{**settings, "max_length": max_length})
    got = _Processor(config, prompt_len, max_length, beams=beams)(tokens, scores)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    if settings.get("forced_eos_token_id") is not None:
        assert got[:, 3].eq(0).all()  # cur_len == max_length - 1: only EOS is left


@pytest.mark.parametrize("name", ["repetition_penalty", "no_repeat_ngram_size"])
def test_each_new_processor_changes_scores_only_where_it_should(name):
    tokens = torch.tensor([[1, 2, 3, 1, 2], [4, 4, 4, 4, 4]])
    scores = torch.tensor([[-1.0, 2.0, -3.0, 4.0, 5.0, 6.0], [1.0, -2.0, 3.0, -4.0, 5.0, -6.0]])
    value = 2.0 if name == "repetition_penalty" else 2
    got = _Processor(GenerationConfig(**{name: value}), 1, 20, beams=1)(tokens, scores)
    if name == "repetition_penalty":  # seen ids {1, 2, 3} and {4}: once each
        expected = [[-1.0, 1.0, -6.0, 2.0, 5.0, 6.0], [1.0, -2.0, 3.0, -4.0, 2.5, -6.0]]
    else:  # row 0 ends in 2, which was followed by 3; row 1 ends in 4, followed by 4
        inf = float("inf")
        expected = [[-1.0, 2.0, -3.0, -inf, 5.0, 6.0], [1.0, -2.0, 3.0, -4.0, -inf, -6.0]]
    assert got.tolist() == expected


def test_ngram_longer_than_the_history_bans_nothing():
    tokens = torch.tensor([[1, 1, 1]])
    scores = torch.randn(1, 4)
    got = _Processor(GenerationConfig(no_repeat_ngram_size=4), 1, 20, beams=1)(tokens, scores)
    assert torch.equal(got, scores)


def test_bad_values_are_refused():
    prompt = torch.full((1, 1), START)
    for bad, match in [
        ({"repetition_penalty": 0.0}, "repetition_penalty must be a float > 0"),
        ({"no_repeat_ngram_size": -1}, "no_repeat_ngram_size must be an int >= 0"),
        ({"no_repeat_ngram_size": 2.0}, "no_repeat_ngram_size must be an int >= 0"),
        ({"seed": "7"}, "seed must be an int or None"),
    ]:
        with pytest.raises(ValueError, match=match):
            generate(ToyCaptioner(torch.zeros(1, V)), prompt, GenerationConfig(**bad))


# -- a toy captioner against a plain loop ------------------------------------------------


class ToyCaptioner:
    """Next-token logits = a fixed bigram table row of the last token + the row's image
    bias ``(N, V)``; ``reorder`` moves the biases with the beams."""

    def __init__(self, images, rows_per_image=1, scale=1.0, seed=0):
        gen = torch.Generator().manual_seed(seed)
        self.table = scale * torch.randn(V, V, generator=gen)
        self.table[:, EOS] += 0.5 * scale  # captions end, at varied lengths
        self.bias = images.repeat_interleave(rows_per_image, dim=0)

    def __call__(self, tokens):
        return self.table[tokens[:, -1]] + self.bias

    def reorder(self, index):
        self.bias = self.bias[index]


def reference_greedy(toy, images, max_new, min_new, penalty, ngram):
    """transformers' greedy semantics, one row and one token at a time."""
    rows = []
    for image in images:
        seq = [START]
        for step in range(max_new):
            logits = toy.table[seq[-1]] + image  # (V,) float32, as the vectorised loop
            for tok in set(seq):
                logits[tok] = logits[tok] * penalty if logits[tok] < 0 else logits[tok] / penalty
            if ngram and len(seq) >= ngram:
                suffix = seq[len(seq) - ngram + 1 :]
                for i in range(len(seq) - ngram + 1):
                    if seq[i : i + ngram - 1] == suffix:
                        logits[seq[i + ngram - 1]] = -float("inf")
            if step < min_new:
                logits[EOS] = -float("inf")
            seq.append(int(logits.argmax()))
            if seq[-1] == EOS:
                break
        rows.append(seq)
    width = max(map(len, rows))
    return [seq + [PAD] * (width - len(seq)) for seq in rows]


@pytest.mark.parametrize(
    "penalty,ngram,min_new", [(1.0, 0, 0), (1.5, 0, 0), (1.0, 2, 0), (0.8, 1, 0), (1.4, 3, 4)]
)
def test_greedy_equals_a_plain_loop(penalty, ngram, min_new):
    images = torch.randn(4, V, generator=torch.Generator().manual_seed(1))
    toy = ToyCaptioner(images)
    config = GenerationConfig(
        max_new_tokens=14,
        min_new_tokens=min_new,
        repetition_penalty=penalty,
        no_repeat_ngram_size=ngram,
        eos_token_id=EOS,
        pad_token_id=PAD,
        top_k=None,
    )
    prompt = torch.full((4, 1), START)
    got = generate(toy, prompt, config, max_positions=POSITIONS)
    expected = reference_greedy(toy, images, 14, min_new, penalty, ngram)
    assert got.tolist() == expected
    if (penalty, ngram) != (1.0, 0):  # the option changes what is decoded
        assert expected != reference_greedy(toy, images, 14, min_new, 1.0, 0)
    else:  # the toy both repeats itself and ends captions early
        assert any(len(set(r)) < len(r) - r.count(PAD) for r in expected)
        assert any(r[-1] == PAD for r in expected)


# -- a one-token prompt (CoCa's shape) against transformers' generate ---------------------

PROMPT = torch.tensor([[START], [7], [21]])  # one start token per row

GPT2_SETTINGS = [
    {"max_new_tokens": 12},
    {"max_new_tokens": 12, "min_new_tokens": 4, "repetition_penalty": 1.3},
    {"max_new_tokens": 14, "no_repeat_ngram_size": 2, "repetition_penalty": 0.9},
    {"num_beams": 4, "max_new_tokens": 12, "num_return_sequences": 2, "repetition_penalty": 1.2,
     "no_repeat_ngram_size": 2},
    {"num_beams": 3, "max_new_tokens": 10, "min_new_tokens": 3, "length_penalty": 0.5,
     "early_stopping": True, "num_return_sequences": 3},
    {"num_beams": 2, "max_length": 9, "no_repeat_ngram_size": 1},
    {"do_sample": True, "top_k": 8, "temperature": 0.9, "max_new_tokens": 12,
     "num_return_sequences": 2, "repetition_penalty": 1.2, "seed": 3},
    {"do_sample": True, "top_k": 0, "top_p": 0.7, "max_new_tokens": 12, "min_new_tokens": 2,
     "no_repeat_ngram_size": 2, "seed": 4},
    {"do_sample": True, "num_beams": 3, "top_k": 10, "max_new_tokens": 10,
     "num_return_sequences": 2, "repetition_penalty": 1.1, "seed": 5},
]  # fmt: skip


def eos_then_pad(rows):
    """transformers' beam search pads with EOS when pad_token_id is 0 (``pad or eos``): the
    ids after each row's first EOS set to PAD, which is what ours writes."""
    out = []
    for row in rows.tolist():
        end = row.index(EOS) + 1 if EOS in row else len(row)
        out.append(row[:end] + [PAD] * (len(row) - end))
    return out


@pytest.mark.parametrize(
    "settings", GPT2_SETTINGS, ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items())
)
def test_one_token_prompt_same_ids_as_transformers(gpt2, settings):
    special = {"eos_token_id": EOS, "pad_token_id": PAD, "bos_token_id": START}
    hf_settings = {k: v for k, v in settings.items() if k != "seed"}
    with torch.random.fork_rng():
        torch.manual_seed(settings.get("seed", 0))
        expected = gpt2.generate(
            PROMPT, attention_mask=torch.ones_like(PROMPT), use_cache=False,
            **special, **hf_settings,
        )  # fmt: skip
    config = GenerationConfig(**special, **settings)
    torch.manual_seed(1234)  # a seeded run ignores the global RNG
    got = generate(HFDecoder(gpt2), PROMPT, config, max_positions=POSITIONS)
    assert got.tolist() == eos_then_pad(expected)


def test_beam_search_pads_with_pad_id_zero_and_ends_early(gpt2):
    config = GenerationConfig(
        num_beams=4, num_return_sequences=2, max_new_tokens=12, eos_token_id=EOS, pad_token_id=PAD
    )
    got = generate(HFDecoder(gpt2), PROMPT, config, max_positions=POSITIONS)
    assert got.shape[0] == 6 and got.shape[1] <= 13
    padded = 0
    for row in got.tolist():
        end = row.index(EOS) + 1 if EOS in row else len(row)
        assert row[end:] == [PAD] * (len(row) - end) and PAD not in row[:end]
        padded += len(row) > end
    assert padded  # some captions are shorter than others


def test_max_positions_bounds_a_one_token_prompt(gpt2):
    config = GenerationConfig(max_new_tokens=POSITIONS + 1, eos_token_id=EOS)
    with pytest.raises(ValueError, match="decoder positions"):
        generate(HFDecoder(gpt2), PROMPT, config, max_positions=POSITIONS)
    default = GenerationConfig(eos_token_id=EOS, min_new_tokens=30)  # 20 new, capped at 32
    assert generate(HFDecoder(gpt2), PROMPT, default, max_positions=POSITIONS).shape[1] == 21


# -- seeded sampling -------------------------------------------------------------------


def sample(settings, seed):
    images = torch.zeros(2, V)
    beams = settings.get("num_beams", 1)
    rows = beams if beams > 1 else 2  # num_return_sequences
    toy = ToyCaptioner(images, rows_per_image=rows, scale=0.05)  # flat: every draw counts
    options = {"top_k": None, "num_return_sequences": 2, **settings}
    config = GenerationConfig(
        do_sample=True, max_new_tokens=16, eos_token_id=EOS, seed=seed, **options
    )
    return generate(toy, torch.full((2, 1), START), config, max_positions=POSITIONS)


@pytest.mark.parametrize(
    "settings",
    [
        {},
        {"top_k": 12, "top_p": 0.9, "temperature": 1.3},
        {"num_beams": 3, "repetition_penalty": 1.1},
    ],
    ids=["sample", "top-k-top-p", "beam-sample"],
)
def test_same_seed_same_ids_whatever_the_global_rng(settings):
    torch.manual_seed(1)
    state = torch.get_rng_state()
    a = sample(settings, seed=11)
    assert torch.equal(torch.get_rng_state(), state)  # the global RNG is left alone
    torch.manual_seed(2)
    torch.rand(100)
    b = sample(settings, seed=11)
    assert torch.equal(a, b)
    c = sample(settings, seed=12)
    assert a.shape != c.shape or not torch.equal(a, c)


def test_without_a_seed_sampling_follows_the_global_rng():
    torch.manual_seed(5)
    a = sample({}, seed=None)
    torch.manual_seed(5)
    b = sample({}, seed=None)
    c = sample({}, seed=None)  # the global RNG moved on
    assert torch.equal(a, b) and (a.shape != c.shape or not torch.equal(a, c))
