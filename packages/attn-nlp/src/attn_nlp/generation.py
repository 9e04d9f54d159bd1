"""Autoregressive decoding: greedy, sampling and beam search, with or without a KV cache.

Shape legend: ``B`` batch, ``K`` beams, ``N`` decoded rows (``B`` or ``B * K``), ``T`` tokens
so far, ``V`` vocabulary.

The loop knows nothing about the model. It talks to a :class:`Decoder`: called with all
tokens so far ``(N, T)`` it returns the next-token logits ``(N, V)`` (a cached decoder
feeds only the new tokens to the network), and ``reorder(index)`` follows the beams.

The search reproduces ``transformers``' ``generate`` step for step -- the same logits
processors in the same order (repetition penalty, no-repeat n-grams, bad words, min
length, min new tokens, forced EOS, temperature, top-k, top-p, renormalisation) and the
same vectorised beam search (``2 * K`` candidates per step, length penalty
``score / generated_len ** length_penalty``, ``early_stopping`` True / False / ``"never"``)
-- so given the same logits it returns the same token ids. The prompt counts as history
for the repetition penalty and the n-gram ban, as in transformers (decoder-only models:
the prompt; encoder-decoder: the decoder start token).

Two deliberate differences from transformers: ``seed`` (ours) draws
the samples from a private ``torch.Generator`` (same seed, same tokens, whatever the
global RNG did; on CPU the same draws as ``torch.manual_seed(seed)`` before transformers'
``generate``), and beam search pads finished rows with ``pad_token_id`` even when it is
0 (transformers' ``pad_token_id or eos_token_id`` pads with EOS then).

The same loop serves an encoder-decoder (prompt = the decoder start token, the encoder
output held by the :class:`Decoder`) and a decoder-only model such as CoCa's captioner
(prompt = ``[[start]]`` per image, the image tokens held by the :class:`Decoder`).
"""

from __future__ import annotations

import dataclasses
import json
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.nn.functional as F

__all__ = ["Decoder", "GenerationConfig", "generate"]

# transformers options we do not implement; a non-default value in a checkpoint warns.
_UNSUPPORTED_DEFAULTS = {
    "encoder_no_repeat_ngram_size": 0,
    "encoder_repetition_penalty": 1.0,
    "num_beam_groups": 1,
    "diversity_penalty": 0.0,
    "forced_bos_token_id": None,
    "suppress_tokens": None,
    "begin_suppress_tokens": None,
    "exponential_decay_length_penalty": None,
    "typical_p": 1.0,
    "epsilon_cutoff": 0.0,
    "eta_cutoff": 0.0,
    "min_p": None,
}


@dataclass
class GenerationConfig:
    """Decoding settings; names and defaults follow ``transformers.GenerationConfig``."""

    max_length: int | None = None  # total length incl. the prompt; None = 20 new tokens
    max_new_tokens: int | None = None  # overrides max_length
    min_length: int = 0  # EOS is banned while len(tokens) < min_length
    min_new_tokens: int | None = None  # EOS is banned for this many new tokens
    num_beams: int = 1
    num_return_sequences: int = 1
    length_penalty: float = 1.0  # beam score = sum log p / generated_len ** length_penalty
    early_stopping: bool | str = False  # True, False or "never"
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int | None = 50  # only with do_sample; 0 / None = off
    top_p: float = 1.0  # only with do_sample
    repetition_penalty: float = 1.0  # seen tokens: score < 0 -> score * p, else score / p
    no_repeat_ngram_size: int = 0  # > 0: no n-gram of this size occurs twice
    bad_words_ids: list[list[int]] | None = None  # token sequences never generated
    forced_eos_token_id: int | list[int] | None = None  # forced as the last token
    renormalize_logits: bool = False  # log-softmax after all processors
    eos_token_id: int | list[int] | None = None
    pad_token_id: int | None = None  # fills finished rows; None = first EOS
    decoder_start_token_id: int | None = None  # first decoder token (encoder-decoder)
    bos_token_id: int | None = None
    use_cache: bool = True
    seed: int | None = None  # ours: samples from a private generator; None = torch's global RNG

    def update(self, **overrides: Any) -> GenerationConfig:
        """A copy with ``overrides`` applied; unknown names raise ``TypeError``."""
        names = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(overrides) - names)
        if unknown:
            raise TypeError(f"unknown generation option(s) {unknown}; known: {sorted(names)}")
        return dataclasses.replace(self, **overrides)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GenerationConfig:
        """Known keys of a ``generation_config.json`` (or old-style ``config.json``)."""
        for key, default in _UNSUPPORTED_DEFAULTS.items():
            if data.get(key) is not None and data[key] != default:
                warnings.warn(
                    f"generation option {key}={data[key]!r} is not supported and is ignored; "
                    "results can differ from transformers",
                    stacklevel=2,
                )
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names and v is not None})

    @classmethod
    def from_pretrained(cls, directory: str | Path) -> GenerationConfig:
        """Read ``generation_config.json``, else the generation keys of ``config.json``.

        That is what ``transformers`` does: old opus-mt checkpoints keep ``num_beams``,
        ``max_length`` and ``bad_words_ids`` in ``config.json``.
        """
        directory = Path(directory)
        for name in ("generation_config.json", "config.json"):
            path = directory / name
            if path.is_file():
                return cls.from_dict(json.loads(path.read_text(encoding="utf-8")))
        return cls()

    @property
    def eos_ids(self) -> list[int]:
        eos = self.eos_token_id
        return [] if eos is None else [eos] if isinstance(eos, int) else list(eos)


