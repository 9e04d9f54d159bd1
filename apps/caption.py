r"""Caption images with a CoCa model: one caption (or several) per image.

    uv run apps/caption.py docs/assets/red_circle.png --model demo-shapes-coca   # offline
    uv run apps/caption.py cat.jpg --model coca_ViT-B-32 --pretrained laion2b_s13b_b90k
    uv run apps/caption.py --folder photos/ --model coca_ViT-L-14 \
        --pretrained mscoco_finetuned_laion2b_s13b_b90k --beams 3 --json
    uv run apps/caption.py cat.jpg --model my_coca/ --sample --top-p 0.9 --seed 0 \
        --num-captions 3

Prints ``path<TAB>caption`` per image (one line per caption with --num-captions), or with
--json one JSON list of ``{"image": path, "caption": best}`` (+ ``"captions": [...]`` with
--num-captions). Decoding (attn_nlp's generate through ``CoCa.generate``): greedy by default
as open_clip's ``generate`` (at most 29 tokens after the start token, at least 4), --beams N
beam search, --sample nucleus / top-k sampling (--seed S: the same captions each run, for
the same images and --batch-size). --model is a CoCa name (``coca_ViT-B-32``,
``coca_ViT-L-14``, ...; see --list-models), an ``hf-hub:`` id or a folder saved by
``attn_clip.save_pretrained``.

Bad input (a missing or unreadable image, a model that is not a CoCa, weights not available
offline, bad decoding options) prints one line on stderr, prints nothing on stdout and exits
with code 2. Images under --folder that cannot be read are skipped with a warning and
counted. Ctrl-C exits with code 130.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
from pathlib import Path

from _common import PRECISIONS, LoadedModel, list_models_and_exit, load_model
from attn_core.cli import fail, make_parser, run, warn
from attn_core.errors import InputError
from attn_vision.images import IMAGE_EXTENSIONS, find_images, iter_images, open_image


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = make_parser(__doc__)
    p.add_argument("images", nargs="*", metavar="IMAGE", help="image files to caption")
    p.add_argument("--folder", metavar="DIR", help="every image under DIR (recursive, sorted)")
    mod = p.add_argument_group("model")
    mod.add_argument("--model", help="a CoCa name, hf-hub:ID or saved folder (required)")
    mod.add_argument("--pretrained", help="tag (e.g. laion2b_s13b_b90k) or checkpoint file")
    mod.add_argument("--device", help="cpu, cuda, cuda:1, mps (default: cuda if available)")
    mod.add_argument("--precision", choices=PRECISIONS, default="fp32", help="weight precision")
    mod.add_argument("--batch-size", type=int, default=16, help="images per generate call")
    mod.add_argument(
        "--list-models", action="store_true", help="list every model name and its tags, then exit"
    )
    dec = p.add_argument_group("decoding (default: greedy)")
    dec.add_argument("--beams", type=int, default=1, help="beam search with N beams (1 = off)")
    dec.add_argument("--sample", action="store_true", help="sample tokens instead of the best")
    dec.add_argument("--top-p", type=float, help="with --sample: nucleus sampling, 0 < P <= 1")
    dec.add_argument("--top-k", type=int, help="with --sample: only the K likeliest tokens")
    dec.add_argument("--temperature", type=float, help="with --sample: > 0 (default 1)")
    dec.add_argument("--seed", type=int, help="with --sample: repeatable samples")
    dec.add_argument(
        "--num-captions", type=int, default=1, help="captions per image (<= --beams, or --sample)"
    )
    dec.add_argument(
        "--max-tokens", type=int, help="at most N tokens per caption, end-of-text included"
    )
    dec.add_argument("--min-tokens", type=int, help="at least N tokens before end-of-text")
    dec.add_argument(
        "--repetition-penalty", type=float, help="> 1 discourages tokens already in the caption"
    )
    dec.add_argument(
        "--no-repeat-ngram", type=int, metavar="N", help="no N-gram of tokens occurs twice"
    )
    out = p.add_argument_group("output")
    out.add_argument("--json", action="store_true", help="one JSON list of the captions")
    return p.parse_args(argv)


# flag -> (generate option, accepted, what is expected); checked when the flag is given
_SAMPLING = {
    "--top-p": ("top_p", lambda v: 0 < v <= 1, "in (0, 1]"),
    "--top-k": ("top_k", lambda v: v >= 0, ">= 0 (0 = off)"),
    "--temperature": ("temperature", lambda v: v > 0, "> 0"),
    "--seed": ("seed", lambda v: True, "an integer"),
}
_LENGTHS = {
    "--max-tokens": ("max_new_tokens", lambda v: v >= 1, ">= 1"),
    "--min-tokens": ("min_new_tokens", lambda v: v >= 0, ">= 0"),
    "--repetition-penalty": ("repetition_penalty", lambda v: v > 0, "> 0"),
    "--no-repeat-ngram": ("no_repeat_ngram_size", lambda v: v >= 0, ">= 0 (0 = off)"),
}


def _value(args: argparse.Namespace, flag: str):
    return getattr(args, flag[2:].replace("-", "_"))


def _given(args: argparse.Namespace, flags: dict) -> dict:
    """The generate options of the ``flags`` given on the command line, each checked."""
    opts = {}
    for flag, (option, ok, expected) in flags.items():
        value = _value(args, flag)
        if value is not None:
            if not ok(value):
                raise InputError(f"{flag} must be {expected}, got {value}")
            opts[option] = value
    return opts


def generation_options(args: argparse.Namespace) -> dict:
    """The ``CoCa.generate`` options of the decoding flags (checked: InputError)."""
    for flag in ("--beams", "--num-captions", "--batch-size"):
        if _value(args, flag) < 1:
            raise InputError(f"{flag} must be >= 1, got {_value(args, flag)}")
    opts: dict = {"num_return_sequences": args.num_captions}
    if args.beams > 1:
        opts["num_beams"] = args.beams
        if args.num_captions > args.beams:
            raise InputError(
                f"--num-captions {args.num_captions} needs at least as many --beams "
                f"(got {args.beams})"
            )
    elif args.num_captions > 1 and not args.sample:
        raise InputError(
            f"--num-captions {args.num_captions}: greedy decoding gives one caption; "
            "pass --beams N (N >= --num-captions) or --sample"
        )
    given = [flag for flag in _SAMPLING if _value(args, flag) is not None]
    if given and not args.sample:
        raise InputError(f"{', '.join(given)}: sampling option(s), need --sample")
    if args.sample:
        opts.update(do_sample=True, **_given(args, _SAMPLING))
    opts.update(_given(args, _LENGTHS))
    if "min_new_tokens" in opts:
        opts["min_length"] = 0  # the model's default minimum gives way
    return opts


def coca_names() -> str:
    import attn_clip

    return ", ".join(attn_clip.list_models("*coca*"))


def no_decoder(name: str) -> InputError:
    return InputError(
        f"{name} has no captioning decoder (a CLIP dual encoder); captioning needs a CoCa "
        f"model: {coca_names()} (or a folder saved from one)"
    )


def check_named_model(model: str) -> None:
    """A registry name that is not a CoCa is refused before any weights are fetched."""
    import attn_clip

    if os.path.exists(model) or model.startswith(("hf-hub:", "local-dir:")):
        return  # its config comes with it: checked once loaded
    try:
        config = attn_clip.get_model_config(model)
    except (ValueError, KeyError):
        return  # load_model names the unknown model and its close matches
    if not config.is_coca:
        raise no_decoder(model)


def check_length(loaded: LoadedModel, opts: dict) -> None:
    """--max-tokens / --min-tokens against the decoder's context."""
    room = loaded.model.config.multimodal.context_length
    longest = opts.get("max_new_tokens")
    if longest is not None and longest > room:
        raise InputError(f"--max-tokens must be <= {room} (the decoder's context), got {longest}")
    if longest is None:
        longest = loaded.model.generation_config().max_length - 1  # after the start token
    shortest = opts.get("min_new_tokens")
    if shortest is not None and shortest > longest:
        raise InputError(f"--min-tokens ({shortest}) must be <= the most tokens ({longest})")


