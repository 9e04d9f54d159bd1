"""A web demo of CLIP in the browser (Gradio): zero-shot classification, image search, captions.

    uv run apps/web.py                                   # then open http://127.0.0.1:7860
    uv run apps/web.py --model demo-shapes               # the bundled model: no network at all
    uv run apps/web.py --index shapes.idx                # + search an index (with its model)
    uv run apps/web.py --model ViT-B-16 --pretrained laion2b_s34b_b88k --port 8080
    uv run apps/web.py --model coca_ViT-B-32 --pretrained mscoco_finetuned_laion2b_s13b_b90k
    uv run apps/web.py --model nllb-clip-base --pretrained v1 --language de   # German labels

Zero-shot tab: an image (upload, paste, or one of the examples), labels (comma or newline
separated) and an optional template give a ranked bar chart of probabilities (a softmax over
the labels, or independent sigmoids for SigLIP-style models) and the heatmap of where the
model looked for the top label -- the computations of apps/zero_shot.py and its --explain.
Search tab (with --index, built by apps/retrieval.py index): a text or an image query gives
the top-k images of the index with their cosine similarities. An index built with another
model than the one loaded is not searched: the tab says so. Caption tab (with a CoCa model:
coca_ViT-B-32, ...): an image gives its caption(s) -- greedy, beam search or sampling -- as
apps/caption.py prints them; with another model the tab says it needs a CoCa.
--language CODE (NLLB code or ISO 639-1: deu_Latn, de, zh, ...) is the language of the labels
and queries typed in the page: an NLLB model's tokenizer reads them as that source language,
and for a language other than English the labels have no template (open_clip's are English)
unless one is typed -- the status line says so.

With no --model, the model is the index's (with --index), else ViT-B-32 (openai), or the
bundled demo-shapes when those weights cannot be had (offline). Bad input in the page (not
an image, a decompression bomb, no labels, an empty query) gets a clear message there and
the server keeps serving; bad command-line input prints one line on stderr and exits with
code 2; Ctrl-C stops the server (exit code 130). Requests are queued and run one at a time.
"""

from __future__ import annotations

import argparse
import os
import re
import threading
import time
import traceback
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _common import (  # the helpers shared by the command-line apps
    DEFAULT_MODEL,
    DEFAULT_PRETRAINED,
    DEMO_MODEL,
    LANGUAGE_HELP,
    PRECISIONS,
    HelpFormatter,
    InputError,
    LoadedModel,
    apply_language,
    check_language,
    fail,
    list_models_and_exit,
    load_image_file,
    load_model,
    run,
    warn,
)
from attn_clip.retrieval.errors import RetrievalError
from attn_clip.retrieval.fingerprint import describe_model

ASSETS = Path(__file__).resolve().parents[1] / "docs" / "assets"
EXAMPLES = [  # (image under docs/assets, labels): shown under the zero-shot inputs
    ("red_circle.png", "red circle, red square, blue circle, green star"),
    ("two_shapes.png", "red circle, blue star, green square"),
    ("cat.jpg", "cat, dog, a red car"),
]
DEFAULT_LABELS = EXAMPLES[0][1]
MAX_LABELS = 1000  # per request: the text tower runs once per label and template
MAX_LABEL_CHARS = 300
MAX_TEMPLATES = 100
SHOWN_LABELS = 10  # bars in the chart
MAX_TOP_K = 50  # search hits
THUMB = 256  # gallery thumbnails (pixels, longer side)
MAX_UPLOAD = "100mb"  # per file; larger uploads are refused by the server
QUEUE_SIZE = 64  # requests waiting; more get "queue full" in the page
CLASSIFIER_CACHE = 32  # label sets whose text embeddings are kept
DEFAULT_TEMPLATE = "a photo of a {}."  # apps/zero_shot.py's
DECODINGS = ("greedy", "beam search", "sampling")  # the caption tab's choices
MAX_BEAMS = 8
MAX_CAPTIONS = 5  # per image


# -- the functions behind the tabs (no Gradio needed) --------------------------------------


