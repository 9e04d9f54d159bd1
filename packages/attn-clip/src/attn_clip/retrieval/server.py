"""A search server for an index: clip-retrieval's ``clip back`` HTTP API over a
:class:`~.api.RetrievalIndex`.

    from attn_clip.retrieval.server import serve
    serve("photos.idx", host="127.0.0.1", port=1234)          # blocks; Ctrl-C stops it

    curl -s http://127.0.0.1:1234/knn-service \\
         -d '{"text": "a dog on a beach", "modality": "image", "num_images": 5}'
    # [{"image_path": "/data/photos/dog.jpg", "id": 17, "similarity": 0.31}, ...]

:func:`make_app` builds the FastAPI application (mount it, test it, run it with any ASGI
server), :func:`serve` runs it with uvicorn, :class:`BackgroundServer` runs it in a thread
(notebooks, tests). FastAPI and uvicorn are imported when used: ``pip install
'attn-clip[serve]'`` (both also come with Gradio).

Endpoints (those of clip back, which clip-retrieval's ``ClipClient`` and its front end call):

- ``POST /knn-service``: the body clip back reads (JSON; any ``Content-Type``, as clip back's
  ``get_json(force=True)``): one query -- ``text`` (embedded by the index's own text tower),
  ``image`` (the image file's bytes, base64; a ``data:...;base64,`` prefix and line breaks
  are fine) or ``embedding_input`` (a list of ``D`` numbers, normalized here); as in clip
  back, the first of them given wins (an empty string counts as not given) --, and
  ``num_images`` (results with metadata, default 10), ``num_result_ids`` (results searched,
  default ``num_images``), ``indice_name`` (default: the first index), ``modality``
  (``"image"``, the default), ``deduplicate`` (clip back's: a result whose embedding has
  cosine > 0.94 to a better one is dropped). The answer is clip back's list, best first:
  ``{"image_path", "caption" (a ``.txt`` file beside the image, when there is one; an
  index built with ``--caption``: the generated caption kept in its manifest),
  "image" (with ``images=True``: the file's bytes, base64), "id" (the embedding's row in
  the generation named by the ``X-Index-Generation`` header), "similarity" (cosine)}``;
  results past ``num_images`` carry ``id`` and ``similarity`` only, as in clip back.
- ``POST /metadata``: ``{"ids": [...], "indice_name": ...}`` -> ``[{"id", "metadata"}]``.
- ``GET /indices-list``: the index names (``["photos"]``); ``GET /health``: ``"ok"``.

What clip back does and this server does not, said in the answer rather than done quietly:
``image_url`` (this server never fetches a URL), ``modality: "text"`` (an index holds image
embeddings only, no caption index) and ``use_mclip: true`` (no M-CLIP text model: a
multilingual CLIP index reads other languages with its own text tower) are refused with a
400; ``use_safety_model``, ``use_violence_detector``, ``aesthetic_score`` /
``aesthetic_weight`` (clip back's optional LAION models, which it also skips when started
without them) and keys clip back does not know are accepted and ignored, and named in the
answer's ``X-Ignored-Options`` header. Bad input -- a body over ``max_body_bytes`` (413),
JSON that is not an object, bad base64, bytes that are not an image, a wrong type or range
-- is a 4xx with ``{"error": "<one line>"}``.

The index is loaded once. Each request first checks (at most every ``reload_interval``
seconds) whether the index's manifest was replaced; when an ``index --update`` has switched
generations, the new one is loaded in a thread (requests go on with the old one meanwhile)
and served from then on. Readers never take the index's lock (that
is the store's rule: a writer holds it, and switches generations with one rename, so the
manifest always names a complete generation; :func:`~.store.load_index_set` reads again if
the switch happens while it reads). A new generation recorded with another model gets that
model. Files are only read below the indexed folder: an id, caption or symlink that
resolves outside it is not read. An index of tar shards (:mod:`.tars`) answers a sample's
id (``shard/key``) as ``image_path``, the caption kept in its manifest, and the image
stored in its tar: an id is never opened as a file. Queries run one at a time on the
server's event loop (image bytes are decoded in a thread first): on a CPU the model and
the search are a few milliseconds, less than handing them to a thread costs under load.
"""

