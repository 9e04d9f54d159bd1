"""Training data: loaders that resume mid-epoch, and image data sets that survive bad files.

* :class:`ResumableSampler` / :func:`make_loader` -- a ``DistributedSampler`` (also for one
  process) whose order depends only on ``(seed, epoch)`` and that can skip the batches a
  resumed run has already seen.
* :class:`CsvImageTextDataset` -- open_clip's CSV convention: one row per image, an image
  path column (``filepath``) and a caption column (``title``), comma- or tab-separated
  (detected from the header), paths relative to the CSV's folder. Items are
  ``(image, caption)``; with a tokenizer the caption becomes its ``(L,)`` token ids.
* :class:`ImageFolderDataset` -- torchvision's ``ImageFolder`` layout and order
  (``root/<class>/<img>``; not importing torchvision, which pulls in dynamo and inductor),
  optionally with a fixed list of class names so a folder holding only some classes
  (held-out ones) is labelled against the full list.

Unreadable images (missing, truncated, not an image) never crash a run: the item comes
back as ``None``, a warning names the file (once per file and process), and
:func:`collate_skip_unreadable` drops it and returns a :class:`Collated` that says how many
it dropped; the training loop sums that over ranks, warns when too many were skipped and
stops when none was readable. A CSV none of whose image paths exists is refused at once;
``dataset.check_readable()`` (before a run writes anything) refuses a data set none of
whose images can be decoded, reading only up to the first good one.

Augmentation can be made independent of worker and rank: with ``seed`` set, the random
transform of item ``i`` in epoch ``e`` always draws the same numbers
(``set_epoch(e)``, which the loop calls), which is what exact resume and
DDP-vs-single-process comparisons need.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import torch
from attn_vision.images import ImageError, open_image, read_captions_csv
from PIL import Image
from torch.utils.data import DataLoader, Dataset, DistributedSampler, default_collate

from .distributed import Distributed

__all__ = [
    "Collated",
    "CsvImageTextDataset",
    "ImageFolderDataset",
    "ResumableSampler",
    "UnreadableDataError",
    "UnreadableImageWarning",
    "collate_skip_unreadable",
    "load_rgb",
    "make_loader",
    "readable_batches",
]


class ResumableSampler(DistributedSampler):
    """A ``DistributedSampler`` (also for one process) that can skip a prefix.

    ``set_epoch(e)`` reshuffles from ``seed + e``; ``skip(n)`` drops this rank's first
    ``n`` indices of the current epoch, which is how a resumed run continues mid-epoch.
    """

    def __init__(self, dataset: Dataset, d: Distributed, *, shuffle: bool, seed: int) -> None:
        super().__init__(dataset, d.world_size, d.rank, shuffle=shuffle, seed=seed)
        self._skip = 0

    def skip(self, n: int) -> None:
        self._skip = n

    def set_epoch(self, epoch: int) -> None:
        super().set_epoch(epoch)
        self._skip = 0

    def __iter__(self) -> Iterator[int]:
        return iter(list(super().__iter__())[self._skip :])

    def __len__(self) -> int:
        return max(0, super().__len__() - self._skip)


def make_loader(
    dataset: Dataset,
    batch_size: int,
    d: Distributed,
    *,
    shuffle: bool = True,
    seed: int = 0,
    collate_fn: Callable | None = None,
    num_workers: int = 0,
) -> DataLoader:
    """A loader over a :class:`ResumableSampler` (``loader.sampler``) whose order depends
    only on ``(seed, epoch)`` -- never on the global RNG. ``collate_fn`` defaults to the
    dataset's own ``collate`` (padding for text, skipping unreadable images)."""
    if batch_size < 1:
        raise ValueError(f"--batch-size must be >= 1, got {batch_size}")
    return DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=ResumableSampler(dataset, d, shuffle=shuffle, seed=seed),
        collate_fn=collate_fn or getattr(dataset, "collate", None),
        num_workers=num_workers,
        generator=torch.Generator().manual_seed(seed),  # keeps the global RNG untouched
        pin_memory=d.device.type == "cuda",
    )


_UNREADABLE = (ImageError, OSError)


class UnreadableImageWarning(UserWarning):
    """An image could not be read and its sample was skipped."""


class UnreadableDataError(ValueError):
    """No image of the training data could be read: nothing to train on."""


def load_rgb(path: str | os.PathLike) -> Image.Image:
    """The image as the apps see it (``attn_vision.images.open_image``: fully decoded, EXIF
    rotation applied, alpha on white, 16-bit rescaled); ``ImageError`` when unreadable."""
    return open_image(path)


