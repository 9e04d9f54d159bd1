"""attn_clip.export as a library: importing it pulls in none of its optional packages, a
missing one is one ImportError naming the ``export`` extra (before anything is written), the
extra lists every package the functions need, and ``export_clip`` refuses bad arguments and
leaves only the files it reports, and the graphs it exports (ViT, ConvNeXt and ModifiedResNet
CLIPs) hold no oneDNN-only op (the full ONNX / OpenVINO / int8 round trips are in
tests/scripts/test_export.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from attn_clip import CLIPConfig, create_model
from attn_clip import export as clip_export
from attn_core import onednn
from torch.utils._python_dispatch import TorchDispatchMode

ROOT = Path(__file__).resolve().parents[2]
OPTIONAL = ("onnx", "onnxscript", "onnxruntime", "openvino", "nncf", "tensorrt")
TINY = {
    "embed_dim": 16,
    "vision_cfg": {"image_size": 32, "patch_size": 16, "width": 32, "layers": 1, "head_width": 16},
    "text_cfg": {"context_length": 16, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1},
}


TEXT = {"layers": 1, "width": 32, "heads": 2, "context_length": 16}
TOWERS = {  # the three trunks with a fast path of their own, at their smallest
    "ViT": lambda: create_model(CLIPConfig.from_open_clip(TINY)),
    "ModifiedResNet (RN50)": lambda: create_model(
        "RN50", vision={"layers": (1, 1, 1, 1), "width": 16, "head_width": 8, "image_size": 64},
        text=TEXT, embed_dim=16,
    ),
    "ConvNeXt": lambda: create_model(
        "convnext_base", vision={"convnext": {"depths": (1, 1, 1, 1), "dims": (8, 16, 24, 32)},
        "image_size": 64}, text=TEXT, embed_dim=16,
    ),
}  # fmt: skip
ONEDNN_ONLY = ("mkldnn", "onednn", "pointwise", "attn_core")  # no ONNX / OpenVINO form


class _RecordOps(TorchDispatchMode):
    """The names of the ATen-level ops a forward runs (eager)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.add(str(func))
        return func(*args, **(kwargs or {}))


def _onednn_only(ops) -> list[str]:
    return sorted(op for op in map(str, ops) if any(word in op for word in ONEDNN_ONLY))


def _eager_ops(tower: torch.nn.Module, x: torch.Tensor) -> set[str]:
    with torch.no_grad(), _RecordOps() as record:
        tower(x)
    return record.ops


def _exported_ops(tower: torch.nn.Module, x: torch.Tensor) -> set[str]:
    """The call targets of ``torch.export``'s graph (what ``torch.onnx.export(dynamo=True)``
    translates), traced without autograd: where the fast path would apply."""
    with torch.no_grad():
        graph = torch.export.export(tower, (x,)).graph
    return {str(n.target) for n in graph.nodes if n.op == "call_function"}


@pytest.mark.parametrize("name", list(TOWERS))
def test_exported_graphs_hold_no_onednn_only_op(name):
    """export's plain copy switches off every module's fast path (a ConvNeXt's blocks too),
    so its reference run and its exported graphs are plain PyTorch ops, even with the
    compiler's oneDNN op registered (as after ``compile_encoders``)."""
    torch.manual_seed(0)
    model = TOWERS[name]().eval()
    images, tokens = clip_export.example_inputs(model, 2)
    image = clip_export.ImageTower(model)
    assert _onednn_only(_eager_ops(image, images))  # the fast path runs oneDNN ops
    plain = clip_export.plain_copy(model)
    assert not _onednn_only(_eager_ops(clip_export.ImageTower(plain), images))
    assert not _onednn_only(_eager_ops(clip_export.TextTower(plain), tokens))
    onednn._register_compile_op()  # the fast path then runs inside traced code too
    assert not _onednn_only(_exported_ops(clip_export.ImageTower(plain), images))
    if name == "ViT":  # the check can fail: the fast path's op in an exported graph
        assert _onednn_only(_exported_ops(image, images)) == ["attn_core.onednn_linear.default"]
        assert not _onednn_only(_exported_ops(clip_export.TextTower(plain), tokens))
    with torch.no_grad():  # the copy computes the same embeddings
        torch.testing.assert_close(image(images), clip_export.ImageTower(plain)(images))


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    return create_model(CLIPConfig.from_open_clip(TINY)).eval()


