"""benchmarks/run.py --quick: every section runs on tiny configs and reports rows, checks
and goals (a smoke test of the benchmarks; timings are not asserted)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch


def test_quick_run_writes_tables_and_json(benchmarks_run, tmp_path, capsys):
    out = tmp_path / "bench.json"
    argv = ["--quick", "--repeats", "1", "--json", str(out), "--markdown", str(tmp_path / "b.md")]
    threads = torch.get_num_threads()
    try:  # one thread: tiny ops are not worth a second one (and other jobs may hold the CPU)
        assert benchmarks_run.main([*argv, "--threads", "1"]) == 0
    finally:
        torch.set_num_threads(threads)
    printed = capsys.readouterr().out
    assert "### Goals" in printed and "| ref / ours |" in printed
    result = json.loads(out.read_text())
    sections = {row["section"] for row in result["rows"]}
    assert len(sections) == 8  # image, text, zero-shot, ViT, attention, dispatch, ann, embed
    impls = {row["impl"] for row in result["rows"]}
    assert {"ours", "open_clip", "timm", "transformers", "ours bf16", "open_clip bf16"} <= impls
    for row in result["rows"]:
        assert row["median_ms"] > 0, row
    checks = " ".join(row["check"] for row in result["rows"])
    assert "max diff" in checks and "cos to fp32" in checks
    goals = {g["name"] for g in result["goals"]}
    assert any(g.startswith("image tower fp32") for g in goals)
    assert "text tower, 80 prompts" in goals and "zero-shot head 1,000 x 80, ours" in goals
    assert "approximate search 10,000 x 128, batch 64" in goals  # ann: recall, queries/s
    assert any(g.startswith("index 16 JPEGs") for g in goals)  # embed: against the model
    # identical weights: ours agrees with every reference (tiny fp32 models)
    for row in result["rows"]:
        if row["check"].startswith("max diff"):
            assert float(row["check"].split()[2].rstrip(";")) <= 1e-4, row
    assert (tmp_path / "b.md").read_text().startswith("###")


def test_bad_section_is_refused(benchmarks_run):
    with pytest.raises(SystemExit):
        benchmarks_run.main(["--only", "nope"])


def test_startup_section_reports_the_goal(benchmarks_run, tmp_path):
    """--only startup: fresh interpreters for the README's first command and `import torch`."""
    out = tmp_path / "bench.json"
    assert benchmarks_run.main(["--only", "startup", "--quick", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert {row["impl"] for row in result["rows"]} == {"import torch", "README first command"}
    (goal,) = result["goals"]
    assert goal["name"] == "start-up: the README's first command" and "s vs" in goal["measured"]


def test_engines_section_runs_every_runtime_on_the_same_weights(benchmarks_run, tmp_path):
    """--only engines --quick: ours, ONNX Runtime and OpenVINO (fp32, bf16, static int8) on
    the tiny CLIP's image tower; fp32 outputs agree with ours."""
    for module in ("onnxruntime", "openvino", "nncf"):
        pytest.importorskip(module)
    out = tmp_path / "bench.json"
    argv = ["--only", "engines", "--quick", "--repeats", "1", "--batches", "1"]
    assert benchmarks_run.main([*argv, "--threads", "1", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    impls = {row["impl"] for row in result["rows"]}
    assert {"ours", "ONNX Runtime", "OpenVINO", "ours bf16", "ours dynamic int8"} <= impls
    assert "OpenVINO static int8" in impls
    for row in result["rows"]:
        if row["check"].startswith("max diff"):
            assert float(row["check"].split()[2]) <= 1e-4, row
        elif row["check"].startswith("cos to fp32"):
            assert float(row["check"].split()[3]) >= 0.99, row
    assert any(g["name"] == "image tower fp32 batch 1 vs OpenVINO" for g in result["goals"])


def test_products_refuses_counts_below_one():
    """products.py: --batch / --repeats / --threads below 1 get one line and exit 2."""
    bench = Path(__file__).resolve().parents[2] / "benchmarks"
    for flag in ("--batch", "--repeats", "--threads"):
        done = subprocess.run(
            [sys.executable, str(bench / "products.py"), "--quick", flag, "0"],
            cwd=bench, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 2, done.stderr[-2000:]
        assert f"{flag} must be at least 1, got 0" in done.stderr.splitlines()[-1]


@pytest.mark.parametrize(
    "script, argv",
    [
        ("op_profile.py", ["--quick", "--repeats", "2"]),
        ("engines_alone.py", ["--quick", "--batches", "1", "--rounds", "1", "--repeats", "1"]),
        ("products.py", ["--quick", "--kernels", "--repeats", "1"]),
    ],
)
def test_profile_and_separate_process_scripts_run(script, argv):
    """op_profile.py (ours' ops next to OpenVINO's counters), engines_alone.py (each
    runtime in its own process) and products.py (the products alone, on each kernel) on
    the tiny CLIP: their tables come out, outputs agree."""
    pytest.importorskip("openvino")
    bench = Path(__file__).resolve().parents[2] / "benchmarks"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, str(bench / script), *argv],
        cwd=bench, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith("| ")]
    if script == "op_profile.py":
        kinds = {r.split(" | ")[0][2:] for r in rows}
        assert "Linear (matrix products of the weights)" in kinds and "layer norm" in kinds
        assert any("_linear_pointwise" in r for r in rows)  # ours' ops
        assert any("FullyConnected" in r for r in rows)  # OpenVINO's node types
    elif script == "products.py":
        labels = {r.split(" | ")[0][2:] for r in rows}
        assert {"tower", "products", "rest (tower - products)"} <= labels
        assert sum(label.startswith("ours products, ") for label in labels) == 5
        diff = float(done.stdout.split("max diff ")[1].split(")")[0])
        assert diff <= 1e-4, done.stdout  # OpenVINO's products are ours
    else:
        fp32 = next(r for r in rows if r.startswith("| fp32 batch 1 "))
        assert float(fp32.split("max diff ")[1].split()[0]) <= 1e-4, fp32
        bf16 = next(r for r in rows if r.startswith("| bf16 batch 1 "))
        assert min(map(float, bf16.split("cos to fp32 ")[1].split()[:3:2])) >= 0.99, bf16