def parse_labels(text: str | None) -> list[str]:
    """Comma- or newline-separated labels, stripped, repeats dropped (order kept)."""
    labels = [s.strip() for s in re.split(r"[,\n]", text or "")]
    labels = list(dict.fromkeys(s for s in labels if s))
    if not labels:
        raise InputError("no labels: type at least one, separated by commas or new lines")
    if len(labels) > MAX_LABELS:
        raise InputError(f"too many labels: {len(labels)} (at most {MAX_LABELS})")
    for label in labels:
        if len(label) > MAX_LABEL_CHARS:
            raise InputError(f"label {label[:40]!r}... is longer than {MAX_LABEL_CHARS} characters")
    return labels


def parse_templates(text: str | None, default: list[str] | None = None) -> list[str]:
    """One template per line, each with exactly one ``{}`` for the label (repeats dropped);
    none: ``default`` (the default template)."""
    templates = [t.strip() for t in (text or "").splitlines() if t.strip()]
    if len(templates) > MAX_TEMPLATES:
        raise InputError(f"too many templates: {len(templates)} (at most {MAX_TEMPLATES})")
    from attn_clip.zero_shot import check_templates

    return check_templates(templates) or list(default or [DEFAULT_TEMPLATE])


def open_upload(path: str | os.PathLike | None, what: str = "image") -> Any:
    """The RGB image of an uploaded file, through the command-line apps' checks (not an
    image, truncated, decompression bomb, extreme size), named by its file name only."""
    if path is None or not str(path).strip():
        raise InputError(f"no {what}: upload one, paste one or pick an example")
    try:
        return load_image_file(path)[0]
    except InputError as e:  # the upload cache's folder means nothing to the user
        raise InputError(str(e).replace(str(path), Path(path).name)) from None


@dataclass
class Prediction:
    """Labels ranked best first, with their probabilities; the heatmap of the top one."""

    labels: list[str]
    probs: list[float]
    sigmoid: bool  # independent sigmoids (SigLIP-style) rather than a softmax
    heatmap: Any = None  # PIL image of the top label's relevancy, or None
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def scores(self, k: int = SHOWN_LABELS) -> dict[str, float]:
        return dict(zip(self.labels[:k], self.probs[:k], strict=True))

    @property
    def how(self) -> str:
        return "independent sigmoids" if self.sigmoid else "softmax"


@dataclass
class Captions:
    """An image's captions, best (or first sampled) first."""

    captions: list[str]
    how: str  # the decoding, in words
    seconds: float = 0.0


def caption_options(
    decoding: str,
    beams: Any = 3,
    num_captions: Any = 1,
    top_p: Any = 0.9,
    temperature: Any = 1.0,
    seed: Any = None,
) -> tuple[dict, str]:
    """The caption tab's choices -> ``(CoCa.generate options, the decoding in words)``
    (apps/caption.py's --beams / --sample --top-p --temperature --seed / --num-captions)."""

    def number(value: Any, name: str, kind: type = int) -> Any:
        try:
            out = kind(value)
            whole = kind is not int or out == float(value)
        except (TypeError, ValueError):
            raise InputError(f"{name} must be a number, got {value!r}") from None
        if not whole:
            raise InputError(f"{name} must be a whole number, got {value!r}")
        return out

    if decoding not in DECODINGS:
        raise InputError(f"decoding must be one of {', '.join(DECODINGS)}, got {decoding!r}")
    n = number(num_captions, "captions")
    if not 1 <= n <= MAX_CAPTIONS:
        raise InputError(f"captions must be between 1 and {MAX_CAPTIONS}, got {n}")
    if decoding == "greedy":
        if n > 1:
            raise InputError("greedy decoding gives one caption: pick beam search or sampling")
        return {}, "greedy"
    if decoding == "beam search":
        beams = number(beams, "beams")
        if not 2 <= beams <= MAX_BEAMS:
            raise InputError(f"beams must be between 2 and {MAX_BEAMS}, got {beams}")
        if n > beams:
            raise InputError(f"{n} captions need at least {n} beams (got {beams})")
        return {"num_beams": beams, "num_return_sequences": n}, f"beam search, {beams} beams"
    top_p, temperature = number(top_p, "top-p", float), number(temperature, "temperature", float)
    if not 0 < top_p <= 1:
        raise InputError(f"top-p must be in (0, 1], got {top_p}")
    if not temperature > 0:
        raise InputError(f"temperature must be > 0, got {temperature}")
    options = {"do_sample": True, "top_p": top_p, "temperature": temperature,
               "num_return_sequences": n}  # fmt: skip
    how = f"sampling, top-p {top_p:g}, temperature {temperature:g}"
    if seed is not None and str(seed).strip() != "":
        options["seed"] = number(seed, "seed")
        how += f", seed {options['seed']}"
    return options, how


