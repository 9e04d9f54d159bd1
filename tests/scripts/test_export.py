"""scripts/export.py (a recipe over attn_clip.export): ONNX and OpenVINO round trips (dynamic
batch and text length), dynamic and static int8 quantization on a tiny CLIP saved as a local
folder, and its bad inputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from attn_clip import CLIPConfig, create_model, save_pretrained
from attn_clip import export as clip_export

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
def shapes_data(tmp_path_factory) -> Path:
    """A few captioned-shapes images: ``train.csv`` (calibration), ``heldout/`` (zero-shot)."""
    from attn_train import shapes

    root = tmp_path_factory.mktemp("shapes")
    shapes.write_dataset(root, n_train=40, n_val=0, n_heldout=24, image_size=32)
    return root


@pytest.fixture(scope="module")
def exported(export_script, tiny_folder, shapes_data, tmp_path_factory):
    """Run the CLI once (one ONNX export for everything): ``--format onnx openvino
    --quantize int8 int8-static`` on the tiny folder, calibrated on 24 shapes images. (The
    longest set-up of tests/scripts, ~16 s on 2 busy cores: torch.onnx's exporter
    (torch.export and its decompositions, about half), OpenVINO's converter and NNCF's
    calibration each cost seconds per graph whatever the model's size (one block less saves
    ~15%); every test below reads this one run.)"""
    for module in ("onnxruntime", "openvino", "nncf"):
        pytest.importorskip(module)
    tmp = tmp_path_factory.mktemp("export")
    out, report = tmp / "out", tmp / "report.json"
    argv = ["--model", str(tiny_folder), "--format", "onnx", "openvino"]
    argv += ["--quantize", "int8", "int8-static", "--calibration", str(shapes_data / "train.csv")]
    argv += ["--calibration-size", "24", "--zeroshot-dir", str(shapes_data / "heldout")]
    argv += ["--zeroshot-classnames", str(shapes_data / "classnames.txt"), "--max-drop", "100"]
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
    assert not list(out.parent.glob(".out.partial-*"))  # the staging folder is gone
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


def test_int8_keeps_the_embeddings(tiny_folder):
    model = create_model(str(tiny_folder))
    qmodel = clip_export.quantize_dynamic_int8(model)
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


# -- OpenVINO ---------------------------------------------------------------------------------


def test_openvino_ir_matches_pytorch(exported, tiny_folder):
    """The IR the CLI wrote, read back with a fresh OpenVINO core at a new batch and text
    length: within 1e-4 of PyTorch (fp32 inference precision)."""
    import openvino as ov
    from attn_clip import Tokenizer

    code, out, result = exported
    for name in ("image.xml", "image.bin", "text.xml", "text.bin"):
        assert (out / name).is_file(), name
    diffs = result["openvino_max_abs_diff"]
    assert len(diffs) == 4 and max(diffs.values()) <= 1e-4
    meta = json.loads((out / "export.json").read_text())
    assert {"image.onnx", "text.onnx", "image.xml", "text.xml"} <= set(meta["inputs"])

    model = create_model(str(tiny_folder))
    core, config = ov.Core(), {"INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": 1}
    image = core.compile_model(str(out / "image.xml"), "CPU", config)
    text = core.compile_model(str(out / "text.xml"), "CPU", config)
    images = torch.randn(5, 3, 32, 32)
    tokens = Tokenizer(24)(["a photo of a dog", "a cat", "two red cars", "x", "y"])[:, :9]
    with torch.no_grad():
        ref_images, ref_text = model.encode_image(images), model.encode_text(tokens)
    assert abs(image(images.numpy())[0] - ref_images.numpy()).max() <= 1e-4
    assert abs(text(tokens.numpy())[0] - ref_text.numpy()).max() <= 1e-4
    speed = result["speed_ms"]  # timed next to PyTorch
    assert all("OpenVINO fp32" in row and "PyTorch fp32" in row for row in speed.values())


def test_static_int8_keeps_the_embeddings(exported):
    code, out, result = exported
    for name in ("image_int8.xml", "image_int8.bin", "text_int8.xml", "text_int8.bin"):
        assert (out / name).is_file(), name
    report = result["int8_static"]
    assert report["calibration"]["images"] == report["calibration"]["captions"] == 24
    cos = report["cosine_to_fp32"]["static int8"]
    assert cos["image"]["n"] == 16  # the 16 CSV rows not used for calibration
    assert cos["image"]["min"] > 0.98 and cos["text"]["min"] > 0.98
    kept = report["kept_fp32"]  # the patch embedding and both output projections
    assert kept["text"] == ["text_embeds"] and kept["image"][0] == "image_embeds"
    assert len(kept["image"]) == 2
    top1 = report["zero_shot_top1"]
    assert top1["n"] == 24 and {"fp32", "dynamic int8", "static int8"} <= set(top1)
    assert (out / "image_int8.bin").stat().st_size < (out / "image.bin").stat().st_size
    speed = result["speed_ms"]
    assert all(len(row) == 4 for row in speed.values())  # fp32, dynamic, OpenVINO fp32 / int8


def test_calibration_from_an_image_folder(export_script, tiny_folder, shapes_data):
    """A folder of class folders: its images, and "a photo of a {class}" as captions."""
    model = create_model(str(tiny_folder))
    data = export_script.read_image_text(shapes_data / "heldout", model)
    calib, rest = clip_export.calibration_split(len(data), 10, eval_size=5)
    assert len(calib) == 10 and len(rest) == 5 and not set(calib) & set(rest)
    rows = clip_export.load_rows(data, calib, model)
    assert len(rows["image"]) == 10 and rows["image"][0].shape == (1, 3, 32, 32)
    assert all(t.shape[0] == 1 and t[0, -1] == t.max() for t in rows["text"])  # cut at EOT
    _, caption = data[0]
    assert caption.startswith("a photo of a ")


# -- bad input: one line, exit 2, nothing written ----------------------------------------------


def _cli(module, argv: list[str], capsys) -> tuple[int, list[str]]:
    from attn_train.cli import run_main

    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        run_main(lambda: module.main(argv))
    return e.value.code, [line for line in capsys.readouterr().err.splitlines() if line.strip()]


def test_bad_engine_and_calibration_input(
    export_script, tiny_folder, shapes_data, tmp_path, capsys
):
    out = tmp_path / "out"
    base = ["--model", str(tiny_folder), "--out", str(out)]
    static = [*base, "--quantize", "int8-static"]
    (tmp_path / "flat").mkdir()
    (tmp_path / "flat" / "a.png").write_bytes(b"not a class folder")
    (tmp_path / "cols.csv").write_text("image,caption\nx.png,a cat\n")
    cases = [
        (static, "--quantize int8-static needs --calibration"),
        ([*static, "--calibration", str(tmp_path / "missing.csv")], "no such file or folder"),
        ([*static, "--calibration", str(tmp_path / "flat")], "expected DIR/<class>/<image>"),
        ([*static, "--calibration", str(tmp_path / "cols.csv")], "no column(s)"),
        (
            [
                *static,
                "--calibration",
                str(shapes_data / "train.csv"),
                "--zeroshot-dir",
                str(tmp_path / "nowhere"),
            ],
            "--zeroshot-dir",
        ),  # fmt: skip
        ([*base, "--format", "onnx", "--calibration", "x.csv"], "only read by --quantize"),
    ]
    if not torch.cuda.is_available():
        cases.append(([*base, "--format", "openvino", "tensorrt"], "needs an NVIDIA GPU"))
    for argv, match in cases:
        code, lines = _cli(export_script, argv, capsys)
        assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), (argv, lines)
        assert match in lines[0], lines[0]
        assert not out.exists() and not list(tmp_path.glob(".out*")), argv


def test_interrupted_export_leaves_nothing(
    export_script, tiny_folder, tmp_path, monkeypatch, capsys
):
    """Ctrl-C after the staging folder exists: one line, 130, no OUT, no staging folder."""

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(clip_export, "export_clip", interrupted)
    out = tmp_path / "out"
    argv = ["--model", str(tiny_folder), "--format", "openvino", "--out", str(out)]
    assert _cli(export_script, argv, capsys) == (130, ["interrupted"])
    assert not out.exists() and not list(tmp_path.glob(".out*"))