def _reason(error: Exception, path: str) -> str:
    """An :class:`ImageError`'s message without the path it starts with."""
    text = str(error)
    return text[len(path) + 2 :] if text.startswith(f"{path}: ") else text


class _SkipAndSeed:
    """Mixin: skip-with-warning bookkeeping and per-item seeded transforms."""

    seed: int | None
    epoch: int
    skipped: set[int]
    _warned: set[str]

    def _init_common(self, seed: int | None) -> None:
        self.seed, self.epoch = seed, 0
        self.skipped, self._warned = set(), set()

    def set_epoch(self, epoch: int) -> None:
        """Random transforms of epoch ``epoch`` (only matters with ``seed`` set)."""
        self.epoch = epoch

    def collate(self, batch: list[Any]) -> Collated:
        """:func:`collate_skip_unreadable` (what :func:`make_loader` uses by default)."""
        return collate_skip_unreadable(batch)

    @property
    def source(self) -> str:
        """The CSV or folder the items come from (for messages)."""
        raise NotImplementedError

    def image_paths(self) -> list[str]:
        """Every item's image path, in item order."""
        raise NotImplementedError

    def check_readable(self) -> None:
        """:class:`UnreadableDataError` unless some image decodes (reads up to the first that
        does; no transform, no random numbers, no warnings)."""
        paths = self.image_paths()
        first = ""
        for path in paths:
            try:
                load_rgb(path)
                return
            except _UNREADABLE as e:
                first = first or f"{path}: {_reason(e, path)}"
        raise UnreadableDataError(
            f"none of the {len(paths)} images of {self.source} can be read (missing, truncated "
            f"or not images): nothing to train on. The first: {first}"
        )

    @contextlib.contextmanager
    def _rng(self, index: int) -> Iterator[None]:
        if self.seed is None:
            yield
            return
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed((self.seed * 1_000_003 + self.epoch * 100_003 + index) % 2**63)
            yield

    def _load(self, index: int, path: str) -> Image.Image | None:
        try:
            return load_rgb(path)
        except _UNREADABLE as e:
            self.skipped.add(index)
            if path not in self._warned:
                self._warned.add(path)
                warnings.warn(
                    f"skipping unreadable image {path}: {_reason(e, path)}",
                    UnreadableImageWarning,
                    stacklevel=3,
                )
            return None


