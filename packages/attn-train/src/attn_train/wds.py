"""Training from webdataset tar shards: image-caption (or image-label) samples split by rank
and DataLoader worker, shuffled by seed, an epoch of ``num_samples``, resumed exactly.

::

    data = ShardDataset("shards/{00000..00099}.tar", transform, tokenizer, seed=0)
    loader = make_shard_loader(data, batch_size, run.d, seed=0, num_workers=4)
    if run.resume:
        loader.check_resume(run.last)            # the same layout as the stopped run
    fit(run, model, ..., loader, ..., write_files=lambda f: ... or loader.write_state(f))

The shards are read by :mod:`attn_vision.wds` (samples grouped as webdataset does; local
files only). The order of epoch ``e``:

* the shard list is shuffled by ``(seed, e)`` (``shuffle=False``: kept);
* reader slot ``s = rank + world_size * worker`` of ``S = world_size * workers`` (webdataset's
  ``split_by_node`` then ``split_by_worker``) reads the shards ``order[s::S]`` in turn, and
  starts over when it runs out; the samples of each shard in an order shuffled by
  ``(seed, e, shard)``. With ``resampled=True`` a slot instead draws its shards with
  replacement from ``(seed, e, s)`` (open_clip's ``--dataset-resampled``);
* an epoch is ``num_samples`` samples (``--train-num-samples``; default: every sample of
  every shard, counted from the tar headers): every rank makes the same
  ``num_samples // (batch_size * world_size)`` batches (DDP needs equal counts), its batch
  ``j`` made by worker ``j % workers`` from its slot's stream.

None of it depends on anything but the seed, the epoch and the layout (processes, workers,
batch size, the shard list), so the position of every slot is a function of the number of
batches a rank has consumed -- ``progress["batches"]`` of the checkpoint. A resumed run
skips each slot's consumed samples (reading only tar headers) and hands the remaining
batches out in the same round-robin order; :meth:`ShardLoader.write_state` records the
layout in the checkpoint (``shards.json``) and :meth:`ShardLoader.check_resume` refuses to
resume under another one (the order would differ). When every shard holds ``batch_size``
samples (``make_shapes.py --format wds --shard-size B``), rank ``r``'s batch ``j`` is shard
``order[r + world_size * j]``, so ``N`` processes of ``B`` see the same global batches as one
process of ``N * B``.

Bad samples (no image or an undecodable one, no caption or label, a truncated shard) come
out as ``None``: :func:`attn_train.data.collate_skip_unreadable` drops and counts them, the
loop sums the count over ranks (``skipped_images``); a warning names each (once a process).
Random augmentation is seeded per sample by ``(seed, e, shard index, key)``, whatever the
layout.
"""

from __future__ import annotations

import hashlib
import json
import random
import warnings
import zlib
from collections.abc import Callable, Iterator, Sequence
from itertools import count, islice
from pathlib import Path
from typing import Any

import torch
from attn_vision import wds
from PIL import Image
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from .checkpoint import find_checkpoint, read_checkpoint_file
from .data import UnreadableDataError, UnreadableImageWarning, _SkipAndSeed
from .distributed import Distributed

__all__ = [
    "ShardDataset",
    "ShardLoader",
    "add_shard_args",
    "make_shard_loader",
    "recipe_loader",
    "uses_shards",
    "with_data_state",
]

STATE = "shards.json"  # the data layout, in every checkpoint of a run trained from shards