@dataclass
class Hit:
    rank: int
    path: str  # relative to the index's folder (a shard index: the sample's id, shard/key)
    score: float
    image: Any  # thumbnail (PIL); a grey box when the file can no longer be read

    @property
    def caption(self) -> str:
        return f"#{self.rank} · {self.score:.3f} · {self.path}"


@dataclass
class SearchIndex:
    index: Any  # attn_clip.RetrievalIndex (written by apps/retrieval.py index)
    problem: str | None = None  # why it cannot be searched with the loaded model

    @property
    def base(self) -> Path:
        return self.index.base

    def describe(self) -> str:
        return (
            f"`{self.base.name}`: {len(self.index)} images under `{self.index.root}`, "
            f"built with {self.index.record.describe()}"
        )


def open_index(path: str | os.PathLike) -> SearchIndex:
    """An index written by apps/retrieval.py (manifest + embeddings, checked together)."""
    from attn_clip.retrieval import IndexNotFoundError, RetrievalIndex

    try:
        return SearchIndex(RetrievalIndex.open(path))
    except IndexNotFoundError as e:
        raise InputError(f"{e}; build it with: apps/retrieval.py index DIR --out") from None


def index_problem(idx: SearchIndex, loaded: LoadedModel, precision: str) -> str | None:
    """Why ``idx`` cannot be searched with ``loaded`` (another model, or other weights under
    the same name), or None; else the index searches with ``loaded`` from now on."""
    from attn_clip.retrieval import IndexModel

    recorded = idx.index.record
    if (loaded.name, loaded.pretrained) != (recorded.name, recorded.pretrained):
        return (
            f"{idx.base.name} was built with {recorded.describe()}, not with the loaded "
            f"{describe_model(loaded.name, loaded.pretrained)}: its embeddings only make sense "
            "with that model. Restart without --model / --pretrained to use the index's "
            "model, or rebuild the index with this one."
        )
    try:
        idx.index.model = IndexModel(**vars(loaded), precision=precision)
    except RetrievalError as e:
        return str(e)
    return None