import base64
import dataclasses
import json
import logging
import os
import socket
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from .errors import RetrievalError
from .export import file_below, read_caption
from .knn_query import (
    DEDUP_THRESHOLD,
    MAX_RESULTS,
    KnnQuery,
    QueryError,
    duplicates,
    parse_knn_body,
    parse_metadata_body,
)
from .manifest import index_base, manifest_path

__all__ = [
    "DEDUP_THRESHOLD",
    "MAX_BODY_BYTES",
    "MAX_RESULTS",
    "BackgroundServer",
    "QueryError",
    "make_app",
    "serve",
]

LOG = logging.getLogger(__name__)

MAX_BODY_BYTES = 32 << 20  # a 24 MiB image, base64-encoded
INSTALL = "the search server needs FastAPI and uvicorn: pip install 'attn-clip[serve]'"


# -- the index as served: snapshots and hot reload -------------------------------------------


class OpenShards:
    """The ``size`` tar shards last read from, kept open: listing a shard reads all its tar
    headers (most of a second for img2dataset's 10,000 samples), then a sample is one short
    read."""

    def __init__(self, size: int = 8) -> None:
        self.size = size
        self._open: OrderedDict[Path, Any] = OrderedDict()  # tar -> its ShardReader
        self._lock = threading.Lock()  # (requests read from the loop and from threads)

    def image_bytes(self, tar: Path, key: str) -> bytes | None:
        """The image file of sample ``key`` of ``tar`` as stored (as
        :func:`.tars.sample_image_bytes`), or None when the tar, the sample or its image is
        gone."""
        from attn_vision import wds

        with self._lock:
            shard = self._open.pop(tar, None)
            self._open[tar] = shard = wds.ShardReader(tar) if shard is None else shard
            try:
                sample = shard.sample(shard.keys.index(key))
            except ValueError:  # (BadSample too) no such key, or its files cannot be read
                sample = {}
            finally:
                while len(self._open) > self.size:
                    self._open.popitem(last=False)[1].close()
        ext = next((e for e in wds.IMAGE_EXTENSIONS if e in sample), None)
        return sample[ext] if ext is not None else None

    def close(self) -> None:
        """Close every shard; later reads (a request still on an old snapshot) close theirs."""
        with self._lock:
            self.size = 0
            while self._open:
                self._open.popitem()[1].close()


@dataclasses.dataclass
class Snapshot:
    """One generation of an index, as loaded: what a request searches from start to end."""

    index: Any  # a RetrievalIndex with its manifest, embeddings and model
    stamp: tuple[int, int, int]  # the manifest file's (inode, mtime_ns, size) when read
    root: Path  # the indexed folder, resolved
    captions: dict[int, str | None] = dataclasses.field(default_factory=dict)
    tars: OpenShards = dataclasses.field(default_factory=OpenShards)  # a shard index's

    @property
    def generation(self) -> int | None:
        return self.index.manifest.generation

    def path(self, row: int) -> Path:
        return self.index.root / self.index.embeddings.ids[row]

    @property
    def shards(self) -> bool:
        """Whether this is an index of tar shards (ids ``shard/key``, never file names)."""
        return self.index.manifest.shards is not None

    def caption(self, row: int) -> str | None:
        """A shard sample's caption or a captioned folder index's generated one (kept in the
        manifest), or the text of the ``.txt`` file
        beside the row's image (clip-retrieval's folder layout, read once per generation);
        None when there is none."""
        if self.shards or self.index.manifest.captions:  # (a captioned folder: generated)
            return self.index.manifest.caption(self.index.embeddings.ids[row])
        if row not in self.captions:
            self.captions[row] = read_caption(self.root, self.path(row))
        return self.captions[row]

    def image(self, row: int) -> str | None:
        """The row's image file, base64-encoded: a shard sample's from its tar, a folder's
        from below the indexed folder; None when it is gone (or not below the folder)."""
        data = self._sample_bytes(row) if self.shards else self._file_bytes(row)
        return base64.b64encode(data).decode("ascii") if data is not None else None

    def _file_bytes(self, row: int) -> bytes | None:
        path = file_below(self.root, self.path(row))
        try:
            return path.read_bytes() if path is not None else None
        except OSError:
            return None

    def _sample_bytes(self, row: int) -> bytes | None:
        id = self.index.embeddings.ids[row]
        tar = self.index.manifest.shard_file(id)
        return self.tars.image_bytes(tar, id.partition("/")[2]) if tar is not None else None

    def metadata(self, row: int, images: bool) -> dict[str, Any]:
        """clip back's metadata columns for ``row``: ``image_path`` (the file, or a shard
        sample's id), ``caption`` when there is one, ``image`` with ``images``."""
        path = self.index.embeddings.ids[row] if self.shards else str(self.path(row))
        meta: dict[str, Any] = {"image_path": path}
        if (caption := self.caption(row)) is not None:
            meta["caption"] = caption
        if images and (data := self.image(row)) is not None:
            meta["image"] = data
        return meta


