"""benchmarks/retrieval_server.py (section ``server``) on --quick: the three query kinds over
HTTP next to the same search in process, every answer equal to it, the 4-client run without
errors, and the goals naming the CPU. Timings are not asserted."""

from __future__ import annotations

import json

from benchmarks import run


def test_server_section_answers_as_the_library_and_reports_latency(tmp_path):
    out = tmp_path / "bench.json"
    assert run.main(["--only", "server", "--quick", "--threads", "1", "--server-queries", "6",
                     "--json", str(out)]) == 0  # fmt: skip
    result = json.loads(out.read_text())
    rows = {(r["case"].split(" query")[0], r["impl"]): r for r in result["rows"]}
    for kind in ("text", "image", "embedding_input"):
        http = rows[(kind, "HTTP /knn-service")]
        assert http["check"].endswith("6 of 6 == in process"), http
        assert http["median_ms"] > 0 and http["ref_over_ours"] > 0
        assert rows[(kind, "in process (RetrievalIndex)")]["median_ms"] > 0
    (mixed,) = [r for r in result["rows"] if "clients" in r["case"]]
    assert "; 0 errors (answers == in process);" in mixed["check"]
    goals = {g["name"]: g for g in result["goals"]}
    assert goals["server, 4 concurrent clients x 6 mixed queries"]["met"]
    assert result["meta"]["cpu_model"] in goals["server text query p50, demo-shapes"]["measured"]
