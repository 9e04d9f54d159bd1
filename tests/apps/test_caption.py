"""apps/caption.py, run as a user would, on a random-init tiny CoCa saved to a folder: the
captions printed (``path<TAB>caption``, --json) are the library's (``CoCa.caption`` on the
same preprocessed batch), each decoding flag reaches ``generate``, --folder recurses and
skips a broken file, beams and seeded sampling repeat, bad input is one line and exit 2 with
nothing on stdout, Ctrl-C is exit 130. Also ``attn_clip.create_model(..., multimodal={...})``.

One run is a real process (an interpreter start costs seconds); the rest call ``main(argv)``
in process."""

from __future__ import annotations

import json
from pathlib import Path

import attn_clip
import caption as app  # apps/caption.py
import pytest
import torch
from _support.apps import ROOT, TINY_COCA, run_app, save_tiny_coca
from attn_core.cli import run
from PIL import Image, ImageDraw

RED_CIRCLE = ROOT / "docs" / "assets" / "red_circle.png"
CAT = ROOT / "docs" / "assets" / "cat.jpg"
SHORT = ["--max-tokens", "8"]  # most runs: shorter captions, fewer decoding steps


@pytest.fixture(scope="module")
def coca_dir(tmp_path_factory) -> Path:
    """A random-init tiny coca_ViT-B-32 in a save_pretrained folder."""
    return save_tiny_coca(tmp_path_factory.mktemp("coca") / "tiny")


@pytest.fixture(scope="module")
def reference(coca_dir):
    """The folder's model and transform, loaded by the library (not by the app)."""
    model, preprocess, _ = attn_clip.create_model_and_transforms(str(coca_dir))
    return model, preprocess


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """Drawn shapes in nested folders, a text file and a broken image."""
    root = tmp_path_factory.mktemp("pictures")
    (root / "b" / "deeper").mkdir(parents=True)
    colours = ["red", "blue", "green", "orange"]
    where = ["z.png", "a.png", "b/deeper/c.jpg", "b/d.png"]
    for colour, rel in zip(colours, where, strict=True):
        image = Image.new("RGB", (48, 40), "white")
        ImageDraw.Draw(image).ellipse((8, 6, 40, 34), fill=colour)
        image.save(root / rel)
    (root / "b" / "broken.png").write_bytes(b"not a picture")
    (root / "notes.txt").write_text("not an image extension: not looked at")
    return root


def captions_of(reference, paths, **options) -> list[str]:
    """``CoCa.caption`` of the images as one batch (as the app batches them)."""
    model, preprocess = reference
    x = torch.stack([preprocess(Image.open(p).convert("RGB")) for p in paths])
    return model.caption(x, **options)


def cli(capsys, *argv) -> tuple[int, str, str]:
    code = app.main([*map(str, argv), "--device", "cpu"])
    out, err = capsys.readouterr()
    return code, out, err


def tsv(out: str) -> list[tuple[str, str]]:
    return [tuple(line.split("\t")) for line in out.splitlines()]


# -- create_model(multimodal=...) ----------------------------------------------------------


def test_create_model_takes_multimodal_overrides():
    model = attn_clip.create_model("coca_ViT-B-32", **TINY_COCA)
    m = model.config.multimodal
    assert isinstance(model, attn_clip.coca.CoCa)
    assert (m.layers, m.width, m.heads) == (1, 64, 2)
    assert m.context_length == attn_clip.get_model_config("coca_ViT-B-32").multimodal.context_length
    assert len(model.text_decoder.blocks) == len(model.text_decoder.cross_blocks) == 1
    with pytest.raises(ValueError, match=r"unknown CLIP config override\(s\): multimodal\.depth"):
        attn_clip.create_model("coca_ViT-B-32", multimodal={"depth": 1})
    with pytest.raises(ValueError, match="multimodal width"):  # checked against the towers
        attn_clip.create_model("coca_ViT-B-32", **{**TINY_COCA, "multimodal": {"width": 32}})


# -- the captions --------------------------------------------------------------------------


def test_one_caption_per_image_the_library_s_greedy_caption(coca_dir, reference, capsys):
    code, out, err = cli(capsys, RED_CIRCLE, CAT, "--model", coca_dir)
    assert code == 0 and err == "", err
    rows = tsv(out)
    assert [path for path, _ in rows] == [str(RED_CIRCLE), str(CAT)]
    assert [c for _, c in rows] == captions_of(reference, [RED_CIRCLE, CAT])
    assert all(c.strip() for _, c in rows)

    # batches of one: the same captions
    assert cli(capsys, RED_CIRCLE, CAT, "--model", coca_dir, "--batch-size", "1")[1] == out


