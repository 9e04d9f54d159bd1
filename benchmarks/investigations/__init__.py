"""One-off investigations of a measured gap (issue 19's batch-1 gap to OpenVINO), each with
its own command line and tables, run as ``uv run python -m benchmarks.investigations.NAME``:
``products`` (the weight products of the blocks alone, on every CPU kernel PyTorch has) and
``op_profile`` (ours' per-op profile next to OpenVINO's per-node counters)."""