def test_import_pulls_in_no_optional_package():
    code = (
        "import sys\nfrom attn_clip import export\nimport attn_clip.export\n"
        f"print(sorted(m for m in {OPTIONAL!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"


def test_a_missing_package_names_the_extra(tiny, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxscript", None)  # "not installed"
    monkeypatch.setitem(sys.modules, "nncf", None)
    monkeypatch.setitem(sys.modules, "tensorrt", None)
    with pytest.raises(ImportError, match=r"onnxscript is not installed: .*attn-clip\[export\]"):
        clip_export.export_onnx(tiny, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    with pytest.raises(ImportError, match=r"nncf is not installed: .*attn-clip\[export\]"):
        clip_export.quantize_static({}, {})
    with pytest.raises(ImportError, match=r"attn-clip\[export\]"):
        clip_export.export_clip(tiny, tmp_path / "out", ["onnx"])
    assert not (tmp_path / "out").exists()
    with pytest.raises(ImportError, match=r"tensorrt is not installed: pip install tensorrt"):
        clip_export.require("tensorrt")  # not in the extra: GPUs only


def test_the_extra_lists_every_package_the_functions_need():
    tomllib = pytest.importorskip("tomllib")
    pyproject = tomllib.loads((ROOT / "packages/attn-clip/pyproject.toml").read_text())
    extra = pyproject["project"]["optional-dependencies"]["export"]
    names = {req.split(">")[0].split("=")[0].split("[")[0].strip() for req in extra}
    needed = clip_export.requirements(clip_export.FORMATS[:2], clip_export.QUANTIZE)
    assert set(needed) == names == {"onnx", "onnxscript", "onnxruntime", "openvino", "nncf"}
    assert clip_export.requirements([], ["int8"]) == []  # torch.ao only


def test_export_clip_refuses_bad_arguments(tiny, tmp_path):
    out = tmp_path / "out"
    with pytest.raises(ValueError, match="unknown format"):
        clip_export.export_clip(tiny, out, ["tflite"])
    with pytest.raises(ValueError, match="needs calibration"):
        clip_export.export_clip(tiny, out, [], ["int8-static"])
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="needs an NVIDIA GPU"):
            clip_export.export_clip(tiny, out, ["tensorrt"])
        with pytest.raises(RuntimeError, match="needs an NVIDIA GPU"):
            clip_export.export_tensorrt(tiny, out, out)
    assert not out.exists()


def test_dynamic_int8_alone_writes_only_its_file(tiny, tmp_path):
    report, written, failed = clip_export.export_clip(
        tiny, tmp_path, [], ["int8"], batch=2, repeats=1, verbose=False
    )
    assert written == ["clip_int8.pt"] and not failed
    assert sorted(p.name for p in tmp_path.iterdir()) == ["clip_int8.pt"]  # no temp folder
    assert report["int8"]["size_mb"]["int8"] < report["int8"]["size_mb"]["fp32"]
    assert "onnx_max_abs_diff" not in report and "speed_ms" not in report


def test_calibration_set_holds_rows_out(tiny):
    data = [(torch.randn(3, 32, 32), "a red circle") for _ in range(12)] + [None]
    calib = clip_export.calibration_set(data, 8, tiny, source="list", eval_size=3)
    assert len(calib.rows["image"]) == 8 and len(calib.check_rows["image"]) == 3
    assert calib.held_out and calib.source == "list"
    assert calib.rows["text"][0].shape[1] < 16  # cut after the EOT token


@pytest.mark.parametrize("vnni, fix", [(True, None), (False, True)])
def test_static_int8_fixes_overflow_on_cpus_without_vnni(vnni, fix, monkeypatch):
    """Without VNNI the int8 kernels saturate at int16: NNCF's overflow fix (7-bit weights) is
    then on for every layer; with VNNI NNCF's defaults stay."""
    nncf = pytest.importorskip("nncf")
    from attn_clip.export import quantize

    assert isinstance(quantize.cpu_has_vnni(), bool)  # this machine's /proc/cpuinfo
    seen = []
    monkeypatch.setattr(quantize, "cpu_has_vnni", lambda: vnni)
    monkeypatch.setattr(quantize, "keep_fp32", lambda model, name: [])
    monkeypatch.setattr(nncf, "quantize", lambda *a, advanced_parameters=None, **kw: seen.append(
        advanced_parameters))  # fmt: skip
    quantize.quantize_static({"text": object()}, {"text": [torch.zeros(1, 4)]})
    got = seen[0] if seen[0] is None else seen[0].overflow_fix == nncf.OverflowFix.ENABLE
    assert got is fix


def _signal_stack() -> tuple[int, bool]:
    """This thread's alternate signal stack: (address, whether that address is mapped)."""
    import ctypes

    class StackT(ctypes.Structure):  # sigaltstack(2)'s stack_t
        _fields_ = [("sp", ctypes.c_void_p), ("flags", ctypes.c_int), ("size", ctypes.c_size_t)]

    stack = StackT()
    assert ctypes.CDLL(None).sigaltstack(None, ctypes.byref(stack)) == 0
    sp = stack.sp or 0
    for line in Path("/proc/self/maps").read_text().splitlines():
        lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
        if lo <= sp < hi:
            return sp, True
    return sp, False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sigaltstack via /proc")
def test_openvino_leaves_the_signal_stack_alive():
    """OpenVINO's CPU plugin installs its own signal stack on each compile and puts back the
    one it found when that model is freed: freed first-in first-out (two towers), the thread
    kept an unmapped stack and the next handled signal (Ctrl-C; SIGCHLD after a DataLoader
    with workers) was a SIGSEGV -- it took a pytest-xdist worker down. compile_openvino keeps
    Python's stack, so any order of frees leaves it as it was."""
    ov = pytest.importorskip("openvino")
    import numpy as np

    def tiny_graph():
        x = ov.opset13.parameter([1, 4], np.float32)
        return ov.Model([ov.opset13.relu(x)], [x])

    before = _signal_stack()
    first = clip_export.compile_openvino(tiny_graph(), threads=1)
    second = clip_export.compile_openvino(tiny_graph(), threads=1)
    assert first(np.ones((1, 4), np.float32))[0].shape == (1, 4)
    del first, second  # first in, first out
    assert _signal_stack() == before
