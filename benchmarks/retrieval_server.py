"""Section ``server``: the search server (``apps/retrieval.py serve``,
``attn_clip.retrieval.server``) answering clip-retrieval's ``/knn-service`` over HTTP on
127.0.0.1, against the same search called in process (``RetrievalIndex``: the query embedded
by the index's model, then the exact top-k; no HTTP, no JSON).

The index: the bundled demo-shapes CLIP's embeddings of 30 generated shapes, padded with
random unit vectors to 10,000 rows (``--quick``: 1,000), written as an index generation.
The server runs in this process (uvicorn in a thread, :class:`BackgroundServer`); one client
on a keep-alive connection with ``TCP_NODELAY`` (as curl and ``requests`` set it) sends
``--server-queries`` requests of each kind one after another (200; ``--quick``: 20):
``text`` (a caption of a shape), ``image`` (a 64 px PNG, base64) and ``embedding_input``
(a random 64-d vector), 10 results each. The table's median, the ``check`` column's p50 /
p99 (nearest rank) and whether every answer equals the in-process search; ``ref / ours`` is
the HTTP median over the in-process one (what serving costs on top of the search). Then 4 clients at
once, each on its own connection, send the three kinds in turn: p50 / p99 over all their
requests, the errors (the goal: none) and the requests per second. The server and the
clients share this process and its cores (the GIL included): a server alone answers at
least this fast.
"""

from __future__ import annotations

import argparse
import base64
import io
import math
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

from benchmarks.caption import cpu_description
from benchmarks.harness import Report, Timing

SECTION = "Search server (apps/retrieval.py serve: clip-retrieval's /knn-service)"
GOAL_MS = 20.0  # p50 of a text query on the demo model
CLIENTS = 4


def percentile(times: list[float], q: float) -> float:
    """The nearest-rank ``q``-th percentile of ``times``."""
    ordered = sorted(times)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def build_index(folder: Path, rows: int):
    """``(base, RetrievalIndex)``: 30 shapes embedded by demo-shapes, padded with random unit
    vectors to ``rows``, saved as the index at ``folder / "shapes.idx"``."""
    import torch.nn.functional as F
    from attn_clip.retrieval import EmbeddingIndex, Manifest, RetrievalIndex, save_index_set
    from attn_train.shapes import COLOURS, SHAPES, render_shape

    images = folder / "images"
    images.mkdir()
    for i, (colour, shape) in enumerate((c, s) for c in list(COLOURS)[:6] for s in SHAPES):
        render_shape(colour, shape, "large", seed=i, noise=0.0).save(images / f"{i:02d}.png")
    base = folder / "shapes.idx"
    index = RetrievalIndex.create(base, "demo-shapes", "shapes", device="cpu")
    index.update(images, progress=False, workers=0)
    real = index.embeddings
    padded = EmbeddingIndex(real.dim)
    extra = [f"synthetic/{i:05d}.png" for i in range(rows - len(real))]
    g = torch.Generator().manual_seed(0)
    padded.add(torch.cat([real.embeddings, F.normalize(torch.randn(len(extra), real.dim, generator=g), dim=-1)]),  # noqa: E501
               real.ids + extra)  # fmt: skip
    blank = {"size": 1, "mtime_ns": 0, "sha256": "0" * 64}
    files = index.manifest.files | {i: blank for i in extra}
    save_index_set(base, padded, Manifest(index.manifest.model, index.manifest.root, files))
    return base, RetrievalIndex.open(base, index.model)


def queries(index, count: int) -> dict[str, list]:
    """``count`` bodies of each kind, with what the in-process search is given for each."""
    from attn_train.shapes import COLOURS, SHAPES, render_shape

    g = torch.Generator().manual_seed(1)
    out: dict[str, list] = {"text": [], "image": [], "embedding_input": []}
    colours = list(COLOURS)
    for i in range(count):
        colour, shape = colours[i % len(colours)], SHAPES[i % len(SHAPES)]
        out["text"].append((f"a {colour} {shape}", f"a {colour} {shape}"))
        picture = render_shape(colour, shape, "medium", seed=100 + i, noise=0.0)
        png = io.BytesIO()
        picture.save(png, format="PNG")
        out["image"].append((base64.b64encode(png.getvalue()).decode(), picture))
        v = torch.randn(index.embeddings.dim, generator=g)
        out["embedding_input"].append((v.tolist(), v))
    return out


def nodelay_client(url: str):
    import httpx

    nodelay = [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]
    return httpx.Client(
        base_url=url, timeout=60, transport=httpx.HTTPTransport(socket_options=nodelay)
    )  # noqa: E501


def search_in_process(index, kind: str, query) -> list[int]:
    """The rows the in-process search gives (what every HTTP answer must equal)."""
    if kind == "embedding_input":
        return index.embeddings.search(query, k=10).indices[0].tolist()
    ids = [h.id for h in index.search(query, k=10)]
    return [index.embeddings.ids.index(i) for i in ids[:10]]


