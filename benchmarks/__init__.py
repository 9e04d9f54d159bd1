"""Side-by-side speed benchmarks: attn-zoo against open_clip, timm, transformers, ONNX
Runtime and OpenVINO, on identical weights (docs/benchmarks.md).

Run from the repository root::

    uv run python -m benchmarks.run --quick            # every default section, tiny configs
    uv run python -m benchmarks.run --only image,text  # some sections

Layout: ``run.py`` (the command line and its sections), ``harness.py`` (interleaved
timing, peak memory, agreement checks, the report), ``clip_models.py`` (one CLIP built four
ways on identical weights), one module per section, and ``investigations/`` (scripts that
explain one measured gap, each with its own tables: ``products``, ``op_profile``)."""
