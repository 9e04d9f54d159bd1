"""attn_train.wds: training samples from webdataset shards -- every sample once an epoch split
over ranks and DataLoader workers; 2 ranks of B see one process's global batches of 2B; a
skipped (resumed) epoch continues with exactly the batches the uninterrupted one made, with
and without workers or resampling; the order is a function of seed and epoch; bad samples
are None items that the collate counts; augmentation is seeded per sample whatever the layout;
the refusals (too few shards, too small an epoch, nothing usable, another layout on resume)."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest
import torch
from attn_train import Distributed
from attn_train.data import UnreadableDataError, UnreadableImageWarning
from attn_train.wds import ShardDataset, make_shard_loader
from attn_vision.wds import ShardWriter
from PIL import Image

N_SHARDS, PER_SHARD = 6, 4
pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create")  # 2 cores


def tensor(img: Image.Image) -> torch.Tensor:
    return torch.tensor(img.getpixel((0, 0)), dtype=torch.float32)


def write_shards(folder: Path, n_shards: int = N_SHARDS, per_shard: int = PER_SHARD) -> str:
    """Shards of ``per_shard`` samples captioned ``s{i}`` (their writing order)."""
    with ShardWriter(folder, per_shard, image_format="png") as w:
        for i in range(n_shards * per_shard):
            w.write(Image.new("RGB", (4, 4), (i, 0, 0)), f"s{i}")
    return w.spec


@pytest.fixture(scope="module")
def spec(tmp_path_factory) -> str:
    return write_shards(tmp_path_factory.mktemp("shards"))


def epoch(spec: str, *, rank=0, world=1, workers=0, batch=4, e=0, skip=0, **kw) -> list[list]:
    """The caption batches of rank ``rank``'s epoch ``e`` (after ``skip`` batches)."""
    data = ShardDataset(spec, tensor, **kw)
    loader = make_shard_loader(data, batch, Distributed(rank, world), num_workers=workers)
    loader.sampler.set_epoch(e)
    loader.sampler.skip(skip * batch)
    return [list(b.batch[1]) for b in loader]