class ShardDataset(_SkipAndSeed, IterableDataset):
    """Samples of webdataset shards for training (see the module docstring).

    Args:
        urls: brace-expanded shard list, sources joined with ``::``
            (``"data/{00000..00099}.tar"``); every shard must be a local file.
        transform: PIL image -> tensor.
        tokenizer: captions -> ``(1, L)`` ids (None keeps the caption string).
        label: read a class label instead of the caption: ``"cls"`` (``{key}.cls``) or the
            name of a ``{key}.json`` field (an int, or a class name of ``classnames``).
        classnames: the class list labels index (``_`` in a name read as a space).
        num_samples: samples an epoch (all ranks together); default: all of them.
        shuffle, resampled, seed: the order (module docstring).

    Items are ``(image, caption)`` or ``(image, label)``, or ``None`` for a bad sample.
    """

    def __init__(
        self,
        urls: str,
        transform: Callable[[Image.Image], Any] | None = None,
        tokenizer: Callable[[list[str]], torch.Tensor] | None = None,
        *,
        label: str | None = None,
        classnames: Sequence[str] | None = None,
        num_samples: int | None = None,
        shuffle: bool = True,
        resampled: bool = False,
        seed: int = 0,
    ) -> None:
        self.urls, self.shards = str(urls), wds.list_shards(urls)
        self.transform, self.tokenizer, self.label = transform, tokenizer, label
        self.classes = {c.replace("_", " "): i for i, c in enumerate(classnames or [])}
        self.shuffle, self.resampled = shuffle, resampled
        self._init_common(seed)
        self._counts: dict[int, int] = {}
        if num_samples is None:
            num_samples = sum(self._count(i) for i in range(len(self.shards)))
        if num_samples < 1:
            raise ValueError(f"{self.urls}: no samples in its {len(self.shards)} shards")
        self.num_samples = num_samples
        self.rank, self.world_size, self.workers, self.batch_size = 0, 1, 1, 1
        self.batches, self._skip = num_samples, 0

    def split(self, rank: int, world_size: int, workers: int, batch_size: int) -> None:
        """This process's part: ``workers`` DataLoader workers (0: in the process) making
        batches of ``batch_size``. ``ValueError`` if there are fewer shards than readers
        (without resampling) or fewer samples than one global batch."""
        self.rank, self.world_size, self.workers = rank, world_size, max(1, workers)
        self.batch_size = batch_size
        readers = world_size * self.workers
        if not self.resampled and len(self.shards) < readers:
            raise ValueError(
                f"{len(self.shards)} shards cannot be split over {world_size} process(es) x "
                f"{self.workers} worker(s) = {readers} readers: use fewer --workers, more "
                "shards, or --dataset-resampled"
            )
        self.batches = self.num_samples // (batch_size * world_size)
        if self.batches < 1:
            raise ValueError(
                f"an epoch of {self.num_samples} samples is less than one global batch "
                f"({batch_size} x {world_size} processes): raise --train-num-samples"
            )

    def __len__(self) -> int:
        return self.num_samples

    @property
    def source(self) -> str:
        return self.urls

    def set_epoch(self, epoch: int) -> None:
        """Epoch ``epoch``'s order, from its first batch."""
        self.epoch, self._skip = epoch, 0

    def skip(self, batches: int) -> None:
        """Start the epoch after this rank's first ``batches`` batches (resuming)."""
        self._skip = batches

    def layout(self) -> dict[str, Any]:
        """What the order depends on besides the epoch (recorded in checkpoints)."""
        names = "\n".join(p.name for p in self.shards).encode()
        return {
            "shards": len(self.shards),
            "shard_names_sha256": hashlib.sha256(names).hexdigest(),
            "num_samples": self.num_samples,
            "world_size": self.world_size,
            "workers": self.workers,
            "batch_size": self.batch_size,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "resampled": self.resampled,
        }

    # -- the order ------------------------------------------------------------------------

    def _count(self, index: int) -> int:
        if index not in self._counts:
            with wds.ShardReader(self.shards[index]) as shard:
                self._counts[index] = len(shard)
        return self._counts[index]

    def _draws(self, slot: int, slots: int) -> Iterator[tuple[int, str]]:
        """The shards slot ``slot`` reads this epoch, endless: ``(shard index, salt of its
        sample order)``."""
        n = len(self.shards)
        if self.resampled:
            if not any(self._count(i) for i in range(n)):
                raise UnreadableDataError(f"{self.urls}: its {n} shards hold no sample")
            rng = random.Random(f"{self.seed}-{self.epoch}-resample-{slot}")
            for draw in count():
                yield rng.randrange(n), f"r{slot}-{draw}"
        order = list(range(n))
        if self.shuffle:
            random.Random(f"{self.seed}-{self.epoch}").shuffle(order)
        mine = order[slot::slots]
        if not any(self._count(i) for i in mine):
            raise UnreadableDataError(f"{self.urls}: shards {mine} (of one reader) hold no sample")
        for cycle in count():
            yield from ((i, f"c{cycle}") for i in mine)

    def _positions(self, slot: int, slots: int) -> Iterator[tuple[wds.ShardReader, int, int]]:
        """``(open shard, shard index, sample index)`` in slot ``slot``'s order."""
        for i, salt in self._draws(slot, slots):
            with wds.ShardReader(self.shards[i]) as shard:
                self._counts[i] = len(shard)
                if shard.truncated:
                    self._warn(f"{shard.path}: {shard.truncated}")
                order = list(range(len(shard)))
                if self.shuffle:
                    random.Random(f"{self.seed}-{self.epoch}-{i}-{salt}").shuffle(order)
                for j in order:
                    yield shard, i, j

    def __iter__(self) -> Iterator[tuple[Any, Any] | None]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        if workers != self.workers:
            raise RuntimeError(f"split() for {self.workers} workers, iterated by {workers}")
        slot = (worker + self._skip) % workers  # the batches this worker makes next
        b = self.batch_size
        total = len(range(slot, self.batches, workers)) * b  # this epoch, from the start
        done = len(range(slot, self._skip, workers)) * b  # consumed before a resume
        stream = self._positions(self.rank + self.world_size * slot, self.world_size * workers)
        for n, (shard, i, j) in enumerate(islice(stream, total)):
            if n >= done:
                yield self._item(shard, i, j)

    # -- one sample -----------------------------------------------------------------------

    def _warn(self, message: str) -> None:
        if message not in self._warned:
            self._warned.add(message)
            warnings.warn(message, UnreadableImageWarning, stacklevel=3)

    def _target(self, sample: dict[str, Any]) -> Any:
        if self.label is None:
            text = wds.sample_caption(sample)
            return text if self.tokenizer is None else self.tokenizer([text])[0]
        value = wds.sample_label(sample, self.label)
        if isinstance(value, str):
            if value.replace("_", " ") not in self.classes:
                raise wds.BadSample(f"{sample['__key__']}: label {value!r} is not a class name")
            return self.classes[value.replace("_", " ")]
        if self.classes and not 0 <= value < len(self.classes):
            raise wds.BadSample(f"{sample['__key__']}: label {value} of {len(self.classes)}")
        return value

    def _item(self, shard: wds.ShardReader, i: int, j: int) -> tuple[Any, Any] | None:
        try:
            sample = shard.sample(j)
            img, target = wds.sample_image(sample), self._target(sample)
        except wds.BadSample as e:
            self._warn(f"skipping sample {shard.path.name}/{shard.keys[j]}: {e}")
            return None
        if self.transform is not None:
            with self._rng(zlib.crc32(f"{i}/{sample['__key__']}".encode())):
                img = self.transform(img)
        return img, target

    def check_readable(self) -> None:
        """:class:`UnreadableDataError` unless some sample has a usable image and caption /
        label (reads shards in order up to the first such sample; no warnings)."""
        first = ""
        for path in self.shards:
            with wds.ShardReader(path) as shard:
                for j in range(len(shard)):
                    try:
                        sample = shard.sample(j)
                        wds.sample_image(sample), self._target(sample)
                        return
                    except wds.BadSample as e:
                        first = first or str(e)
        raise UnreadableDataError(
            f"none of the samples of the {len(self.shards)} shards of {self.urls} is usable "
            f"(an image and a {'label' if self.label else 'caption'}): nothing to train on. "
            f"The first: {first or 'the shards hold no samples'}"
        )