class WebDemo:
    """The model (and index) behind the page; ``classify`` and ``search`` are the tabs.
    ``language``: the language of the labels (--language; None = English): the templates
    used when none is typed (:func:`attn_clip.zero_shot.templates_for_language`). The
    tokenizer is ``loaded``'s as it is (:func:`load_demo` sets its language)."""

    def __init__(
        self, loaded: LoadedModel, index: SearchIndex | None = None, language: str | None = None
    ) -> None:
        from attn_clip.zero_shot import templates_for_language

        self.loaded = loaded
        self.index = index
        self.language = language
        self.templates, self.template_note = templates_for_language(language)
        self._classifiers: OrderedDict[tuple, Any] = OrderedDict()
        self._lock = threading.Lock()  # the queue runs one request at a time; to be sure

    @property
    def model_name(self) -> str:
        return describe_model(self.loaded.name, self.loaded.pretrained)

    @property
    def sigmoid(self) -> bool:
        return self.loaded.model.logit_bias is not None

    @property
    def is_coca(self) -> bool:
        """The model has a captioning decoder (the caption tab is active)."""
        return self.loaded.model.config.is_coca

    def no_decoder(self) -> str:
        """What the caption tab says for a model without a captioning decoder."""
        import attn_clip

        return (
            f"{self.model_name} has no captioning decoder: captions need a CoCa model; "
            f"start the app with --model {' / '.join(attn_clip.list_models('*coca*'))} "
            "(and its --pretrained tag) or a folder saved from one"
        )

    def _classifier(self, labels: list[str], templates: list[str]):
        import attn_clip
        import torch

        key = (tuple(labels), tuple(templates))
        if key in self._classifiers:
            self._classifiers.move_to_end(key)
            return self._classifiers[key]
        loaded = self.loaded
        with torch.inference_mode():  # apps/zero_shot.py's classifier (batches of <= 800)
            classifier = attn_clip.build_zero_shot_classifier(
                loaded.model, loaded.tokenizer, labels, templates,
                batch_size=max(1, 800 // len(templates)), device=loaded.device,
            )  # fmt: skip
        self._classifiers[key] = classifier
        while len(self._classifiers) > CLASSIFIER_CACHE:
            self._classifiers.popitem(last=False)
        return classifier

    def _cut_labels(self, labels: list[str], templates: list) -> list[str]:
        """Labels whose prompt is longer than the text context (their end is cut off)."""
        tokenizer = self.loaded.tokenizer
        if not hasattr(tokenizer, "encode"):
            return []
        room = tokenizer.context_length - 2  # start and end of text
        return [
            label
            for label in labels
            if max(len(tokenizer.encode(t.format(label))) for t in templates) > room
        ]

    def classify(
        self,
        image_path: str | os.PathLike | None,
        labels_text: str | None,
        template_text: str | None = None,
        explain: bool = True,
        method: str = "relevancy",
    ) -> Prediction:
        """Rank the labels for the image (apps/zero_shot.py's computation) and, with
        ``explain``, draw the relevancy heatmap of the top label (its --explain)."""
        import attn_clip
        import torch

        labels = parse_labels(labels_text)
        templates = parse_templates(template_text, self.templates)
        typed = (template_text or "").strip() != ""
        image = open_upload(image_path)
        start = time.perf_counter()
        loaded, model = self.loaded, self.loaded.model
        with self._lock:
            classifier = self._classifier(labels, templates)
            with torch.inference_mode():
                x = loaded.preprocess(image)[None].to(loaded.device)
                logits = attn_clip.zero_shot_logits(model, model.encode_image(x), classifier)
                logits = logits.float()[0]
                probs = (logits.sigmoid() if self.sigmoid else logits.softmax(dim=-1)).cpu()
            order = probs.argsort(descending=True).tolist()
            pred = Prediction(
                [labels[i] for i in order], [float(probs[i]) for i in order], self.sigmoid
            )
            if self.template_note and not typed:
                pred.notes.append(self.template_note)
            if len(labels) == 1 and not self.sigmoid:
                pred.notes.append("a softmax over one label is always 100%: add labels to compare")
            if cut := self._cut_labels(labels, templates):
                pred.notes.append(
                    f"longer than the text context, cut off: {', '.join(map(repr, cut[:5]))}"
                    + (f" and {len(cut) - 5} more" if len(cut) > 5 else "")
                )
            if explain:  # needs gradients: outside inference mode, on a plain copy
                target = classifier[:, order[0]].clone()
                try:
                    pred.heatmap = attn_clip.explain_image(
                        model, image, target, method=method, transform=loaded.preprocess
                    )
                except (ValueError, NotImplementedError, AttributeError, RuntimeError) as e:
                    pred.notes.append(f"no heatmap for this model ({type(e).__name__}: {e})")
        pred.seconds = time.perf_counter() - start
        return pred

    def caption(
        self,
        image_path: str | os.PathLike | None,
        decoding: str = "greedy",
        beams: Any = 3,
        num_captions: Any = 1,
        top_p: Any = 0.9,
        temperature: Any = 1.0,
        seed: Any = None,
    ) -> Captions:
        """The image's caption(s) from the CoCa decoder (apps/caption.py's computation)."""
        import torch

        if not self.is_coca:
            raise InputError(self.no_decoder())
        options, how = caption_options(decoding, beams, num_captions, top_p, temperature, seed)
        image = open_upload(image_path)
        start = time.perf_counter()
        loaded = self.loaded
        with self._lock, torch.inference_mode():
            x = loaded.preprocess(image)[None].to(loaded.device)
            captions = loaded.model.caption(x, **options)
        return Captions(captions, how, time.perf_counter() - start)

    def search(
        self, text: str | None, image_path: str | os.PathLike | None, k: int = 8
    ) -> list[Hit]:
        """The top-``k`` images of the index for a text or an image query."""
        import torch

        if self.index is None:
            raise InputError(
                "no index: start the app with --index IDX (built by apps/retrieval.py index)"
            )
        if self.index.problem:
            raise InputError(self.index.problem)
        text = (text or "").strip()
        has_image = image_path is not None and str(image_path).strip() != ""
        if not text and not has_image:
            raise InputError("empty query: type a text or drop an image")
        if text and has_image:
            raise InputError("two queries: search for a text or an image, not both (clear one)")
        try:
            k = int(k)
        except (TypeError, ValueError):
            raise InputError(f"top-k must be a number, got {k!r}") from None
        if not 1 <= k <= MAX_TOP_K:
            raise InputError(f"top-k must be between 1 and {MAX_TOP_K}, got {k}")
        image = open_upload(image_path, "query image") if has_image else None
        with self._lock, torch.inference_mode():
            found = self.index.index.search(text if image is None else image, k=k)
        return [
            Hit(rank, h.id, h.score, thumbnail(h.path, h.key)) for rank, h in enumerate(found, 1)
        ]


def thumbnail(path: Path, key: str | None = None):
    """The image at ``path`` (a shard index's hit: sample ``key`` of the tar ``path``) scaled
    to fit THUMB pixels, or a grey box when it is gone."""
    from attn_clip.retrieval.tars import sample_image_at
    from attn_vision.wds import BadSample
    from PIL import Image, ImageOps

    try:
        image = load_image_file(path)[0] if key is None else sample_image_at(path, key)
    except (InputError, BadSample):  # moved or deleted since indexing
        return Image.new("RGB", (THUMB, THUMB), (200, 200, 200))
    return ImageOps.contain(image, (THUMB, THUMB))


# -- the page ------------------------------------------------------------------------------


def _gradio():
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # no calls home
    try:
        import gradio as gr
    except ImportError:
        raise InputError(
            "Gradio is not installed: uv sync --extra web (or pip install gradio)"
        ) from None
    return gr


def checked_image(gr, **kwargs):
    """A gr.Image input whose value is the uploaded file's path, handed over as it is: the
    checks are apps/_common.py's (Gradio's own preprocessing would open it unchecked first).
    (An instance attribute, not a subclass: Gradio writes a .pyi next to the file that
    defines a component class.)"""
    image = gr.Image(type="filepath", image_mode=None, sources=["upload", "clipboard"], **kwargs)
    gradio_preprocess = image.preprocess

    def preprocess(payload):
        if payload is None:
            return None
        if payload.path is not None and not (payload.url or "").startswith("data:"):
            return str(payload.path)  # in Gradio's upload folder (Gradio checks that)
        try:  # a data URL: Gradio writes it to a file
            return gradio_preprocess(payload)
        except Exception as e:
            raise gr.Error(f"not an image: {e}", print_exception=False) from None

    image.preprocess = preprocess
    return image


def _md(text: str) -> str:
    """``text`` shown literally in Markdown (labels and file names may contain * _ < ...)."""
    return re.sub(r"([\\`*_{}\[\]<>()#+|~!-])", r"\\\1", str(text))


def _error(e: Exception) -> str:
    """The status line for a failed request: the message of a bad input; one line for a
    bug (its traceback goes to the server's console, never to the page)."""
    if isinstance(e, InputError):
        return f"**Error:** {_md(e)}"
    traceback.print_exc()
    return (
        f"**Error:** internal error ({_md(type(e).__name__)}: {_md(e)}); the server keeps running"
    )


def classify_outputs(demo: WebDemo, image, labels, template, explain=True, method="relevancy"):
    """The zero-shot tab: ``(scores for the chart or None, heatmap or None, heatmap title,
    status text)``; bad input gives its message in the status, never an exception."""
    try:
        pred = demo.classify(image, labels, template, explain, method)
    except Exception as e:
        return None, None, "Heatmap", _error(e)
    title = f"where the model looked for '{pred.labels[0]}'"
    status = f"**{_md(pred.labels[0])}** first of {len(pred.labels)} label(s) " + _md(
        f"({100 * pred.probs[0]:.2f}%, {pred.how}, {pred.seconds:.2f} s)"
    )
    status = "\n\n".join([status] + [f"note: {_md(n)}" for n in pred.notes])
    return pred.scores(), pred.heatmap, title, status


def search_outputs(demo: WebDemo, text, image, k=8):
    """The search tab: ``(gallery items [(thumbnail, caption)] or None, status text)``."""
    try:
        hits = demo.search(text, image, k)
    except Exception as e:
        return None, _error(e)
    what = f"'{text.strip()}'" if (text or "").strip() else "the image"
    status = f"{len(hits)} best matches for {what} (cosine similarity)"
    return [(h.image, h.caption) for h in hits], _md(status)


def caption_outputs(demo: WebDemo, image, decoding="greedy", beams=3, num_captions=1,
                    top_p=0.9, temperature=1.0, seed=None):  # fmt: skip
    """The caption tab: ``(the captions, one per line, or "", status text)``."""
    try:
        result = demo.caption(image, decoding, beams, num_captions, top_p, temperature, seed)
    except Exception as e:
        return "", _error(e)
    n = len(result.captions)
    status = f"{n} caption{'s' if n > 1 else ''} ({result.how}, {result.seconds:.2f} s)"
    return "\n".join(result.captions), _md(status)


def build_app(demo: WebDemo):
    """The Gradio Blocks of the three tabs (not launched)."""
    gr = _gradio()

    def on_classify(image, labels, template, explain, method):
        scores, heat, title, status = classify_outputs(
            demo, image, labels, template, explain, method
        )
        return scores, gr.update(value=heat, label=title), status

    def on_search(text, image, k):
        return search_outputs(demo, text, image, k)

    def on_caption(image, decoding, beams, num_captions, top_p, temperature, seed):
        return caption_outputs(demo, image, decoding, beams, num_captions, top_p, temperature,
                               seed)  # fmt: skip

    one_line = {"concurrency_id": "model", "concurrency_limit": 1}  # all events: one line
    scoring = "independent sigmoids (SigLIP-style)" if demo.sigmoid else "a softmax over the labels"
    language = f" · language: {_md(demo.language)}" if demo.language else ""
    with gr.Blocks(title="attn-zoo CLIP demo") as app:
        gr.Markdown(
            f"# attn-zoo CLIP demo\nModel: **{_md(demo.model_name)}** · scores: {scoring}"
            + language
        )
        with gr.Tab("Zero-shot classification", id="zero-shot"):
            with gr.Row():
                with gr.Column():
                    zs_image = checked_image(
                        gr,
                        label="Image (upload or paste)",
                        elem_id="zs-image",
                    )
                    zs_labels = gr.Textbox(
                        value=DEFAULT_LABELS,
                        lines=3,
                        label="Labels (comma or newline separated)",
                        elem_id="zs-labels",
                    )
                    zs_template = gr.Textbox(
                        placeholder="(none: each label as it is)"
                        if demo.template_note
                        else DEFAULT_TEMPLATE,
                        label="Template, with {} for the label (optional; one per line)",
                        elem_id="zs-template",
                    )
                    with gr.Row():
                        zs_explain = gr.Checkbox(value=True, label="Heatmap of the top label")
                        zs_method = gr.Radio(
                            ["relevancy", "rollout"], value="relevancy", label="Heatmap method"
                        )
                    zs_button = gr.Button("Classify", variant="primary", elem_id="zs-run")
                with gr.Column():
                    zs_status = gr.Markdown(elem_id="zs-status")
                    zs_scores = gr.Label(
                        num_top_classes=SHOWN_LABELS, label="Probabilities", elem_id="zs-scores"
                    )
                    zs_heat = gr.Image(
                        type="pil", label="Heatmap", interactive=False, elem_id="zs-heatmap"
                    )
            examples = [[str(ASSETS / name), labels] for name, labels in EXAMPLES]
            examples = [e for e in examples if Path(e[0]).is_file()]
            if examples:
                gr.Examples(examples, inputs=[zs_image, zs_labels], label="Examples")
            zs_inputs = [zs_image, zs_labels, zs_template, zs_explain, zs_method]
            zs_outputs = [zs_scores, zs_heat, zs_status]
            zs_button.click(on_classify, zs_inputs, zs_outputs, api_name="classify", **one_line)
            zs_labels.submit(on_classify, zs_inputs, zs_outputs, api_name=False, **one_line)

        with gr.Tab("Image search", id="search"):
            if demo.index is None:
                gr.Markdown(
                    "No index loaded. Build one with `uv run apps/retrieval.py index PHOTOS "
                    "--out photos.idx`, then start this app with `--index photos.idx`."
                )
            else:
                info = demo.index.describe()
                if demo.index.problem:
                    info += f"\n\n**Cannot search it:** {demo.index.problem}"
                gr.Markdown(info)
            ready = demo.index is not None and not demo.index.problem
            with gr.Row():
                with gr.Column():
                    s_text = gr.Textbox(
                        label="Text query", placeholder="a red circle", elem_id="s-text"
                    )
                    s_image = checked_image(
                        gr,
                        label="... or an image query",
                        elem_id="s-image",
                    )
                    s_k = gr.Slider(1, MAX_TOP_K, value=8, step=1, label="Results (top-k)")
                    s_button = gr.Button(
                        "Search", variant="primary", interactive=ready, elem_id="s-run"
                    )
                with gr.Column(scale=2):
                    s_status = gr.Markdown(elem_id="s-status")
                    s_gallery = gr.Gallery(
                        label="Best matches", columns=3, object_fit="contain", elem_id="s-gallery"
                    )
            s_button.click(
                on_search,
                [s_text, s_image, s_k],
                [s_gallery, s_status],
                api_name="search",
                **one_line,
            )
            s_text.submit(
                on_search, [s_text, s_image, s_k], [s_gallery, s_status], api_name=False, **one_line
            )

        with gr.Tab("Caption", id="caption"):
            if not demo.is_coca:
                gr.Markdown(_md(demo.no_decoder()), elem_id="cap-notice")
            else:
                with gr.Row():
                    with gr.Column():
                        c_image = checked_image(
                            gr, label="Image (upload or paste)", elem_id="c-image"
                        )
                        c_decoding = gr.Radio(
                            list(DECODINGS), value="greedy", label="Decoding", elem_id="c-decoding"
                        )
                        with gr.Row():
                            c_beams = gr.Slider(2, MAX_BEAMS, value=3, step=1, label="Beams")
                            c_n = gr.Slider(1, MAX_CAPTIONS, value=1, step=1, label="Captions")
                        with gr.Row():
                            c_top_p = gr.Slider(
                                0.05, 1, value=0.9, step=0.05, label="Sampling: top-p"
                            )
                            c_temp = gr.Slider(0.1, 2, value=1.0, step=0.1, label="Temperature")
                            c_seed = gr.Number(value=0, precision=0, label="Seed (empty: random)")
                        c_button = gr.Button("Caption", variant="primary", elem_id="c-run")
                    with gr.Column():
                        c_status = gr.Markdown(elem_id="c-status")
                        c_text = gr.Textbox(
                            lines=5, label="Caption(s)", interactive=False, elem_id="c-text"
                        )
                c_button.click(
                    on_caption,
                    [c_image, c_decoding, c_beams, c_n, c_top_p, c_temp, c_seed],
                    [c_text, c_status],
                    api_name="caption",
                    **one_line,
                )
    # one request at a time, a bounded waiting line: two users cannot exhaust memory
    app.queue(default_concurrency_limit=1, max_size=QUEUE_SIZE)
    return app


# -- the command line ----------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n")[0],
        formatter_class=HelpFormatter,
        epilog="examples:\n" + "\n".join(__doc__.split("\n")[2:6]),
    )
    p.add_argument(
        "--model",
        help=f"architecture, hf-hub:ID, folder, or {DEMO_MODEL} (default: the index's model, "
        f"else {DEFAULT_MODEL}, else {DEMO_MODEL} offline)",
    )
    p.add_argument("--pretrained", help="tag, or checkpoint file / folder")
    p.add_argument("--index", metavar="IDX", help="an index built by apps/retrieval.py index")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: all)")
    p.add_argument("--port", type=int, default=7860, help="port to listen on")
    p.add_argument("--device", help="cpu, cuda, cuda:1, mps (default: cuda if available)")
    p.add_argument("--precision", choices=PRECISIONS, default="fp32", help="weight precision")
    p.add_argument("--language", metavar="CODE", help=LANGUAGE_HELP + " (default: English)")
    p.add_argument(
        "--list-models", action="store_true", help="list every model name and its tags, then exit"
    )
    return p.parse_args(argv)