def bench_server(args: argparse.Namespace, report: Report) -> None:
    """Sequential rows per query kind (HTTP vs in process), the 4-client run, the goal."""
    from attn_clip.retrieval.server import BackgroundServer, make_app

    cpu = cpu_description()
    report.meta["cpu_model"] = cpu
    rows = 1_000 if args.quick else 10_000
    count = args.server_queries or (20 if args.quick else 200)
    threads = torch.get_num_threads()
    with tempfile.TemporaryDirectory(prefix="attn-zoo-bench-server-") as tmp:
        base, index = build_index(Path(tmp), rows)
        bodies = queries(index, count)
        app = make_app(base, model=index.model)
        with BackgroundServer(app) as server, nodelay_client(server.url) as client:
            p50, answers = {}, {}  # answers: the in-process rows of each query
            for kind, items in bodies.items():
                http, local, wrong = [], [], 0
                answers[kind] = []
                for i, (value, query) in enumerate([items[0]] * 3 + items):  # 3 warm-ups
                    start = time.perf_counter()
                    r = client.post("/knn-service", json={kind: value, "num_images": 10})
                    took = time.perf_counter() - start
                    start = time.perf_counter()
                    expected = search_in_process(index, kind, query)
                    if i >= 3:
                        answers[kind].append(expected)
                        http.append(took)
                        local.append(time.perf_counter() - start)
                        wrong += r.status_code != 200 or [x["id"] for x in r.json()] != expected
                p50[kind] = percentile(http, 50) * 1e3
                check = (f"p50 {p50[kind]:.1f} / p99 {percentile(http, 99) * 1e3:.1f} ms; "
                         f"{count - wrong} of {count} == in process")  # fmt: skip
                local_check = f"p50 {percentile(local, 50) * 1e3:.1f} / p99 {percentile(local, 99) * 1e3:.1f} ms"  # noqa: E501
                report.add_case(
                    SECTION, f"{kind} query, {rows:,} vectors, k 10",
                    {"HTTP /knn-service": Timing(http), "in process (RetrievalIndex)": Timing(local)},  # noqa: E501
                    1, "query", ours="in process (RetrievalIndex)",
                    checks={"HTTP /knn-service": check, "in process (RetrievalIndex)": local_check},  # noqa: E501
                )  # fmt: skip
            concurrent(report, server.url, bodies, answers, rows, count)
    where = f"({cpu}, {threads} threads, {rows:,} vectors)"
    report.goal("server text query p50, demo-shapes", f"<= {GOAL_MS:.0f} ms",
                f"{p50['text']:.1f} ms {where}", p50["text"] <= GOAL_MS)  # fmt: skip


def concurrent(
    report: Report, url: str, bodies: dict, answers: dict, rows: int, count: int
) -> None:
    """4 clients at once, each sending the three kinds in turn, ``count`` requests each; an
    error is a failed request or an answer other than the in-process search's."""
    mixed = [(kind, bodies[kind][i][0], answers[kind][i]) for i in range(count) for kind in bodies]
    mixed = mixed[:count]
    times: list[float] = []
    errors: list[str] = []

    def one_client() -> None:
        with nodelay_client(url) as client:
            for kind, value, expected in mixed:
                start = time.perf_counter()
                try:
                    r = client.post("/knn-service", json={kind: value})
                    r.raise_for_status()
                    if [x["id"] for x in r.json()] != expected:
                        errors.append(f"a {kind} answer differs from the in-process search")
                except Exception as e:  # noqa: BLE001  (counted: the goal is none)
                    errors.append(repr(e))
                times.append(time.perf_counter() - start)

    started = time.perf_counter()
    clients = [threading.Thread(target=one_client) for _ in range(CLIENTS)]
    for t in clients:
        t.start()
    for t in clients:
        t.join()
    wall = time.perf_counter() - started
    total = CLIENTS * len(mixed)
    p50, p99 = percentile(times, 50) * 1e3, percentile(times, 99) * 1e3
    check = (f"p50 {p50:.1f} / p99 {p99:.1f} ms; {len(errors)} errors (answers == in process); "
             f"{total / wall:.0f} requests/s")  # fmt: skip
    report.add_case(SECTION, f"{CLIENTS} clients x {len(mixed)} mixed, {rows:,} vectors",
                    {"HTTP /knn-service": Timing(times)}, 1, "query", ours="HTTP /knn-service",
                    checks={"HTTP /knn-service": check})  # fmt: skip
    report.goal(f"server, {CLIENTS} concurrent clients x {len(mixed)} mixed queries", "0 errors",
                f"{len(errors)} errors of {total}", not errors)  # fmt: skip
    if errors:
        print(f"  first error: {errors[0]}", file=sys.stderr)