def test_json_with_beams_and_several_captions(coca_dir, reference, capsys):
    argv = [RED_CIRCLE, CAT, "--model", coca_dir, "--beams", "3", "--num-captions", "2", *SHORT]
    code, out, _ = cli(capsys, *argv, "--json")
    assert code == 0
    records = json.loads(out)
    expected = captions_of(
        reference, [RED_CIRCLE, CAT], num_beams=3, num_return_sequences=2, max_new_tokens=8
    )
    assert [r["image"] for r in records] == [str(RED_CIRCLE), str(CAT)]
    assert [r["captions"] for r in records] == [expected[:2], expected[2:]]
    assert all(r["caption"] == r["captions"][0] for r in records)
    assert json.loads(cli(capsys, *argv, "--json")[1]) == records  # beams repeat

    rows = tsv(cli(capsys, *argv)[1])  # as text: one line per caption, best first
    assert rows == [(str(RED_CIRCLE), c) for c in expected[:2]] + [
        (str(CAT), c) for c in expected[2:]
    ]

    one = json.loads(cli(capsys, RED_CIRCLE, "--model", coca_dir, "--json", *SHORT)[1])
    assert list(one[0]) == ["image", "caption"]  # no "captions" for one caption per image


def test_seeded_sampling_repeats(coca_dir, reference, capsys):
    argv = [RED_CIRCLE, CAT, "--model", coca_dir, "--sample", "--top-p", "0.9", "--json", *SHORT]
    runs = [json.loads(cli(capsys, *argv, "--seed", seed)[1]) for seed in ("7", "7", "8")]
    assert runs[0] == runs[1]
    assert [r["caption"] for r in runs[0]] != [r["caption"] for r in runs[2]]
    expected = captions_of(
        reference, [RED_CIRCLE, CAT], do_sample=True, top_p=0.9, seed=7, max_new_tokens=8
    )
    assert [r["caption"] for r in runs[0]] == expected
    greedy = captions_of(reference, [RED_CIRCLE, CAT], max_new_tokens=8)
    assert [r["caption"] for r in runs[0]] != greedy


@pytest.fixture(scope="module")
def greedy(reference) -> list[str]:
    return captions_of(reference, [RED_CIRCLE, CAT], max_new_tokens=8)


@pytest.mark.parametrize(
    "flags,options,changes",
    [
        (["--max-tokens", "4"], {"max_new_tokens": 4}, True),
        # (a random model rarely ends a caption early: the minimum need not change it)
        (["--min-tokens", "3", "--max-tokens", "6"],
         {"min_new_tokens": 3, "min_length": 0, "max_new_tokens": 6}, None),
        ([*SHORT, "--repetition-penalty", "2.0"], {"repetition_penalty": 2.0}, True),
        ([*SHORT, "--no-repeat-ngram", "1"], {"no_repeat_ngram_size": 1}, True),
        ([*SHORT, "--sample", "--top-k", "5", "--temperature", "0.5", "--seed", "3"],
         {"do_sample": True, "top_k": 5, "temperature": 0.5, "seed": 3}, True),
        ([*SHORT, "--sample", "--seed", "1", "--num-captions", "3"],
         {"do_sample": True, "seed": 1, "num_return_sequences": 3}, True),
        ([*SHORT, "--beams", "2", "--sample", "--seed", "0"],
         {"num_beams": 2, "do_sample": True, "seed": 0}, True),
    ],
)  # fmt: skip
def test_each_decoding_flag_reaches_generate(
    coca_dir, reference, greedy, capsys, flags, options, changes
):
    code, out, err = cli(capsys, RED_CIRCLE, CAT, "--model", coca_dir, *flags)
    assert code == 0, err
    got = [c for _, c in tsv(out)]
    assert got == captions_of(reference, [RED_CIRCLE, CAT], **{"max_new_tokens": 8, **options})
    n = options.get("num_return_sequences", 1)
    if changes is not None:
        assert got[::n] != greedy  # the flag made a difference


def test_folder_recursive_sorted_broken_file_skipped(coca_dir, reference, folder, capsys):
    argv = ["--folder", folder, "--model", coca_dir, *SHORT]
    code, out, err = cli(capsys, *argv, "--batch-size", "2")
    assert code == 0
    order = ["a.png", "b/d.png", "b/deeper/c.jpg", "z.png"]  # find_images' order, broken out
    rows = tsv(out)
    assert [Path(p).relative_to(folder).as_posix() for p, _ in rows] == order
    # batches of two files as found: [a, broken] [d, c] [z] -> [a] [d, c] [z] captioned
    batches = [order[:1], order[1:3], order[3:]]
    expected = [
        c
        for b in batches
        for c in captions_of(reference, [folder / p for p in b], max_new_tokens=8)
    ]
    assert [c for _, c in rows] == expected
    lines = err.strip().splitlines()
    assert lines[0].startswith("warning: skipped ") and "broken.png" in lines[0], err
    assert lines[-1] == "warning: skipped 1 unreadable file(s) of 5"

    records = json.loads(cli(capsys, *argv, "--json", "--batch-size", "3")[1])
    broken = [r for r in records if "error" in r]
    assert len(records) == 5 and len(broken) == 1
    assert broken[0]["image"].endswith("broken.png") and "not an image" in broken[0]["error"]


