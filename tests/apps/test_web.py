"""apps/web.py, the Gradio demo: the functions behind each tab (in-process, no server), the
command line (bad input: one line, exit 2; Ctrl-C: exit 130), and the page itself driven in
headless Chromium (Debian's ``chromium`` + ``chromium-driver``, through Selenium): upload
docs/assets/red_circle.png and see "red circle" ranked first, search an index built by
apps/retrieval.py (tests/_support/retrieval.py's gallery) and see the red circles first,
bad input shown in the page while the server keeps serving; the caption tab on a second
server with a random-init tiny CoCa (saved to a folder) gives the library's captions, and on
demo-shapes says that it needs a CoCa. The browser tests skip, saying
why, only where Chromium or its driver is missing (.ci/run installs both with apt-get).

Set WEB_SCREENSHOTS=DIR to also copy the browser tests' screenshots there (docs/assets has
the ones docs/apps.md shows)."""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import web
from _support.apps import png_header, save_tiny_coca
from _support.retrieval import (
    GALLERY,
    ROOT,
    render,
    shapes_gallery,  # noqa: F401  (a fixture)
    shapes_index,  # noqa: F401  (a fixture)
)
from PIL import Image

APPS = ROOT / "apps"
RED_CIRCLE = ROOT / "docs" / "assets" / "red_circle.png"
LABELS = "blue circle, red circle, red square, green star"  # red circle not first on purpose


def plain(markdown: str) -> str:
    """A status text without its Markdown escapes (what the page shows)."""
    return re.sub(r"\\(.)", r"\1", markdown)


@pytest.fixture(scope="module")
def loaded():
    return web.load_model("demo-shapes", None, "cpu", "fp32")


@pytest.fixture(scope="module")
def demo(loaded):
    return web.WebDemo(loaded)


@pytest.fixture(scope="module")
def coca_dir(tmp_path_factory) -> Path:
    """A random-init tiny coca_ViT-B-32 in a save_pretrained folder."""
    return save_tiny_coca(tmp_path_factory.mktemp("coca") / "tiny")


@pytest.fixture(scope="module")
def coca_demo(coca_dir):
    return web.WebDemo(web.load_model(str(coca_dir), None, "cpu", "fp32"))


def library_captions(demo, image: Path, **options) -> list[str]:
    loaded = demo.loaded
    x = loaded.preprocess(Image.open(image).convert("RGB"))[None]
    return loaded.model.caption(x, **options)


@pytest.fixture(scope="module")
def index_path(shapes_index) -> Path:  # noqa: F811
    """The shared gallery of generated shapes (10 and a broken file), indexed by
    `apps/retrieval.py index`."""
    return shapes_index[0]


@pytest.fixture(scope="module")
def search_demo(loaded, index_path):
    idx = web.open_index(index_path)
    idx.problem = web.index_problem(idx, loaded, "fp32")
    assert idx.problem is None
    return web.WebDemo(loaded, idx)


# -- the functions behind the tabs ---------------------------------------------------------


def test_labels_and_templates():
    assert web.parse_labels(" cat, dog\n a red car ,\n\ncat,") == ["cat", "dog", "a red car"]
    for empty in ("", None, " , \n ,"):
        with pytest.raises(web.InputError, match="no labels"):
            web.parse_labels(empty)
    with pytest.raises(web.InputError, match="too many labels"):
        web.parse_labels(",".join(f"l{i}" for i in range(web.MAX_LABELS + 1)))
    assert web.parse_templates("") == ["a photo of a {}."]
    assert web.parse_templates("a drawing of a {}.\n\n  a {} shape ") == [
        "a drawing of a {}.",
        "a {} shape",
    ]
    with pytest.raises(web.InputError, match=r"^template 'no label here' must contain"):
        web.parse_templates("no label here")


def test_classify_ranks_the_right_label_and_explains_it(demo):
    pred = demo.classify(str(RED_CIRCLE), LABELS)
    assert pred.labels[0] == "red circle" and pred.probs[0] > 0.9
    assert sorted(pred.labels) == sorted(web.parse_labels(LABELS))
    assert pred.probs == sorted(pred.probs, reverse=True)
    assert abs(sum(pred.probs) - 1) < 1e-5 and not pred.sigmoid
    assert pred.heatmap.size == Image.open(RED_CIRCLE).size  # the --explain overlay
    rollout = demo.classify(str(RED_CIRCLE), LABELS, explain=True, method="rollout")
    assert rollout.heatmap.size == pred.heatmap.size
    assert demo.classify(str(RED_CIRCLE), LABELS, explain=False).heatmap is None

    scores, heat, title, status = web.classify_outputs(demo, str(RED_CIRCLE), LABELS, "")
    assert list(scores)[0] == "red circle" and len(scores) == 4
    assert heat is not None and title == "where the model looked for 'red circle'"
    assert status.startswith("**red circle** first of 4 label(s)") and "softmax" in status


