"""attn_nlp.evaluate_translation: sacrebleu BLEU / chrF, exact match (spaces ignored)."""

from __future__ import annotations

import pytest
from attn_nlp import evaluate_translation


class _Echo:
    """A translator stand-in that returns canned hypotheses and records its arguments."""

    def __init__(self, hyps: list[str]) -> None:
        self.hyps, self.calls = hyps, []

    def translate(self, sources: list[str], beams: int, batch_size: int) -> list[str]:
        self.calls.append((sources, beams, batch_size))
        return self.hyps


def test_scores_and_exact_match():
    sacrebleu = pytest.importorskip("sacrebleu")
    pairs = [("one", "三 百 零 五"), ("two", "二")]
    t = _Echo(["三百零五", "一"])
    m = evaluate_translation(t, pairs, beams=2, batch_size=8)
    assert t.calls == [(["one", "two"], 2, 8)]
    assert m["exact"] == 0.5 and m["example"] == "三百零五"
    refs = [[r for _, r in pairs]]
    assert m["bleu"] == sacrebleu.corpus_bleu(t.hyps, refs, tokenize="zh").score  # Chinese refs
    assert m["chrf"] == sacrebleu.corpus_chrf(t.hyps, refs).score
    perfect = evaluate_translation(
        _Echo(["the cat sat", "a dog"]), [("x", "the cat sat"), ("y", "a dog")]
    )
    assert perfect["exact"] == 1.0 and perfect["chrf"] == 100.0
