"""attn_vision.hf.processor: a transformers ``preprocessor_config.json`` -> our transform,
whose tensors equal transformers' image processor's (PIL backend) on 3 real photos."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import transformers as T
from attn_vision.hf.processor import data_config, read_preprocessor_config
from attn_vision.transforms import create_transform
from PIL import Image

skimage_data = pytest.importorskip("skimage.data")

IMAGENET = dict(image_mean=[0.485, 0.456, 0.406], image_std=[0.229, 0.224, 0.225])
PROCESSORS = {  # name -> transformers' PIL-backend processor, as the hub configs set it up
    "vit": lambda: T.ViTImageProcessorPil(),  # google/vit-*: 224 x 224, bilinear, 0.5
    "deit": lambda: T.DeiTImageProcessorPil(**IMAGENET),  # facebook/deit-*: 256 -> crop 224
    "dinov2": lambda: T.BitImageProcessorPil(  # facebook/dinov2-*: shorter side 256, crop 224
        size={"shortest_edge": 256}, crop_size={"height": 224, "width": 224}, **IMAGENET
    ),
    "convnext": lambda: T.ConvNextImageProcessorPil(size={"shortest_edge": 224}, **IMAGENET),
    "convnext_384": lambda: T.ConvNextImageProcessorPil(size={"shortest_edge": 384}, **IMAGENET),
}
MODEL = SimpleNamespace(in_chans=3)


@pytest.fixture(scope="module")
def photos() -> dict[str, Image.Image]:
    # rocket (427 x 640) -> 256 x 383 for DINOv2: a crop offset of 79.5, where
    # transformers' floor and torchvision's rounding part
    names = ("astronaut", "chelsea", "rocket")
    return {n: Image.fromarray(getattr(skimage_data, n)()) for n in names}


def _config(processor) -> dict:
    """The ``preprocessor_config.json`` that ``save_pretrained`` writes for ``processor``."""
    return json.loads(processor.to_json_string())


@pytest.mark.parametrize("name", list(PROCESSORS))
def test_tensors_equal_transformers(photos, name):
    processor = PROCESSORS[name]()
    transform = create_transform(data_config(_config(processor), MODEL))
    for photo, img in photos.items():
        expected = torch.from_numpy(processor(img, return_tensors="np")["pixel_values"][0])
        torch.testing.assert_close(transform(img), expected, atol=1e-5, rtol=0, msg=photo)


def test_crop_offset_is_transformers_floor(photos):
    cfg = data_config(_config(PROCESSORS["dinov2"]()), MODEL)
    assert cfg["crop_offset"] == "floor"
    img = photos["rocket"]
    rounded = create_transform({**cfg, "crop_offset": "round"})(img)
    assert not torch.allclose(create_transform(cfg)(img), rounded, atol=1e-3)


def test_read_from_a_saved_folder(tmp_path):
    PROCESSORS["deit"]().save_pretrained(tmp_path)
    cfg = data_config(read_preprocessor_config(tmp_path), MODEL)
    assert (cfg["input_size"], cfg["crop_mode"], cfg["interpolation"]) == (
        (3, 224, 224),
        "squash",
        "bicubic",
    )
    assert read_preprocessor_config(tmp_path / "missing") is None
    (tmp_path / "preprocessor_config.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="JSON object"):
        read_preprocessor_config(tmp_path)


@pytest.mark.parametrize(
    "changes, match",
    [
        (dict(do_resize=False), "do_resize=False"),
        (dict(rescale_factor=1 / 127.5), "rescale_factor"),
        (dict(do_rescale=False), "do_rescale=False"),
        (dict(size={"shortest_edge": 256}, do_center_crop=False), "without do_center_crop"),
        (dict(do_center_crop=True, crop_size={"height": 200, "width": 224}), "proportion"),
        (dict(resample=9), "resample=9"),
        (dict(size={"longest_edge": 9}), "size="),
        (dict(do_pad=True), "do_pad"),
    ],
)
def test_unsupported_settings_are_refused_by_name(changes, match):
    with pytest.raises(ValueError, match=match):
        data_config({**_config(PROCESSORS["vit"]()), **changes}, MODEL)


def test_no_normalize_and_legacy_int_sizes(photos):
    processor = T.ViTImageProcessorPil(do_normalize=False, size=32)
    cfg = data_config({**_config(processor), "size": 32}, MODEL)  # transformers 4's int size
    assert cfg["input_size"] == (3, 32, 32)
    expected = processor(photos["chelsea"], return_tensors="np")["pixel_values"][0]
    assert np.abs(create_transform(cfg)(photos["chelsea"]).numpy() - expected).max() < 1e-5


@pytest.mark.parametrize("name", ["vit", "dinov2"])
def test_torchvision_backend_is_within_one_grey_level(photos, name):
    """transformers' default (torchvision) backend resamples uint8 tensors: its pixels
    differ from PIL's (and ours) by at most one grey level, 1 / 255 / std after normalising."""
    pil = PROCESSORS[name]()
    config = {k: v for k, v in _config(pil).items() if k != "image_processor_type"}
    processor = getattr(T, type(pil).__name__.removesuffix("Pil"))(**config)
    transform = create_transform(data_config(_config(pil), MODEL))
    one_level = 1 / 255 / min(pil.image_std)
    for img in photos.values():
        expected = processor(img, return_tensors="pt")["pixel_values"][0]
        assert (transform(img) - expected).abs().max() <= one_level + 1e-5


# preprocessor_config.json of older hub folders (transformers 4's feature extractors)
LEGACY = {
    "google/vit-base-patch16-224": ("ViTImageProcessorPil", dict(
        feature_extractor_type="ViTFeatureExtractor", do_normalize=True, do_resize=True,
        image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5], resample=2, size=224)),
    "microsoft/resnet-50": ("ConvNextImageProcessorPil", dict(
        feature_extractor_type="ConvNextFeatureExtractor", crop_pct=0.875, do_normalize=True,
        do_resize=True, resample=3, size=224, **IMAGENET)),
    "facebook/deit-base-distilled-patch16-224": ("DeiTImageProcessorPil", dict(
        feature_extractor_type="DeiTFeatureExtractor", crop_size=224, do_center_crop=True,
        do_normalize=True, do_resize=True, resample=3, size=256, **IMAGENET)),
}  # fmt: skip


@pytest.mark.parametrize("repo", list(LEGACY))
def test_older_hub_configs(photos, tmp_path, repo):
    class_name, config = LEGACY[repo]
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(config))
    processor = getattr(T, class_name).from_pretrained(tmp_path)
    transform = create_transform(data_config(read_preprocessor_config(tmp_path), MODEL))
    for photo, img in photos.items():
        expected = torch.from_numpy(processor(img, return_tensors="np")["pixel_values"][0])
        torch.testing.assert_close(transform(img), expected, atol=1e-5, rtol=0, msg=photo)
