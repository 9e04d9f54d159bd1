"""attn_vision.images, the one image decoder: the apps (apps/_common.py re-exports it) and
training (attn_train.data.load_rgb) get the same pixels and the same tensor for every kind of
file, and those pixels are right (alpha on white, EXIF rotation, 16-bit rescaled)."""

from __future__ import annotations

from pathlib import Path

import _common  # apps/_common.py
import numpy as np
import pytest
import torch
from attn_core.errors import InputError
from attn_train.data import CsvImageTextDataset, load_rgb
from attn_vision import images
from attn_vision.images import ImageError, load_image_file, read_captions_csv
from PIL import Image
from torchvision import transforms as T

TO_TENSOR = T.Compose([T.Resize(8), T.CenterCrop(8), T.ToTensor()])


def _rgba() -> Image.Image:
    a = np.zeros((6, 4, 4), np.uint8)
    a[..., 0], a[..., 3] = 200, 255
    a[0, 0, 3] = 0  # one transparent pixel: white, not the black of .convert("RGB")
    a[1, 1, 3] = 128
    return Image.fromarray(a, "RGBA")


def _palette_with_transparency() -> Image.Image:
    img = Image.new("P", (4, 6), 1)
    img.putpalette([0, 0, 0, 10, 200, 30] + [0] * 762)
    img.putpixel((0, 0), 0)
    img.info["transparency"] = 0
    return img


def _sixteen_bit() -> Image.Image:
    a = np.linspace(0, 65535, 24, dtype=np.uint16).reshape(6, 4)
    return Image.fromarray(a)  # uint16: mode I;16


def _exif_rotated() -> Image.Image:
    a = np.zeros((12, 8, 3), np.uint8)
    a[:4, :4] = (255, 0, 0)
    img = Image.fromarray(a, "RGB")
    exif = img.getexif()
    exif[0x0112] = 6  # Orientation: rotate 90 degrees clockwise to view
    img.info["exif"] = exif.tobytes()
    return img


CASES = {
    "RGBA.png": _rgba,
    "LA.png": lambda: _rgba().convert("LA"),
    "P_transparency.png": _palette_with_transparency,
    "CMYK.jpg": lambda: Image.new("CMYK", (4, 6), (10, 200, 30, 40)),
    "I16.png": _sixteen_bit,
    "EXIF_rotated.jpg": _exif_rotated,
}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("modes")
    out = {}
    for name, make in CASES.items():
        img = make()
        kwargs = {"exif": img.info["exif"]} if "exif" in img.info else {}
        if "transparency" in img.info:
            kwargs["transparency"] = img.info["transparency"]
        img.save(root / name, **kwargs)
        out[name] = root / name
    return out


@pytest.mark.parametrize("name", sorted(CASES))
def test_apps_and_training_get_the_same_pixels_and_tensor(files, name):
    apps_image, digest = _common.load_image_file(files[name])
    train_image = load_rgb(files[name])
    assert apps_image.mode == train_image.mode == "RGB"
    assert np.array_equal(np.asarray(apps_image), np.asarray(train_image))
    assert torch.equal(TO_TENSOR(apps_image), TO_TENSOR(train_image))
    assert len(digest) == 64


def test_the_pixels_are_right(files):
    rgba = np.asarray(load_rgb(files["RGBA.png"]))
    assert tuple(rgba[0, 0]) == (255, 255, 255)  # transparent -> white
    assert tuple(rgba[1, 1]) == (227, 127, 127)  # half transparent red over white
    assert tuple(rgba[2, 2]) == (200, 0, 0)
    assert tuple(np.asarray(load_rgb(files["LA.png"]))[0, 0]) == (255, 255, 255)
    palette = np.asarray(load_rgb(files["P_transparency.png"]))
    assert tuple(palette[0, 0]) == (255, 255, 255) and tuple(palette[1, 1]) == (10, 200, 30)
    grey = np.asarray(load_rgb(files["I16.png"]))[..., 0]
    assert grey.min() == 0 and grey.max() == 255 and len(np.unique(grey)) == 24  # not clipped
    rotated = load_rgb(files["EXIF_rotated.jpg"])
    assert rotated.size == (12, 8)  # stored 8x12, shown turned a quarter
    assert np.asarray(rotated)[0, -1, 0] > 200  # the red corner moved to the top right
    cmyk = np.asarray(load_rgb(files["CMYK.jpg"])).reshape(-1, 3)
    assert len(np.unique(cmyk, axis=0)) == 1 and cmyk.std() > 0  # one colour, not grey


def test_the_apps_re_export_the_one_decoder():
    for name in ("load_image_file", "iter_images", "find_images", "check_folder", "to_rgb"):
        assert getattr(_common, name) is getattr(images, name)
    assert issubclass(ImageError, InputError) and issubclass(ImageError, ValueError)


def test_an_empty_file_is_not_called_a_non_image(tmp_path):
    (tmp_path / "empty.png").write_bytes(b"")
    (tmp_path / "text.png").write_text("hello")
    with pytest.raises(ImageError, match=r"empty\.png: empty file \(0 bytes\)"):
        load_image_file(tmp_path / "empty.png")
    with pytest.raises(ImageError, match=r"text\.png: not an image"):
        load_image_file(tmp_path / "text.png")


def test_one_captions_reader_for_training_and_the_apps(tmp_path):
    Image.new("RGB", (4, 4)).save(tmp_path / "a.png")
    csv = tmp_path / "c.tsv"
    csv.write_text("\ufeffImage\tCaption\na.png\t a red dot \n/abs/b.png\tanother\n")
    rows = read_captions_csv(csv)
    assert rows == [(tmp_path / "a.png", "a red dot"), (Path("/abs/b.png"), "another")]
    ds = CsvImageTextDataset(csv, img_key=None, caption_key=None)
    assert ds.images == [str(p) for p, _ in rows] and ds.captions == [c for _, c in rows]
    assert read_captions_csv(csv, root="/data")[0][0] == Path("/data/a.png")
    with pytest.raises(InputError, match=r"no column\(s\) \['an image column \(filepath/"):
        read_captions_csv(csv, img_key=None, caption_key="caption", sep=",")
    csv.write_text("filepath,title\na.png,\n")
    with pytest.raises(InputError, match="line 2: empty image path or caption"):
        read_captions_csv(csv)
    with pytest.raises(InputError, match="captions CSV not found"):
        read_captions_csv(tmp_path / "nope.csv")