class ShardLoader:
    """:func:`make_shard_loader`'s loader: a ``DataLoader`` over a :class:`ShardDataset` with
    what :func:`attn_train.fit` reads of a loader (``sampler.set_epoch`` / ``skip`` /
    ``num_samples``, ``batch_size``, ``drop_last``, ``dataset``, ``len``: batches a rank
    makes an epoch)."""

    drop_last = True  # every batch is whole

    def __init__(self, dataset: ShardDataset, loader: DataLoader, batch_size: int) -> None:
        self.dataset, self.batch_size, self._loader = dataset, batch_size, loader
        self.sampler = self  # fit() positions the data through loader.sampler
        self.num_samples = dataset.batches * batch_size  # this rank's items an epoch

    def set_epoch(self, epoch: int) -> None:
        self.dataset.set_epoch(epoch)

    def skip(self, n: int) -> None:
        """Skip this rank's first ``n`` items (whole batches) of the epoch."""
        self.dataset.skip(n // self.batch_size)

    def __len__(self) -> int:
        return self.dataset.batches

    def __iter__(self) -> Iterator[Any]:
        return iter(self._loader)

    def write_state(self, folder: Path) -> None:
        """Record the data layout in a checkpoint folder (a ``write_files`` step)."""
        (Path(folder) / STATE).write_text(json.dumps(self.dataset.layout(), indent=2) + "\n")

    def check_resume(self, last: str | Path) -> None:
        """Before resuming from ``last``: ``ValueError`` if its run was not trained from
        shards or read them in another layout (then the same batch count would be other
        samples); ``ResumeError`` if its record is unreadable."""
        found = find_checkpoint(last)
        if found is None:
            return
        path = found / STATE
        if not path.is_file():
            raise ValueError(
                f"cannot resume: {found} was not trained from shards (no {STATE}); start fresh "
                f"with --no-resume, or remove {found.parent}"
            )
        then = read_checkpoint_file(path, lambda p: json.loads(p.read_text()))
        now = self.dataset.layout()
        changed = [f"{k} {then.get(k)} -> {v}" for k, v in now.items() if then.get(k) != v]
        if changed:
            raise ValueError(
                f"cannot resume {found} exactly: the shards are read in another layout "
                f"({', '.join(changed)}); run it with the same processes, --workers, "
                "--batch-size, shards and --seed, or start fresh with --no-resume"
            )


def make_shard_loader(
    dataset: ShardDataset,
    batch_size: int,
    d: Distributed,
    *,
    seed: int = 0,
    collate_fn: Callable | None = None,
    num_workers: int = 0,
) -> ShardLoader:
    """:func:`attn_train.make_loader` for shards: this rank's part of ``dataset``, in batches
    of ``batch_size`` made by ``num_workers`` workers; the global RNG is never drawn from."""
    if batch_size < 1:
        raise ValueError(f"--batch-size must be >= 1, got {batch_size}")
    dataset.split(d.rank, d.world_size, num_workers, batch_size)
    loader = DataLoader(
        dataset,
        batch_size=batch_size,
        collate_fn=collate_fn or dataset.collate,
        num_workers=num_workers,
        generator=torch.Generator().manual_seed(seed),  # keeps the global RNG untouched
        pin_memory=d.device.type == "cuda",
    )
    return ShardLoader(dataset, loader, batch_size)


# -- the recipes' flags -------------------------------------------------------------------------

TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz")


def add_shard_args(p: Any, dataset_type: bool = True) -> None:
    """open_clip's webdataset flags: ``--train-num-samples --dataset-resampled`` and, where
    ``--train-data`` may also be a CSV, ``--dataset-type``."""
    if dataset_type:
        p.add_argument(
            "--dataset-type",
            choices=["auto", "csv", "webdataset"],
            default="auto",
            help="--train-data format (auto: webdataset when it names .tar shards)",
        )
    p.add_argument("--train-num-samples", type=int, help="webdataset: samples an epoch (all)")
    p.add_argument(
        "--dataset-resampled", action="store_true", help="webdataset: draw shards with replacement"
    )


def uses_shards(args: Any) -> bool:
    """Whether ``--train-data`` is a shard list (``--dataset-type``, if the recipe has it; auto:
    every name it expands to ends in .tar / .tar.gz / .tgz); its files are checked then
    (``ValueError``)."""
    text, kind = str(args.train_data), getattr(args, "dataset_type", "webdataset")
    if kind == "auto":
        try:
            shards = all(n.endswith(TAR_SUFFIXES) for n in wds.expand_urls(text))
        except ValueError:  # unbalanced braces: not a pattern
            shards = False
    else:
        shards = kind == "webdataset"
    if not shards and (args.train_num_samples is not None or args.dataset_resampled):
        raise ValueError("--train-num-samples / --dataset-resampled are for webdataset shards")
    if shards:
        wds.list_shards(text)
        if args.train_num_samples is not None and args.train_num_samples < 1:
            raise ValueError(f"--train-num-samples must be >= 1, got {args.train_num_samples}")
    return shards


def recipe_loader(
    args: Any, run: Any, transform: Callable[[Image.Image], Any], **dataset: Any
) -> ShardLoader:
    """A recipe's training loader from ``--train-data`` shards (``args``: ``--seed
    --batch-size --workers`` and :func:`add_shard_args`'s; ``run``: :func:`attn_train.start_run`'s):
    refuses a set with no usable sample, and -- resuming -- a checkpoint read in another
    layout (both ``ValueError``, before anything is written). ``dataset``: more
    :class:`ShardDataset` arguments (``tokenizer``, ``label``, ``classnames``)."""
    data = ShardDataset(
        str(args.train_data),
        transform,
        num_samples=args.train_num_samples,
        resampled=args.dataset_resampled,
        seed=args.seed,
        **dataset,
    )
    data.check_readable()
    loader = make_shard_loader(
        data, args.batch_size, run.d, seed=args.seed, num_workers=args.workers
    )
    if run.resume:
        loader.check_resume(run.last)
    return loader


def with_data_state(write: Callable[[Path], None], loader: Any) -> Callable[[Path], None]:
    """:func:`attn_train.fit`'s ``write_files``: ``write(folder)`` and, when ``loader`` is a
    :class:`ShardLoader`, the data layout it is resumed with (:meth:`ShardLoader.write_state`)."""
    if not isinstance(loader, ShardLoader):
        return write

    def both(folder: Path) -> None:
        write(folder)
        loader.write_state(folder)

    return both