def tsv(text: str) -> str:
    return " ".join(text.split())  # no tab or new line inside a field


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.list_models:
        return list_models_and_exit()
    try:
        if not args.model:
            raise InputError(f"no --model: pass a CoCa model ({coca_names()}) or its folder")
        if not args.images and not args.folder:
            raise InputError("no images: pass IMAGE [IMAGE ...] or --folder DIR")
        opts = generation_options(args)
        named = [Path(p) for p in args.images]
        for path in named:  # named images must all be good before any work starts
            open_image(path)
        found = find_images(args.folder) if args.folder else []
        if args.folder and not found:
            exts = ", ".join(sorted(IMAGE_EXTENSIONS))
            raise InputError(f"no images ({exts}) under {args.folder}")
        check_named_model(args.model)
        loaded = load_model(args.model, args.pretrained, args.device, args.precision)
        if not loaded.model.config.is_coca:
            raise no_decoder(args.model)
        check_length(loaded, opts)
    except InputError as e:
        return fail(str(e))

    import torch
    from tqdm import tqdm

    model = loaded.model
    paths = list(dict.fromkeys(named + found))
    n = args.num_captions
    records: list[dict] = []
    skipped = 0
    bar = tqdm(total=len(paths), unit="img", disable=None if args.folder else True)
    stream = iter_images(paths, workers=min(4, os.cpu_count() or 1), transform=loaded.preprocess)
    while batch := list(itertools.islice(stream, args.batch_size)):
        bar.update(len(batch))
        good = []
        for path, x, _, error in batch:
            if error is None:
                good.append((path, x))
                continue
            skipped += 1  # only files found under --folder can fail here
            warn(f"skipped {error}")
            if args.json:
                records.append({"image": str(path), "error": error})
        if not good:
            continue
        x = torch.stack([x for _, x in good]).to(loaded.device)
        try:
            captions = model.caption(x, **opts)  # (B * n) strings, an image's rows adjacent
        except RuntimeError as e:  # e.g. an unsupported precision on this device
            bar.close()
            return fail(f"cannot run the model ({args.precision} on {loaded.device}): {e}")
        for i, (path, _) in enumerate(good):
            mine = captions[i * n : (i + 1) * n]
            if args.json:
                record = {"image": str(path), "caption": mine[0]}
                if n > 1:
                    record["captions"] = mine
                records.append(record)
                continue
            bar.clear()
            for caption in mine:
                print(f"{path}\t{tsv(caption)}", flush=True)
            bar.refresh()
    bar.close()
    if args.json:
        print(json.dumps(records, ensure_ascii=False, indent=2))
    if skipped:
        warn(f"skipped {skipped} unreadable file(s) of {len(paths)}")
    return 0


if __name__ == "__main__":
    run(main)