def test_every_sample_once_an_epoch_over_ranks_and_workers(spec):
    seen, shards = [], []
    for rank in range(2):  # reader slot rank + 2 * worker of 6 reads shard order[slot]
        batches = epoch(spec, rank=rank, world=2, workers=3, batch=2)
        assert len(batches) == 24 // 4  # every rank the same count: DDP needs it
        seen += [c for b in batches for c in b]
        shards += [{int(c[1:]) // PER_SHARD for c in b} for b in batches]
    assert sorted(seen) == sorted(f"s{i}" for i in range(24))
    # batch j of a rank comes from worker j % 3: one shard per worker, two batches each
    assert all(len(s) == 1 for s in shards) and len({min(s) for s in shards}) == 6
    assert shards[0] == shards[3] != shards[1]


def test_two_ranks_of_b_see_the_global_batches_of_one_process_of_2b(spec):
    one = epoch(spec, batch=2 * PER_SHARD)
    two = [epoch(spec, rank=r, world=2, batch=PER_SHARD) for r in range(2)]
    assert len(one) == len(two[0]) == len(two[1]) == 3
    for j, batch in enumerate(one):  # gathered in rank order
        assert batch == two[0][j] + two[1][j]
    assert one != epoch(spec, batch=2 * PER_SHARD, e=1)  # reshuffled every epoch
    assert one == epoch(spec, batch=2 * PER_SHARD)  # a function of seed and epoch only
    assert one != epoch(spec, batch=2 * PER_SHARD, seed=1)
    plain = epoch(spec, batch=2 * PER_SHARD, shuffle=False)
    assert [c for b in plain for c in b] == [f"s{i}" for i in range(24)]


@pytest.mark.parametrize("workers, resampled, skip", [(0, False, 2), (2, False, 3), (3, True, 4)])
def test_a_resumed_epoch_continues_with_the_uninterrupted_batches(spec, workers, resampled, skip):
    kw = dict(workers=workers, batch=2, e=1, resampled=resampled, num_samples=40)
    whole = epoch(spec, **kw)
    assert len(whole) == 20  # an epoch of 40 samples: the 24 are read again
    assert epoch(spec, skip=skip, **kw) == whole[skip:]


def test_num_samples_cycles_each_readers_shards(spec):
    batches = epoch(spec, batch=4, num_samples=48, shuffle=False)
    flat = [c for b in batches for c in b]
    assert flat == [f"s{i}" for i in range(24)] * 2
    resampled = [c for b in epoch(spec, batch=4, resampled=True, num_samples=48) for c in b]
    assert len(resampled) == 48 and len(set(resampled)) < 24  # shards drawn with replacement


def test_augmentation_is_seeded_per_sample_whatever_the_layout(spec):
    def noisy(img: Image.Image) -> torch.Tensor:
        return tensor(img) + torch.rand(())

    def values(world: int, workers: int) -> dict[str, float]:
        out = {}
        for rank in range(world):
            data = ShardDataset(spec, noisy, seed=3)
            loader = make_shard_loader(data, 4, Distributed(rank, world), num_workers=workers)
            for b in loader:
                out |= {c: v.item() for c, v in zip(b.batch[1], b.batch[0][:, 1], strict=True)}
        return out

    state = torch.get_rng_state()
    one = values(1, 0)
    assert torch.equal(torch.get_rng_state(), state)  # the global RNG is not drawn from
    assert one == values(2, 2) and len(one) == 24


def bad_shards(folder: Path) -> str:
    """Two shards of 4: a corrupt PNG, a missing caption, a caption-only sample, 5 good."""
    png = io.BytesIO()
    Image.new("RGB", (4, 4), (9, 9, 9)).save(png, "PNG")
    files = [
        [("a.png", png.getvalue()), ("a.txt", b"good a"), ("b.png", b"\x89PNG broken")]
        + [("b.txt", b"corrupt"), ("c.png", png.getvalue()), ("d.png", png.getvalue())]
        + [("d.txt", b"good d")],
        [("e.txt", b"caption only")]
        + [
            (f"{k}.{x}", png.getvalue() if x == "png" else b"ok")
            for k in "fgh"
            for x in "png txt".split()
        ],
    ]
    for n, members in enumerate(files):
        with tarfile.open(folder / f"{n}.tar", "w") as tar:
            for name, data in members:
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return str(folder / "{0..1}.tar")


def test_bad_samples_are_none_items_the_collate_counts(tmp_path):
    data = ShardDataset(bad_shards(tmp_path), tensor, shuffle=False)
    loader = make_shard_loader(data, 4, Distributed())
    with pytest.warns(UnreadableImageWarning) as caught:
        batches = list(loader)
    assert [b.skipped for b in batches] == [2, 1] and [len(b.batch[1]) for b in batches] == [2, 3]
    assert [c for b in batches for c in b.batch[1]] == ["good a", "good d", "ok", "ok", "ok"]
    messages = " | ".join(str(w.message) for w in caught)
    assert "0.tar/b: " in messages and "not an image" in messages
    assert "0.tar/c: " in messages and "no caption (missing)" in messages
    assert "1.tar/e: " in messages and "no image" in messages
    data.check_readable()  # some sample is usable


def test_refusals(spec, tmp_path):
    data = ShardDataset(spec, tensor)
    with pytest.raises(ValueError, match="6 shards cannot be split over 2 process\\(es\\) x 4"):
        make_shard_loader(data, 2, Distributed(0, 2), num_workers=4)
    make_shard_loader(ShardDataset(spec, resampled=True), 2, Distributed(0, 2), num_workers=4)
    with pytest.raises(ValueError, match="less than one global batch \\(8 x 2 processes\\)"):
        make_shard_loader(ShardDataset(spec, num_samples=10), 8, Distributed(0, 2))
    bad = tmp_path / "bad"
    bad.mkdir()
    with tarfile.open(bad / "0.tar", "w") as tar:
        info = tarfile.TarInfo("x.txt")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"no"))
    with pytest.raises(UnreadableDataError, match="nothing to train on. The first: .*no image"):
        ShardDataset(str(bad / "0.tar")).check_readable()
    with pytest.raises(ValueError, match="1 of the 1 shards"):
        ShardDataset(str(tmp_path / "missing.tar"))


def test_resuming_under_another_layout_is_refused(spec, tmp_path):
    last = tmp_path / "last"
    last.mkdir()
    for name in ("model.safetensors", "trainer_state.pt"):  # what find_checkpoint looks for
        (last / name).write_bytes(b"")
    loader = make_shard_loader(ShardDataset(spec), 4, Distributed(), num_workers=2)
    with pytest.raises(ValueError, match="was not trained from shards"):
        loader.check_resume(last)
    loader.write_state(last)
    loader.check_resume(last)  # the same layout
    assert json.loads((last / "shards.json").read_text())["workers"] == 2
    other = make_shard_loader(ShardDataset(spec), 4, Distributed(), num_workers=1)
    with pytest.raises(ValueError, match="another layout \\(workers 2 -> 1\\)"):
        other.check_resume(last)
    (last / "shards.json").write_text("{not json")
    with pytest.raises(ValueError, match="cannot resume: .*shards.json is truncated or corrupt"):
        loader.check_resume(last)
