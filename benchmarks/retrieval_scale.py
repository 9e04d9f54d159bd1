"""Sections ``ann`` and ``embed``: retrieval over large collections.

``ann``: approximate search with ``attn_clip.EmbeddingIndex`` -- 1,000,000 normalised 512-d
vectors drawn around 10,000 cluster centres (real embeddings are clustered; uniformly random
vectors are a worst case no index handles) and 1,000 held-out queries from the same
distribution. The index is built the way ``apps/retrieval.py index`` builds it: the exact
embeddings saved and loaded back memory-mapped, then ``build_ann()`` with its defaults (the
factory chosen by size and a memory budget of 1/8 of the float32 embeddings, trained on a
sample, nprobe tuned to recall@10 >= 0.95 on stored vectors). Reported: build time, the
approximate index's bytes, queries/s at batch 1 and 64 against exact search over the same
memory-mapped vectors (``faiss.knn``, the exact path), recall@10 of the 1,000 held-out queries
against exact search (also at 4x and 16x the tuned nprobe), and how much anonymous (non
file-backed) memory loading and searching added. ``--ann-size`` sets the number of vectors
(``--quick``: 10,000 of width 128).

``embed``: ``apps/retrieval.py index``'s embedding loop (``embed_images``: JPEG draft-mode
decoding, resizing in 4 threads, two batches of read-ahead) on 1,000 real-size JPEGs
(1024x768 random crops of the scikit-image sample photos) against the model alone on ready
input tensors at the same batch size (CLIP ViT-B/32, random weights, batch 32), and the loop
as it was before (full-size decoding, no read-ahead). ``--embed-images`` sets the count
(``--quick``: 16 small JPEGs, the bundled demo-shapes model).
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks.harness import Report, time_interleaved

SECTION = "Approximate search (attn_clip.EmbeddingIndex.build_ann)"
PER_CENTRE = 100  # 1,000,000 vectors -> 10,000 centres


def clustered(n_points: int, n_queries: int, n_centres: int, dim: int = 512, seed: int = 0):
    """``(points, queries)``: normalised vectors, each ``c + s * g / sqrt(D)`` for a random
    centre ``c`` (unit norm), its cluster's spread ``s`` ~ U(0.8, 1.2) and Gaussian ``g``:
    a vector's cosine to its centre is ~0.6-0.8, to another centre ~0 +- 0.04."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((n_centres, dim), dtype=np.float32)
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    spread = rng.uniform(0.8, 1.2, n_centres).astype(np.float32)
    out = np.empty((n_points + n_queries, dim), dtype=np.float32)
    for start in range(0, len(out), 65_536):
        rows = slice(start, min(len(out), start + 65_536))
        label = rng.integers(0, n_centres, rows.stop - rows.start)
        noise = rng.standard_normal((len(label), dim), dtype=np.float32)
        v = centres[label] + noise * (spread[label, None] / np.sqrt(dim))
        out[rows] = v / np.linalg.norm(v, axis=1, keepdims=True)
    return out[:n_points], out[n_points:]


def rss_mb() -> dict[str, float]:
    """Resident memory of this process: anonymous (heap) and file-backed (mapped files)."""
    try:
        with open("/proc/self/status") as f:
            fields = dict(line.split(":", 1) for line in f if line.startswith("Rss"))
    except OSError:
        return {}
    return {k: int(v.split()[0]) / 1024 for k, v in fields.items()}


def recall_at(found: np.ndarray, truth: np.ndarray, k: int = 10) -> float:
    hits = [len(set(a[:k]) & set(b[:k])) for a, b in zip(found, truth, strict=True)]
    return float(np.mean(hits)) / k