class CsvImageTextDataset(_SkipAndSeed, Dataset):
    """Image-caption pairs from a CSV in open_clip's convention.

    Args:
        path: the CSV file; relative image paths are resolved against its folder.
        transform: PIL image -> tensor (e.g. :func:`attn_clip.image_transform`).
        tokenizer: captions -> ``(1, L)`` ids; None keeps the caption string.
        img_key, caption_key: column names (open_clip's ``--csv-img-key`` /
            ``--csv-caption-key``; defaults ``filepath`` / ``title``; None: the first
            known name the header has, see ``attn_vision.images.read_captions_csv``, the
            one reader of captions CSVs).
        sep: column separator; None detects tab or comma from the header line.
        seed: makes random transforms a function of ``(seed, epoch, index)``.

    ``dataset[i]`` is ``(image, caption)``, or ``None`` when the image is unreadable.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        transform: Callable[[Image.Image], Any] | None = None,
        tokenizer: Callable[[list[str]], torch.Tensor] | None = None,
        img_key: str | None = "filepath",
        caption_key: str | None = "title",
        sep: str | None = None,
        seed: int | None = None,
    ) -> None:
        self.path = Path(path)
        self.transform, self.tokenizer = transform, tokenizer
        self._init_common(seed)
        rows = read_captions_csv(path, img_key=img_key, caption_key=caption_key, sep=sep)
        self.images = [str(p) for p, _ in rows]
        self.captions = [t for _, t in rows]
        if not any(map(os.path.isfile, self.images)):  # stops at the first file found
            raise ValueError(
                f"{self.path}: none of its {len(rows)} image paths is a file (the first: "
                f"{self.images[0]}; relative paths are read from the CSV's folder)"
            )

    def __len__(self) -> int:
        return len(self.images)

    @property
    def source(self) -> str:
        return str(self.path)

    def image_paths(self) -> list[str]:
        return self.images

    def __getitem__(self, index: int) -> tuple[Any, Any] | None:
        img = self._load(index, self.images[index])
        if img is None:
            return None
        if self.transform is not None:
            with self._rng(index):
                img = self.transform(img)
        text = self.captions[index]
        if self.tokenizer is not None:
            text = self.tokenizer([text])[0]
        return img, text


# torchvision's ImageFolder extensions (``torchvision.datasets.folder.IMG_EXTENSIONS``)
FOLDER_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


class ImageFolderDataset(_SkipAndSeed, Dataset):
    """torchvision's ``ImageFolder`` (``root/<class>/<img>``: the same classes, samples and
    order, ``classes`` / ``class_to_idx`` / ``samples`` (``imgs``) / ``targets``) that skips
    unreadable images (returns ``None``).

    ``classnames``: the full, ordered class list. Folder names are matched to it with
    ``_`` read as a space (``red_circle`` -> ``"red circle"``), so a folder holding only
    some classes is labelled by its index in the full list. Default: the sorted folder
    names, as ``ImageFolder`` does.
    """

    def __init__(
        self,
        root: str | os.PathLike,
        transform: Callable[[Image.Image], Any] | None = None,
        classnames: Sequence[str] | None = None,
        seed: int | None = None,
        target_transform: Callable[[int], Any] | None = None,
    ) -> None:
        self._classnames = list(classnames) if classnames is not None else None
        self._init_common(seed)
        self.root, self.transform, self.target_transform = str(root), transform, target_transform
        self.classes, self.class_to_idx = self.find_classes(self.root)
        self.samples = self._find_samples(allow_empty=classnames is not None)
        self.targets = [target for _, target in self.samples]
        self.imgs = self.samples  # torchvision's alias

    def _find_samples(self, allow_empty: bool) -> list[tuple[str, int]]:
        """``(path, class index)`` in torchvision's ``make_dataset`` order: class folders
        sorted, then ``os.walk`` (links followed) sorted, then file names sorted."""
        samples, found = [], set()
        for folder in sorted(self.class_to_idx):
            target_dir = os.path.join(self.root, folder)
            for dirpath, _, names in sorted(os.walk(target_dir, followlinks=True)):
                for name in sorted(names):
                    if name.lower().endswith(FOLDER_EXTENSIONS):
                        samples.append((os.path.join(dirpath, name), self.class_to_idx[folder]))
                        found.add(folder)
        empty = sorted(set(self.class_to_idx) - found)
        if empty and not allow_empty:
            raise FileNotFoundError(
                f"Found no valid file for the classes {', '.join(empty)}. "
                f"Supported extensions are: {', '.join(FOLDER_EXTENSIONS)}"
            )
        return samples

    def __len__(self) -> int:
        return len(self.samples)

    @property
    def source(self) -> str:
        return str(self.root)

    def image_paths(self) -> list[str]:
        return [path for path, _ in self.samples]

    def find_classes(self, directory: str | os.PathLike) -> tuple[list[str], dict[str, int]]:
        with os.scandir(directory) as entries:  # FileNotFoundError for a missing root
            folders = sorted(e.name for e in entries if e.is_dir())
        if not folders:
            raise FileNotFoundError(f"Couldn't find any class folder in {directory}.")
        if self._classnames is None:
            return folders, {name: i for i, name in enumerate(folders)}
        index = {name.replace("_", " "): i for i, name in enumerate(self._classnames)}
        unknown = [f for f in folders if f.replace("_", " ") not in index]
        if unknown:
            raise ValueError(
                f"{directory}: folder(s) {unknown} are not among the {len(index)} class names"
            )
        return list(self._classnames), {f: index[f.replace("_", " ")] for f in folders}

    def __getitem__(self, index: int) -> tuple[Any, int] | None:
        path, target = self.samples[index]
        img = self._load(index, path)
        if img is None:
            return None
        if self.transform is not None:
            with self._rng(index):
                img = self.transform(img)
        if self.target_transform is not None:
            target = self.target_transform(target)
        return img, target


class Collated(NamedTuple):
    """A batch of the readable items (None when none was) and how many were dropped."""

    batch: Any
    skipped: int


def collate_skip_unreadable(batch: list[Any]) -> Collated:
    """``default_collate`` of the readable items, and the number of ``None`` items dropped."""
    items = [b for b in batch if b is not None]
    return Collated(default_collate(items) if items else None, len(batch) - len(items))


def readable_batches(dataset: Dataset, batch_size: int) -> Iterator[Any]:
    """The batches of ``dataset`` in order, unreadable items (``None``) dropped and batches
    with no readable item skipped: for evaluation, one process, no shuffling."""
    loader = DataLoader(dataset, batch_size=batch_size, collate_fn=collate_skip_unreadable)
    for batch, _ in loader:
        if batch is not None:
            yield batch
