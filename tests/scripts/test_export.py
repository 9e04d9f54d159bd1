"""scripts/export.py: ONNX round trip (dynamic batch and text length) and int8 quantization
on a tiny CLIP saved as a local folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from attn_clip import CLIPConfig, create_model, save_pretrained

TINY = {
    "embed_dim": 32,
    "vision_cfg": {"image_size": 32, "patch_size": 8, "width": 64, "layers": 2, "head_width": 16},
    "text_cfg": {"context_length": 24, "vocab_size": 49408, "width": 48, "heads": 4, "layers": 2},
}


@pytest.fixture(scope="module")
def export_script(load_script):
    return load_script("export")


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory) -> Path:
    torch.manual_seed(0)
    model = create_model(CLIPConfig.from_open_clip(TINY))
    with torch.no_grad():  # non-trivial norms, so a dropped or swapped one would show
        for p in model.parameters():
            if p.ndim == 1:
                p.add_(torch.randn_like(p) * 0.05)
    return save_pretrained(model, tmp_path_factory.mktemp("tiny") / "clip")


@pytest.fixture(scope="module")
def exported(export_script, tiny_folder, tmp_path_factory):
    """Run the CLI once: ``--format onnx --quantize int8`` on the tiny folder."""
    pytest.importorskip("onnxruntime")
    tmp = tmp_path_factory.mktemp("export")
    out, report = tmp / "out", tmp / "report.json"
    argv = ["--model", str(tiny_folder), "--format", "onnx", "--quantize", "int8"]
    argv += ["--out", str(out), "--json", str(report), "--batch", "2", "--repeats", "1"]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny ops: a second thread only adds waiting
    try:
        code = export_script.main(argv)
    finally:
        torch.set_num_threads(threads)
    return code, out, json.loads(report.read_text())


def test_onnx_round_trip_and_int8(exported):
    code, out, result = exported
    assert code == 0
    for name in ("image.onnx", "text.onnx", "export.json", "clip_int8.pt"):
        assert (out / name).is_file(), name
    diffs = result["onnx_max_abs_diff"]
    assert len(diffs) == 4 and max(diffs.values()) <= 1e-4
    assert {k for k in diffs if k.startswith("text")} == {
        "text batch 3 length 24",
        "text batch 1 length 6",
    }  # dynamic batch and text length
    for name, r in result["int8"].items():
        if name != "size_mb":
            assert r["cosine_min"] >= 0.99, name
    assert result["int8"]["size_mb"]["int8"] < result["int8"]["size_mb"]["fp32"]


def test_onnx_graph_runs_at_a_new_batch_and_length(exported, tiny_folder):
    import onnxruntime as ort
    from attn_clip import Tokenizer

    _, out, _ = exported
    model = create_model(str(tiny_folder))
    tokens = Tokenizer(24)(["a photo of a dog", "a cat", "two red cars", "x", "y"])[:, :9]
    session = ort.InferenceSession(str(out / "text.onnx"))
    got = session.run(None, {"tokens": tokens.numpy()})[0]
    images = torch.randn(5, 3, 32, 32)
    got_images = ort.InferenceSession(str(out / "image.onnx")).run(None, {"images": images.numpy()})
    with torch.no_grad():
        ref = model.encode_text(tokens)  # the fast, truncated path
        ref_images = model.encode_image(images)
    assert abs(got - ref.numpy()).max() <= 1e-4
    assert abs(got_images[0] - ref_images.numpy()).max() <= 1e-4


def test_int8_keeps_the_embeddings(export_script, tiny_folder):
    model = create_model(str(tiny_folder))
    qmodel = export_script.quantize_int8(model)
    assert "DynamicQuantizedLinear" in repr(qmodel.text.blocks[0].mlp.fc1)
    images = torch.randn(4, 3, 32, 32)
    with torch.no_grad():
        cos = torch.nn.functional.cosine_similarity(
            qmodel.encode_image(images), model.encode_image(images), dim=-1
        )
    assert cos.min() >= 0.99


def test_bad_input_exits_2(export_script, capsys):
    assert export_script.main(["--model", "no-such-model", "--format", "onnx"]) == 2
    assert "error" in capsys.readouterr().err