class Decoder(Protocol):
    """What the decoding loop needs from a model."""

    def __call__(self, tokens: torch.Tensor) -> torch.Tensor:
        """All tokens so far ``(N, T)`` -> next-token logits ``(N, V)``."""
        ...

    def reorder(self, index: torch.Tensor) -> None:
        """Row ``i`` continues from row ``index[i]`` (beam search)."""
        ...


def resolve_max_length(config: GenerationConfig, prompt_len: int, max_positions: int | None) -> int:
    """Final ``max_length`` as in transformers (``max_new_tokens`` wins; default 20 new)."""
    if config.max_new_tokens is not None:
        max_length = prompt_len + config.max_new_tokens
    elif config.max_length is not None:
        max_length = config.max_length
    else:
        max_length = prompt_len + 20
        if max_positions is not None:
            max_length = min(max_length, max_positions)
    if max_length <= prompt_len:
        raise ValueError(
            f"max_length={max_length} leaves no room to generate after a prompt of {prompt_len}"
        )
    # the last token is never fed back, so positions 0 .. max_length - 2 are used
    if max_positions is not None and max_length - 1 > max_positions:
        raise ValueError(
            f"max_length={max_length} needs {max_length - 1} decoder positions, but the model "
            f"has {max_positions}; lower max_length / max_new_tokens"
        )
    return max_length