def load_demo(args: argparse.Namespace, language: str | None = None) -> WebDemo:
    """The model and index the command line names, for texts in ``language`` (--language);
    InputError on any bad input."""
    check_language(language)
    if not 1 <= args.port <= 65535:
        raise InputError(f"--port must be between 1 and 65535, got {args.port}")
    _gradio()  # fail fast, before loading a model
    idx = open_index(args.index) if args.index else None
    if idx is not None and args.model is None and args.pretrained is None:
        recorded = idx.index.record
        loaded = load_model(recorded.name, recorded.pretrained, args.device, args.precision)
    elif args.model is None and args.pretrained is None:
        try:
            loaded = load_model(DEFAULT_MODEL, DEFAULT_PRETRAINED, args.device, args.precision)
        except InputError as e:
            if not str(e).startswith("weights not available"):
                raise
            warn(
                f"{DEFAULT_MODEL} ({DEFAULT_PRETRAINED}) weights not available (offline?): "
                f"serving the bundled {DEMO_MODEL} instead (pass --model to choose)"
            )
            loaded = load_model(DEMO_MODEL, None, args.device, args.precision)
    else:
        loaded = load_model(args.model, args.pretrained, args.device, args.precision)
    if idx is not None:
        idx.problem = index_problem(idx, loaded, args.precision)
        if idx.problem:
            warn(f"search disabled: {idx.problem}")
    apply_language(loaded, language)  # after the index's check (its probe text is as is)
    if idx is not None and not idx.problem:
        idx.index.model.tokenizer = loaded.tokenizer  # text queries in that language too
    return WebDemo(loaded, idx, language)


def serve(app, host: str, port: int, what: str) -> None:
    """Serve until Ctrl-C (then close the server and raise KeyboardInterrupt)."""
    try:
        app.launch(
            server_name=host,
            server_port=port,
            prevent_thread_lock=True,
            quiet=True,
            ssr_mode=False,
            mcp_server=False,
            max_file_size=MAX_UPLOAD,
            allowed_paths=[str(ASSETS)],  # the example images
        )
    except OSError as e:
        why = e.strerror or "in use, or not an address of this machine"
        raise InputError(
            f"cannot listen on {host}:{port} ({why}): pass another --port or --host"
        ) from None
    shown = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    print(f"serving {what} on http://{shown}:{port} (Ctrl-C to stop)", flush=True)
    try:
        while True:
            time.sleep(0.5)
    except KeyboardInterrupt:
        app.close(verbose=False)
        raise


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.list_models:
        return list_models_and_exit()
    try:
        demo = load_demo(args, args.language)
        serve(build_app(demo), args.host, args.port, demo.model_name)
    except InputError as e:
        return fail(str(e))
    return 0


if __name__ == "__main__":
    run(main)
