"""benchmarks/: the sections of ``benchmarks.run`` and both investigations run in this
process on tiny configs (one repeat) and report rows, checks and goals; bad input is refused
(one real process per entry form for the exit code). Timings are not asserted.

Not run here, as before: ``families`` (full-width open_clip RN50 / convnext_base towers, ~12 s
of CPU even at 64 px) and ``compile`` (Inductor compiles both towers); each export of the
tiny CLIP is done once per process (``clip_models.random_clip_onnx``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import run
from benchmarks.investigations import caption_step, op_profile, products

ROOT = Path(__file__).resolve().parents[2]
ONE = ["--quick", "--repeats", "1", "--threads", "1"]  # tiny ops are not worth a second thread


def run_json(tmp_path: Path, *argv: str) -> dict:
    """``benchmarks.run.main`` in process with ``--json``; the written result."""
    out = tmp_path / "bench.json"
    assert run.main([*argv, "--json", str(out)]) == 0
    return json.loads(out.read_text())


def max_diffs(result: dict) -> list[float]:
    return [
        float(row["check"].split()[2].rstrip(";"))
        for row in result["rows"]
        if row["check"].startswith("max diff")
    ]


def test_quick_run_writes_tables_and_json(tmp_path, capsys):
    """--quick's default sections: image, text, zero-shot, ViT, attention, dispatch, ann, embed."""
    result = run_json(tmp_path, *ONE, "--markdown", str(tmp_path / "b.md"))
    printed = capsys.readouterr().out
    assert "### Goals" in printed and "| ref / ours |" in printed
    assert len({row["section"] for row in result["rows"]}) == 8
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
    assert max_diffs(result) and max(max_diffs(result)) <= 1e-4
    assert (tmp_path / "b.md").read_text().startswith("###")


BAD_INPUT = [
    (run.main, ["--only", "nope"], "unknown sections ['nope']; expected some of: image,"),
    (run.main, ["--skip", "image,nope"], "unknown sections ['nope']"),
    (run.main, ["--repeats", "0"], "--repeats must be at least 1, got 0"),
    (run.main, ["--rounds", "0"], "--rounds must be at least 1, got 0"),
    (run.main, ["--precisions", "fp16"], "--precisions expects fp32, bf16 or fp32,bf16"),
    (products.main, ["--quick", "--batch", "0"], "--batch must be at least 1, got 0"),
    (products.main, ["--quick", "--repeats", "0"], "--repeats must be at least 1, got 0"),
    (products.main, ["--quick", "--threads", "0"], "--threads must be at least 1, got 0"),
    (op_profile.main, ["--quick", "--repeats", "0"], "--repeats must be at least 1, got 0"),
    (op_profile.main, ["--quick", "--top", "0"], "--top must be at least 1, got 0"),
]


