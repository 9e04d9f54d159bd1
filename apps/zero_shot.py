"""Zero-shot image classification with CLIP: rank your labels for each image.

    uv run apps/zero_shot.py --image docs/assets/cat.jpg --labels cat dog "a red car"
    uv run apps/zero_shot.py --model demo-shapes --image docs/assets/red_circle.png \
        --labels "red circle" "blue square" "green star"          # offline, bundled model
    uv run apps/zero_shot.py --images photos/ --imagenet --top-k 3 --json
    uv run apps/zero_shot.py --image cat.jpg --labels cat dog --explain cat_heatmap.png

Each label becomes a prompt through the templates (default ``"a photo of a {}."``; with
--imagenet OpenAI's 80 ImageNet templates); a label's text embedding is the normalized mean
over its prompts. Probabilities are a softmax over the labels of
``exp(logit_scale) * cosine`` (independent sigmoids for SigLIP-style models).
--explain saves the image with a heatmap of where the model looked for the top label
(gradient-weighted attention relevancy, Chefer et al. 2021; or attention rollout).

Bad input (missing / corrupt / truncated / decompression-bomb image, no labels, unknown
model, weights not available offline) prints one line on stderr and exits with code 2.
Images under --images that cannot be read are skipped with a warning and counted.
The image and model helpers here are shared with apps/retrieval.py.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import itertools
import json
import os
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

DEFAULT_MODEL, DEFAULT_PRETRAINED = "ViT-B-32", "openai"
DEMO_MODEL = "demo-shapes"
IMAGE_EXTENSIONS = frozenset(
    ".jpg .jpeg .jpe .png .bmp .gif .webp .tif .tiff .ppm .pgm .pbm .pnm .jfif".split()
)
PRECISIONS = ("fp32", "bf16", "fp16")
DEFAULT_TEMPLATE = "a photo of a {}."


class InputError(ValueError):
    """Bad user input: reported as one line on stderr with exit code 2."""


def fail(message: str) -> int:
    print(f"error: {' '.join(str(message).split())}", file=sys.stderr)  # always one line
    return 2


def warn(message: str) -> None:
    print(f"warning: {' '.join(str(message).split())}", file=sys.stderr)


# -- images --------------------------------------------------------------------------------


def to_rgb(img: Image.Image) -> Image.Image:
    """Any Pillow mode -> 8-bit RGB: alpha is composited on white, 16-bit / 32-bit / float
    grey levels are rescaled (not clipped), CMYK / YCbCr / palette / 1-bit are converted."""
    mode = img.mode
    if mode.startswith("I;16") or mode in ("I", "F"):
        a = np.asarray(img, dtype=np.float32)
        if mode == "F" and a.size and a.max() <= 1.0:
            top = 1.0  # float image in [0, 1]
        else:
            top = 65535.0 if mode.startswith("I;16") or (a.size and a.max() > 255) else 255.0
        grey = np.clip(a / top * 255.0, 0, 255).round().astype(np.uint8)
        return Image.fromarray(grey, "L").convert("RGB")
    if mode in ("RGBA", "LA", "La", "RGBa", "PA") or (mode == "P" and "transparency" in img.info):
        rgba = img.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    if mode == "RGB":
        return img
    try:
        return img.convert("RGB")
    except (ValueError, OSError) as e:
        raise InputError(f"unsupported image mode {mode!r}: {e}") from None


MAX_FILE_BYTES = 1 << 30  # larger "images" are refused before reading them


def load_image_file(path: str | os.PathLike) -> tuple[Image.Image, str]:
    """Read and decode ``path`` fully: ``(RGB image with EXIF rotation applied, SHA-256 of
    the file)``, or raise InputError saying what is wrong: missing, a folder, not an image,
    truncated / corrupt, or so large it could be a decompression bomb (Pillow's warning is
    treated as an error too)."""
    p = Path(path)
    if not p.exists():
        raise InputError(f"image not found: {path}")
    if p.is_dir():
        raise InputError(f"{path} is a folder, not an image (use --images DIR for folders)")
    try:
        if p.stat().st_size > MAX_FILE_BYTES:
            raise InputError(f"{path}: file larger than {MAX_FILE_BYTES >> 20} MiB")
        data = p.read_bytes()
    except OSError as e:
        raise InputError(f"{path}: cannot read: {e.strerror or e}") from None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as img:
                img.load()
                img = to_rgb(ImageOps.exif_transpose(img))
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        raise InputError(f"{path}: refusing a decompression-bomb sized image: {e}") from None
    except UnidentifiedImageError:
        raise InputError(f"{path}: not an image (or a format Pillow cannot read)") from None
    except InputError as e:
        raise InputError(f"{path}: {e}") from None
    except Exception as e:  # truncated data, broken chunks, bad EXIF: Pillow raises many types
        what = "truncated image" if "truncated" in str(e) else "corrupt image"
        raise InputError(f"{path}: {what} ({type(e).__name__}: {e})") from None
    return img, hashlib.sha256(data).hexdigest()


def open_image(path: str | os.PathLike) -> Image.Image:
    """:func:`load_image_file` without the hash."""
    return load_image_file(path)[0]


def iter_images(paths: list[Path], workers: int = 4):
    """``(path, image, sha256, error)`` for each path, in order, decoded by a thread pool
    (``error`` is the InputError message and ``image`` None for an unreadable file)."""
    from concurrent.futures import ThreadPoolExecutor

    def load(path: Path):
        try:
            return (path, *load_image_file(path), None)
        except InputError as e:
            return path, None, None, str(e)

    if workers <= 1:
        yield from map(load, paths)
        return
    with ThreadPoolExecutor(workers) as pool:
        window = workers * 4  # bounded read-ahead: memory stays flat on huge folders
        for start in range(0, len(paths), window):
            yield from pool.map(load, paths[start : start + window])


def find_images(root: str | os.PathLike) -> list[Path]:
    """Every file with an image extension under ``root`` (recursive, sorted, no hidden dirs)."""
    root = Path(root)
    if not root.is_dir():
        raise InputError(f"image folder not found: {root}")
    found = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        found += [
            Path(dirpath) / f
            for f in filenames
            if Path(f).suffix.lower() in IMAGE_EXTENSIONS and not f.startswith(".")
        ]
    return sorted(found)


# -- models --------------------------------------------------------------------------------


@dataclass
class LoadedModel:
    model: Any  # attn_clip.CLIP
    preprocess: Any  # PIL image -> (3, H, W)
    tokenizer: Any  # list[str] -> (n, L)
    name: str  # what identifies the weights: the model name (or folder)
    pretrained: str | None  # tag or absolute path
    device: Any  # torch.device


def resolve_model_args(model: str | None, pretrained: str | None) -> tuple[str, str | None]:
    """``--model`` / ``--pretrained`` -> ``(name, pretrained)`` with paths made absolute.

    A folder given as ``--pretrained`` with no ``--model`` brings its own architecture
    (``open_clip_config.json`` / ``config.json``) and becomes the model.
    """
    if pretrained is not None and os.path.exists(pretrained):
        pretrained = str(Path(pretrained).resolve())
    if model is None:
        if pretrained is not None and os.path.isdir(pretrained):
            return pretrained, None
        model = DEFAULT_MODEL
        if pretrained is None:
            pretrained = DEFAULT_PRETRAINED
    elif os.path.exists(model):
        model = str(Path(model).resolve())
    return model, pretrained


def _default_pretrained(name: str) -> str | None:
    """The weights to load when only ``--model`` is given: ``openai`` or the only tag
    (``demo-shapes`` has one, bundled), else an error listing the choices."""
    import attn_clip

    if name.startswith(("hf-hub:", "local-dir:")) or os.path.exists(name):
        return None  # brings its own weights
    attn_clip.get_model_config(name)  # ValueError naming close matches if unknown
    tags = attn_clip.list_pretrained_tags(name)
    if DEFAULT_PRETRAINED in tags:
        return DEFAULT_PRETRAINED
    if len(tags) == 1:
        return tags[0]
    if not tags:
        raise InputError(
            f"no pretrained weights are known for {name!r}: pass --pretrained PATH "
            f"(a checkpoint file or folder), or use --model {DEMO_MODEL} offline"
        )
    raise InputError(f"{name!r} has several pretrained tags, pick one with --pretrained: {tags}")


def pick_device(requested: str | None):
    import torch

    if requested is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(requested)
    except RuntimeError as e:
        raise InputError(f"bad --device {requested!r}: {e}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise InputError(f"--device {requested}: CUDA is not available on this machine")
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        raise InputError(f"--device {requested}: only {torch.cuda.device_count()} GPU(s) here")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise InputError(f"--device {requested}: MPS is not available on this machine")
    return device


def load_model(
    model: str | None, pretrained: str | None, device: str | None, precision: str
) -> LoadedModel:
    """Build the CLIP of ``--model`` / ``--pretrained`` (see :func:`resolve_model_args`);
    every failure a user can cause becomes an InputError with one clear line."""
    import attn_clip

    name, pretrained = resolve_model_args(model, pretrained)
    dev = pick_device(device)
    try:
        weights = pretrained if pretrained is not None else _default_pretrained(name)
        m, preprocess, tokenizer = attn_clip.create_model_and_transforms(
            name, weights, device=dev, precision=precision
        )
    except attn_clip.PretrainedDownloadError as e:
        raise InputError(
            f"weights not available: {e} Or run offline with the bundled model: "
            f"--model {DEMO_MODEL} (or --pretrained PATH to a downloaded checkpoint)."
        ) from None
    except FileNotFoundError as e:
        raise InputError(f"cannot load model {name!r}: {e}") from None
    except (ValueError, KeyError, TypeError, OSError, RuntimeError) as e:
        msg = str(e).strip("'\"")
        raise InputError(msg if name in msg or "unknown" in msg else f"{name}: {msg}") from None
    label = pretrained if isinstance(pretrained, str) else None
    if label is None and isinstance(weights, str):
        label = weights
    return LoadedModel(m, preprocess, tokenizer, name, label, dev)


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


def read_templates(args: argparse.Namespace) -> list:
    if args.template:
        for t in args.template:
            try:
                ok = "{}" in t and t.format("x") != t
            except (IndexError, KeyError, ValueError):
                ok = False
            if not ok:
                raise InputError(
                    f"--template {t!r} must contain exactly one '{{}}' for the label, e.g. "
                    f"{DEFAULT_TEMPLATE!r}"
                )
        return list(dict.fromkeys(args.template))
    if args.imagenet:
        import attn_clip

        return list(attn_clip.OPENAI_IMAGENET_TEMPLATES)
    return [DEFAULT_TEMPLATE]


def _template_text(t) -> str:
    return t if isinstance(t, str) else t("{}")


def _cache_path(loaded: LoadedModel, labels: list[str], templates: list) -> Path:
    """Where a large classifier is cached: keyed by the text tower's weights and prompts."""
    import torch

    h = hashlib.sha256()
    text = loaded.model.text
    fingerprint = [text.positional_embedding, text.ln_final.weight, text.ln_final.bias]
    fingerprint += [p for p in text.blocks[-1].parameters()]
    fingerprint += [text.proj.weight] if text.proj is not None else []
    for t in fingerprint:
        h.update(t.detach().to("cpu", torch.float32).numpy().tobytes())
    h.update(str(next(text.parameters()).dtype).encode())
    h.update(json.dumps([labels, [_template_text(t) for t in templates]]).encode())
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "attn-zoo" / "zero-shot-heads" / f"{h.hexdigest()[:24]}.safetensors"