def _stamp(base: Path) -> tuple[int, int, int]:
    st = os.stat(manifest_path(base))
    return st.st_ino, st.st_mtime_ns, st.st_size


class ServedIndex:
    """An index on disk and the snapshot of it being served, reloaded when its manifest
    changes (see the module docstring)."""

    def __init__(
        self,
        name: str,
        path: str | os.PathLike,
        model: Any = None,
        *,
        device: Any = None,
        precision: str | None = None,
        reload_interval: float = 1.0,
    ) -> None:
        from .api import RetrievalIndex

        self.name, self.base = name, index_base(path)
        self.device, self.precision = device, precision
        self.reload_interval = reload_interval
        stamp = _stamp(self.base) if manifest_path(self.base).is_file() else (0, 0, 0)
        index = RetrievalIndex.open(self.base, model, device=device, precision=precision)
        index.model  # noqa: B018  (built and checked now, not at the first query)
        self.current = self._snapshot(index, stamp)
        self._checked = time.monotonic()
        self._reloading = threading.Lock()  # held by the thread loading a new generation
        self._failed: tuple[int, int, int] | None = None  # the stamp whose load failed

    def _snapshot(self, index: Any, stamp: tuple[int, int, int]) -> Snapshot:
        if index.embeddings is None or not len(index.embeddings):
            raise RetrievalError(f"{self.base}: the index is empty: update it from a folder")
        return Snapshot(index, stamp, index.root.resolve())

    def snapshot(self) -> Snapshot:
        """The snapshot to answer a request from: the current one. When the manifest has
        changed (checked at most every ``reload_interval`` seconds), the new generation is
        loaded in a thread and served once complete; a failed load keeps the old one, logged,
        and is not tried again before the manifest changes again."""
        now = time.monotonic()
        if now - self._checked >= self.reload_interval and not self._reloading.locked():
            self._checked = now
            try:
                stamp = _stamp(self.base)
            except OSError:  # the manifest is being replaced: the old one is still served
                stamp = self.current.stamp
            if stamp not in (self.current.stamp, self._failed) and self._reloading.acquire(False):
                threading.Thread(target=self._reload_logged, args=(stamp,), daemon=True,
                                 name=f"reload-{self.name}").start()  # fmt: skip
        return self.current

    def _reload_logged(self, stamp: tuple[int, int, int]) -> None:
        try:
            self._reload(stamp)
        except Exception as e:  # noqa: BLE001  (served on with the old generation)
            self._failed = stamp
            LOG.warning("%s: keeping generation %s, reload failed: %s", self.name,
                        self.current.generation, e)  # fmt: skip
        finally:
            self._reloading.release()

    def _reload(self, stamp: tuple[int, int, int]) -> None:
        from .api import RetrievalIndex
        from .embed import IndexModel
        from .store import load_index_set

        old = self.current.index
        manifest, embeddings = load_index_set(self.base)
        record = manifest.model
        model = old.model
        if (record.name, record.pretrained) != (old.record.name, old.record.pretrained) or (
            not record.same_weights(old.record)
        ):
            model = IndexModel.from_record(record, device=self.device, precision=self.precision)
        index = RetrievalIndex(self.base, manifest, embeddings, model, device=self.device,
                               precision=self.precision)  # fmt: skip
        if manifest.generation != old.manifest.generation or manifest.root != old.manifest.root:
            LOG.info("%s: now serving generation %s (%d images)", self.name, manifest.generation,
                     len(embeddings))  # fmt: skip
        old_snapshot, self.current = self.current, self._snapshot(index, stamp)
        old_snapshot.tars.close()


