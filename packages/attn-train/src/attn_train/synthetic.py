"""Generated toy tasks for the NLP recipes (deterministic: same seed, same data).

* translation: English number words or dates -> Chinese (:func:`write_translation_corpus`);
  a fixed 2% of all sources (by hash) is reserved for the dev set.
* sentiment: short reviews whose clauses can be negated (:func:`write_reviews`).
* language modelling: nursery-rhyme lines from a small grammar (:func:`rhymes`).

The captioned-shapes images (the CLIP / ViT recipes' data, on which the bundled
``demo-shapes`` CLIP is trained) are :mod:`attn_train.shapes`.
"""

from __future__ import annotations

import csv
import random
import zlib
from pathlib import Path

__all__ = [
    "chinese_number",
    "english_number",
    "make_pair",
    "make_review",
    "rhymes",
    "write_reviews",
    "write_translation_corpus",
]

# -- translation: numbers and dates ----------------------------------------------------

ONES = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen "
    "fourteen fifteen sixteen seventeen eighteen nineteen"
).split()
TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()
ZH_DIGITS = "零一二三四五六七八九"
MONTHS = (
    "January February March April May June July August September October November December"
).split()


def english_number(n: int) -> str:
    """0 <= n < 1e6 in British English words: 'three thousand four hundred and five'."""

    def below_100(k: int) -> str:
        return ONES[k] if k < 20 else TENS[k // 10] + (f"-{ONES[k % 10]}" if k % 10 else "")

    def below_1000(k: int) -> str:
        hundreds, rest = divmod(k, 100)
        if not hundreds:
            return below_100(rest)
        return f"{ONES[hundreds]} hundred" + (f" and {below_100(rest)}" if rest else "")

    if n == 0:
        return "zero"
    thousands, rest = divmod(n, 1000)
    words = f"{below_1000(thousands)} thousand" if thousands else ""
    if rest:
        glue = " and " if thousands and rest < 100 else " "
        words = (words + glue if words else "") + below_1000(rest)
    return words


def chinese_number(n: int) -> str:
    """0 <= n < 1e8 in Chinese numerals: 3405 -> 三千四百零五, 15 -> 十五."""

    def group(k: int) -> str:  # 0 < k < 10000
        out, zero = "", False
        for power, unit in ((3, "千"), (2, "百"), (1, "十"), (0, "")):
            digit = k // 10**power % 10
            if digit == 0:
                zero = bool(out)
            else:
                out += ("零" if zero else "") + ZH_DIGITS[digit] + unit
                zero = False
        return out

    if n == 0:
        return "零"
    high, low = divmod(n, 10000)
    out = group(high) + "万" if high else ""
    if low:
        out += ("零" if high and low < 1000 else "") + group(low)
    return out[1:] if out.startswith("一十") else out


def make_pair(kind: str, rng: random.Random) -> tuple[str, str]:
    """One generated (English, Chinese) pair: ``kind`` "numbers" or "dates"."""
    if kind == "numbers":
        r = rng.random()
        if r < 0.25:
            n = rng.randrange(100)
        elif r < 0.4:  # round numbers: 3000, 50000, 700000
            n = rng.randrange(1, 10) * 10 ** rng.randrange(1, 6)
        elif r < 0.6:
            n = rng.randrange(10_000)
        else:
            n = rng.randrange(1_000_000)
        return english_number(n), chinese_number(n)
    if kind != "dates":
        raise ValueError(f"kind must be 'numbers' or 'dates', got {kind!r}")
    year, month, day = rng.randrange(1900, 2100), rng.randrange(1, 13), rng.randrange(1, 29)
    return f"{MONTHS[month - 1]} {day}, {year}", f"{year}年{month}月{day}日"


def held_out(source: str) -> bool:
    """A fixed 2% of all possible sources (by hash) is reserved for the dev set."""
    return zlib.crc32(source.encode("utf-8")) % 50 == 0


def write_translation_corpus(kind: str, out: Path, n_train: int, n_dev: int, seed: int) -> None:
    """Write ``train.tsv`` and ``dev.tsv`` (``source<TAB>target``) to ``out``.

    Training pairs repeat (frequent short inputs stay frequent); dev sources come only
    from the held-out 2% of the input space, so no dev source is ever trained on.
    """
    rng = random.Random(seed)
    train: list[tuple[str, str]] = []
    dev: dict[str, str] = {}
    while len(train) < n_train or len(dev) < n_dev:
        src, tgt = make_pair(kind, rng)
        if held_out(src):
            if len(dev) < n_dev:
                dev[src] = tgt
        elif len(train) < n_train:
            train.append((src, tgt))
    out.mkdir(parents=True, exist_ok=True)
    for name, part in (("dev.tsv", list(dev.items())), ("train.tsv", train)):
        (out / name).write_text("".join(f"{s}\t{t}\n" for s, t in part), encoding="utf-8")


# -- sentiment: reviews with negation --------------------------------------------------

GOOD = "great wonderful delightful brilliant moving charming superb fun".split()
BAD = "awful boring dull clumsy tedious bland painful messy".split()
THINGS = "film story acting music ending plot cast script".split()


def make_review(rng: random.Random) -> tuple[str, str]:
    """'the plot was not dull but the music was great' -> pos. Negation flips a clause."""
    clauses, score = [], 0
    for _ in range(rng.randint(1, 3)):
        good = rng.random() < 0.5
        negated = rng.random() < 0.3
        word = rng.choice(GOOD if good else BAD)
        clauses.append(f"the {rng.choice(THINGS)} was {'not ' if negated else ''}{word}")
        score += 1 if good != negated else -1
    if score == 0:  # break ties with a final verdict
        verdict = rng.random() < 0.5
        clauses.append("overall i " + ("loved it" if verdict else "hated it"))
        score = 1 if verdict else -1
    return " but ".join(clauses), "pos" if score > 0 else "neg"


def write_reviews(out: Path, n_train: int, n_dev: int, seed: int) -> None:
    """Write ``train.csv`` and ``dev.csv`` (``text,label``) to ``out``."""
    rng = random.Random(seed)
    out.mkdir(parents=True, exist_ok=True)
    for name, n in (("train.csv", n_train), ("dev.csv", n_dev)):
        with (out / name).open("w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f)
            writer.writerow(["text", "label"])
            writer.writerows(make_review(rng) for _ in range(n))


# -- language modelling: rhymes ----------------------------------------------------------

ANIMALS = "cat dog bird fox frog mouse horse goat duck bee".split()
PLACES = "the hill|the river|the old mill|the garden|the wood|the town".split("|")
VERBS = "ran to|sat by|sang near|hid in|looked at|walked past".split("|")


def rhymes(n_lines: int, seed: int = 0) -> str:
    """Toy nursery-rhyme lines with a small grammar, e.g. 'the fox ran to the hill.'"""
    rng = random.Random(seed)
    lines = []
    for _ in range(n_lines):
        a, b = rng.sample(ANIMALS, 2)
        lines.append(f"the {a} {rng.choice(VERBS)} {rng.choice(PLACES)} with the {b}.")
    return "\n".join(lines) + "\n"
