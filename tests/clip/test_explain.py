"""attn_clip.explain: heatmaps of the bundled demo model, drawn on a display-size copy."""

from __future__ import annotations

import numpy as np
import pytest
from attn_clip import create_model, explain_image
from PIL import Image


@pytest.fixture(scope="module")
def model():
    return create_model("demo-shapes", pretrained=True)


def test_large_images_get_a_display_size_heatmap(model):
    image = Image.new("RGB", (3000, 2000), "white")
    out = explain_image(model, image, "a red circle")
    assert out.size == (1024, 683) and out.mode == "RGB"
    small = Image.new("RGB", (300, 200), "white")
    assert explain_image(model, small, "a red circle").size == (300, 200)
    full = explain_image(model, image.resize((1200, 800)), "a red circle", max_size=None)
    assert full.size == (1200, 800)
    # the same heatmap, whatever the size it is drawn at
    a = np.asarray(explain_image(model, small, "a red circle").resize((150, 100)), np.float32)
    b = np.asarray(full.resize((150, 100)), np.float32)
    assert np.abs(a - b).mean() < 3.0


@pytest.mark.parametrize(
    ("name", "small", "tower"),
    [
        ("RN50", {"vision": {"layers": (1, 1, 1, 1), "image_size": 64}}, "ResNet"),
        ("convnext_base", {"vision": {"convnext": {"depths": (1, 1, 1, 1)}}}, "ConvNeXt"),
    ],
)
def test_cnn_towers_are_refused_by_name(name, small, tower):
    """The heatmaps read a ViT's attention; a ResNet / ConvNeXt tower is a clear ValueError."""
    import torch
    from attn_clip import image_relevancy

    cnn = create_model(name, text={"layers": 1}, **small)
    with pytest.raises(ValueError, match=f"ViT image tower.*is a {tower}"):
        explain_image(cnn, Image.new("RGB", (64, 64)), torch.randn(cnn.config.embed_dim))
    with pytest.raises(ValueError, match=f"is a {tower}"):
        image_relevancy(cnn, torch.randn(1, 3, 64, 64), method="rollout")
