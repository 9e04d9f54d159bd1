"""The CLIP apps with multilingual models, offline: tiny random-init xlm-roberta-base-ViT-B-32
and nllb-clip-base folders (tests/_support/multilingual.py: Hugging Face text towers, their
sentencepiece tokenizers trained here) given Chinese and German labels and queries.

zero_shot.py prints the library's own probabilities (``build_zero_shot_classifier`` +
``predict`` with the label alone as its template, the NLLB tokenizer set to the language);
retrieval.py indexes a folder and searches it with a Chinese text (the scores are the
library's cosines); the web app's zero-shot tab (in process) gives the same numbers; NLLB's
--language puts the language's token first; a bad --language code is one line, exit 2."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pytest
import torch
import zero_shot  # apps/zero_shot.py
from _support.multilingual import LABELS, save_tiny_multilingual
from _support.retrieval import call, make_gallery, one_line_error
from attn_clip.languages import ISO_639_1, NLLB_LANGUAGES, language_code, tokenizer_for_language
from attn_clip.zero_shot import LABEL_ONLY, SIMPLE_TEMPLATES, templates_for_language
from attn_core.errors import InputError
from PIL import Image
from torch.testing import assert_close

NOTE = {
    lang: f"templates: none for {lang!r} (open_clip has English prompt templates only); "
    "each label is used as it is"
    for lang in ("zh", "de", "deu_Latn")
}


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """One intra-op thread for these tiny models (a busy 2-core machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("multilingual")
    return {
        "xlmr": save_tiny_multilingual(root / "xlmr", "xlm-roberta-base-ViT-B-32"),
        "nllb": save_tiny_multilingual(root / "nllb", "nllb-clip-base"),
    }


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    """Four generated shapes (the retrieval tests' gallery, cut short)."""
    from _support.retrieval import GALLERY

    return make_gallery(tmp_path_factory.mktemp("ml_gallery"), GALLERY[::3])


def _library(folder: Path, language: str | None):
    """``(model, preprocess, tokenizer)`` of the folder, the tokenizer as a library user
    sets it up: ``get_tokenizer(config, language=<NLLB code>)`` for an NLLB model."""
    import attn_clip

    model, preprocess, tokenizer = attn_clip.create_model_and_transforms(str(folder))
    if language is not None and tokenizer.tokenizer_class == "NllbTokenizer":
        tokenizer = attn_clip.get_tokenizer(model.config, language=language_code(language))
    return model, preprocess, tokenizer


def _library_probs(folder, language, image: Path, labels, templates) -> torch.Tensor:
    import attn_clip

    model, preprocess, tokenizer = _library(folder, language)
    classifier = attn_clip.build_zero_shot_classifier(model, tokenizer, labels, templates)
    with Image.open(image) as im:
        return attn_clip.predict(model, preprocess(im.convert("RGB"))[None], classifier)[0]


# -- the library's language table and templates ---------------------------------------------


def test_language_codes_and_templates():
    assert language_code("zh") == "zho_Hans" and language_code("DE") == "deu_Latn"
    assert language_code("zho_Hans") == language_code("ZHO_hans") == "zho_Hans"
    assert all(code in NLLB_LANGUAGES for code in ISO_639_1.values())
    for iso, code in {"fr": "fra_Latn", "es": "spa_Latn", "ja": "jpn_Jpan", "ar": "arb_Arab",
                      "hi": "hin_Deva", "ru": "rus_Cyrl", "en": "eng_Latn"}.items():  # fmt: skip
        assert language_code(iso) == code
    for bad in ("xx", "zho_Hanz", "chinese", "", "zh-CN"):
        with pytest.raises(InputError, match="unknown language"):
            language_code(bad)
    transformers = pytest.importorskip("transformers")
    from transformers.models.nllb.tokenization_nllb import FAIRSEQ_LANGUAGE_CODES

    assert transformers and NLLB_LANGUAGES == tuple(FAIRSEQ_LANGUAGE_CODES)
    for english in (None, "en", "eng_Latn"):
        assert templates_for_language(english) == (list(SIMPLE_TEMPLATES), None)
    assert len(templates_for_language("en", imagenet=True)[0]) == 80
    assert templates_for_language("de") == ([LABEL_ONLY], NOTE["de"])


def test_nllb_language_puts_its_token_first(folders):
    """The NLLB tokenizer set to a language: the ids start with that language's token
    (eng_Latn by default), the text's ids after it unchanged; an XLM-R tokenizer has no
    language token: unchanged, and a note says so."""
    import attn_clip

    _, _, default = attn_clip.create_model_and_transforms(str(folders["nllb"]))
    german, note = tokenizer_for_language(default, "de")
    assert note is None and german.language == "deu_Latn" and default.language == "eng_Latn"
    texts = LABELS["de"]
    ids, base = german(texts), default(texts)
    lang_id = attn_clip.HFTokenizer(folders["nllb"], language="deu_Latn").sot_token_id
    assert (ids[:, 0] == lang_id).all() and (base[:, 0] == default.sot_token_id).all()
    assert lang_id != default.sot_token_id
    assert torch.equal(ids[:, 1:], base[:, 1:])
    with pytest.raises(InputError, match="unknown language 'xx'"):
        tokenizer_for_language(default, "xx")

    _, _, xlmr = attn_clip.create_model_and_transforms(str(folders["xlmr"]))
    same, note = tokenizer_for_language(xlmr, "zh")
    assert same is xlmr
    assert note == (
        "language 'zh': the tokenizer (XLMRobertaTokenizer) has no source-language tokens, "
        "so its ids do not change"
    )


# -- zero_shot.py --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("family", "language"), [("xlmr", "zh"), ("nllb", "de"), ("nllb", "deu_Latn")]
)
def test_zero_shot_labels_in_chinese_and_german(folders, images, family, language, capsys):
    """--language: each label as it is (no English template around it), the NLLB tokenizer
    reading them as that language; the probabilities are the library's; stderr says once
    (for two images) what the language changed; --json records it."""
    folder, labels = folders[family], LABELS[language[:2]][:3]
    pics = sorted(images.rglob("*.png"))[:2]
    argv = ["--model", folder, "--labels", *labels, "--language", language, "--json"]
    assert zero_shot.main([str(a) for a in argv] + [f"--image={p}" for p in pics]) == 0
    out, err = capsys.readouterr()
    records = [json.loads(line) for line in out.splitlines()]
    for pic, record in zip(pics, records, strict=True):
        got = {p["label"]: p["prob"] for p in record["predictions"]}
        want = _library_probs(folder, language, pic, labels, [LABEL_ONLY])
        assert_close(torch.tensor([got[label] for label in labels]), want)
        english = _library_probs(folder, None, pic, labels, list(SIMPLE_TEMPLATES))
        assert (want - english).abs().max() > 1e-3  # (the templates matter here)
    tokenizer_language = language_code(language) if family == "nllb" else None
    assert records[0]["language"] == {
        "code": language_code(language),
        "tokenizer_language": tokenizer_language,
        "templates": "none",
        "note": NOTE[language],
    }
    lines = err.strip().splitlines()
    if family == "xlmr":
        assert lines == [
            f"language {language!r}: the tokenizer (XLMRobertaTokenizer) has no "
            "source-language tokens, so its ids do not change",
            NOTE[language],
        ]
    else:
        assert lines == [NOTE[language]]


