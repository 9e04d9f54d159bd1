"""attn_train.data: open_clip CSVs, ImageFolders, unreadable images skipped and counted;
loaders whose order depends only on (seed, epoch) and that skip what a resumed run saw."""

from __future__ import annotations

import warnings

import pytest
import torch
from attn_clip import Tokenizer, image_transform
from attn_clip.config import PreprocessConfig
from attn_train import shapes
from attn_train.data import (
    Collated,
    CsvImageTextDataset,
    ImageFolderDataset,
    UnreadableDataError,
    UnreadableImageWarning,
    collate_skip_unreadable,
    make_loader,
)
from attn_train.distributed import Distributed
from torch.utils.data import DataLoader
from torchvision import transforms as T


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("shapes")
    shapes.write_dataset(root, n_train=12, n_val=0, n_heldout=6, image_size=32)
    return root


def corrupt_files(folder, good_png):
    """A truncated copy of ``good_png`` and a text file with an image name, in ``folder``."""
    good = good_png.read_bytes()
    truncated = folder / "truncated.png"
    truncated.write_bytes(good[: len(good) // 2])
    text = folder / "not_an_image.png"
    text.write_text("hello")
    return truncated, text


def test_csv_paths_relative_to_the_csv_tokens_and_separators(root, tmp_path):
    ds = CsvImageTextDataset(root / "train.csv")
    assert len(ds) == 12
    img, caption = ds[0]
    assert img.size == (32, 32) and caption.startswith("a ")
    # tab-separated, custom columns, absolute paths, a tokenizer and a transform
    tsv = tmp_path / "pairs.tsv"
    tsv.write_text(
        "caption\timage\n"
        + "".join(f"{c}\t{root / p}\n" for p, c in zip(ds.images, ds.captions, strict=True))
    )
    tok = Tokenizer(16)
    ds2 = CsvImageTextDataset(
        tsv, image_transform(PreprocessConfig(size=32)), tok, img_key="image", caption_key="caption"
    )
    x, ids = ds2[3]
    assert x.shape == (3, 32, 32) and ids.shape == (16,)
    assert torch.equal(ids, tok([ds.captions[3]])[0])


def test_csv_errors_name_the_columns(root, tmp_path):
    with pytest.raises(ValueError, match=r"no column\(s\) \['path'\].*filepath"):
        CsvImageTextDataset(root / "train.csv", img_key="path")
    empty = tmp_path / "empty.csv"
    empty.write_text("filepath,title\n")
    with pytest.raises(ValueError, match="has no rows"):
        CsvImageTextDataset(empty)


def test_unreadable_images_are_skipped_with_a_warning_and_counted(root, tmp_path):
    truncated, text = corrupt_files(tmp_path, next(root.rglob("*.png")))
    lines = (root / "train.csv").read_text().splitlines()
    rows = [f"{root / line}" for line in lines[1:4]]
    csv_path = tmp_path / "mixed.csv"
    csv_path.write_text(
        "filepath,title\n"
        + "".join(f"{r}\n" for r in rows)
        + f"{truncated},broken\n{text},not an image\n{tmp_path / 'missing.png'},gone\n"
    )
    ds = CsvImageTextDataset(csv_path, image_transform(PreprocessConfig(size=32)), Tokenizer(16))
    with pytest.warns(UnreadableImageWarning, match="truncated.png"):
        assert ds[3] is None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert ds[3] is None  # the same file warns only once
        assert ds[4] is None and ds[5] is None
    assert [str(w.message).split(":")[0] for w in caught] == [
        f"skipping unreadable image {text}",
        f"skipping unreadable image {tmp_path / 'missing.png'}",
    ]
    assert ds.skipped == {3, 4, 5}
    loader = DataLoader(ds, batch_size=4, collate_fn=collate_skip_unreadable)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnreadableImageWarning)
        batches = list(loader)
    (images, tokens), skipped = batches[0]
    assert images.shape == (3, 3, 32, 32) and tokens.shape == (3, 16) and skipped == 1
    assert batches[1] == (None, 2)


def test_image_folder_skips_corrupt_files(root):
    folder = root / "heldout"
    cls = next(p for p in folder.iterdir() if p.is_dir())
    truncated, text = corrupt_files(cls, next(cls.glob("*.png")))
    try:
        ds = ImageFolderDataset(folder, T.ToTensor())
        i = ds.imgs.index((str(truncated), ds.class_to_idx[cls.name]))
        with pytest.warns(UnreadableImageWarning):
            assert ds[i] is None
        ok = next(j for j in range(len(ds)) if j != i and ds.imgs[j][0].endswith("0.png"))
        assert ds[ok][0].shape == (3, 32, 32)
    finally:
        truncated.unlink()
        text.unlink()


def test_image_folder_labels_against_a_full_class_list(root):
    names = (root / "classnames.txt").read_text().splitlines()
    ds = ImageFolderDataset(root / "heldout", classnames=names)
    assert ds.classes == names and len(ds.class_to_idx) == len(shapes.HELDOUT)
    for path, label in ds.imgs:
        assert names[label] == shapes.class_text(path.split("/")[-2])
    plain = ImageFolderDataset(root / "heldout")
    assert plain.classes == sorted(shapes.class_name(c, s) for c, s in shapes.HELDOUT)
    with pytest.raises(ValueError, match="not among the 2 class names"):
        ImageFolderDataset(root / "heldout", classnames=["red triangle", "green star"])


def test_seeded_augmentation_depends_only_on_seed_epoch_and_index(root):
    tf = T.Compose([T.RandomResizedCrop(32, scale=(0.2, 1.0)), T.ToTensor()])
    ds = CsvImageTextDataset(root / "train.csv", tf, seed=1)
    torch.manual_seed(0)
    a = ds[2][0]
    torch.manual_seed(123)  # the global RNG does not matter ...
    assert torch.equal(a, ds[2][0])
    state = torch.get_rng_state()
    ds[5]
    assert torch.equal(state, torch.get_rng_state())  # ... and is not touched
    ds.set_epoch(1)
    assert not torch.equal(a, ds[2][0])  # a new epoch, new crops
    unseeded = CsvImageTextDataset(root / "train.csv", tf)
    assert not torch.equal(unseeded[2][0], unseeded[2][0])


def test_collate_returns_a_collated_with_the_dropped_count():
    out = collate_skip_unreadable([(torch.zeros(2), 1), None, (torch.ones(2), 0)])
    assert isinstance(out, Collated) and out.skipped == 1
    assert out.batch[0].shape == (2, 2) and out.batch[1].tolist() == [1, 0]
    assert collate_skip_unreadable([None, None]) == Collated(None, 2)


def test_loader_order_depends_on_seed_and_epoch_and_skips_a_prefix():
    data = list(range(20))

    def order(seed: int, epoch: int, skip: int = 0, rank: int = 0, world: int = 1) -> list[int]:
        loader = make_loader(data, 4, Distributed(rank, world), seed=seed)
        loader.sampler.set_epoch(epoch)
        loader.sampler.skip(skip)
        torch.manual_seed(123)  # the global RNG plays no part
        return [i for batch in loader for i in batch.tolist()]

    assert order(0, 0) == order(0, 0) != order(0, 1)
    assert order(0, 0) != order(1, 0) and sorted(order(0, 0)) == data
    assert order(0, 1, skip=8) == order(0, 1)[8:]  # a resumed epoch continues where it was
    ranks = order(0, 0, rank=0, world=2) + order(0, 0, rank=1, world=2)
    assert sorted(ranks) == data  # each rank its own half
    with pytest.raises(ValueError, match="batch-size"):
        make_loader(data, 0, Distributed())


def test_a_csv_whose_images_are_all_missing_or_unreadable_is_refused(root, tmp_path):
    missing = tmp_path / "missing.csv"
    missing.write_text("filepath,title\nnope/a.png,a\nnope/b.png,b\n")
    with pytest.raises(ValueError, match=r"none of its 2 image paths is a file .*nope/a.png"):
        CsvImageTextDataset(missing)  # at once: no image is opened
    truncated, text = corrupt_files(tmp_path, next(root.rglob("*.png")))
    bad = tmp_path / "bad.csv"
    bad.write_text(f"filepath,title\n{truncated},a\n{text},b\n")
    ds = CsvImageTextDataset(bad)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # check_readable warns about nothing
        with pytest.raises(UnreadableDataError, match=rf"none of the 2 images .*{truncated}"):
            ds.check_readable()
    first = (root / "train.csv").read_text().splitlines()[1].split(",")[0]
    good = tmp_path / "good.csv"
    good.write_text(f"filepath,title\n{truncated},a\n{root / first},b\n")
    CsvImageTextDataset(good).check_readable()  # one readable image is enough
    ImageFolderDataset(root / "heldout").check_readable()


def test_image_folder_matches_torchvision(tmp_path):
    """The same classes, class indices, samples and order as torchvision's ImageFolder
    (which attn_train no longer imports): nested folders, upper-case extensions, files that
    are not images, a hidden folder, a class folder without images."""
    from torchvision.datasets import ImageFolder

    for rel in ["b_cls/x.png", "b_cls/sub/deeper/a.JPG", "b_cls/notes.txt", "a_cls/2.webp",
                "a_cls/10.jpeg", ".hidden/z.png", "c_cls/sub/y.bmp"]:  # fmt: skip
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(b"")
    ours, ref = ImageFolderDataset(tmp_path), ImageFolder(str(tmp_path))
    assert (ours.classes, ours.class_to_idx) == (ref.classes, ref.class_to_idx)
    assert ours.samples == ref.samples and ours.targets == ref.targets and len(ours) == len(ref)
    (tmp_path / "d_cls").mkdir()  # a class with no image: both refuse, the same way
    with pytest.raises(FileNotFoundError, match="no valid file for the classes d_cls"):
        ImageFolder(str(tmp_path))
    with pytest.raises(FileNotFoundError, match="no valid file for the classes d_cls"):
        ImageFolderDataset(tmp_path)
    with pytest.raises(FileNotFoundError, match="Couldn't find any class folder"):
        ImageFolderDataset(tmp_path / "b_cls" / "sub" / "deeper")