def test_a_real_process(coca_dir, reference):
    """The one interpreter start: exit 0, the JSON of the in-process runs, quiet stderr."""
    proc = run_app("caption", RED_CIRCLE, "--model", coca_dir, "--device", "cpu", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == [
        {"image": str(RED_CIRCLE), "caption": captions_of(reference, [RED_CIRCLE])[0]}
    ]
    assert proc.stderr == ""


# -- bad input -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "case,needle",
    [
        ("missing", "image not found"),
        ("not_an_image", "not an image"),
        ("clip", "ViT-B-32 has no captioning decoder"),
        ("demo", "demo-shapes has no captioning decoder"),
        ("clip_folder", "has no captioning decoder"),
        ("no_images", "no images: pass IMAGE"),
        ("empty_folder", "no images ("),
        ("no_model", "no --model: pass a CoCa model (coca_"),
        ("top_p", "--top-p: sampling option(s), need --sample"),
        ("bad_top_p", "--top-p must be in (0, 1]"),
        ("captions", "--num-captions 3 needs at least as many --beams (got 2)"),
        ("greedy_captions", "greedy decoding gives one caption"),
        ("beams", "--beams must be >= 1"),
        ("max_tokens", "--max-tokens must be <= 76"),
        ("min_tokens", "--min-tokens (9) must be <= the most tokens (5)"),
        ("penalty", "--repetition-penalty must be > 0"),
        ("unknown", "unknown model 'coca_ViT-Q-1'"),
    ],
)
def test_bad_input_is_one_line_exit_2_nothing_printed(coca_dir, tmp_path, capsys, case, needle):
    image, model, extra = RED_CIRCLE, str(coca_dir), []
    if case == "missing":
        image = tmp_path / "nope.png"
    elif case == "not_an_image":
        image = tmp_path / "notes.png"
        image.write_text("a text file")
    elif case == "clip":
        model = "ViT-B-32"  # refused before any weights are looked for (offline here)
    elif case == "demo":
        model = "demo-shapes"
    elif case == "clip_folder":
        model = str(attn_clip.save_pretrained(attn_clip.create_model(
            "ViT-B-32", embed_dim=16, vision={"layers": 1, "width": 32, "head_width": 16,
            "image_size": 32, "patch_size": 16}, text={"layers": 1, "width": 32, "heads": 2},
        ), tmp_path / "clip"))  # fmt: skip
    elif case == "no_images":
        image = None
    elif case == "empty_folder":
        image, extra = None, ["--folder", tmp_path]
    elif case == "no_model":
        model = None
    else:
        extra = {
            "top_p": ["--top-p", "0.5"],
            "bad_top_p": ["--sample", "--top-p", "1.5"],
            "captions": ["--beams", "2", "--num-captions", "3"],
            "greedy_captions": ["--num-captions", "2"],
            "beams": ["--beams", "0"],
            "max_tokens": ["--max-tokens", "500"],
            "min_tokens": ["--min-tokens", "9", "--max-tokens", "5"],
            "penalty": ["--repetition-penalty", "0"],
            "unknown": [],
        }[case]
        if case == "unknown":
            model = "coca_ViT-Q-1"
    argv = ([image] if image else []) + (["--model", model] if model else []) + extra
    code = app.main([*map(str, argv), "--device", "cpu"])
    assert code == 2
    line = error_line_and_no_output(capsys)
    assert needle in line, line
    if case in ("clip", "demo"):
        assert "coca_ViT-B-32" in line and "coca_ViT-L-14" in line  # the CoCa models named


def error_line_and_no_output(capsys) -> str:
    out, err = capsys.readouterr()
    assert out == "", out
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def test_ctrl_c_is_one_line_exit_130(coca_dir, capsys, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(attn_clip.coca.CoCa, "generate", interrupted)
    with pytest.raises(SystemExit) as exit_:
        run(lambda: app.main([str(RED_CIRCLE), "--model", str(coca_dir), "--device", "cpu"]))
    assert exit_.value.code == 130
    out, err = capsys.readouterr()
    assert out == "" and err.strip().splitlines() == ["interrupted"], err
