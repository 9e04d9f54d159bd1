"""The offline demo path (registry, tokenizer, transforms, the bundled model, zero-shot)
imports none of open_clip, timm, transformers or torchvision (seconds each), nor the
torch compiler stack (torch._dynamo, sympy).

One interpreter runs the three paths in turn (demo, SigLIP, ConvNeXt / ResNet / EVA) and
prints what is imported after each: the paths are cumulative, so each test reads the list
after its own path (a heavy import shows up at the first path that pulls it in)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("open_clip", "timm", "transformers", "torchvision", "torch._dynamo", "sympy")

DEMO = """
import sys
import attn_clip
from PIL import Image

attn_clip.list_models(pretrained=True)
attn_clip.get_pretrained_cfg("ViT-B-32", "openai")
attn_clip.get_model_config("ViT-L-14")
model, preprocess, tokenizer = attn_clip.create_model_and_transforms("demo-shapes", pretrained=True)
labels = ["red circle", "blue square"]
classifier = attn_clip.build_zero_shot_classifier(model.eval(), tokenizer, labels)
image = preprocess(Image.new("RGB", (64, 48), (200, 30, 30)))[None]
attn_clip.predict(model, image, classifier)
len(attn_clip.IMAGENET_CLASSNAMES), attn_clip.OPENAI_IMAGENET_TEMPLATES[0]("dog")
report("demo")
"""


SIGLIP = """
import sys
import attn_clip
import torch

attn_clip.get_pretrained_cfg("ViT-SO400M-14-SigLIP-384", "webli")
small = {"vision": {"layers": 1}, "text": {"layers": 1, "vocab_size": 64}}
model = attn_clip.create_model("ViT-B-16-SigLIP", **small)
attn_clip.save_weights(model, PATH)
model = attn_clip.create_model("ViT-B-16-SigLIP", pretrained=PATH, **small)
model.encode_image(torch.randn(1, 3, 224, 224))
report("siglip")
"""


FAMILIES = """
import sys
import attn_clip
import torch

TEXT = {"layers": 1, "vocab_size": 64}
for name, small in [
    ("convnext_base", {"vision": {"convnext": {"depths": (1, 1, 1, 1)}}, "text": TEXT}),
    ("RN50", {"vision": {"layers": (1, 1, 1, 1)}, "text": TEXT}),
    ("EVA02-B-16", {"vision": {"layers": 1}, "text": TEXT}),
]:
    model = attn_clip.create_model(name, **small)
    attn_clip.save_weights(model, PATH)
    model = attn_clip.create_model(name, pretrained=PATH, **small)
    model.encode_image(torch.randn(1, 3, 224, 224))
report("families")
"""

REPORT = """
import json
import sys


def report(path):
    heavy = sorted({h for h in HEAVY for m in sys.modules if m == h or m.startswith(h + ".")})
    print(json.dumps([path, heavy]), flush=True)
"""


@pytest.fixture(scope="module")
def imported(tmp_path_factory) -> dict[str, list[str]]:
    """``{path: heavy packages imported once it has run}`` from one interpreter."""
    path = str(tmp_path_factory.mktemp("light") / "w.safetensors")
    code = f"HEAVY = {HEAVY!r}\nPATH = {path!r}\n{REPORT}{DEMO}{SIGLIP}{FAMILIES}"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    return dict(json.loads(line) for line in out.stdout.splitlines())


def test_demo_path_imports_no_heavy_packages(imported):
    assert imported["demo"] == []


def test_siglip_from_a_local_file_imports_no_heavy_packages(imported):
    """A SigLIP (timm image tower in open_clip) is built from the shipped table: no timm."""
    assert imported["siglip"] == []


def test_convnext_resnet_and_eva_from_a_local_file_import_no_heavy_packages(imported):
    """ConvNeXt and EVA02 (timm towers in open_clip, from the shipped table) and OpenAI's
    ResNet CLIPs build and load without timm or open_clip."""
    assert imported["families"] == []