def bench_ann(args: argparse.Namespace, report: Report) -> None:
    """Rows: batch 64 and batch 1, ours (approximate + re-rank) against exact search; goals:
    recall@10 >= 0.95 at >= 1,000 queries/s (batch 64), index <= 1/8 of the embeddings."""
    import faiss
    from attn_clip import EmbeddingIndex

    n = args.ann_size or (10_000 if args.quick else 1_000_000)
    dim, n_queries = (128, 200) if args.quick else (512, 1_000)
    threads = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(torch.get_num_threads())  # follow --threads
    started = time.perf_counter()
    points, queries = clustered(n, n_queries, max(1, n // PER_CENTRE), dim)
    gen_s = time.perf_counter() - started
    exact_mb = n * dim * 4 / 2**20
    with tempfile.TemporaryDirectory() as tmp:
        built = EmbeddingIndex(dim)
        built.add(torch.from_numpy(points), ids=[str(i) for i in range(n)])
        del points
        built.save(os.path.join(tmp, "vectors"))
        del built
        rss = [rss_mb()]
        index = EmbeddingIndex.load(os.path.join(tmp, "vectors"))  # memory-mapped
        rss.append(rss_mb())
        started = time.perf_counter()
        info = index.build_ann()
        build_wall = time.perf_counter() - started
        print(
            f"  {n:,} x {dim} vectors ({gen_s:.0f} s to draw): {info['factory']} built in "
            f"{info['build_s']:.1f} s (+{build_wall - info['build_s']:.1f} s to tune "
            f"{info['param']} = {info['nprobe']}: recall@10 {info['recall_at_10']:.3f} on "
            f"{info['check_queries']} stored vectors)",
            flush=True,
        )
        rss.append(rss_mb())
        q = torch.from_numpy(queries)
        truth = faiss.knn(queries, index._matrix(), 10, metric=faiss.METRIC_INNER_PRODUCT)[1]
        found = np.concatenate(
            [index.search(q[i : i + 64], k=10).indices.numpy() for i in range(0, n_queries, 64)]
        )
        recall = recall_at(found, truth)

        timed = min(128, n_queries)  # per call: 2 batches of 64, or 64 single queries
        ours = f"ours {info['factory']}, {info['param']} {info['nprobe']} + re-rank"
        how = "faiss.knn" if n >= index.faiss_threshold else "chunked matmul"
        exact = f"exact ({how}, memory-mapped)"
        t64 = time_interleaved(
            {
                ours: lambda: [index.search(q[i : i + 64], k=10) for i in range(0, timed, 64)],
                exact: lambda: [
                    index.search(q[i : i + 64], k=10, exact=True) for i in range(0, timed, 64)
                ],
            },
            repeats=args.repeats,
        )
        singles = timed // 2
        t1 = time_interleaved(
            {
                ours: lambda: [index.search(q[i], k=10) for i in range(singles)],
                exact: lambda: [index.search(q[i], k=10, exact=True) for i in range(singles)],
            },
            repeats=args.repeats,
        )
        sweep = {}  # more lists scanned: recall against speed
        for value in (4 * info["nprobe"], 16 * info["nprobe"]):
            hits = [
                index.search(q[i : i + 64], k=10, nprobe=value) for i in range(0, n_queries, 64)
            ]
            sweep[value] = recall_at(np.concatenate([h.indices.numpy() for h in hits]), truth)
        t_sweep = time_interleaved(
            {
                f"ours, {info['param']} {value}": lambda value=value: [
                    index.search(q[i : i + 64], k=10, nprobe=value) for i in range(0, timed, 64)
                ]
                for value in sweep
            },
            repeats=args.repeats,
        )
        rss.append(rss_mb())
    faiss.omp_set_num_threads(threads)

    size = f"{n:,} x {dim}, {n // PER_CENTRE:,} centres"
    check = f"recall@10 {recall:.3f} ({n_queries} held-out queries)"
    rows = report.add_case(
        SECTION, f"{size}: batch 64", t64, timed, "query", ours=ours,
        checks={ours: check, exact: "the reference"},
    )  # fmt: skip
    report.add_case(
        SECTION, f"{size}: batch 1", t1, singles, "query", ours=ours,
        checks={ours: check, exact: "the reference"},
    )  # fmt: skip
    report.add_case(
        SECTION, f"{size}: batch 64, more lists", t_sweep, timed, "query",
        ours=next(iter(t_sweep)),
        checks={f"ours, {info['param']} {v}": f"recall@10 {r:.3f}" for v, r in sweep.items()},
    )  # fmt: skip
    qps = rows[ours].throughput or 0.0
    report.goal(
        f"approximate search {n:,} x {dim}, batch 64",
        "recall@10 >= 0.95 at >= 1,000 queries/s",
        f"recall@10 {recall:.3f} at {qps:,.0f} queries/s ({rows[exact].ref_over_ours:.0f}x "
        f"exact search); built in {info['build_s']:.0f} s + {build_wall - info['build_s']:.0f} "
        f"s tuning",
        recall >= 0.95 and qps >= 1000,
    )
    index_mb = info["bytes"] / 2**20
    report.goal(
        f"approximate index memory, {n:,} x {dim}",
        "<= 1/8 of the float32 embeddings",
        f"{index_mb:,.1f} MiB = 1/{exact_mb / index_mb:.0f} of {exact_mb:,.1f} MiB",
        index_mb <= exact_mb / 8,
    )
    if exact_mb >= 64 and all("RssAnon" in r and "RssFile" in r for r in rss):  # (not tiny)
        heap = (rss[1]["RssAnon"] - rss[0]["RssAnon"]) + (rss[3]["RssAnon"] - rss[2]["RssAnon"])
        mapped = max(r["RssFile"] for r in rss) - rss[0]["RssFile"]
        report.goal(
            f"exact embeddings memory-mapped, {n:,} x {dim}",
            "loading + searching add < 1/2 of the embeddings to the heap",
            f"heap +{heap:,.1f} MiB (load, then every search above), mapped file pages "
            f"+{mapped:,.0f} MiB; embeddings {exact_mb:,.1f} MiB",
            heap < exact_mb / 2,
        )


# -- indexing a folder: decoding against the model ---------------------------------------------


def make_jpegs(folder: Path, count: int, size: tuple[int, int], seed: int = 0) -> list[Path]:
    """``count`` JPEGs of ``size`` (quality 90): random crops of the scikit-image sample
    photos (those it has offline), scaled up 1-1.6x past the crop size."""
    import skimage.data
    from PIL import Image

    photos = []
    for name in ("astronaut", "coffee", "chelsea", "rocket", "immunohistochemistry",
                 "hubble_deep_field", "retina"):  # fmt: skip
        try:
            photos.append(Image.fromarray(getattr(skimage.data, name)()).convert("RGB"))
        except Exception:  # a photo that needs a download: left out
            continue
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(count):
        photo = photos[i % len(photos)]
        scale = max(size[0] / photo.width, size[1] / photo.height) * rng.uniform(1.0, 1.6)
        big = photo.resize((math.ceil(photo.width * scale), math.ceil(photo.height * scale)))
        left = int(rng.integers(0, big.width - size[0] + 1))
        top = int(rng.integers(0, big.height - size[1] + 1))
        path = folder / f"{i:05d}.jpg"
        big.crop((left, top, left + size[0], top + size[1])).save(path, quality=90)
        paths.append(path)
    return paths


def bench_embed(args: argparse.Namespace, report: Report) -> None:
    """``apps/retrieval.py index``'s embedding loop on a folder of real-size JPEGs against the
    model alone on ready input tensors, same batch size; the goal is >= 0.8 of it."""
    import attn_clip
    from attn_clip.retrieval import IndexModel, embed_images
    from attn_vision.images import iter_images, load_image_file

    name, count, size, batch = ("demo-shapes", 16, (320, 240), 8) if args.quick else (
        "ViT-B-32", 1_000, (1024, 768), 32)  # fmt: skip
    count = args.embed_images or count
    model, preprocess, tokenizer = attn_clip.create_model_and_transforms(
        name, "shapes" if args.quick else None
    )
    model.eval()
    loaded = IndexModel(model, preprocess, tokenizer, name, None, torch.device("cpu"))
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        paths = make_jpegs(Path(tmp), count, size)
        print(
            f"  {count} JPEGs {size[0]}x{size[1]} written in {time.perf_counter() - started:.0f} s"
        )
        x = torch.stack([preprocess(load_image_file(p)[0]) for p in paths[:batch]])

        def model_only():
            for start in range(0, count, batch):
                model.encode_image(x[: min(batch, count - start)], normalize=True)

        def end_to_end():
            for _ in embed_images(loaded, paths, batch_size=batch, workers=4, progress=False):
                pass

        def before():  # full-size decode, no read-ahead: the loop before issue 18
            stream = iter_images(paths, workers=4, transform=preprocess)
            while chunk := list(itertools.islice(stream, batch)):
                model.encode_image(torch.stack([t for _, t, _, _ in chunk]), normalize=True)

        impls = {"model only (input tensors ready)": model_only, "index end to end": end_to_end,
                 "end to end, full decode, no read-ahead": before}  # fmt: skip
        timings = time_interleaved(impls, repeats=2 if args.quick else min(args.repeats, 3))
        few = paths[: min(count, 200)]  # decoding alone, one thread: what it costs the CPU
        decode = {
            "draft mode (index)": lambda: [
                None for _ in iter_images(few, 0, transform=preprocess, draft=max(preprocess.size))
            ],
            "full decode (before)": lambda: [
                None for _ in iter_images(few, 0, transform=preprocess)
            ],
        }
        decode_t = time_interleaved(decode, repeats=2 if args.quick else min(args.repeats, 3))
    report.add_case(
        "Indexing a folder (apps/retrieval.py index)",
        f"{len(few)} JPEGs {size[0]}x{size[1]}: decode + preprocess only, 1 thread",
        decode_t, len(few), "img", ours="draft mode (index)",
    )  # fmt: skip
    rows = report.add_case(
        "Indexing a folder (apps/retrieval.py index)",
        f"{count} JPEGs {size[0]}x{size[1]}, {name}, batch {batch}, 4 decode threads",
        timings, count, "img", ours="index end to end",
    )  # fmt: skip
    share = rows["model only (input tensors ready)"].ref_over_ours or 0.0
    old = rows["end to end, full decode, no read-ahead"].ref_over_ours or 0.0
    report.goal(
        f"index {count} JPEGs {size[0]}x{size[1]} ({name}, batch {batch})",
        ">= 0.8 of the model-only images/s",
        f"{share:.2f} of it ({rows['index end to end'].throughput:,.1f} img/s; before: "
        f"{share / old if old else float('nan'):.2f})",
        share >= 0.8,
    )
