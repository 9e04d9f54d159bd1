"""Writing an update: the approximate-index policy, the new generation, the summary.

:func:`update_folder` is the single-process update (under the index's lock: plan, embed,
write); :mod:`.shards` runs the same steps across torchrun ranks.
"""

from __future__ import annotations

import glob
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attn_vision.images import find_images

from .embed import IndexModel, embed_images
from .errors import RetrievalError
from .index import EmbeddingIndex
from .manifest import Manifest, manifest_path
from .options import AnnOptions
from .plan import UpdatePlan, file_stat, plan_update
from .store import save_index_set

__all__ = ["UpdateResult", "update_folder", "write_update"]

ANN_SUMMARY_KEYS = ("factory", "bytes", "nprobe", "param", "recall_at_10", "check_queries",
                    "build_s", "retrained")  # fmt: skip


def _warn(message: str) -> None:
    warnings.warn(message, stacklevel=3)


@dataclass
class UpdateResult:
    """What an update did."""

    base: Path
    manifest: Manifest
    embeddings: EmbeddingIndex
    counts: dict[str, int]  # added, updated, unchanged, removed, skipped
    extra: dict[str, int] = field(default_factory=dict)  # torchrun: ranks, resumed
    ann: dict | None = None  # the approximate index's info (see EmbeddingIndex.build_ann)

    @property
    def images(self) -> int:
        return len(self.embeddings)

    @property
    def manifest_path(self) -> Path:
        return manifest_path(self.base)

    def summary(self) -> dict[str, Any]:
        """The JSON summary the retrieval app prints (``index --json``)."""
        out = {"index": str(self.base), "model": self.manifest.model.describe(),
               "images": self.images, **self.counts, **self.extra}  # fmt: skip
        if self.ann is not None:
            out["ann"] = {k: self.ann[k] for k in ANN_SUMMARY_KEYS if k in self.ann}
        return out

    def describe(self) -> list[str]:
        """The lines the retrieval app prints: what was indexed, the approximate index,
        which files were written."""
        counts, extra = self.counts, self.extra
        parts = ", ".join(f"{v} {k}" for k, v in counts.items() if v or k == "added")
        more = "".join(f", {v} {k}" for k, v in extra.items() if k != "ranks")
        ranks = f" on {extra['ranks']} ranks" if "ranks" in extra else ""
        noun = "image" if self.images == 1 else "images"
        lines = [f"indexed {self.images} {noun} under {self.manifest.root} with "
                 f"{self.manifest.model.describe()}{ranks} ({parts}{more})"]  # fmt: skip
        if self.ann is not None:
            ann, n, dim = self.ann, self.images, self.embeddings.dim
            exact, size = n * dim * 4, max(ann["bytes"], 1)
            part = f"1/{exact / size:.0f} of" if size <= exact else f"{size / exact:.1f}x"
            lines.append(
                f"approximate index {ann['factory']}: {size / 2**20:.2f} MiB ({part} the "
                f"float32 embeddings), built in {ann['build_s']:.1f} s; recall@10 "
                f"{ann['recall_at_10']:.3f} against exact search ({ann['check_queries']} "
                f"indexed images as queries) at {ann['param']} {ann['nprobe']}"
            )
        gen = f"{self.base.name}.g{self.manifest.generation}.*"
        lines.append(f"wrote {self.manifest_path} (embeddings: {gen})")
        return lines


def write_update(
    base: Path,
    plan: UpdatePlan,
    ann_options: AnnOptions,
    warn: Callable[[str], None] = _warn,
    extra: dict | None = None,
) -> UpdateResult:
    """Assemble the plan's index, add the approximate index when asked for, and write it all
    as one new generation (holding the index's lock); remove torchrun shards left over."""
    index, manifest = plan.assemble()
    info = ann_options.build(index, plan.old_index, warn)
    save_index_set(base, index, manifest)
    for shard in base.parent.glob(f"{glob.escape(base.name)}.shard-*.safetensors"):
        shard.unlink(missing_ok=True)  # finished (or abandoned) shards of torchrun runs
    return UpdateResult(base, manifest, index, dict(plan.counts), dict(extra or {}), info)


def find_folder_images(root: Path) -> list[Path]:
    found = find_images(root)
    if not found:
        raise RetrievalError(f"no images under {root}")
    return found


def update_folder(
    base: Path,
    root: Path,
    model: IndexModel,
    old: tuple[Manifest, EmbeddingIndex] | None,
    *,
    ann_options: AnnOptions,
    batch_size: int = 32,
    workers: int = 4,
    progress: bool = True,
    warn: Callable[[str], None] = _warn,
    caption: bool = False,
) -> UpdateResult:
    """One process: plan against ``old`` (None: a new index), embed, write. Call it holding
    the index's lock. ``caption`` (a CoCa ``model``): keep each image's greedy caption,
    generated in the same pass (unchanged files keep theirs)."""
    found = find_folder_images(root)
    record = old[0].model if old else model.record()
    ann_options.check(record.embed_dim, len(found))
    plan = plan_update(root, found, record, *(old or (None, None)))
    plan.captions = caption
    captions: dict[Path, str] | None = {} if caption else None
    stream = embed_images(model, plan.todo, batch_size=batch_size, workers=workers,
                          progress=progress, captions=captions)  # fmt: skip
    for path, emb, digest, error in stream:
        text = captions.get(path) if captions is not None else None
        plan.take(path.relative_to(root).as_posix(), file_stat(path), emb, digest, error, text)
        if error is not None:
            warn(f"skipped {error}")
    extra = {"captioned": len(captions)} if captions is not None else None
    return write_update(base, plan, ann_options, warn, extra)
