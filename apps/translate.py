"""Translate text with opus-mt (Marian) weights or a model trained by scripts/train_translation.py.

    uv run apps/translate.py --model Helsinki-NLP/opus-mt-en-zh "I love deep learning"
    uv run apps/translate.py --model runs/numbers/best "three hundred and five"
    echo "Good morning" | uv run apps/translate.py --model PATH --beams 1 --json

Texts come from the arguments, else one per line from stdin. Bad input (empty text, unknown
model, unreadable, unsafe or mismatched checkpoint, no such --device, weights not available
offline) prints one line on stderr and exits with code 2; Ctrl-C exits with 130.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings

from _common import pick_device
from attn_core.cli import fail, make_parser, one_line, run, warn
from attn_core.errors import InputError

DEFAULT_MODEL = "Helsinki-NLP/opus-mt-en-zh"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = make_parser(__doc__)
    p.add_argument("texts", nargs="*", help="texts to translate (default: lines of stdin)")
    p.add_argument("--model", default=DEFAULT_MODEL, help="Hub repo id or checkpoint directory")
    p.add_argument("--beams", type=int, default=4, help="beam size (1 = greedy)")
    p.add_argument("--max-new-tokens", type=int, default=None, help="default: the checkpoint's")
    p.add_argument("--batch-size", type=int, default=16, help="texts per batch")
    p.add_argument("--device", default=None, help="cpu, cuda, ... (default: cuda if available)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    texts = args.texts if args.texts else [line.rstrip("\n") for line in sys.stdin]
    if not texts:
        return fail("no input text (pass texts as arguments or on stdin)")
    for i, text in enumerate(texts):
        if not text.strip():
            return fail(f"input text {i + 1} is empty")
    if args.beams < 1:
        return fail(f"--beams must be >= 1, got {args.beams}")

    from attn_core.hub import WeightsError
    from attn_nlp import Translator

    start = time.perf_counter()
    try:
        device = pick_device(args.device)
        translator = Translator.from_pretrained(args.model, device=device)
    except InputError as e:
        return fail(str(e))
    except (WeightsError, OSError, ValueError, TypeError, RuntimeError) as e:
        msg = one_line(e, path_option="--model PATH")  # this app's option for a local folder
        return fail(msg if args.model in msg else f"cannot load {args.model}: {msg}")
    loaded = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            outputs = translator.translate(
                texts,
                beams=args.beams,
                max_new_tokens=args.max_new_tokens,
                batch_size=args.batch_size,
                progress=len(texts) > args.batch_size and not args.json,
            )
        except ValueError as e:
            return fail(str(e))
    for w in caught:  # e.g. truncation of an over-long source
        warn(w.message)
    done = time.perf_counter()

    if args.json:
        result = {
            "model": args.model,
            "beams": args.beams,
            "device": str(device),
            "load_seconds": round(loaded - start, 3),
            "translate_seconds": round(done - loaded, 3),
            "translations": [
                {"source": s, "translation": t} for s, t in zip(texts, outputs, strict=True)
            ],
        }
        print(json.dumps(result, ensure_ascii=False, indent=2))
    else:
        for source, target in zip(texts, outputs, strict=True):
            print(target if len(texts) == 1 else f"{source}\t{target}")
    return 0


if __name__ == "__main__":
    run(main, path_option="--model PATH")
