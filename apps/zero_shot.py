r"""Zero-shot image classification with CLIP: rank your labels for each image.

    uv run apps/zero_shot.py --image docs/assets/cat.jpg --labels cat dog "a red car"
    uv run apps/zero_shot.py --model demo-shapes --image docs/assets/red_circle.png \
        --labels "red circle" "blue square" "green star"          # offline, bundled model
    uv run apps/zero_shot.py --images photos/ --imagenet --top-k 3 --json
    uv run apps/zero_shot.py --image cat.jpg --labels cat dog --explain cat_heatmap.png
    uv run apps/zero_shot.py --model xlm-roberta-base-ViT-B-32 --pretrained laion5b_s13b_b90k \
        --image cat.jpg --labels 猫 狗 汽车 --language zh                  # labels in Chinese

Each label becomes a prompt through the templates (default ``"a photo of a {}."``; with
--imagenet OpenAI's 80 ImageNet templates); a label's text embedding is the normalized mean
over its prompts. --language CODE (an NLLB code such as zho_Hans / deu_Latn, or ISO 639-1
zh / de / fr / ...) says what language the labels are in: an NLLB model's tokenizer reads
them as that source language, and for any language but English there are no templates
(open_clip has English ones only): each label is used as it is, and a line on stderr says so
(--template still wins). Probabilities are a softmax over the labels of
``exp(logit_scale) * cosine``; for SigLIP / SigLIP2 (models with a ``logit_bias``) each
label's own sigmoid ``p(match)`` of ``exp(logit_scale) * cosine + logit_bias``, which need
not sum to 1 (JSON: the same numbers under "prob").
--explain saves the image with a heatmap of where the model looked for the top label
(gradient-weighted attention relevancy, Chefer et al. 2021; or attention rollout).

Bad input (missing / corrupt / truncated / decompression-bomb image, no labels, unknown
model, weights not available offline) prints one line on stderr and exits with code 2.
Images under --images that cannot be read are skipped with a warning and counted.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import os
import sys
from pathlib import Path

from _common import (  # the model helpers shared with apps/retrieval.py
    DEFAULT_MODEL,
    DEFAULT_PRETRAINED,
    DEMO_MODEL,
    LANGUAGE_HELP,
    PRECISIONS,
    LoadedModel,
    apply_language,
    check_language,
    display_width,
    list_models_and_exit,
    load_model,
    note,
    pad,
)
from attn_core.cli import fail, make_parser, run, warn
from attn_core.errors import InputError
from attn_vision.images import IMAGE_EXTENSIONS, find_images, iter_images, open_image

DEFAULT_TEMPLATE = "a photo of a {}."

# -- labels and the classifier -------------------------------------------------------------


def read_labels(args: argparse.Namespace) -> list[str]:
    labels = list(args.labels or [])
    if args.labels_file:
        path = Path(args.labels_file)
        if not path.is_file():
            raise InputError(f"labels file not found: {path}")
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except UnicodeDecodeError as e:
            raise InputError(f"labels file {path} is not UTF-8 text: {e}") from None
        from_file = [s.strip() for s in lines if s.strip() and not s.lstrip().startswith("#")]
        if not from_file:
            raise InputError(f"labels file {path} has no labels (one per line)")
        labels += from_file
    if args.imagenet:
        import attn_clip

        labels += list(attn_clip.IMAGENET_CLASSNAMES)
    if not labels:
        raise InputError("no labels: pass --labels, --labels-file or --imagenet")
    for i, label in enumerate(labels):
        if not label.strip():
            raise InputError(f"label {i + 1} is empty")
    return list(dict.fromkeys(label.strip() for label in labels))  # drop repeats, keep order


def choose_templates(args: argparse.Namespace) -> tuple[list, str | None]:
    """``(templates, note)``: --template as given, else the library's for --language (English:
    the default or, with --imagenet, OpenAI's 80; another language: the label alone, and a
    note saying so)."""
    from attn_clip.zero_shot import check_templates, templates_for_language

    if args.template:
        return check_templates(args.template, "--template"), None
    return templates_for_language(args.language, args.imagenet)


def read_templates(args: argparse.Namespace) -> list:
    return choose_templates(args)[0]


def language_record(args: argparse.Namespace, loaded: LoadedModel, note: str | None) -> dict:
    """--json with --language: what the language changed (the NLLB code, the tokenizer's
    source language or None, the templates: "given", "english" or "none", the note)."""
    from attn_clip.languages import has_source_languages, is_english

    tokenizer = loaded.tokenizer
    templates = "given" if args.template else "english" if is_english(args.language) else "none"
    return {
        "code": check_language(args.language),
        "tokenizer_language": tokenizer.language if has_source_languages(tokenizer) else None,
        "templates": templates,
        "note": note,
    }


def _template_text(t) -> str:
    return t if isinstance(t, str) else t("{}")


def _cache_path(loaded: LoadedModel, labels: list[str], templates: list) -> Path:
    """Where a large classifier is cached: keyed by the text tower's weights (its last
    parameters: the final block, norm and projection of any tower), the tokenizer's source
    language and the prompts."""
    import torch

    h = hashlib.sha256()
    params = list(loaded.model.text.parameters())
    for t in params[-8:]:
        h.update(t.detach().to("cpu", torch.float32).numpy().tobytes())
    h.update(str(params[0].dtype).encode())
    h.update(str(getattr(loaded.tokenizer, "language", None)).encode())
    h.update(json.dumps([labels, [_template_text(t) for t in templates]]).encode())
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "attn-zoo" / "zero-shot-heads" / f"{h.hexdigest()[:24]}.safetensors"


def build_classifier(loaded: LoadedModel, labels: list[str], templates: list, cache: bool):
    """``(E, K)`` label embeddings; big heads (--imagenet) are built in batches with a
    progress bar and cached on disk."""
    import attn_clip
    from attn_core import hub
    from safetensors.torch import load_file

    path = _cache_path(loaded, labels, templates) if cache else None
    if path is not None and path.is_file():
        try:
            return load_file(str(path))["classifier"].to(loaded.device)
        except Exception:  # a broken cache entry is rebuilt
            pass
    classifier = attn_clip.build_zero_shot_classifier(
        loaded.model,
        loaded.tokenizer,  # the text tower drops the padding after EOT by itself
        labels,
        templates,
        batch_size=max(1, 800 // len(templates)),
        device=loaded.device,
        use_tqdm=len(labels) * len(templates) > 2000 and sys.stderr.isatty(),
    )
    if path is not None:
        try:
            hub.save_state_dict({"classifier": classifier}, path)
        except OSError as e:
            warn(f"could not cache the classifier in {path.parent}: {e}")
    return classifier


# -- the app -------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = make_parser(__doc__)
    src = p.add_argument_group("images")
    src.add_argument(
        "--image", action="append", default=[], metavar="PATH", help="an image file, repeatable"
    )
    src.add_argument("--images", metavar="DIR", help="every image under DIR (recursive)")
    lab = p.add_argument_group("labels")
    lab.add_argument("--labels", nargs="+", metavar="LABEL", help='e.g. cat dog "a red car"')
    lab.add_argument("--labels-file", metavar="FILE", help="one label per line (# = comment)")
    lab.add_argument(
        "--imagenet", action="store_true", help="the 1,000 ImageNet classes (80 OpenAI templates)"
    )
    lab.add_argument(
        "--template",
        action="append",
        metavar="T",
        help=f'prompt template with {{}} for the label, repeatable (default "{DEFAULT_TEMPLATE}"; '
        "with a --language other than English: the label alone)",
    )
    lab.add_argument("--language", metavar="CODE", help=LANGUAGE_HELP + " (default: English)")
    out = p.add_argument_group("output")
    out.add_argument("--top-k", type=int, default=5, help="labels shown per image")
    out.add_argument("--json", action="store_true", help="one JSON object per image (JSON lines)")
    out.add_argument(
        "--explain",
        metavar="OUT.png",
        help="save a heatmap of the top label over the image (a folder for several images)",
    )
    out.add_argument(
        "--explain-method",
        choices=("relevancy", "rollout"),
        default="relevancy",
        help="gradient-weighted relevancy (Chefer et al.) or attention rollout",
    )
    mod = p.add_argument_group("model")
    mod.add_argument(
        "--model",
        help=f"architecture, hf-hub:ID, folder, or {DEMO_MODEL} (default {DEFAULT_MODEL})",
    )
    mod.add_argument(
        "--pretrained",
        help=f"tag (default {DEFAULT_PRETRAINED} for {DEFAULT_MODEL}) or checkpoint file / folder",
    )
    mod.add_argument("--device", help="cpu, cuda, cuda:1, mps (default: cuda if available)")
    mod.add_argument("--precision", choices=PRECISIONS, default="fp32", help="weight precision")
    mod.add_argument("--batch-size", type=int, default=32, help="images per forward pass")
    mod.add_argument(
        "--list-models", action="store_true", help="list every model name and its tags, then exit"
    )
    mod.add_argument(
        "--no-cache", action="store_true", help="do not cache the --imagenet classifier"
    )
    return p.parse_args(argv)


def _check_args(args: argparse.Namespace) -> None:
    if args.top_k < 1:
        raise InputError(f"--top-k must be >= 1, got {args.top_k}")
    if args.batch_size < 1:
        raise InputError(f"--batch-size must be >= 1, got {args.batch_size}")
    if not args.image and not args.images:
        raise InputError("no images: pass --image PATH (repeatable) or --images DIR")


def explain_names(paths: list[Path], root: Path | None) -> dict[Path, str]:
    """A distinct PNG name per image: its path under --images joined with "__" (else its
    file name), numbered when two would collide."""
    names: dict[Path, str] = {}
    used: set[str] = set()
    for path in paths:
        under = root is not None and path.is_relative_to(root)
        rel = path.relative_to(root) if under else Path(path.name)
        stem = base = "__".join(rel.with_suffix("").parts)
        n = 1
        while stem in used:
            n += 1
            stem = f"{base}-{n}"
        used.add(stem)
        names[path] = f"{stem}.png"
    return names


def _print_table(path: str, labels: list[str], probs, top: list[int], sigmoid: bool) -> None:
    width = max(5, *(display_width(labels[i]) for i in top))
    print(path)
    print(f"  {'#':>2}  {pad('label', width)}  {'p(match)' if sigmoid else 'prob':>7}")
    for rank, i in enumerate(top, 1):
        print(f"  {rank:>2}  {pad(labels[i], width)}  {100 * float(probs[i]):>6.2f}%")
    print()


def warn_truncated(loaded: LoadedModel, labels: list[str], templates: list) -> None:
    """Name the labels whose prompts do not fit the text context (they would be cut, and
    two labels that differ only after the cut would get the same score)."""
    tokenizer = loaded.tokenizer
    if not hasattr(tokenizer, "encode"):
        return
    # CLIP: start and end of text; SigLIP: the end only
    room = tokenizer.context_length - getattr(tokenizer, "num_special_tokens", 2)
    for label in labels:
        longest = max(len(tokenizer.encode(_template_text(t).format(label))) for t in templates)
        if longest > room:
            warn(
                f"label {label!r} is {longest} tokens in its prompt, longer than the text "
                f"context ({room}); the end is cut off"
            )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.list_models:
        return list_models_and_exit()
    try:
        _check_args(args)
        check_language(args.language)
        labels = read_labels(args)
        templates, template_note = choose_templates(args)
        # Named images must all be good before any work starts; folders skip bad files.
        named = [Path(p) for p in args.image]
        for p in named:
            open_image(p)
        root = Path(args.images) if args.images else None
        found = find_images(root) if root is not None else []
        if root is not None and not found:
            raise InputError(f"no images ({', '.join(sorted(IMAGE_EXTENSIONS))}) under {root}")
        paths = list(dict.fromkeys(named + found))
        many = len(paths) > 1 or root is not None  # --explain names a folder then
        if args.explain:
            target = Path(args.explain) if many else Path(args.explain).parent
            if many and target.exists() and not target.is_dir():
                raise InputError(f"--explain {target}: with several images it must be a folder")
            if not many and not target.is_dir():
                raise InputError(f"--explain: folder {target} does not exist")
        loaded = load_model(args.model, args.pretrained, args.device, args.precision)
        apply_language(loaded, args.language)  # (a note when the tokenizer has no languages)
        tower = loaded.model.config.vision.tower
        if args.explain and tower != "vit":
            raise InputError(f"--explain needs a ViT image tower; {args.model} has a {tower}")
    except InputError as e:
        return fail(str(e))
    if template_note:
        note(template_note)
    lang = language_record(args, loaded, template_note) if args.language else None
    if not args.imagenet:  # the ImageNet class names all fit
        warn_truncated(loaded, labels, templates)

    import attn_clip
    import torch
    from tqdm import tqdm

    model = loaded.model
    try:
        classifier = build_classifier(
            loaded, labels, templates, cache=args.imagenet and not args.no_cache
        )
    except RuntimeError as e:  # e.g. an unsupported precision on this device
        return fail(f"cannot run the text tower ({args.precision} on {loaded.device}): {e}")
    k = min(args.top_k, len(labels))
    heat_names = explain_names(paths, root) if args.explain and many else {}
    if heat_names:
        Path(args.explain).mkdir(parents=True, exist_ok=True)
    sigmoid = model.logit_bias is not None  # SigLIP-style: independent per-label scores
    skipped = 0
    bar = tqdm(total=len(paths), unit="img", disable=None if many else True)
    # without --explain the workers turn each picture into the model's input at once
    transform = None if args.explain else loaded.preprocess
    stream = iter_images(paths, workers=min(4, os.cpu_count() or 1), transform=transform)
    while batch := list(itertools.islice(stream, args.batch_size)):
        bar.update(len(batch))
        good = []
        for path, image, _, error in batch:
            if error is None:
                good.append((path, image))
                continue
            skipped += 1  # only files found under --images can fail here
            bar.clear()
            warn(f"skipped {error}")
            if args.json:
                print(json.dumps({"image": str(path), "error": error}), flush=True)
        if not good:
            continue
        inputs = [loaded.preprocess(image) if args.explain else image for _, image in good]
        x = torch.stack(inputs).to(loaded.device)
        try:
            with torch.no_grad():
                logits = attn_clip.zero_shot_logits(model, model.encode_image(x), classifier)
        except RuntimeError as e:
            bar.close()
            return fail(f"cannot run the image tower ({args.precision} on {loaded.device}): {e}")
        logits = logits.float()
        probs = (logits.sigmoid() if sigmoid else logits.softmax(dim=-1)).cpu()  # (B, K)
        top = probs.topk(k, dim=-1).indices.tolist()
        for (path, image), p, t in zip(good, probs, top, strict=True):
            heat_path = None
            if args.explain:
                heat_path = Path(args.explain) / heat_names[path] if many else Path(args.explain)
                attn_clip.save_explanation(
                    model,
                    image,
                    classifier[:, t[0]],
                    heat_path,
                    method=args.explain_method,
                    transform=loaded.preprocess,
                )
            if args.json:
                record = {
                    "image": str(path),
                    "predictions": [{"label": labels[i], "prob": float(p[i])} for i in t],
                }
                if heat_path is not None:
                    record["explain"] = str(heat_path)
                if lang is not None:
                    record["language"] = lang
                print(json.dumps(record, ensure_ascii=False), flush=True)
            else:
                bar.clear()
                _print_table(str(path), labels, p, t, sigmoid)
                if heat_path is not None:
                    print(f"  heatmap of '{labels[t[0]]}' saved to {heat_path}\n")
    bar.close()
    if skipped:
        warn(f"skipped {skipped} unreadable file(s) of {len(paths)}")
    return 0


if __name__ == "__main__":
    run(main)
