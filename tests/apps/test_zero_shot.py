"""apps/zero_shot.py, run as a user would: the bundled demo-shapes CLIP on generated shapes,
--json / --explain, every kind of bad input (exit code 2, one line), and open_clip parity
for a checkpoint passed by --pretrained PATH.

One run is a real process (an interpreter start costs seconds); the rest call ``main(argv)``
in process."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import zero_shot as app  # apps/zero_shot.py
from _support.apps import error_line, png_header, run_app
from PIL import Image

# Colour-shape pairs the demo model saw in training, drawn large and centred without noise.
CLEAR = [
    ("red", "circle"),
    ("blue", "square"),
    ("green", "triangle"),
    ("yellow", "star"),
    ("purple", "cross"),
    ("orange", "square"),
]
TINY_OC_CFG = {
    "embed_dim": 32,
    "vision_cfg": {"image_size": 32, "patch_size": 8, "width": 64, "layers": 2, "head_width": 16},
    "text_cfg": {"context_length": 20, "vocab_size": 49408, "width": 48, "heads": 4, "layers": 2},
}


def render(colour: str, shape: str, seed: int = 0) -> Image.Image:
    from attn_train import shapes

    return shapes.render_shape(colour, shape, "large", "center", seed=seed, noise=0.0)


@pytest.fixture(scope="module")
def shapes_dir(tmp_path_factory) -> Path:
    """Clear shapes (RGB PNG), the same shapes in modes that must be converted, a
    non-square image and one broken file, in nested folders."""
    root = tmp_path_factory.mktemp("shapes")
    for colour, shape in CLEAR:
        (root / "rgb").mkdir(exist_ok=True)
        render(colour, shape).save(root / "rgb" / f"{colour}_{shape}.png")
    modes = root / "modes"
    modes.mkdir()
    rgba = render("red", "circle", seed=1).convert("RGBA")
    alpha = np.full((64, 64), 255, np.uint8)
    alpha[:3], alpha[-3:], alpha[:, :3], alpha[:, -3:] = 0, 0, 0, 0  # transparent frame
    rgba.putalpha(Image.fromarray(alpha))
    rgba.save(modes / "rgba_red_circle.png")
    render("blue", "square", seed=1).convert("CMYK").save(modes / "cmyk_blue_square.jpg")
    render("green", "triangle", seed=1).convert("L").save(modes / "grey.png")
    grey = np.asarray(render("yellow", "star", seed=1).convert("L"), dtype=np.uint16) * 257
    Image.fromarray(grey).save(modes / "sixteen_bit.png")  # mode I;16, values up to 65535
    render("purple", "cross", seed=1).convert("P").save(modes / "palette.gif")
    wide = render("orange", "square", seed=2).resize((150, 90))
    wide.save(root / "wide.png")
    (root / "rgb" / "broken.jpg").write_bytes(b"not an image at all")
    (root / "classnames.txt").write_text(
        "# every colour-shape pair\n"
        + "\n".join(f"{c} {s}" for c in ("red", "green", "blue", "yellow", "purple", "orange")
                    for s in ("circle", "square", "triangle", "star", "cross"))
        + "\n"
    )  # fmt: skip
    return root


def test_demo_shapes_folder_json_explain(shapes_dir, tmp_path):
    """The one real process (exit 0; bad input and Ctrl-C in a real process:
    tests/test_interrupt_while_loading.py): recursion, every image mode converted, the broken
    file skipped and counted, the right colour + shape on top for clear images, JSON lines,
    explain PNGs."""
    out = tmp_path / "heat"
    proc = run_app(
        "zero_shot",
        "--model", "demo-shapes", "--images", shapes_dir,
        "--labels-file", shapes_dir / "classnames.txt",
        "--json", "--top-k", "3", "--explain", out,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    records = [json.loads(line) for line in proc.stdout.splitlines()]
    by_name = {Path(r["image"]).relative_to(shapes_dir).as_posix(): r for r in records}
    assert len(by_name) == 6 + 5 + 1 + 1  # clear + modes + wide + broken

    broken = by_name.pop("rgb/broken.jpg")
    assert "not an image" in broken["error"]
    assert "skipped 1 unreadable file(s) of 13" in proc.stderr
    assert "Traceback" not in proc.stderr

    for colour, shape in CLEAR:
        r = by_name[f"rgb/{colour}_{shape}.png"]
        assert r["predictions"][0]["label"] == f"{colour} {shape}", r
    for r in by_name.values():
        probs = [p["prob"] for p in r["predictions"]]
        assert len(probs) == 3 and probs == sorted(probs, reverse=True) and 0 < sum(probs) <= 1
    for name in ("modes/rgba_red_circle.png", "modes/cmyk_blue_square.jpg"):
        top = by_name[name]["predictions"][0]["label"]
        assert top == " ".join(Path(name).stem.split("_")[1:]), (name, top)

    for name, r in by_name.items():  # a heatmap per image, the size of that image
        heat = Path(r["explain"])
        assert heat.parent == out and heat.suffix == ".png"
        with Image.open(heat) as h, Image.open(shapes_dir / name) as src:
            assert h.format == "PNG" and h.size == src.size
    with Image.open(out / "wide.png") as h:
        assert h.size == (150, 90)


@pytest.fixture(scope="module")
def oc_checkpoint(tmp_path_factory):
    """A random open_clip model saved in open_clip's folder layout, and the same model read
    back by open_clip itself (model, preprocess, tokenizer)."""
    import open_clip
    from open_clip.push_to_hf_hub import save_config_for_hf
    from safetensors.torch import save_file

    folder = tmp_path_factory.mktemp("oc")
    torch.manual_seed(0)
    model = open_clip.model.CLIP(**TINY_OC_CFG)
    with torch.no_grad():  # norms and biases off their init, so a swapped one shows
        for p in model.parameters():
            if p.ndim <= 1:
                p.add_(torch.randn_like(p) * 0.05)
    model.visual.image_mean = open_clip.OPENAI_DATASET_MEAN
    model.visual.image_std = open_clip.OPENAI_DATASET_STD
    save_file(model.state_dict(), str(folder / "open_clip_model.safetensors"))
    save_config_for_hf(model, folder / "open_clip_config.json", model_config=TINY_OC_CFG)
    ref, _, preprocess = open_clip.create_model_and_transforms(f"local-dir:{folder}")
    return folder, ref.eval(), preprocess, open_clip.get_tokenizer(f"local-dir:{folder}")


def test_pretrained_path_matches_open_clip(oc_checkpoint, shapes_dir, tmp_path, capsys):
    import open_clip
    from open_clip.zero_shot_classifier import build_zero_shot_classifier
    from skimage import data

    folder, ref, preprocess, tokenizer = oc_checkpoint
    cat = tmp_path / "cat.jpg"
    Image.fromarray(data.chelsea()).save(cat, quality=95)  # 451 x 300: resize + crop
    images = [cat, shapes_dir / "wide.png"]
    labels = ["cat", "dog", "a red car", "orange square"]
    templates = ["a photo of a {}.", "a drawing of a {}"]

    argv = [
        "--pretrained", folder, *[a for p in images for a in ("--image", p)],
        "--labels", *labels, *[a for t in templates for a in ("--template", t)],
        "--top-k", "10", "--json",
    ]  # fmt: skip
    assert app.main([str(a) for a in argv]) == 0
    ours = [json.loads(line) for line in capsys.readouterr().out.splitlines()]

    with torch.no_grad():
        classifier = build_zero_shot_classifier(ref, tokenizer, labels, templates, device="cpu")
        x = torch.stack([preprocess(Image.open(p).convert("RGB")) for p in images])
        feats = torch.nn.functional.normalize(ref.encode_image(x), dim=-1)
        expected = (ref.logit_scale.exp() * feats @ classifier).softmax(dim=-1)
    assert isinstance(ref, open_clip.model.CLIP)
    for record, want in zip(ours, expected, strict=True):
        got = {p["label"]: p["prob"] for p in record["predictions"]}
        assert list(got) == [labels[i] for i in want.argsort(descending=True)]
        torch.testing.assert_close(
            torch.tensor([got[label] for label in labels]), want, atol=1e-5, rtol=1e-4
        )


@pytest.mark.parametrize(
    "case",
    [
        "missing",
        "folder",
        "not_an_image",
        "truncated",
        "bomb_error",
        "bomb_warning",
        "no_labels",
        "empty_labels_file",
        "bad_template",
        "no_images",
        "empty_folder",
        "empty_file",
    ],
)
def test_bad_input_exits_2_before_loading_a_model(case, shapes_dir, tmp_path, capsys):
    good = shapes_dir / "rgb" / "red_circle.png"
    labels = ["--labels", "cat", "dog"]
    if case == "missing":
        args, needle = ["--image", tmp_path / "nope.jpg", *labels], "image not found"
    elif case == "folder":
        args, needle = ["--image", shapes_dir, *labels], "is a folder"
    elif case == "not_an_image":
        (tmp_path / "notes.png").write_text("hello")
        args, needle = ["--image", tmp_path / "notes.png", *labels], "not an image"
    elif case == "truncated":
        buf = tmp_path / "full.jpg"
        Image.fromarray(np.random.default_rng(0).integers(0, 255, (96, 96, 3), np.uint8)).save(buf)
        data = buf.read_bytes()
        (tmp_path / "cut.jpg").write_bytes(data[: len(data) // 2])
        args, needle = ["--image", tmp_path / "cut.jpg", *labels], "truncated"
    elif case == "bomb_error":  # > 2x Pillow's limit: DecompressionBombError
        args, needle = ["--image", png_header(tmp_path / "b.png", 20000, 20000), *labels], "bomb"
    elif case == "bomb_warning":  # > Pillow's limit: only a warning in Pillow, an error here
        args, needle = ["--image", png_header(tmp_path / "w.png", 10000, 10000), *labels], "bomb"
    elif case == "no_labels":
        args, needle = ["--image", good], "no labels"
    elif case == "empty_labels_file":
        (tmp_path / "labels.txt").write_text("# nothing\n\n")
        args, needle = ["--image", good, "--labels-file", tmp_path / "labels.txt"], "no labels"
    elif case == "bad_template":
        args, needle = ["--image", good, *labels, "--template", "a photo"], "--template"
    elif case == "no_images":
        args, needle = labels, "no images"
    elif case == "empty_file":
        (tmp_path / "zero.jpg").write_bytes(b"")
        args, needle = ["--image", tmp_path / "zero.jpg", *labels], "empty file (0 bytes)"
    else:
        (tmp_path / "empty").mkdir()
        args, needle = ["--images", tmp_path / "empty", *labels], "no images"
    assert app.main([str(a) for a in args]) == 2
    assert needle in error_line(capsys)


def test_weights_not_available_offline(shapes_dir, tmp_path, capsys, monkeypatch):
    """ViT-B-32 + openai with an empty cache and no network: which file, which repo, where
    the cache is, and what to do instead -- at once, in one line. (In-process with the hub
    switched offline, as HF_HUB_OFFLINE=1 does, to save an interpreter start.)"""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    image = str(shapes_dir / "rgb" / "red_circle.png")
    assert app.main(["--image", image, "--labels", "cat", "dog"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: weights not available"), err
    for needle in (
        "open_clip_model.safetensors",
        "timm/vit_base_patch32_clip_224.openai",
        str(tmp_path / "hub"),
        "--model demo-shapes",
        "--pretrained PATH",
    ):
        assert needle in err[0], (needle, err[0])


def test_table_output_and_single_explain_in_process(oc_checkpoint, shapes_dir, tmp_path, capsys):
    """Calling main() directly (no new interpreter): the readable table, --explain to a
    file, and the bad inputs that are only found once attn_clip is imported."""
    image = shapes_dir / "wide.png"
    heat = tmp_path / "heat.png"
    argv = ["--pretrained", str(oc_checkpoint[0]), "--image", str(image), "--explain", str(heat)]
    assert app.main([*argv, "--labels", "cat", "dog", "--top-k", "1"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == str(image) and out[1].split() == ["#", "label", "prob"]
    assert out[2].split()[0] == "1" and out[2].endswith("%") and out[3] == ""
    assert "heatmap of" in out[4] and str(heat) in out[4]
    with Image.open(heat) as h:
        assert h.size == (150, 90)

    for args, needle in [
        (["--model", "ViT-Q-99"], "unknown model 'ViT-Q-99'"),
        (["--model", "ViT-S-32"], "no pretrained weights are known"),
        (["--model", "ViT-B-32", "--pretrained", "laion9000"], "neither an existing file"),
        (["--pretrained", str(oc_checkpoint[0]), "--device", "cuda:7"], "--device"),
    ]:
        if "cuda" in args[-1] and torch.cuda.device_count() > 7:
            continue
        assert app.main(["--image", str(image), "--labels", "a", "b", *args]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: ") and needle in err[0], err


def test_explain_forward_geometry_and_text_dependence(oc_checkpoint):
    """attn_clip.explain (behind --explain): its block-by-block forward is encode_image,
    the map is where the model input came from, and relevancy depends on the text."""
    import attn_clip
    from attn_clip import PreprocessConfig

    model = attn_clip.create_model(str(oc_checkpoint[0]))
    x = torch.randn(2, 3, 32, 32)
    emb, maps = attn_clip.image_features_with_attention(model, x)
    torch.testing.assert_close(emb, model.encode_image(x), atol=1e-5, rtol=1e-5)
    assert len(maps) == 2 and maps[0].shape == (2, 4, 17, 17)  # 1 + 4 x 4 tokens

    a, b = torch.randn(32), torch.randn(32)
    heat_a = attn_clip.image_relevancy(model, x, a)
    assert heat_a.shape == (2, 4, 4) and heat_a.amin() == 0 and heat_a.amax() == 1
    assert not torch.allclose(heat_a, attn_clip.image_relevancy(model, x, b))
    rollout = attn_clip.image_relevancy(model, x, method="rollout")
    assert rollout.shape == (2, 4, 4)

    box = attn_clip.input_box  # (left, top, right, bottom) in image pixels
    assert box((200, 100), PreprocessConfig(size=32)) == (50.0, 0.0, 150.0, 100.0)
    assert box((200, 100), PreprocessConfig(size=32, resize_mode="longest")) == (
        0.0, -50.0, 200.0, 150.0,
    )  # fmt: skip
    assert box((200, 100), PreprocessConfig(size=32, resize_mode="squash")) == (0, 0, 200, 100)

    image = Image.new("RGB", (200, 100), (128, 128, 128))
    heat = torch.zeros(4, 4)
    heat[:, :2] = 1.0  # left half of the model input (a center crop) is hot
    out = np.asarray(attn_clip.heatmap_overlay(image, heat, PreprocessConfig(size=32)))
    assert out.shape == (100, 200, 3)
    assert (out[:, :50] == 51).all() and (out[:, 150:] == 51).all()  # cropped away: dimmed
    assert out[50, 60, 0] > out[50, 60, 2] and out[50, 140, 2] > out[50, 140, 0]  # red | blue


def test_imagenet_head_is_built_once_and_cached(
    oc_checkpoint, shapes_dir, tmp_path, capsys, monkeypatch
):
    """--imagenet: 1,000 classes (one template here to keep it fast; the default is
    OpenAI's 80), cached under $XDG_CACHE_HOME and reused."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    argv = ["--pretrained", str(oc_checkpoint[0]), "--image", str(shapes_dir / "wide.png")]
    argv += ["--imagenet", "--template", "a photo of a {}.", "--top-k", "3", "--json"]
    assert app.main(argv) == 0
    first = json.loads(capsys.readouterr().out)
    (cached,) = (tmp_path / "attn-zoo" / "zero-shot-heads").glob("*.safetensors")
    written = cached.stat().st_mtime_ns
    assert app.main(argv) == 0
    assert json.loads(capsys.readouterr().out) == first
    assert cached.stat().st_mtime_ns == written  # read, not rebuilt
    labels = [p["label"] for p in first["predictions"]]
    assert len(labels) == 3 and all(isinstance(label, str) for label in labels)
    assert len(app.read_templates(app.parse_args(["--imagenet"]))) == 80


def test_extreme_images_are_refused_before_decoding(capsys, tmp_path):
    """A 69-byte 1 x 89,000,000 PNG passes the decompression-bomb guard: its side and a
    5000 x 10 image's aspect ratio are refused from the header; in a folder, skipped."""
    tall = png_header(tmp_path / "tall.png", 1, 89_000_000)
    assert tall.stat().st_size < 100
    wide = png_header(tmp_path / "wide.png", 5000, 10)
    for path, needle in ((tall, "sides above"), (wide, "aspect ratio")):
        args = ["--model", "demo-shapes", "--image", str(path), "--labels", "a", "b"]
        assert app.main(args) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and needle in err[0], err
    folder = tmp_path / "folder"
    folder.mkdir()
    tall.rename(folder / "tall.png")
    Image.new("RGB", (32, 32), "red").save(folder / "red.png")
    assert app.main(["--model", "demo-shapes", "--images", str(folder), "--labels", "a"]) == 0
    err = capsys.readouterr().err
    assert "skipped 1 unreadable file(s) of 2" in err and "Traceback" not in err


SPM_TEXTS = ["a photo of a red circle", "a blue square", "a green triangle", "a yellow star"]


def siglip_folder(folder: Path) -> Path:
    """A tiny random SigLIP (timm-style image tower with the MAP head, SigLIP text tower, a
    logit bias) saved in open_clip's layout, with a sentencepiece tokenizer trained here in
    the same folder, as the timm/ViT-*-SigLIP hub repos ship theirs."""
    import io
    from dataclasses import replace

    import attn_clip
    import sentencepiece as spm

    cfg = attn_clip.get_model_config("ViT-B-16-SigLIP")
    v = replace(cfg.vision, image_size=32, patch_size=8, width=32, layers=1, head_width=16)
    t = replace(cfg.text, width=32, heads=2, layers=1, context_length=16, vocab_size=64)
    model = attn_clip.create_model(replace(cfg, embed_dim=32, vision=v, text=t))
    attn_clip.save_pretrained(model, folder)
    out = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(SPM_TEXTS * 20), model_writer=out, vocab_size=24,
        model_type="unigram", pad_id=0, eos_id=1, unk_id=2, bos_id=-1, minloglevel=2,
    )  # fmt: skip
    (folder / "spiece.model").write_bytes(out.getvalue())
    (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "T5Tokenizer"}))
    return folder