def test_classify_gives_the_numbers_of_the_command_line_app(demo, capsys):
    """The same probabilities as `apps/zero_shot.py --json` for the same image, labels and
    template (both call the same library functions)."""
    import zero_shot

    labels = web.parse_labels(LABELS)
    template = "a drawing of a {}."
    argv = ["--model", "demo-shapes", "--image", str(RED_CIRCLE), "--labels", *labels]
    assert zero_shot.main([*argv, "--template", template, "--json", "--top-k", "4"]) == 0
    cli = {p["label"]: p["prob"] for p in json.loads(capsys.readouterr().out)["predictions"]}
    pred = demo.classify(str(RED_CIRCLE), LABELS, template, explain=False)
    ours = dict(zip(pred.labels, pred.probs, strict=True))
    assert list(cli) == pred.labels
    for label in labels:
        assert abs(ours[label] - cli[label]) < 1e-6, (label, ours[label], cli[label])


def test_sigmoid_scores_for_models_with_a_logit_bias(demo, monkeypatch):
    """SigLIP-style models (a logit_bias) get independent sigmoids, as in the command line."""
    import attn_clip

    model = demo.loaded.model
    monkeypatch.setattr(model, "logit_bias", torch.nn.Parameter(torch.tensor(-3.0)))
    pred = demo.classify(str(RED_CIRCLE), LABELS, explain=False)
    assert pred.sigmoid and pred.labels[0] == "red circle"
    x = demo.loaded.preprocess(Image.open(RED_CIRCLE).convert("RGB"))[None]
    labels = web.parse_labels(LABELS)
    classifier = attn_clip.build_zero_shot_classifier(
        model, demo.loaded.tokenizer, labels, ["a photo of a {}."]
    )
    with torch.inference_mode():
        expected = attn_clip.zero_shot_logits(model, model.encode_image(x), classifier)[0]
    expected = dict(zip(labels, expected.sigmoid().tolist(), strict=True))
    for label, p in zip(pred.labels, pred.probs, strict=True):
        assert abs(p - expected[label]) < 1e-5
    assert abs(sum(pred.probs) - 1) > 0.05  # not a softmax
    assert "independent sigmoids" in web.classify_outputs(demo, str(RED_CIRCLE), LABELS, "")[3]


@pytest.mark.parametrize(
    "case", ["no_image", "not_an_image", "truncated", "bomb", "no_labels", "bad_template"]
)
def test_bad_input_gives_a_message_in_the_page(demo, tmp_path, case):
    image, labels, template, needle = str(RED_CIRCLE), LABELS, "", None
    if case == "no_image":
        image, needle = None, "no image: upload one"
    elif case == "not_an_image":
        image = tmp_path / "notes.png"
        image.write_text("this is a text file")
        needle = "notes.png: not an image"
    elif case == "truncated":
        image = tmp_path / "cut.png"
        image.write_bytes(RED_CIRCLE.read_bytes()[:300])
        needle = "cut.png: truncated image"
    elif case == "bomb":
        image = png_header(tmp_path / "bomb.png", 20000, 20000)
        needle = "bomb.png: refusing a decompression-bomb sized image"
    elif case == "no_labels":
        labels, needle = " ,\n", "no labels"
    else:
        template, needle = "a photo", "template 'a photo' must contain exactly one '{}'"
    scores, heat, _, status = web.classify_outputs(demo, image, labels, template)
    assert scores is None and heat is None
    assert status.startswith("**Error:** "), status
    assert needle in plain(status), status
    assert str(tmp_path) not in status  # the upload folder means nothing to the user
    assert "Traceback" not in status and "\n" not in status