def test_zero_shot_table_and_explicit_template(folders, images, capsys):
    """The table lines up Chinese labels (two columns each); an explicit --template wins
    over --language (no note about templates) and is what the library is given."""
    folder, labels = folders["nllb"], LABELS["zh"][:3]
    image = sorted(images.rglob("*.png"))[0]
    base = ["--model", str(folder), "--image", str(image), "--labels", *labels]
    assert zero_shot.main([*base, "--language", "zh"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == str(image) and out[1].split() == ["#", "label", "prob"]
    assert sorted(line.split()[1] for line in out[2:5]) == sorted(labels)
    assert len({zero_shot.display_width(line) for line in out[2:5]}) == 1  # aligned
    template = "一张{}的照片"
    assert zero_shot.main([*base, "--language", "zh", "--template", template, "--json"]) == 0
    out, err = capsys.readouterr()
    record = json.loads(out)
    assert record["language"]["templates"] == "given" and record["language"]["note"] is None
    assert "templates:" not in err
    got = {p["label"]: p["prob"] for p in record["predictions"]}
    want = _library_probs(folder, "zh", image, labels, [template])
    assert_close(torch.tensor([got[label] for label in labels]), want)


# -- retrieval.py --------------------------------------------------------------------------


def test_retrieval_index_and_search_in_chinese(folders, images, tmp_path):
    """An NLLB folder indexes a folder of images; a Chinese text query with --language zh
    gives the library's cosines (its text tokenized as zho_Hans), best first."""
    import retrieval  # apps/retrieval.py

    folder, index = folders["nllb"], tmp_path / "photos.idx"
    result = call(retrieval.main, "index", images, "--out", index, "--model", folder, "--json")
    assert result.code == 0, result.err
    query = LABELS["zh"][4]
    result = call(retrieval.main, "search", index, "--text", query, "--language", "zh", "--json")
    assert result.code == 0 and result.err == "", result.err
    record = json.loads(result.out)
    assert record["query"] == query and len(record["hits"]) == 4

    model, preprocess, tokenizer = _library(folder, "zh")
    paths = sorted(images.rglob("*.png"))
    with torch.no_grad():
        x = torch.stack([preprocess(Image.open(p).convert("RGB")) for p in paths])
        cos = (
            model.encode_image(x, normalize=True)
            @ model.encode_text(tokenizer([query]), normalize=True)[0]
        )
    want = sorted(zip(cos.tolist(), map(str, paths), strict=True), reverse=True)
    assert [h["path"] for h in record["hits"]] == [p for _, p in want]
    assert_close(torch.tensor([h["score"] for h in record["hits"]]), torch.tensor(
        [s for s, _ in want]), atol=1e-5, rtol=1e-5)  # fmt: skip
    english = call(retrieval.main, "search", index, "--text", query, "--json")
    assert json.loads(english.out)["hits"] != record["hits"]  # eng_Latn: other scores


# -- web.py --------------------------------------------------------------------------------


def test_web_zero_shot_tab_in_german(folders, images, monkeypatch):
    """``load_demo`` with an NLLB folder and --language de (the page itself is
    tests/apps/test_web.py's; Gradio is not needed here): the tab's probabilities are the
    library's, labels used as they are, and the status says so; a typed template wins."""
    import web  # apps/web.py

    monkeypatch.setattr(web, "_gradio", lambda: None)
    args = argparse.Namespace(model=str(folders["nllb"]), pretrained=None, index=None,
                              device="cpu", precision="fp32", port=7860)  # fmt: skip
    demo = web.load_demo(args, "de")
    assert demo.loaded.tokenizer.language == "deu_Latn"
    labels = LABELS["de"][:3]
    image = sorted(images.rglob("*.png"))[0]
    scores, heat, _, status = web.classify_outputs(demo, str(image), ", ".join(labels), "")
    want = _library_probs(folders["nllb"], "de", image, labels, [LABEL_ONLY])
    assert_close(torch.tensor([scores[label] for label in labels]), want)
    assert heat is not None  # the image tower's heatmap, as for any ViT
    assert re.sub(r"\\(.)", r"\1", status).endswith(f"note: {NOTE['de']}")  # (Markdown)
    scores, _, _, status = web.classify_outputs(
        demo, str(image), ", ".join(labels), "ein Bild: {}", explain=False
    )
    assert "templates:" not in status
    want = _library_probs(folders["nllb"], "de", image, labels, ["ein Bild: {}"])
    assert_close(torch.tensor([scores[label] for label in labels]), want)


# -- bad codes -----------------------------------------------------------------------------


@pytest.mark.parametrize("code", ["xx", "zho_Hanz", "klingon"])
def test_a_bad_language_code_is_one_line_exit_2(folders, images, tmp_path, code, capsys):
    import retrieval
    import web

    image = sorted(images.rglob("*.png"))[0]
    argv = ["--model", str(folders["nllb"]), "--image", str(image), "--labels", "a", "b"]
    assert zero_shot.main([*argv, "--language", code]) == 2
    one_line_error(capsys.readouterr().err, f"--language: unknown language {code!r}", "zho_Hans")
    result = call(retrieval.main, "search", tmp_path / "none.idx", "--text", "猫",
                  "--language", code)  # fmt: skip
    assert result.code == 2
    one_line_error(result.err, f"--language: unknown language {code!r}")
    result = call(web.main, "--model", folders["nllb"], "--language", code)
    assert result.code == 2
    one_line_error(result.err, f"--language: unknown language {code!r}")
    assert not list(tmp_path.iterdir())  # nothing created
