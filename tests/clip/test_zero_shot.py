"""Zero-shot: classifier weights equal open_clip's; softmax vs sigmoid scores."""

from __future__ import annotations

import open_clip
import pytest
import torch
from attn_clip import (
    CLIP,
    IMAGENET_CLASSNAMES,
    OPENAI_IMAGENET_TEMPLATES,
    SIMPLE_TEMPLATES,
    CLIPConfig,
    Tokenizer,
    build_zero_shot_classifier,
    load_checkpoint,
    predict,
    zero_shot_logits,
)
from torch.testing import assert_close


def test_template_sets():
    assert len(OPENAI_IMAGENET_TEMPLATES) == 80 and len(IMAGENET_CLASSNAMES) == 1000
    assert OPENAI_IMAGENET_TEMPLATES[0]("dog") == "a bad photo of a dog."
    assert IMAGENET_CLASSNAMES[0] == "tench"
    assert SIMPLE_TEMPLATES == ("a photo of a {}.",)


@pytest.mark.parametrize(
    ("templates", "batch_size"),
    [
        (OPENAI_IMAGENET_TEMPLATES[:12], 3),
        (SIMPLE_TEMPLATES, None),
        (["a {} photo.", "art of a {}"], 2),
    ],
)
def test_classifier_equals_open_clip(h, templates, batch_size):
    cfg = h.oc_cfg()
    ref = h.make_open_clip(cfg)
    ours = load_checkpoint(CLIP(CLIPConfig.from_open_clip(cfg)).eval(), ref.state_dict())
    tokenizer = Tokenizer(20)
    classes = list(IMAGENET_CLASSNAMES[:7])
    weights = build_zero_shot_classifier(ours, tokenizer, classes, templates, batch_size=batch_size)
    expected = open_clip.build_zero_shot_classifier(
        ref, tokenizer, classes, templates, num_classes_per_batch=batch_size
    )
    assert weights.shape == (32, 7)
    assert_close(weights, expected, atol=1e-5, rtol=1e-5)
    assert_close(weights.norm(dim=0), torch.ones(7))


def test_classifier_input_errors(h):
    model = CLIP(CLIPConfig.from_open_clip(h.oc_cfg())).eval()
    with pytest.raises(ValueError, match="classnames"):
        build_zero_shot_classifier(model, Tokenizer(20), [], SIMPLE_TEMPLATES)
    with pytest.raises(ValueError, match="templates"):
        build_zero_shot_classifier(model, Tokenizer(20), ["cat"], "a photo of a {}.")


def test_predict_softmax_for_clip_and_sigmoid_for_siglip(h, tiny_images):
    classes = ["cat", "dog", "car", "tree"]
    for bias, softmax in ((None, True), (-10.0, False)):
        model = CLIP(CLIPConfig.from_open_clip(h.oc_cfg(init_logit_bias=bias))).eval()
        clf = build_zero_shot_classifier(model, Tokenizer(20), classes)
        scores = predict(model, tiny_images, clf)
        assert scores.shape == (3, 4) and ((scores >= 0) & (scores <= 1)).all()
        with torch.no_grad():
            logits = zero_shot_logits(model, model.encode_image(tiny_images), clf)
            expected = model(
                tiny_images, Tokenizer(20)(["a photo of a " + c + "." for c in classes])
            )
        assert_close(logits, expected.logits_per_image, atol=1e-4, rtol=1e-4)
        if softmax:
            assert_close(scores.sum(-1), torch.ones(3))
        else:
            assert_close(scores, torch.sigmoid(logits))
            assert not torch.allclose(scores.sum(-1), torch.ones(3))


def test_evaluate_zero_shot_counts_top1_and_top5(h):
    from attn_clip import evaluate_zero_shot

    classes = ["cat", "dog", "car", "tree", "boat", "house", "bird"]
    model = h.perturb_(CLIP(CLIPConfig.from_open_clip(h.oc_cfg())))
    images = torch.randn(10, 3, 32, 32)
    clf = build_zero_shot_classifier(model, Tokenizer(20), classes, batch_size=None)
    with torch.no_grad():
        ranked = zero_shot_logits(model, model.encode_image(images), clf).argsort(-1, True)
    labels = torch.cat([ranked[:4, 0], ranked[4:7, 3], ranked[7:, 6]])  # top-1, top-5, neither
    batches = [(images[:6], labels[:6]), (images[6:], labels[6:])]
    m = evaluate_zero_shot(model, Tokenizer(20), batches, classes)
    assert m == {"top1": 0.4, "top5": 0.7, "n": 10}
    assert evaluate_zero_shot(model, Tokenizer(20), [], classes)["n"] == 0


def test_match_probability_is_siglips_sigmoid(h):
    from attn_clip import match_probability

    cosine = torch.tensor([[0.9, 0.1], [-0.2, 0.3]])
    clip = CLIP(CLIPConfig.from_open_clip(h.oc_cfg())).eval()
    assert match_probability(clip, cosine) is None  # a softmax model: no absolute scale
    siglip = CLIP(CLIPConfig.from_open_clip(h.oc_cfg(init_logit_bias=-10.0))).eval()
    want = torch.sigmoid(siglip.logit_scale.exp() * cosine + siglip.logit_bias)
    assert_close(match_probability(siglip, cosine), want.detach())