class _Processor:
    """transformers' logits processors, in transformers' order, as one callable.

    Called with the tokens so far ``(N, T)`` (prompt included) and the scores ``(N, V)``
    (logits; log-probabilities in beam search), it returns the processed scores ``(N, V)``.
    """

    def __init__(self, config: GenerationConfig, prompt_len: int, max_length: int, beams: int):
        penalty, ngram = config.repetition_penalty, config.no_repeat_ngram_size
        if not penalty > 0:
            raise ValueError(f"repetition_penalty must be a float > 0, got {penalty!r}")
        if isinstance(ngram, bool) or not isinstance(ngram, int) or ngram < 0:
            raise ValueError(f"no_repeat_ngram_size must be an int >= 0 (0 = off), got {ngram!r}")
        self.c = config
        self.eos = config.eos_ids
        self.prompt_len = prompt_len
        self.max_length = max_length
        bad = [list(seq) for seq in (config.bad_words_ids or [])]
        self.bad_words = [seq for seq in bad if not (len(seq) == 1 and seq[0] in self.eos)]
        # in beam search keep one token more than the EOS count (as transformers)
        self.min_keep = len(self.eos) + 1 if beams > 1 else 1
        forced = config.forced_eos_token_id
        self.forced_eos = [forced] if isinstance(forced, int) else forced

    def __call__(self, tokens: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        c, cur_len = self.c, tokens.shape[1]
        if c.repetition_penalty != 1.0:
            scores = self._repetition_penalty(tokens, scores)
        if c.no_repeat_ngram_size:
            scores = self._no_repeat_ngram(tokens, scores)
        if self.bad_words:
            scores = scores + self._bad_words_bias(tokens, scores)
        if self.eos and cur_len < c.min_length:
            scores = scores.clone()
            scores[:, self.eos] = -float("inf")
        if self.eos and c.min_new_tokens and cur_len - self.prompt_len < c.min_new_tokens:
            scores = scores.clone()
            scores[:, self.eos] = -float("inf")
        if self.forced_eos and cur_len == self.max_length - 1:
            scores = torch.full_like(scores, -float("inf"))
            scores[:, self.forced_eos] = 0.0
        if c.do_sample:
            scores = self._warp(scores)
        if c.renormalize_logits:
            scores = scores.log_softmax(dim=-1)
        return scores

    def _repetition_penalty(self, tokens: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        """Every token id seen so far, once: ``score * p`` if negative, else ``score / p``."""
        p, V = self.c.repetition_penalty, scores.shape[-1]
        # ids outside the output vocabulary (a larger embedding table) go to a spare column
        seen = tokens.new_zeros(tokens.shape[0], V + 1, dtype=torch.bool)
        seen.scatter_(1, tokens.clamp(max=V), True)
        penalised = torch.where(scores < 0, scores * p, scores / p)
        return torch.where(seen[:, :V], penalised, scores)

    def _no_repeat_ngram(self, tokens: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        """Ban every token that would complete an n-gram already in the row (``n`` =
        ``no_repeat_ngram_size``): one that followed an earlier occurrence of the row's
        last ``n - 1`` tokens."""
        n, (N, T), V = self.c.no_repeat_ngram_size, tokens.shape, scores.shape[-1]
        if T < n:  # no complete n-gram yet
            return scores
        ngrams = tokens.unfold(1, n, 1)  # (N, T - n + 1, n): every n-gram so far
        suffix = tokens[:, T - n + 1 :]  # (N, n - 1): what the next token would extend
        hit = (ngrams[:, :, :-1] == suffix[:, None, :]).all(dim=-1)  # (N, T - n + 1)
        # the last token of each matching n-gram is banned; misses go to a spare column
        banned = tokens.new_zeros(N, V + 1, dtype=torch.bool)
        banned.scatter_(1, torch.where(hit, ngrams[:, :, -1].clamp(max=V), V), True)
        return scores.masked_fill(banned[:, :V], -float("inf"))

    def _bad_words_bias(self, tokens: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        bias = torch.zeros_like(scores)
        for seq in self.bad_words:
            if max(seq) >= scores.shape[-1]:
                raise ValueError(f"bad_words_ids {seq} are outside the vocabulary")
            prefix = seq[:-1]
            if not prefix:
                bias[:, seq[-1]] = -float("inf")
            elif len(prefix) <= tokens.shape[1]:
                hit = (tokens[:, -len(prefix) :] == tokens.new_tensor(prefix)).all(-1)
                bias[hit, seq[-1]] = -float("inf")
        return bias

    def _warp(self, scores: torch.Tensor) -> torch.Tensor:
        c = self.c
        if c.temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {c.temperature}")
        if c.temperature != 1.0:
            scores = scores / c.temperature
        if c.top_k:
            k = min(max(c.top_k, self.min_keep), scores.shape[-1])
            kth = torch.topk(scores, k)[0][..., -1, None]
            scores = scores.masked_fill(scores < kth, -float("inf"))
        if c.top_p < 1.0:
            sorted_scores, order = torch.sort(scores, descending=False)
            cum = sorted_scores.softmax(dim=-1).cumsum(dim=-1)
            remove = cum <= (1 - c.top_p)
            remove[..., -self.min_keep :] = False
            scores = scores.masked_fill(remove.scatter(1, order, remove), -float("inf"))
        return scores


@torch.no_grad()
def generate(
    decoder: Decoder,
    prompt: torch.Tensor,
    config: GenerationConfig,
    *,
    max_positions: int | None = None,
) -> torch.Tensor:
    """Decode from ``prompt`` ``(B, T0)``; returns ``(B * num_return_sequences, L)`` ids.

    ``decoder`` must already hold ``num_beams`` (beam search) or ``num_return_sequences``
    (greedy / sampling) rows per prompt, beams of one prompt adjacent. The result starts
    with the prompt; rows that finish early are padded with ``pad_token_id`` (default: the
    first EOS). ``max_positions`` (the decoder's position table) bounds ``max_length``.
    With ``do_sample`` and ``config.seed`` set, the draws come from a generator of their
    own, so the same seed gives the same ids whatever the global RNG state.

    A decoder-only captioner calls it with ``prompt = [[start]] * B``, e.g.
    ``GenerationConfig(bos_token_id=sot, eos_token_id=eot, pad_token_id=0, ...)``.
    """
    if prompt.ndim != 2 or prompt.dtype != torch.long:
        raise ValueError(f"prompt must be a (B, T) long tensor, got {tuple(prompt.shape)}")
    if config.num_beams < 1 or config.num_return_sequences < 1:
        raise ValueError("num_beams and num_return_sequences must be >= 1")
    if config.num_return_sequences > config.num_beams > 1:
        raise ValueError(
            f"num_return_sequences ({config.num_return_sequences}) must be <= num_beams "
            f"({config.num_beams})"
        )
    seed = config.seed
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise ValueError(f"seed must be an int or None, got {seed!r}")
    if config.pad_token_id is None and config.eos_ids:
        config = config.update(pad_token_id=config.eos_ids[0])
    max_length = resolve_max_length(config, prompt.shape[1], max_positions)
    draw = _Sampler(seed)
    if config.num_beams > 1:
        return _beam_search(decoder, prompt, config, max_length, draw)
    rows = prompt.repeat_interleave(config.num_return_sequences, dim=0)
    return _greedy_or_sample(decoder, rows, config, max_length, draw)


class _Sampler:
    """``torch.multinomial`` over the global RNG (``seed=None``) or a private generator,
    made on the device of the first probabilities it draws from."""

    def __init__(self, seed: int | None) -> None:
        self.seed = seed
        self.generator: torch.Generator | None = None

    def __call__(self, probs: torch.Tensor, num_samples: int) -> torch.Tensor:
        """``probs`` ``(N, V)`` -> ``num_samples`` ids per row ``(N, num_samples)``."""
        if self.seed is not None and self.generator is None:
            self.generator = torch.Generator(device=probs.device).manual_seed(self.seed)
        return torch.multinomial(probs, num_samples=num_samples, generator=self.generator)


def _greedy_or_sample(
    decoder: Decoder,
    tokens: torch.Tensor,
    config: GenerationConfig,
    max_length: int,
    draw: _Sampler,
) -> torch.Tensor:
    process = _Processor(config, tokens.shape[1], max_length, beams=1)
    eos = tokens.new_tensor(config.eos_ids)
    unfinished = torch.ones(tokens.shape[0], dtype=torch.bool, device=tokens.device)
    while True:
        scores = process(tokens, decoder(tokens).float())  # (N, V)
        if config.do_sample:
            next_tokens = draw(scores.softmax(dim=-1), 1).squeeze(1)
        else:
            next_tokens = scores.argmax(dim=-1)
        if len(eos):
            next_tokens = torch.where(unfinished, next_tokens, config.pad_token_id)
            unfinished &= ~torch.isin(next_tokens, eos)
        tokens = torch.cat((tokens, next_tokens[:, None]), dim=1)
        if tokens.shape[1] >= max_length or not unfinished.any():
            return tokens


def _gather(t: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``t[b, index[b, j], ...]`` for ``t`` ``(B, K, ...)`` and ``index`` ``(B, J)``."""
    while index.ndim < t.ndim:
        index = index.unsqueeze(-1)
    return torch.take_along_dim(t, index, dim=1)


def _beam_search(
    decoder: Decoder,
    prompt: torch.Tensor,
    config: GenerationConfig,
    max_length: int,
    draw: _Sampler,
) -> torch.Tensor:
    """transformers' vectorised beam search (``GenerationMixin._beam_search``)."""
    K, lp = config.num_beams, config.length_penalty
    stop_when_full = config.early_stopping is True
    B, prompt_len = prompt.shape
    device = prompt.device
    eos = prompt.new_tensor(config.eos_ids)
    keep = max(2, 1 + len(eos)) * K  # candidates per prompt: enough to keep K alive
    top_k_mask = torch.arange(keep, device=device) < K  # only these may become finished
    process = _Processor(config, prompt_len, max_length, beams=K)
    # what rows hold after their EOS (transformers' `pad or eos` would pad id 0 with EOS)
    fill = config.pad_token_id if len(eos) else -1

    # running hypotheses (still extendable) and finished ones, K of each per prompt
    running = torch.full((B, K, max_length), fill, dtype=torch.long, device=device)
    running[:, :, :prompt_len] = prompt[:, None, :]
    running_scores = torch.zeros(B, K, device=device)
    running_scores[:, 1:] = -1e9  # start from one beam so the K beams differ
    finished = running.clone()
    finished_scores = torch.full((B, K), -1e9, device=device)
    finished_len = torch.zeros(B, K, dtype=torch.long, device=device)  # generated tokens
    is_finished = torch.zeros(B, K, dtype=torch.bool, device=device)
    can_improve = torch.ones(B, 1, dtype=torch.bool, device=device)
    batch_offset = torch.arange(B, device=device)[:, None] * K

    cur_len = prompt_len
    while True:
        flat = running[:, :, :cur_len].reshape(B * K, cur_len)
        log_probs = F.log_softmax(decoder(flat).float(), dim=-1)
        log_probs = process(flat, log_probs)
        V = log_probs.shape[-1]
        total = (log_probs.view(B, K, V) + running_scores[:, :, None]).view(B, K * V)

        # a. the best `keep` continuations over all beams of each prompt
        if config.do_sample:
            idx = draw(F.softmax(total, dim=-1), keep)
            cand_scores = torch.gather(total, 1, idx)
            cand_scores, order = cand_scores.sort(dim=-1, descending=True)
            idx = idx.gather(-1, order)
        else:
            cand_scores, idx = torch.topk(total, k=keep)
        cand_beam, cand_token = idx // V, idx % V  # (B, keep)
        cand = _gather(running, cand_beam)
        cand[:, :, cur_len] = cand_token
        done = torch.isin(cand_token, eos) | (cur_len + 1 >= max_length)  # (B, keep)

        # b. the K best unfinished candidates keep running
        alive_scores = cand_scores + done.to(torch.float32) * -1.0e9
        pick = torch.topk(alive_scores, k=K)[1]
        running = _gather(cand, pick)
        running_scores = _gather(alive_scores, pick)
        source_rows = (_gather(cand_beam, pick) + batch_offset).view(-1)

        # c. finished candidates (among the top K) compete with the finished so far
        just_done = done & top_k_mask[None, :]
        gen_len = cur_len + 1 - prompt_len
        done_scores = cand_scores / (gen_len**lp)
        full = is_finished.all(dim=-1, keepdim=True) & stop_when_full
        done_scores = done_scores + full.to(torch.float32) * -1.0e9
        done_scores = done_scores + (~can_improve).to(torch.float32) * -1.0e9
        done_scores = done_scores + (~just_done) * -1.0e9
        merged_scores = torch.cat((finished_scores, done_scores), dim=1)
        best = torch.topk(merged_scores, k=K)[1]
        finished = _gather(torch.cat((finished, cand), dim=1), best)
        finished_scores = _gather(merged_scores, best)
        finished_len = _gather(
            torch.cat((finished_len, torch.full_like(cand_token, gen_len)), dim=1), best
        )
        is_finished = _gather(torch.cat((is_finished, just_done), dim=1), best)

        decoder.reorder(source_rows)
        cur_len += 1

        # d. stop when no running beam can beat the worst finished one (per prompt)
        if config.early_stopping == "never" and lp > 0.0:
            best_len = max_length - prompt_len
        else:
            best_len = cur_len - prompt_len
        best_running = running_scores[:, :1] / (best_len**lp)
        worst_done = torch.where(is_finished, finished_scores.min(dim=1, keepdim=True)[0], -1.0e9)
        can_improve = can_improve & (best_running > worst_done).any(dim=-1, keepdim=True)
        open_beams = not (bool(is_finished.all()) and stop_when_full)
        if not (bool(can_improve.any()) and open_beams and not bool(done.all())):
            break

    n = config.num_return_sequences
    out_len = prompt_len + int(finished_len[:, :n].max())
    return finished[:, :n, :out_len].reshape(B * n, out_len)