# -- the application -------------------------------------------------------------------------


def _index_paths(index: str | os.PathLike | Mapping[str, str | os.PathLike]) -> dict[str, Path]:
    if isinstance(index, Mapping):
        if not index:
            raise RetrievalError("no index to serve")
        return {str(name): Path(p) for name, p in index.items()}
    base = index_base(index)
    return {base.name.removesuffix(".idx"): base}


def make_app(
    index: str | os.PathLike | Mapping[str, str | os.PathLike],
    *,
    model: Any = None,
    device: Any = None,
    precision: str | None = None,
    images: bool = False,
    exact: bool = False,
    nprobe: int | None = None,
    max_body_bytes: int = MAX_BODY_BYTES,
    reload_interval: float = 1.0,
):
    """A FastAPI app answering clip back's endpoints for ``index`` (a path: served under its
    name without ``.idx``, ``photos.idx`` -> ``"photos"``; or ``{name: path}`` for several).
    Each index is opened now, with its recorded model built (or ``model``, an
    :class:`~.embed.IndexModel` checked to be the recorded one, for every index it fits):
    the errors of :meth:`RetrievalIndex.open` are raised here, before anything listens.

    ``images``: add each result's image file, base64-encoded, as clip back does (``image``);
    ``exact`` / ``nprobe``: as ``search --exact`` / ``--nprobe`` on an approximate index;
    ``max_body_bytes``: larger request bodies are refused (413); ``reload_interval``: at
    most how often (seconds) a request checks whether the index has a new generation
    (0: every request)."""
    try:
        from fastapi import FastAPI, Request
        from fastapi.responses import JSONResponse
        from starlette.concurrency import run_in_threadpool
        from starlette.exceptions import HTTPException
    except ImportError as e:
        raise ImportError(f"{INSTALL} ({e})") from None
    import torch

    if max_body_bytes < 1 or reload_interval < 0 or (nprobe is not None and nprobe < 1):
        raise RetrievalError("max_body_bytes and nprobe must be >= 1, reload_interval >= 0")
    served: dict[str, ServedIndex] = {}
    for name, path in _index_paths(index).items():
        fits = model is not None and _names_model(path, model)
        served[name] = ServedIndex(
            name, path, model if fits else None, device=device, precision=precision,
            reload_interval=reload_interval,
        )  # fmt: skip

    def lookup(name: str | None) -> ServedIndex:
        if name is None:
            return next(iter(served.values()))
        if name not in served:
            raise QueryError(f"unknown indice_name {name!r}; this server has {list(served)}", 404)
        return served[name]

    def knn(query: KnnQuery, picture: Any) -> tuple[list[dict], Snapshot]:
        snap = lookup(query.indice_name).snapshot()
        index = snap.index
        k = min(query.num_result_ids, len(index))
        if query.embedding is not None:
            if len(query.embedding) != index.embeddings.dim:
                raise QueryError(
                    f"embedding_input has {len(query.embedding)} values; this index's "
                    f"embeddings have {index.embeddings.dim}"
                )
            q = torch.tensor([query.embedding], dtype=torch.float32)
        else:
            q = picture if query.image is not None else query.text
        with torch.inference_mode():
            if not isinstance(q, torch.Tensor):
                q = index.embed_queries([q])
            found = index.embeddings.search(q, k=k, exact=exact, nprobe=nprobe)
        rows, scores = found.indices[0].tolist(), found.scores[0].tolist()
        if query.deduplicate:
            drop = duplicates(index.embeddings.embeddings[found.indices[0]])
            rows = [r for i, r in enumerate(rows) if i not in drop]
            scores = [s for i, s in enumerate(scores) if i not in drop]
        results = []
        for i, (row, score) in enumerate(zip(rows, scores, strict=True)):
            out = snap.metadata(row, images) if i < query.num_images else {}
            results.append(out | {"id": row, "similarity": score})
        return results, snap

    def metadata(body: Any) -> list[dict]:
        ids, name = parse_metadata_body(body)
        snap = lookup(name).snapshot()
        n = len(snap.index)
        for i in ids:
            if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < n:
                raise QueryError(f"ids must be rows of the index (0 to {n - 1}), got {i!r}")
        return [{"id": i, "metadata": snap.metadata(i, images)} for i in ids]

    def error(status: int, message: str) -> JSONResponse:
        return JSONResponse({"error": " ".join(str(message).split())}, status_code=status)

    app = FastAPI(title="attn-zoo retrieval server (clip back API)", docs_url=None,
                  redoc_url=None, openapi_url=None)  # fmt: skip
    app.state.indexes = served

    @app.exception_handler(QueryError)
    async def _query_error(request: Request, e: QueryError) -> JSONResponse:
        return error(e.status, str(e))

    @app.exception_handler(ValueError)  # an image that cannot be used, a bad index, ...
    async def _value_error(request: Request, e: ValueError) -> JSONResponse:
        return error(400, str(e))

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, e: HTTPException) -> JSONResponse:
        return error(e.status_code, f"{e.detail}: {request.method} {request.url.path}")

    @app.exception_handler(Exception)
    async def _internal_error(request: Request, e: Exception) -> JSONResponse:
        LOG.exception("%s %s failed", request.method, request.url.path)
        return error(500, f"internal error ({type(e).__name__}); see the server's log")

    async def json_body(request: Request) -> Any:
        raw = await request.body()
        try:
            return json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise QueryError(f"the body is not JSON ({e})") from None

    @app.post("/knn-service")
    async def knn_service(request: Request) -> JSONResponse:
        query = parse_knn_body(await json_body(request))
        picture = None
        if query.image is not None:  # decoded in a thread (a large image takes a while)
            from attn_vision.images import decode_image

            picture = await run_in_threadpool(decode_image, query.image, "image", None)
        # the model and the search run here, one query at a time: handing them to a thread
        # cost more than they take (measured: benchmarks section server)
        results, snap = knn(query, picture)
        headers = {"X-Index-Generation": str(snap.generation)}
        if query.ignored:
            headers["X-Ignored-Options"] = ", ".join(query.ignored)
        return JSONResponse(results, headers=headers)

    @app.post("/metadata")
    async def metadata_service(request: Request) -> JSONResponse:
        return JSONResponse(await run_in_threadpool(metadata, await json_body(request)))

    @app.get("/indices-list")
    async def indices_list() -> JSONResponse:
        return JSONResponse(list(served))

    @app.get("/health")
    async def health() -> JSONResponse:
        return JSONResponse("ok")

    app.add_middleware(BodyLimit, limit=max_body_bytes)
    return app