def build_classifier(loaded: LoadedModel, labels: list[str], templates: list, cache: bool):
    """``(E, K)`` label embeddings; big heads (--imagenet) are built in batches with a
    progress bar and cached on disk."""
    import attn_clip
    from safetensors.torch import load_file, save_file

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
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            save_file({"classifier": classifier.detach().cpu().contiguous()}, str(tmp))
            os.replace(tmp, path)
        except OSError as e:
            warn(f"could not cache the classifier in {path.parent}: {e}")
    return classifier


# -- the app -------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n".join(__doc__.split("\n")[1:6]),
    )
    src = p.add_argument_group("images")
    src.add_argument("--image", action="append", default=[], metavar="PATH", help="repeatable")
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
        help=f'prompt template, repeatable (default "{DEFAULT_TEMPLATE}")',
    )
    out = p.add_argument_group("output")
    out.add_argument("--top-k", type=int, default=5, help="labels shown per image (default 5)")
    out.add_argument("--json", action="store_true", help="one JSON object per image (JSON lines)")
    out.add_argument(
        "--explain",
        metavar="OUT.png",
        help="save a heatmap of the top label over the image (a folder for several images)",
    )
    out.add_argument("--explain-method", choices=("relevancy", "rollout"), default="relevancy")
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
    mod.add_argument("--precision", choices=PRECISIONS, default="fp32")
    mod.add_argument("--batch-size", type=int, default=32)
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


def _print_table(path: str, labels: list[str], probs, top: list[int]) -> None:
    width = max(5, *(len(labels[i]) for i in top))
    print(path)
    print(f"  {'#':>2}  {'label':<{width}}  {'prob':>7}")
    for rank, i in enumerate(top, 1):
        print(f"  {rank:>2}  {labels[i]:<{width}}  {100 * float(probs[i]):>6.2f}%")
    print()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        _check_args(args)
        labels = read_labels(args)
        templates = read_templates(args)
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
    except InputError as e:
        return fail(str(e))

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
    stream = iter_images(paths, workers=min(4, os.cpu_count() or 1))
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
        x = torch.stack([loaded.preprocess(image) for _, image in good]).to(loaded.device)
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
                print(json.dumps(record, ensure_ascii=False), flush=True)
            else:
                bar.clear()
                _print_table(str(path), labels, p, t)
                if heat_path is not None:
                    print(f"  heatmap of '{labels[t[0]]}' saved to {heat_path}\n")
    bar.close()
    if skipped:
        warn(f"skipped {skipped} unreadable file(s) of {len(paths)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