def test_a_bug_is_one_line_in_the_page_and_a_traceback_on_the_console(demo, monkeypatch, capsys):
    def boom(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(demo, "classify", boom)
    scores, _, _, status = web.classify_outputs(demo, str(RED_CIRCLE), LABELS, "")
    assert scores is None
    assert status == "**Error:** internal error (RuntimeError: boom); the server keeps running"
    assert "Traceback" in capsys.readouterr().err


def test_search_by_text_and_by_image(search_demo):
    hits = search_demo.search("a red circle", None, k=5)
    assert [h.rank for h in hits] == [1, 2, 3, 4, 5]
    assert all(h.path.startswith("circles/red_circle_") for h in hits[:3]), hits
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    assert hits[0].image.size[0] <= web.THUMB and hits[0].image.size[1] <= web.THUMB

    hits = search_demo.search("", str(RED_CIRCLE), k=3)
    assert all(h.path.startswith("circles/red_circle_") for h in hits), hits

    items, status = web.search_outputs(search_demo, "a blue square", None, 2)
    assert {caption.split(" · ")[2] for _, caption in items} == {
        "squares/blue_square_3.png",
        "squares/blue_square_4.png",
    }
    assert items[0][1].startswith("#1 · 0.") and "2 best matches for 'a blue square'" in status


@pytest.mark.parametrize(
    "text,image,k,needle",
    [
        ("", None, 5, "empty query"),
        ("  ", None, 5, "empty query"),
        ("a red circle", str(RED_CIRCLE), 5, "not both"),
        ("a red circle", None, 0, "top-k must be between 1 and"),
        ("", "notes.png", 5, "notes.png: not an image"),
    ],
)
def test_search_bad_queries(search_demo, tmp_path, text, image, k, needle):
    if image == "notes.png":
        image = tmp_path / "notes.png"
        image.write_text("not an image")
    items, status = web.search_outputs(search_demo, text, image, k)
    assert items is None and status.startswith("**Error:** ")
    assert needle in plain(status), status


def test_search_without_an_index_says_how_to_get_one(demo):
    items, status = web.search_outputs(demo, "a red circle", None, 5)
    assert items is None and "start the app with --index IDX" in plain(status), status


def test_an_index_of_another_model_is_not_searched(loaded, index_path):
    """Built with another model (or other weights under the same name): the tab says so
    instead of showing results."""
    idx = web.open_index(index_path)
    record = idx.index.record
    idx.index.manifest.model = replace(record, name="ViT-B-32", pretrained="openai")
    problem = web.index_problem(idx, loaded, "fp32")
    assert problem.startswith(
        "shapes.idx was built with ViT-B-32 (openai), not with the loaded demo-shapes (shapes)"
    ), problem
    idx.problem = problem
    items, status = web.search_outputs(web.WebDemo(loaded, idx), "a red circle", None, 3)
    assert items is None and "built with ViT" in status

    same = web.open_index(index_path)
    same.index.manifest.model = replace(record, probe=[-v for v in record.probe])
    assert "rebuild the index" in web.index_problem(same, loaded, "fp32")


def test_the_index_brings_its_model(index_path):
    args = argparse.Namespace(
        model=None,
        pretrained=None,
        index=str(index_path),
        device="cpu",
        precision="fp32",
        port=7860,
    )
    demo = web.load_demo(args)
    assert demo.model_name == "demo-shapes (shapes)" and demo.index.problem is None


def test_offline_with_no_model_it_serves_the_bundled_one(tmp_path, monkeypatch, capsys):
    """No --model and ViT-B-32's weights not to be had (the hub switched offline, as
    HF_HUB_OFFLINE=1 does, with an empty cache): demo-shapes, and one warning saying so."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    args = argparse.Namespace(
        model=None, pretrained=None, index=None, device="cpu", precision="fp32", port=7860
    )
    assert web.load_demo(args).model_name == "demo-shapes (shapes)"
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("warning: ViT-B-32 (openai) weights not available (offline?)")


def test_a_shard_index_s_thumbnails_come_from_its_tars(loaded, tmp_path):
    """A shard index (ids ``shard/key``): each hit's thumbnail is its sample's image read
    from the tar (not a file planted at folder/id), a grey box once its tar is gone."""
    import numpy as np
    from attn_clip.retrieval import IndexModel, RetrievalIndex
    from attn_vision.wds import ShardWriter
    from PIL import ImageOps

    items = {f"a {c} {s}": (c, s, *rest) for c, s, *rest in (GALLERY[i] for i in (0, 3, 5, 7))}
    shards = tmp_path / "shards"
    with ShardWriter(shards, shard_size=2, image_format="png") as writer:
        for caption, item in items.items():
            writer.write(render(*item), caption)
    index = RetrievalIndex.create(tmp_path / "s.idx", IndexModel(**vars(loaded), precision="fp32"))
    index.update(str(shards / "{00000..00001}.tar"), progress=False, workers=0)
    for id in index.embeddings.ids:  # a different picture at folder/id
        (shards / id).parent.mkdir(exist_ok=True)
        render("purple", "cross").save(shards / id, "PNG")
    idx = web.open_index(tmp_path / "s.idx")
    assert web.index_problem(idx, loaded, "fp32") is None
    demo = web.WebDemo(loaded, idx)

    def pixels(image) -> np.ndarray:
        return np.asarray(image.convert("RGB"))

    hits = demo.search("a red circle", None, k=4)
    assert sorted(h.path for h in hits) == sorted(index.embeddings.ids)
    for h in hits:
        item = items[idx.index.manifest.caption(h.path)]
        expected = ImageOps.contain(render(*item), (web.THUMB, web.THUMB))
        np.testing.assert_array_equal(pixels(h.image), pixels(expected))
    (shards / "00001.tar").unlink()
    for h in demo.search("a red circle", None, k=4):
        grey = (pixels(h.image) == 200).all()
        assert grey == h.path.startswith("00001/"), h.path


def test_build_app_queues_every_request_on_one_line(search_demo):
    app = web.build_app(search_demo)
    assert app._queue.max_size == web.QUEUE_SIZE
    fns = [fn for fn in app.fns.values() if fn.name in ("on_classify", "on_search")]
    assert len(fns) == 4
    assert {(fn.concurrency_id, fn.concurrency_limit) for fn in fns} == {("model", 1)}


def test_caption_options():
    assert web.caption_options("greedy") == ({}, "greedy")
    assert web.caption_options("beam search", 4.0, 2) == (
        {"num_beams": 4, "num_return_sequences": 2},
        "beam search, 4 beams",
    )
    options, how = web.caption_options("sampling", 3, 3, 0.5, 0.7, 11)
    assert options == {"do_sample": True, "top_p": 0.5, "temperature": 0.7,
                       "num_return_sequences": 3, "seed": 11}  # fmt: skip
    assert how == "sampling, top-p 0.5, temperature 0.7, seed 11"
    assert "seed" not in web.caption_options("sampling", seed=None)[0]  # empty: random
    assert "seed" not in web.caption_options("sampling", seed=" ")[0]
    bad = [
        (("nucleus",), "decoding must be one of greedy, beam search, sampling"),
        (("greedy", 3, 2), "greedy decoding gives one caption"),
        (("beam search", 1), "beams must be between 2 and 8"),
        (("beam search", 2, 3), "3 captions need at least 3 beams (got 2)"),
        (("beam search", 2.5), "beams must be a whole number"),
        (("sampling", 3, 9), "captions must be between 1 and 5"),
        (("sampling", 3, 1, 0), "top-p must be in (0, 1]"),
        (("sampling", 3, 1, 0.9, 0), "temperature must be > 0"),
        (("sampling", 3, 1, 0.9, 1.0, "x"), "seed must be a number"),
    ]
    for args, needle in bad:
        with pytest.raises(web.InputError, match=re.escape(needle)):
            web.caption_options(*args)


def test_caption_tab_gives_the_library_s_captions(coca_demo):
    got = coca_demo.caption(str(RED_CIRCLE))
    assert got.captions == library_captions(coca_demo, RED_CIRCLE) and got.how == "greedy"
    beams = coca_demo.caption(str(RED_CIRCLE), "beam search", 3, 2)
    expected = library_captions(coca_demo, RED_CIRCLE, num_beams=3, num_return_sequences=2)
    assert beams.captions == expected and len(expected) == 2
    sampled = [coca_demo.caption(str(RED_CIRCLE), "sampling", seed=s).captions for s in (5, 5, 6)]
    assert sampled[0] == sampled[1] != sampled[2]
    assert sampled[0] == library_captions(
        coca_demo, RED_CIRCLE, do_sample=True, top_p=0.9, temperature=1.0, seed=5
    )

    text, status = web.caption_outputs(coca_demo, str(RED_CIRCLE), "beam search", 3, 2)
    assert text.split("\n") == expected
    assert plain(status).startswith("2 captions (beam search, 3 beams, "), status


def test_caption_tab_gives_the_captions_of_the_command_line_app(coca_demo, coca_dir, capsys):
    import caption

    argv = [str(RED_CIRCLE), "--model", str(coca_dir), "--device", "cpu", "--json"]
    assert (
        caption.main([*argv, "--sample", "--top-p", "0.8", "--seed", "2", "--num-captions", "2"])
        == 0
    )
    cli = json.loads(capsys.readouterr().out)[0]["captions"]
    assert coca_demo.caption(str(RED_CIRCLE), "sampling", 3, 2, 0.8, 1.0, 2).captions == cli


@pytest.mark.parametrize(
    "case,needle",
    [
        ("no_image", "no image: upload one"),
        ("not_an_image", "notes.png: not an image"),
        ("greedy_two", "greedy decoding gives one caption"),
        ("top_p", "top-p must be in (0, 1]"),
    ],
)
def test_caption_bad_input_gives_a_message_in_the_page(coca_demo, tmp_path, case, needle):
    image, args = str(RED_CIRCLE), ()
    if case == "no_image":
        image = None
    elif case == "not_an_image":
        image = tmp_path / "notes.png"
        image.write_text("this is a text file")
    elif case == "greedy_two":
        args = ("greedy", 3, 2)
    else:
        args = ("sampling", 3, 1, 0.0)
    text, status = web.caption_outputs(coca_demo, image, *args)
    assert text == "" and status.startswith("**Error:** "), status
    assert needle in plain(status), status
    assert str(tmp_path) not in status and "\n" not in status


def test_caption_tab_without_a_coca_says_so(demo):
    text, status = web.caption_outputs(demo, str(RED_CIRCLE))
    assert text == "" and plain(status).startswith(
        "**Error:** demo-shapes (shapes) has no captioning decoder: captions need a CoCa model"
    ), status
    app = web.build_app(demo)
    assert "on_caption" not in {fn.name for fn in app.fns.values()}
    notice = [b for b in app.blocks.values() if getattr(b, "elem_id", None) == "cap-notice"]
    expected = "--model coca_base / coca_roberta-ViT-B-32 / coca_ViT-B-32"
    assert len(notice) == 1 and expected in plain(notice[0].value)


def test_caption_tab_with_a_coca_queues_on_the_model_line(coca_demo):
    app = web.build_app(coca_demo)
    fns = [fn for fn in app.fns.values() if fn.name == "on_caption"]
    assert [(fn.concurrency_id, fn.concurrency_limit) for fn in fns] == [("model", 1)]
    assert not [b for b in app.blocks.values() if getattr(b, "elem_id", None) == "cap-notice"]


# -- the command line ----------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("case", ["port", "index", "model", "port_in_use"])
def test_command_line_errors_are_one_line_exit_2(tmp_path, capsys, case):
    with socket.socket() as busy:
        if case == "port":
            argv, needle = ["--port", "70000"], "--port must be between 1 and 65535"
        elif case == "index":
            argv, needle = ["--index", str(tmp_path / "none.idx")], "no index at"
        elif case == "model":
            argv, needle = ["--model", "ViT-Q-99"], "ViT-Q-99"
        else:
            busy.bind(("127.0.0.1", 0))
            busy.listen()
            port = busy.getsockname()[1]
            argv, needle = ["--model", "demo-shapes", "--port", str(port)], "cannot listen on"
        assert web.main(argv) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], err
    assert "serving" not in out


# -- in a real browser ---------------------------------------------------------------------


def find_chromium() -> tuple[str | None, str | None]:
    """(browser, chromedriver): $CHROME_BIN / $CHROMEDRIVER, else found on PATH."""
    names = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
    browser = os.environ.get("CHROME_BIN") or next(filter(None, map(shutil.which, names)), None)
    driver = os.environ.get("CHROMEDRIVER") or shutil.which("chromedriver")
    return browser, driver


def start_server(tmp_path_factory, *args):
    """`apps/web.py ARGS` on a free port, as a user starts it: ``(process, port, logs)``."""
    logs = tmp_path_factory.mktemp("web_server")
    port = free_port()
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "GRADIO_TEMP_DIR": str(logs / "gradio"),
        "GRADIO_ANALYTICS_ENABLED": "False",
    }
    out, err = open(logs / "stdout", "w+"), open(logs / "stderr", "w+")  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, str(APPS / "web.py"), *map(str, args), "--port", str(port)],
        stdout=out,
        stderr=err,
        env=env,
        cwd=ROOT,
        # Ctrl-C as in a terminal, even when the tests themselves run in the background
        # (`cmd &` starts them with SIGINT ignored, and Python keeps an ignored SIGINT)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    return proc, port, logs, (out, err)


def stop_server(proc, files) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    for f in files:
        f.close()


@pytest.fixture(scope="module", autouse=True)
def started_server(index_path, tmp_path_factory):
    """`apps/web.py --model demo-shapes --index IDX`, started with the module, so that its
    start-up (importing torch and Gradio, ~15 s) runs beside the in-process tests;
    :func:`server` waits for it."""
    proc, port, logs, files = start_server(
        tmp_path_factory, "--model", "demo-shapes", "--index", index_path
    )
    yield proc, port, logs
    stop_server(proc, files)


@pytest.fixture(scope="module", autouse=True)
def started_coca_server(coca_dir, tmp_path_factory):
    """`apps/web.py --model TINY_COCA_FOLDER`, for the caption tab (started with the module
    too); :func:`coca_server` waits for it."""
    proc, port, logs, files = start_server(tmp_path_factory, "--model", coca_dir)
    yield proc, port, logs
    stop_server(proc, files)


def serving(started):
    """The server, once it serves: ``(process, url, logs)``."""
    proc, port, logs = started
    deadline = time.monotonic() + 180
    while "serving" not in (logs / "stdout").read_text():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"the server did not start: {(logs / 'stderr').read_text()}")
        time.sleep(0.2)
    return proc, f"http://127.0.0.1:{port}/", logs


@pytest.fixture(scope="module")
def server(started_server):
    return serving(started_server)


@pytest.fixture(scope="module")
def coca_server(started_coca_server):
    return serving(started_coca_server)


@pytest.fixture(scope="module")
def browser():
    browser, driver = find_chromium()
    if browser is None or driver is None:
        pytest.skip(
            "headless Chromium not found (no chromium / chromedriver on PATH): install "
            "Debian's chromium and chromium-driver (apt-get install chromium chromium-driver; "
            ".ci/run does) or set CHROME_BIN and CHROMEDRIVER"
        )
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = browser
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        opts.add_argument(arg)
    opts.add_argument("--window-size=1400,1000")
    d = webdriver.Chrome(service=Service(driver), options=opts)
    yield d
    d.quit()


def wait_for(driver, condition, timeout: float = 60, what: str = ""):
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait

    try:
        return WebDriverWait(driver, timeout, poll_frequency=0.2).until(lambda d: condition(d))
    except TimeoutException:
        pytest.fail(f"timed out waiting for {what}; the page says: {page_text(driver)[:2000]}")


def page_text(driver) -> str:
    from selenium.webdriver.common.by import By

    return driver.find_element(By.TAG_NAME, "body").text


def text_of(driver, css: str) -> str:
    from selenium.webdriver.common.by import By

    found = driver.find_elements(By.CSS_SELECTOR, css)
    return found[0].text if found else ""


def set_text(driver, css: str, text: str) -> None:
    """Replace a textbox's content as a user does (select all, type)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    box = driver.find_element(By.CSS_SELECTOR, css)
    box.send_keys(Keys.CONTROL, "a")
    box.send_keys(Keys.DELETE)
    if text:
        box.send_keys(text)


def images_loaded(driver, css: str) -> bool:
    script = (
        "const imgs = document.querySelectorAll(arguments[0]);"
        "return imgs.length > 0 && [...imgs].every(i => i.complete && i.naturalWidth > 0);"
    )
    return driver.execute_script(script, css)


def screenshot(driver, tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    driver.save_screenshot(str(path))
    assert path.stat().st_size > 10_000
    if os.environ.get("WEB_SCREENSHOTS"):
        shutil.copy(path, Path(os.environ["WEB_SCREENSHOTS"]) / name)
    return path


def classify_in_page(driver, labels: str | None) -> str:
    """Type the labels (None: keep them), click Classify, wait for the answer: the status
    text (each call here expects a status different from the one before)."""
    from selenium.webdriver.common.by import By

    if labels is not None:
        set_text(driver, "#zs-labels textarea", labels)
    before = text_of(driver, "#zs-status")
    driver.find_element(By.CSS_SELECTOR, "#zs-run").click()
    return wait_for(driver, lambda d: answered(d, "#zs-status", before), what="the answer")


def answered(driver, css: str, before: str = "") -> str:
    """The text of the status ``css`` once its request is done (Gradio's progress tracker
    hidden) and it differs from ``before``; else ''."""
    script = (
        "const t = document.querySelector(arguments[0] + ' [data-testid=status-tracker]');"
        "return !t || t.classList.contains('hide');"
    )
    if not driver.execute_script(script, css):
        return ""
    text = text_of(driver, css)
    return text if text and text != before else ""


def ranked_labels(driver) -> list[str]:
    from selenium.webdriver.common.by import By

    rows = driver.find_elements(By.CSS_SELECTOR, "#zs-scores .confidence-set dt")
    return [r.text for r in rows]


def test_browser_zero_shot(browser, server, tmp_path):  # (no browser: skipped at once)
    from selenium.webdriver.common.by import By

    proc, url, _ = server
    browser.get(url)
    upload = wait_for(
        browser,
        lambda d: d.find_elements(By.CSS_SELECTOR, "#zs-image input[type=file]"),
        what="the image upload",
    )
    upload[0].send_keys(str(RED_CIRCLE))
    wait_for(browser, lambda d: images_loaded(d, "#zs-image img"), what="the uploaded image")
    status = classify_in_page(browser, LABELS)
    assert status.startswith("red circle first of 4 label(s)"), status
    assert text_of(browser, "#zs-scores [data-testid=label-output-value]") == "red circle"
    assert ranked_labels(browser)[0] == "red circle"
    assert sorted(ranked_labels(browser)) == sorted(LABELS.split(", "))
    wait_for(browser, lambda d: images_loaded(d, "#zs-heatmap img"), what="the heatmap")
    assert "where the model looked for 'red circle'" in text_of(browser, "#zs-heatmap")
    screenshot(browser, tmp_path, "web_zero_shot.png")

    # bad input: a message in the page, no stack trace, and the server keeps serving
    browser.find_element(By.CSS_SELECTOR, "#zs-image button[aria-label='Remove Image']").click()
    notes = tmp_path / "notes.png"
    notes.write_text("this is a text file, not a picture")
    upload = wait_for(
        browser,
        lambda d: d.find_elements(By.CSS_SELECTOR, "#zs-image input[type=file]"),
        what="the emptied image upload",
    )
    upload[0].send_keys(str(notes))
    status = classify_in_page(browser, None)
    assert status == "Error: notes.png: not an image (or a format Pillow cannot read)", status
    status = classify_in_page(browser, " , ")
    assert status.startswith("Error: no labels"), status
    assert "Traceback" not in page_text(browser)
    assert proc.poll() is None

    # an example (image + labels) in one click, classified as well
    example = browser.find_element(By.CSS_SELECTOR, "[data-testid=dataset-cell-0-1]")
    assert example.text == "red circle, red square, blue circle, green star"
    example.click()
    wait_for(
        browser,
        lambda d: (
            "red square, blue circle"
            in d.find_element(By.CSS_SELECTOR, "#zs-labels textarea").get_attribute("value")
        ),
        what="the example's labels",
    )
    status = classify_in_page(browser, None)
    assert status.startswith("red circle first of 4 label(s)"), status


def test_browser_search(browser, server, tmp_path):
    from selenium.webdriver.common.by import By

    proc, url, _ = server
    browser.get(url)
    tab = wait_for(
        browser,
        lambda d: [
            t
            for t in d.find_elements(By.CSS_SELECTOR, "button[role=tab]")
            if "search" in t.text.lower()
        ],
        what="the search tab",
    )
    tab[0].click()
    wait_for(browser, lambda d: "shapes.idx" in page_text(d), what="the index description")
    assert "10 images under" in page_text(browser)
    set_text(browser, "#s-text textarea", "a red circle")
    browser.find_element(By.CSS_SELECTOR, "#s-run").click()
    status = wait_for(browser, lambda d: answered(d, "#s-status"), what="the search answer")
    assert status == "8 best matches for 'a red circle' (cosine similarity)", status
    captions = [c.text for c in browser.find_elements(By.CSS_SELECTOR, "#s-gallery .caption-label")]
    assert len(captions) == 8 and captions[0].startswith("#1 · "), captions
    ranked = [c.split(" · ")[2] for c in captions]
    assert all(p.startswith("circles/red_circle_") for p in ranked[:3]), ranked
    wait_for(browser, lambda d: images_loaded(d, "#s-gallery img"), what="the thumbnails")
    screenshot(browser, tmp_path, "web_search.png")

    set_text(browser, "#s-text textarea", "")
    browser.find_element(By.CSS_SELECTOR, "#s-run").click()
    status = wait_for(browser, lambda d: answered(d, "#s-status", status), what="the error")
    assert status == "Error: empty query: type a text or drop an image", status
    assert proc.poll() is None


def open_tab(driver, url: str, word: str) -> None:
    from selenium.webdriver.common.by import By

    driver.get(url)
    tab = wait_for(
        driver,
        lambda d: [
            t for t in d.find_elements(By.CSS_SELECTOR, "button[role=tab]") if word in t.text
        ],
        what=f"the {word} tab",
    )
    tab[0].click()


def caption_in_page(driver, decoding: str) -> tuple[str, str]:
    """Pick the decoding, click Caption, wait: ``(status, captions text)``."""
    from selenium.webdriver.common.by import By

    choice = [
        label
        for label in driver.find_elements(By.CSS_SELECTOR, "#c-decoding label")
        if label.text.strip() == decoding
    ]
    choice[0].click()
    before = text_of(driver, "#c-status")
    driver.find_element(By.CSS_SELECTOR, "#c-run").click()
    status = wait_for(driver, lambda d: answered(d, "#c-status", before), what="the captions")
    text = driver.find_element(By.CSS_SELECTOR, "#c-text textarea").get_attribute("value")
    return status, text


def test_browser_caption(browser, coca_server, coca_demo, tmp_path):
    from selenium.webdriver.common.by import By

    proc, url, _ = coca_server
    open_tab(browser, url, "Caption")
    upload = wait_for(
        browser,
        lambda d: d.find_elements(By.CSS_SELECTOR, "#c-image input[type=file]"),
        what="the caption image upload",
    )
    upload[0].send_keys(str(RED_CIRCLE))
    wait_for(browser, lambda d: images_loaded(d, "#c-image img"), what="the uploaded image")
    status, text = caption_in_page(browser, "beam search")
    assert status.startswith("1 caption (beam search, 3 beams, "), status
    assert text == library_captions(coca_demo, RED_CIRCLE, num_beams=3)[0]
    status, text = caption_in_page(browser, "sampling")
    assert status.startswith("1 caption (sampling, top-p 0.9, temperature 1, seed 0, "), status
    assert text == library_captions(coca_demo, RED_CIRCLE, do_sample=True, top_p=0.9, seed=0)[0]
    status, again = caption_in_page(browser, "greedy")
    assert (
        status.startswith("1 caption (greedy, ")
        and again == library_captions(coca_demo, RED_CIRCLE)[0]
    )
    screenshot(browser, tmp_path, "web_caption.png")

    # bad input: a message in the page, and the server keeps serving
    browser.find_element(By.CSS_SELECTOR, "#c-image button[aria-label='Remove Image']").click()
    notes = tmp_path / "notes.png"
    notes.write_text("this is a text file, not a picture")
    upload = wait_for(
        browser,
        lambda d: d.find_elements(By.CSS_SELECTOR, "#c-image input[type=file]"),
        what="the emptied caption image upload",
    )
    upload[0].send_keys(str(notes))
    status, text = caption_in_page(browser, "beam search")
    assert status == "Error: notes.png: not an image (or a format Pillow cannot read)", status
    assert text == "" and proc.poll() is None


def test_browser_caption_tab_of_a_clip_says_it_needs_a_coca(browser, server):
    open_tab(browser, server[1], "Caption")
    wait_for(
        browser,
        lambda d: "has no captioning decoder" in text_of(d, "#cap-notice"),
        what="the caption tab's notice",
    )
    assert "coca_ViT-B-32" in text_of(browser, "#cap-notice")


def test_ctrl_c_stops_the_server_with_exit_code_130(server):
    """Last in this file: it stops the shared server."""
    proc, _, logs = server
    assert proc.poll() is None, (logs / "stderr").read_text()
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 130
    assert (logs / "stderr").read_text().strip().splitlines()[-1] == "interrupted"
