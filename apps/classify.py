r"""Classify images with an attn_vision model: a fine-tuned folder, a Hugging Face one, timm's.

    uv run apps/classify.py --model runs/vit/best --image cat.jpg        # finetune_vit output
    uv run apps/classify.py --model hf-hub:google/vit-base-patch16-224 --image cat.jpg
    uv run apps/classify.py --model resnet18 --pretrained --images photos/ --top-k 3 --json
    uv run apps/classify.py --model vit_base_patch16_224.augreg2_in21k_ft_in1k \
        --pretrained --image docs/assets/cat.jpg

``--model`` is a folder written by ``scripts/finetune_vit.py`` / ``attn_vision.save_pretrained``
or a transformers image classifier's folder (``config.json`` + weights, e.g. a
``ViTForImageClassification``'s ``save_pretrained``), or ``hf-hub:<repo id>`` of one
(downloaded once, cached): these bring their weights and their class names (transformers'
``id2label``); or an attn_vision model name (``--pretrained``: timm's weights for the tag,
or a checkpoint file; without ``--pretrained`` a name is refused, its weights would be
random, unless ``--random-weights`` asks for that). Class names: the model's own, else
ImageNet's for a 1,000-class head, else ``class N``. Each image is
preprocessed as the weights expect (the model's ``pretrained_cfg``) and its top-k classes
printed (``--json``: one JSON object per image). Bad input prints one line on stderr and
exits with code 2; images under --images that cannot be read are skipped and counted;
Ctrl-C exits with 130.
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

from _common import brings_weights, display_width, pad, pick_device
from attn_core.cli import fail, make_parser, one_line, run, warn
from attn_core.errors import InputError
from attn_vision.images import find_images, iter_images, open_image


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = make_parser(__doc__)
    p.add_argument(
        "--model", required=True, help="a model folder, hf-hub:<repo id> or an attn_vision name"
    )
    p.add_argument(
        "--pretrained",
        nargs="?",
        const=True,
        default=None,
        help="timm's weights for the name's tag (no value), or a checkpoint file",
    )
    p.add_argument(
        "--random-weights",
        action="store_true",
        help="allow a model name without --pretrained (random weights: to try the app out)",
    )
    p.add_argument(
        "--image", action="append", default=[], metavar="PATH", help="an image file, repeatable"
    )
    p.add_argument("--images", metavar="DIR", help="every image under DIR (recursive)")
    p.add_argument("--top-k", type=int, default=5, help="classes shown per image")
    p.add_argument("--batch-size", type=int, default=32, help="images per forward pass")
    p.add_argument("--device", help="cpu, cuda, ... (default: cuda if available)")
    p.add_argument("--json", action="store_true", help="one JSON object per image (JSON lines)")
    return p.parse_args(argv)


def class_names(model) -> list[str]:
    """The model's class names: saved with it, ImageNet's for 1,000 classes, else numbers."""
    names = model.pretrained_cfg.get("label_names")
    if names and len(names) == model.num_classes:
        return [str(n) for n in names]
    if model.num_classes == 1000:
        import attn_clip

        return list(attn_clip.IMAGENET_CLASSNAMES)
    return [f"class {i}" for i in range(model.num_classes)]


def load(args: argparse.Namespace):
    """``(model, transform, class names, device)``; every failure an InputError."""
    import attn_vision
    from attn_core.hub import WeightsError

    device = pick_device(args.device)
    path_option = "--pretrained PATH"  # how to pass a local checkpoint instead
    try:
        own_weights = brings_weights(args.model)
        if own_weights:  # a folder / hub repo: its local copy is passed as --model
            path_option = "--model FOLDER"
        random_init = args.pretrained is None and not own_weights
        if random_init:
            attn_vision.get_model_config(args.model)  # an unknown name is named first
        if random_init and not args.random_weights:
            raise InputError(
                f"--model {args.model} without --pretrained would classify with random "
                "weights: pass --pretrained (timm's weights for its tag), --pretrained PATH "
                "(a checkpoint), a saved model folder, or --random-weights to try it anyway"
            )
        model = attn_vision.create_model(args.model, pretrained=args.pretrained)
    except InputError:
        raise
    except (WeightsError, ValueError, OSError) as e:
        msg = one_line(e, path_option=path_option)
        raise InputError(msg if args.model in msg else f"cannot load {args.model}: {msg}") from None
    if not model.num_classes:
        raise InputError(f"{args.model} has no classifier head (num_classes=0)")
    transform = attn_vision.create_transform(model)
    return model.to(device).eval(), transform, class_names(model), device


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        if args.top_k < 1 or args.batch_size < 1:
            raise InputError("--top-k and --batch-size must be >= 1")
        if not args.image and not args.images:
            raise InputError("no images: pass --image PATH (repeatable) or --images DIR")
        named = [Path(p) for p in args.image]
        for path in named:  # named images must all be good before any work starts
            open_image(path)
        found = find_images(args.images) if args.images else []
        if args.images and not found:
            raise InputError(f"no images under {args.images}")
        model, transform, names, device = load(args)
    except InputError as e:
        return fail(str(e))

    import torch

    k = min(args.top_k, len(names))
    paths = list(dict.fromkeys(named + found))
    skipped = 0
    stream = iter_images(paths)
    while batch := list(itertools.islice(stream, args.batch_size)):
        good = [(path, image) for path, image, _, error in batch if error is None]
        for error in (b[3] for b in batch if b[3] is not None):
            skipped += 1
            warn(f"skipped {error}")
        if not good:
            continue
        x = torch.stack([transform(image) for _, image in good]).to(device)  # RGB already
        with torch.inference_mode():
            probs = model(x).float().softmax(dim=-1).cpu()  # (B, C)
        top = probs.topk(k, dim=-1)
        for (path, _), p, idx in zip(good, top.values.tolist(), top.indices.tolist(), strict=True):
            hits = [{"class": names[i], "index": i, "prob": v} for i, v in zip(idx, p, strict=True)]
            if args.json:
                print(json.dumps({"image": str(path), "predictions": hits}, ensure_ascii=False))
                continue
            width = max(5, *(display_width(h["class"]) for h in hits))
            print(f"{path}\n  {'#':>2}  {pad('class', width)}  {'prob':>7}")
            for rank, h in enumerate(hits, 1):
                print(f"  {rank:>2}  {pad(h['class'], width)}  {100 * h['prob']:>6.2f}%")
            print()
    if skipped:
        warn(f"skipped {skipped} unreadable file(s) of {len(paths)}")
    return 0


if __name__ == "__main__":
    run(main)