@pytest.mark.parametrize(
    "main, argv, message",
    [pytest.param(*case, id=f"{case[0].__module__} {' '.join(case[1])}") for case in BAD_INPUT],
)
def test_bad_input_gets_one_line_and_exit_2(main, argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err.splitlines()[-1]


@pytest.mark.parametrize(
    "entry", [["-m", "benchmarks.run"], ["benchmarks/run.py"]], ids=["-m benchmarks.run", "file"]
)
def test_entry_points_exit_2_in_a_real_process(entry):
    """Both documented forms (``python -m benchmarks.run`` and the file) import the package
    and exit 2 on bad input; arguments are read before torch is imported (well under 1 s)."""
    done = subprocess.run(
        [sys.executable, *entry, "--only", "nope"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr[-2000:]
    assert "unknown sections ['nope']" in done.stderr.splitlines()[-1]


def test_startup_section_reports_the_goal(tmp_path):
    """--only startup --quick: one fresh interpreter each for the README's first command
    and `import torch`."""
    result = run_json(tmp_path, "--only", "startup", "--quick")
    assert {row["impl"] for row in result["rows"]} == {"import torch", "README first command"}
    (goal,) = result["goals"]
    assert goal["name"] == "start-up: the README's first command" and "s vs" in goal["measured"]


def test_engines_section_runs_every_runtime_on_the_same_weights(tmp_path):
    """--only engines --quick: ours, ONNX Runtime and OpenVINO (fp32, bf16, static int8) on
    the tiny CLIP's towers; fp32 outputs agree with ours."""
    for module in ("onnxruntime", "openvino", "nncf"):
        pytest.importorskip(module)
    result = run_json(tmp_path, "--only", "engines", *ONE, "--batches", "1")
    impls = {row["impl"] for row in result["rows"]}
    assert {"ours", "ONNX Runtime", "OpenVINO", "ours bf16", "ours dynamic int8"} <= impls
    assert "OpenVINO static int8" in impls
    assert max_diffs(result) and max(max_diffs(result)) <= 1e-4
    for row in result["rows"]:
        if row["check"].startswith("cos to fp32"):
            assert float(row["check"].split()[3]) >= 0.99, row
    goals = {g["name"] for g in result["goals"]}
    assert {"image tower fp32 batch 1 vs OpenVINO", "text tower fp32, 80 prompts vs OpenVINO"} <= (
        goals
    )


def test_engines_alone_section_runs_each_runtime_in_its_own_process(tmp_path):
    """--only engines-alone --quick: one process for ours, one for OpenVINO (fp32 and bf16,
    batch 1); OpenVINO's fp32 output agrees with ours, bf16 outputs keep cosine >= 0.99."""
    pytest.importorskip("openvino")
    result = run_json(tmp_path, "--only", "engines-alone", *ONE, "--batches", "1")
    assert [(r["case"], r["impl"]) for r in result["rows"]] == [
        ("fp32 batch 1", "ours"), ("fp32 batch 1", "OpenVINO"),
        ("bf16 batch 1", "ours"), ("bf16 batch 1", "OpenVINO"),
    ]  # fmt: skip
    fp32, bf16 = (r["check"] for r in result["rows"] if r["impl"] == "OpenVINO")
    assert float(fp32.split()[2]) <= 1e-4, fp32
    assert min(map(float, bf16.split()[3:6:2])) >= 0.99, bf16
    goals = [g["name"] for g in result["goals"]]
    assert goals == [f"tiny CLIP {p} batch 1, each runtime alone" for p in ("fp32", "bf16")]


def test_caption_section_runs_ours_against_open_clips_loop(tmp_path):
    """--only caption --quick: a tiny CoCa (open_clip's, its weights loaded into ours);
    greedy at batch 1 and 8 gives open_clip's tokens, with and without the cache; beam
    search runs the image tower once per image, and its rows split generate into the tower
    and the decoding; the weights-alone bound and the batch-1 step split come along."""
    result = run_json(tmp_path, "--only", "caption", *ONE)
    greedy = [r for r in result["rows"] if "greedy, 30 tokens" in r["section"]]
    bound = "weights alone (a bound)"
    assert {(r["case"], r["impl"]) for r in greedy} == {
        ("batch 1", "ours"), ("batch 1", "open_clip forward loop"),
        ("batch 1", "ours, use_cache=False"), ("batch 8", "ours"),
        ("batch 8", "open_clip forward loop"), ("batch 1", bound), ("batch 8", bound),
    }  # fmt: skip
    for row in greedy:
        decodes = row["impl"] not in ("open_clip forward loop", bound)
        assert row["check"] == "same tokens" or not decodes, row
        assert row["unit"] == "token" and row["median_ms"] > 0
    split = [r for r in result["rows"] if "one step split" in r["section"]]
    assert [r["impl"] for r in split] == [
        "text tower step", "decoder blocks", "vocabulary projection"
    ]  # fmt: skip
    assert all(r["median_ms"] > 0 and r["check"].endswith("of the three") for r in split)
    beams = {(r["case"], r["impl"]): r for r in result["rows"] if "beam" in r["section"]}
    assert "the tower saw 1 image(s)" in beams[("batch 1: generate", "ours")]["check"]
    total = beams[("batch 1: generate", "ours")]["median_ms"]
    tower = beams[("batch 1: image tower", "ours, once per image")]["median_ms"]
    decoding = beams[("batch 1: decoding (generate - tower)", "ours")]["median_ms"]
    assert decoding == pytest.approx(total - tower, abs=1e-6)  # one repeat: exact
    assert beams[("batch 1: image tower", "open_clip, once per beam")]["ref_over_ours"]
    goals = {g["name"]: g for g in result["goals"]}
    assert {"greedy captions batch 1, tiny CoCa", "greedy captions batch 8, tiny CoCa"} <= set(
        goals
    )
    assert all("same tokens" in goals[f"greedy captions batch {b}, tiny CoCa"]["measured"]
               for b in (1, 8))  # fmt: skip
    assert goals["beam search 6 beams batch 1: image tower once per image"]["met"]
    assert result["meta"]["cpu_model"]  # /proc/cpuinfo's model name and vector ISA


def test_mobileclip_section_times_the_folded_tower_against_open_clip(tmp_path):
    """--only mobileclip --quick: a shrunk MobileCLIP-S2 (open_clip's, its folder loaded by
    ours); at batch 1 and 8 ours folded against open_clip as shipped, after timm's
    reparameterize_model, and ours unfolded, all within 1e-4 of open_clip; the text tower
    row; the five goals, each naming the CPU."""
    result = run_json(tmp_path, "--only", "mobileclip", *ONE)
    image = [r for r in result["rows"] if "image tower" in r["section"]]
    impls = {"ours (folded)", "open_clip", "open_clip + timm reparameterize_model",
             "ours (unfolded)"}  # fmt: skip
    assert {(r["case"], r["impl"]) for r in image} == {
        (f"batch {b}, 64 px", impl) for b in (1, 8) for impl in impls
    }
    for row in image:
        assert row["median_ms"] > 0, row
        assert (row["impl"] == "ours (folded)") == (row["ref_over_ours"] is None), row
    assert max_diffs(result) and max(max_diffs(result)) <= 1e-4
    text = [r for r in result["rows"] if "text tower" in r["section"]]
    assert {r["impl"] for r in text} == {"ours", "open_clip"}
    goals = [g["name"] for g in result["goals"]]
    assert len(goals) == 5 and sum("reparameterize_model" in g for g in goals) == 2
    assert all(result["meta"]["cpu_model"] in g["measured"] for g in result["goals"])


def test_products_splits_the_tower_into_products_and_rest(tiny_openvino):
    """investigations.products --quick --kernels: tower, products and rest for ours and
    OpenVINO, our products on 5 kernels; OpenVINO's products are ours (max diff)."""
    args = products.parse_args(["--quick", "--kernels", "--repeats", "1"])
    text = products.products_table(args, *tiny_openvino)
    labels = {r.split(" | ")[0][2:] for r in text.splitlines() if r.startswith("| ")}
    assert {"tower", "products", "rest (tower - products)"} <= labels
    assert sum(label.startswith("ours products, ") for label in labels) == 5
    assert float(text.split("max diff ")[1].split(")")[0]) <= 1e-4, text


def test_op_profile_lists_ours_next_to_openvino(tiny_openvino):
    """investigations.op_profile --quick: kinds of work for both, ours' aten ops and
    OpenVINO's node types."""
    args = op_profile.parse_args(["--quick", "--repeats", "2"])
    text = op_profile.profile_tables(args, *tiny_openvino)
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    kinds = {r.split(" | ")[0][2:] for r in rows}
    assert "Linear (matrix products of the weights)" in kinds and "layer norm" in kinds
    assert any("_linear_pointwise" in r for r in rows)  # ours' ops
    assert any("FullyConnected" in r for r in rows)  # OpenVINO's node types


def test_caption_step_investigation_runs_every_variant(capsys):
    """investigations.caption_step --quick: the three decoders give the same tokens (else it
    exits) and every variant prints its CPU time."""
    caption_step.main(["--quick", "--repeats", "1"])
    lines = capsys.readouterr().out.splitlines()
    assert [line.split("  ")[0] for line in lines] == [
        "shipped", "fused blocks at one row", "math attention",
        "block products, MKL F.linear", "block products, oneDNN packed",
        "vocabulary projection, MKL F.linear", "vocabulary projection, oneDNN packed",
    ]  # fmt: skip
    assert all(" ms CPU per " in line for line in lines)