def test_siglip_folder_gives_sigmoid_probabilities(shapes_dir, tmp_path, capsys):
    """A SigLIP folder (its own tokenizer inside) runs offline; each label gets its own
    sigmoid probability (they need not sum to 1), as attn_clip.predict computes it."""
    pytest.importorskip("sentencepiece")
    pytest.importorskip("transformers")
    import attn_clip

    folder = siglip_folder(tmp_path / "siglip")
    image = shapes_dir / "rgb" / "red_circle.png"
    labels = ["red circle", "blue square", "green triangle"]
    argv = ["--model", str(folder), "--image", str(image), "--labels", *labels]
    assert app.main([*argv, "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    got = {p["label"]: p["prob"] for p in record["predictions"]}

    model, preprocess, tokenizer = attn_clip.create_model_and_transforms(str(folder))
    assert isinstance(tokenizer, attn_clip.HFTokenizer) and tokenizer.num_special_tokens == 1
    classifier = attn_clip.build_zero_shot_classifier(model, tokenizer, labels)
    with Image.open(image) as im:
        want = attn_clip.predict(model, preprocess(im)[None], classifier)[0]
    torch.testing.assert_close(torch.tensor([got[label] for label in labels]), want)
    assert abs(float(want.sum()) - 1) > 1e-3  # not a softmax

    assert app.main([*argv, "--top-k", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].split() == ["#", "label", "p(match)"] and out[2].endswith("%")