def _names_model(path: Path, model: Any) -> bool:
    from .manifest import Manifest

    record = Manifest.read(path).model
    return (record.name, record.pretrained) == (model.name, model.pretrained)


class BodyLimit:
    """ASGI middleware: request bodies over ``limit`` bytes get a 413 before the app sees
    them (by ``Content-Length``, or counted as they arrive when it is absent)."""

    def __init__(self, app: Any, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length", b"0")
        if not length.isdigit() or int(length) > self.limit:
            return await self._refuse(send)
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            more = message.get("more_body", False)
            if size > self.limit:
                return await self._refuse(send)
        body, replayed = b"".join(chunks), False

        async def replay() -> dict:
            nonlocal replayed
            if replayed:
                return await receive()  # (waits for the client to disconnect)
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        return await self.app(scope, replay, send)

    async def _refuse(self, send: Callable) -> None:
        text = json.dumps({"error": f"request body larger than {self.limit} bytes"}).encode()
        headers = [(b"content-type", b"application/json"), (b"connection", b"close"),
                   (b"content-length", str(len(text)).encode())]  # fmt: skip
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": text})


# -- running it --------------------------------------------------------------------------------


def listen(host: str, port: int, *, start: bool = True) -> socket.socket:
    """A listening TCP socket on ``host:port`` (0: a free port; ``start=False``: bound
    only, ``listen()`` is the caller's), or a ``RetrievalError`` saying why not (port in
    use, address not available, ...)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
        family, kind, proto, _, address = infos[0]
        # proto IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on such sockets' connections
        # (without it, a response written in two parts waits ~40 ms for a delayed ACK)
        sock = socket.socket(family, kind, proto)
    except (OSError, IndexError) as e:
        raise RetrievalError(f"cannot listen on {host}:{port}: {e}") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        if start:
            sock.listen(128)
    except OSError as e:
        sock.close()
        raise RetrievalError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    return sock


def _url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _server(app: Any, log_level: str, access_log: bool):
    try:
        import uvicorn
    except ImportError as e:
        raise ImportError(f"{INSTALL} ({e})") from None
    config = uvicorn.Config(app, log_level=log_level, access_log=access_log, lifespan="off",
                            timeout_graceful_shutdown=5)  # fmt: skip
    return uvicorn.Server(config)


def describe(app: Any) -> str:
    """One line per served index: its name, size, generation and folder."""
    return "; ".join(
        f"{name}: {len(s.current.index)} images, generation {s.current.generation}, "
        f"folder {s.current.index.root}"
        for name, s in app.state.indexes.items()
    )


def serve(
    index: str | os.PathLike | Mapping[str, str | os.PathLike],
    host: str = "127.0.0.1",
    port: int = 1234,
    *,
    threads: int | None = None,
    log_level: str = "info",
    access_log: bool = True,
    announce: Callable[[str], None] | None = None,
    sock: socket.socket | None = None,
    **options: Any,
) -> None:
    """Serve ``index`` (see :func:`make_app`, which ``options`` go to) on ``host:port``
    until Ctrl-C / SIGTERM (then uvicorn finishes the requests under way and returns, and a
    Ctrl-C is raised again as ``KeyboardInterrupt``). The port is bound, then the index and
    its model are loaded, before anything is served, so bad input raises first. ``threads``: torch
    threads per query (default: torch's; 1 is fastest for small models on a busy machine).
    ``announce`` gets the line saying where it listens (default: printed on stderr);
    ``sock``: a socket bound by :func:`listen` (``start=False``) to serve on instead of
    ``host:port`` (closed here too)."""
    sock = sock or listen(host, port, start=False)  # a busy port: said before the model loads
    try:
        app = make_app(index, **options)
    except BaseException:
        sock.close()
        raise
    sock.listen(128)
    if not LOG.handlers:  # reloads are logged next to uvicorn's lines
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s:     %(message)s"))
        LOG.addHandler(handler)
        LOG.setLevel(logging.INFO)
    if threads is not None:
        import torch

        torch.set_num_threads(threads)
    line = f"serving {describe(app)} on {_url(sock)}"
    (announce or (lambda text: print(text, file=sys.stderr, flush=True)))(line)
    try:
        _server(app, log_level, access_log).run(sockets=[sock])
    finally:
        sock.close()


class BackgroundServer:
    """Run an app (:func:`make_app`) with uvicorn in a daemon thread::

        with BackgroundServer(make_app("photos.idx")) as server:
            httpx.post(f"{server.url}/knn-service", json={"text": "a dog"})

    ``port`` 0 picks a free one; :attr:`url` says which."""

    def __init__(
        self, app: Any, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning"
    ) -> None:
        self.app, self.sock = app, listen(host, port)
        self.url = _url(self.sock)
        self._server = _server(app, log_level, access_log=False)
        self._thread = threading.Thread(target=self._run, daemon=True, name="retrieval-server")

    def _run(self) -> None:
        self._server.run(sockets=[self.sock])

    def __enter__(self) -> "BackgroundServer":
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.sock.close()
                raise RuntimeError("the retrieval server did not start (see its log)")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self.sock.close()
