"""Zero-shot classification: class-name prompts -> a linear classifier over image embeddings.

Shape legend: ``B`` images, ``K`` classes, ``P`` templates (prompts) per class,
``E`` embedding width.

``build_zero_shot_classifier`` embeds every ``template.format(classname)``, L2-normalizes,
averages the ``P`` prompts of a class and normalizes again (prompt ensembling, as OpenAI
and open_clip do). ``predict`` turns image embeddings into class scores: a softmax over
classes for CLIP, independent sigmoids (multi-label) for SigLIP-style models that have a
``logit_bias``. ``evaluate_zero_shot`` scores a labelled image set with such a classifier
(top-1 / top-5, as the training recipe does after every epoch).

Prompt templates exist in English only (open_clip ships OpenAI's English ones):
``templates_for_language`` gives them for English labels and, for labels in any other
language, the label alone (:data:`LABEL_ONLY`) with a note saying so.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from itertools import islice
from pathlib import Path

import torch
import torch.nn.functional as F
from attn_core.errors import InputError

from .model import CLIP

__all__ = [
    "IMAGENET_CLASSNAMES",
    "LABEL_ONLY",
    "OPENAI_IMAGENET_TEMPLATES",
    "SIMPLE_TEMPLATES",
    "build_zero_shot_classifier",
    "check_templates",
    "evaluate_zero_shot",
    "match_probability",
    "predict",
    "templates_for_language",
    "zero_shot_logits",
]

Template = str | Callable[[str], str]

# OpenAI's 80 ImageNet prompts and 1,000 class names, as open_clip ships them (copied into
# imagenet_zero_shot.json by ``python -m attn_clip.registry --write``). The prompts are
# callables, ``OPENAI_IMAGENET_TEMPLATES[0]("dog") == "a bad photo of a dog."``.
with open(Path(__file__).with_name("imagenet_zero_shot.json"), encoding="utf-8") as _f:
    _METADATA = json.load(_f)
OPENAI_IMAGENET_TEMPLATES: tuple[Callable[[str], str], ...] = tuple(
    t.format for t in _METADATA["openai_imagenet_templates"]
)
IMAGENET_CLASSNAMES: tuple[str, ...] = tuple(_METADATA["imagenet_classnames"])
SIMPLE_TEMPLATES: tuple[str, ...] = ("a photo of a {}.",)
LABEL_ONLY = "{}"  # the template of a label used as it is


def templates_for_language(
    language: str | None = None, imagenet: bool = False
) -> tuple[list[Template], str | None]:
    """``(templates, note)`` for labels written in ``language`` (an NLLB or ISO 639-1 code,
    :func:`attn_clip.languages.language_code`; None = English).

    English: :data:`SIMPLE_TEMPLATES` (``imagenet``: OpenAI's 80 ImageNet prompts) and no
    note. Any other language: ``[LABEL_ONLY]`` -- each label as it is, since open_clip has
    English prompt templates only (an English prompt around a German label is neither
    language) -- and a one-line note saying so. An unknown code: ``InputError``.
    """
    from .languages import is_english

    if is_english(language):
        return list(OPENAI_IMAGENET_TEMPLATES if imagenet else SIMPLE_TEMPLATES), None
    note = (
        f"templates: none for {language!r} (open_clip has English prompt templates only); "
        "each label is used as it is"
    )
    return [LABEL_ONLY], note


def check_templates(templates: Iterable[str], what: str = "template") -> list[str]:
    """``templates`` in order with repeats dropped, each checked to hold exactly one ``{}``
    for the class name; otherwise an InputError (a ValueError) naming ``what`` (the apps
    pass their option, ``--template``)."""
    templates = list(templates)
    for t in templates:
        try:
            ok = "{}" in t and t.format("x") != t
        except (IndexError, KeyError, ValueError):  # "{0}{1}", "{name}", "{" ...
            ok = False
        if not ok:
            raise InputError(
                f"{what} {t!r} must contain exactly one '{{}}' for the label, e.g. "
                f"{SIMPLE_TEMPLATES[0]!r}"
            )
    return list(dict.fromkeys(templates))


def _fill(template: Template, classname: str) -> str:
    return template.format(classname) if isinstance(template, str) else template(classname)


@torch.no_grad()
def build_zero_shot_classifier(
    model: CLIP,
    tokenizer: Callable[[list[str]], torch.Tensor],
    classnames: Sequence[str],
    templates: Sequence[Template] = SIMPLE_TEMPLATES,
    batch_size: int | None = 10,
    device: str | torch.device | None = None,
    use_tqdm: bool = False,
) -> torch.Tensor:
    """Classifier weights ``(E, K)``: normalized mean of each class's normalized prompts.

    Args:
        model: anything with ``encode_text(tokens, normalize=True)``.
        tokenizer: list of strings -> ``(n, L)`` token ids.
        classnames: the ``K`` class names.
        templates: ``P`` format strings (``"a photo of a {}."``) or callables.
        batch_size: classes per text-encoder batch (``batch_size * P`` prompts); None = all.
        device: where tokens go (default: the model's device).
    """
    if isinstance(classnames, str) or len(classnames) == 0:
        raise ValueError("classnames must be a non-empty sequence of strings")
    if isinstance(templates, str) or len(templates) == 0:
        raise ValueError("templates must be a non-empty sequence of format strings or callables")
    if device is None:
        device = next(model.parameters()).device
    P = len(templates)
    step = batch_size or len(classnames)
    it = iter(classnames)
    batches = iter(lambda: list(islice(it, step)), [])
    if use_tqdm:
        from tqdm import tqdm

        batches = tqdm(batches, total=-(-len(classnames) // step), unit="batch")
    weights = []
    for names in batches:
        prompts = [_fill(t, c) for c in names for t in templates]
        emb = model.encode_text(tokenizer(prompts).to(device), normalize=True)  # (k*P, E)
        emb = emb.reshape(len(names), P, -1).mean(dim=1)  # (k, E)
        weights.append(F.normalize(emb, dim=-1).T)  # (E, k)
    return torch.cat(weights, dim=1)  # (E, K)


def zero_shot_logits(
    model: CLIP, image_features: torch.Tensor, classifier: torch.Tensor
) -> torch.Tensor:
    """``(B, E)`` image embeddings (normalized here) x ``(E, K)`` -> ``(B, K)`` logits."""
    feats = F.normalize(image_features, dim=-1).to(classifier.dtype)
    logits = model.logit_scale.exp().to(feats.dtype) * feats @ classifier
    if model.logit_bias is not None:
        logits = logits + model.logit_bias.to(feats.dtype)
    return logits


def match_probability(model: CLIP, cosine: torch.Tensor) -> torch.Tensor | None:
    """SigLIP-style models (with a ``logit_bias``): the probability that an image and a text
    match, ``sigmoid(exp(logit_scale) * cosine + logit_bias)``, for cosine similarities of
    any shape; None for a CLIP, whose scores mean something only next to each other."""
    if model.logit_bias is None:
        return None
    scale, bias = model.logit_scale.detach().float(), model.logit_bias.detach().float()
    return (scale.exp().to(cosine.device) * cosine.float() + bias.to(cosine.device)).sigmoid()


@torch.no_grad()
def predict(model: CLIP, images: torch.Tensor, classifier: torch.Tensor) -> torch.Tensor:
    """Class scores ``(B, K)`` for preprocessed ``images`` ``(B, C, H, W)``.

    Softmax over classes (rows sum to 1) for CLIP; independent sigmoids (each in
    ``[0, 1]``, multi-label) when the model has a ``logit_bias`` (SigLIP-style).
    """
    logits = zero_shot_logits(model, model.encode_image(images), classifier)
    return logits.sigmoid() if model.logit_bias is not None else logits.softmax(dim=-1)


@torch.no_grad()
def evaluate_zero_shot(
    model: CLIP,
    tokenizer: Callable[[list[str]], torch.Tensor],
    batches: Iterable[Sequence[torch.Tensor]],
    classnames: Sequence[str],
    templates: Sequence[Template] = SIMPLE_TEMPLATES,
    device: str | torch.device | None = None,
) -> dict[str, float]:
    """Zero-shot ``top1`` / ``top5`` accuracy over ``(images (B, C, H, W), labels (B,))``
    batches (label ``i`` is ``classnames[i]``) and ``n``, the images scored.

    One classifier from all the class names at once (:func:`build_zero_shot_classifier`);
    put the model in eval mode first. ``device``: where images go (default: the model's).
    """
    classifier = build_zero_shot_classifier(
        model, tokenizer, classnames, templates, batch_size=None, device=device
    )
    hits, n = [0, 0], 0  # top-1, top-5
    for images, labels in batches:
        logits = zero_shot_logits(
            model, model.encode_image(images.to(classifier.device)), classifier
        )
        top = logits.float().topk(min(5, logits.shape[-1]), dim=-1).indices.cpu()  # (B, 5)
        right = top == labels.cpu()[:, None]
        hits = [hits[0] + int(right[:, 0].sum()), hits[1] + int(right.any(dim=-1).sum())]
        n += len(labels)
    return {"top1": hits[0] / max(1, n), "top5": hits[1] / max(1, n), "n": n}
