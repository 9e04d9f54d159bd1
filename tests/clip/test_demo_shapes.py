"""The bundled ``demo-shapes`` CLIP: registered, loads offline, names never-trained
colour-shape pairs, and recognises shapes drawn by other code than its training generator
(``attn_train.shapes``): this file's own renderer, on flat backgrounds of any shade."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from _support.independent_shapes import CLASSES, COLOURS, independent_set


@pytest.fixture(scope="module")
def demo():
    import attn_clip

    model, preprocess, tokenizer = attn_clip.create_model_and_transforms(
        "demo-shapes", pretrained=True
    )
    return model.eval(), preprocess, tokenizer


def top1(demo, images, names: list[str]) -> list[str]:
    import attn_clip

    model, preprocess, tokenizer = demo
    classifier = attn_clip.build_zero_shot_classifier(model, tokenizer, names, ["a photo of a {}"])
    x = torch.stack([preprocess(im) for im in images])
    return [names[i] for i in attn_clip.predict(model, x, classifier).argmax(dim=-1).tolist()]


# -- the bundled model ----------------------------------------------------------------------


def test_demo_shapes_is_registered_with_bundled_weights():
    import attn_clip
    from attn_clip.registry import BUNDLED_MODELS, default_pretrained_tag

    assert "demo-shapes" in attn_clip.list_models()  # bundled models are always listed
    assert "demo-shapes:shapes" in attn_clip.list_models(pretrained=True)
    cfg = attn_clip.get_model_config("demo-shapes")
    assert (cfg.vision.image_size, cfg.vision.patch_size) == (48, 8)
    assert default_pretrained_tag("demo-shapes") == "shapes"
    assert attn_clip.list_pretrained_tags("demo-shapes") == ["shapes"]
    src = attn_clip.get_pretrained_cfg("demo-shapes", "shapes")
    path = Path(src.file)
    assert path.is_file() and path.parent.name == "weights" and not src.hf_hub_id
    assert path.stat().st_size < 6_000_000  # "a few MB"
    assert src.preprocess == BUNDLED_MODELS["demo-shapes"].preprocess
    with pytest.raises(ValueError, match="pretrained=True needs a model with bundled weights"):
        attn_clip.create_model("ViT-B-32", pretrained=True)
    with pytest.raises(ValueError, match="unknown pretrained tag 'openai'.*shapes"):
        attn_clip.get_pretrained_cfg("demo-shapes", "openai")


def test_attn_clip_does_not_hold_or_import_the_shapes_generator():
    """The generated shapes are training data (attn_train.shapes); attn_clip, and loading
    the bundled model, never import attn_train."""
    code = (
        "import sys, importlib.util, attn_clip\n"
        "attn_clip.create_model('demo-shapes', pretrained=True)\n"
        "assert importlib.util.find_spec('attn_clip.shapes') is None\n"
        "assert not [m for m in sys.modules if m.startswith('attn_train')], 'attn_train'\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_demo_shapes_loads_offline_and_names_unseen_pairs(monkeypatch):
    import attn_clip
    from attn_core import hub
    from attn_train import shapes

    def no_network(*args, **kwargs):
        raise AssertionError("the bundled model must not touch the hub")

    monkeypatch.setattr(hub, "download", no_network)
    model, preprocess, tokenizer = attn_clip.create_model_and_transforms(
        "demo-shapes", pretrained=True
    )
    assert model.preprocess_cfg.size == 48
    demo = (model.eval(), preprocess, tokenizer)
    names = [f"{c} {s}" for c, s in shapes.combos("all")]  # all 30, 24 of them seen
    samples = shapes.make_dataset(30, seed=2024, split="heldout", image_size=48)
    want = [f"{s.colour} {s.shape}" for s in samples]
    got = top1(demo, [s.image() for s in samples], names)
    assert sum(g == w for g, w in zip(got, want, strict=True)) >= 21, got  # unseen pairs (28)
    # the same scenes rendered at 96 px, resized by the model's own preprocessing
    big = [
        shapes.render_shape(s.colour, s.shape, s.size, s.position, s.seed, image_size=96)
        for s in samples
    ]
    got = top1(demo, big, names)
    assert sum(g == w for g, w in zip(got, want, strict=True)) >= 22, got  # (27 of 30)


def test_independent_renderer_draws_what_it_says():
    images = independent_set(per_class=2, seed=1)
    assert len(images) == 60 and {name for _, name in images} == set(CLASSES)
    assert [im.tobytes() for im, _ in images[:5]] == [
        im.tobytes() for im, _ in independent_set(per_class=2, seed=1)[:5]
    ]
    for im, name in images:
        a = np.asarray(im, np.float32)
        base = np.array(COLOURS[name.split()[0]], np.float32)
        shape = np.linalg.norm(a - base, axis=-1) < 40
        side = max(np.ptp(np.nonzero(shape)[0]), np.ptp(np.nonzero(shape)[1])) + 1
        assert 0.2 <= side / im.width <= 0.8, (name, side, im.size)


def test_demo_shapes_recognises_shapes_drawn_by_other_code(demo):
    """300 images from this file's renderer (10 per class, all 30 classes, 6 of them never
    trained): the colour and the shape right (top-1 of 30) for at least 90% (99.3%; the
    first bundled model, trained on 27 fixed layouts at 32 px, scored 70.3%)."""
    images = independent_set(per_class=10, seed=0)
    got = top1(demo, [im for im, _ in images], CLASSES)
    right = [g == name for g, (_, name) in zip(got, images, strict=True)]
    wrong = [(name, g) for g, (_, name) in zip(got, images, strict=True) if g != name]
    assert sum(right) / len(right) >= 0.90, (sum(right) / len(right), wrong)
    colour = [g.split()[0] == name.split()[0] for g, (_, name) in zip(got, images, strict=True)]
    assert sum(colour) / len(colour) >= 0.98


def test_demo_shapes_meets_its_held_out_goal(demo):
    """The goal of the bundled model: >= 90% zero-shot top-1 (of all 30 classes) on images
    of the six colour-shape pairs it never saw in training; 300 fresh renders (281 right:
    93.7%; the model before it, 89.8% on its 600 held-out images, had 272 here)."""
    from attn_train import shapes

    names = [f"{c} {s}" for c, s in shapes.combos("all")]
    samples = shapes.make_dataset(300, seed=7, split="heldout", image_size=48)
    got = top1(demo, [s.image() for s in samples], names)
    right = sum(g == f"{s.colour} {s.shape}" for g, s in zip(got, samples, strict=True))
    assert right / len(samples) >= 0.90, right
