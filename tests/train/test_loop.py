"""attn_train.loop.fit on a tiny model: accumulation equals the big batch, a NaN / inf
loss stops cleanly with the last good checkpoint untouched, and stop + resume is exact
(dropout, shuffling, accumulation, EMA, schedule, evaluation that draws random numbers);
Ctrl-C names the checkpoint, unreadable items warn / stop the run, and the progress bar is
as long as the run. (2 processes with accumulation equal one: test_distributed.py.)"""

from __future__ import annotations

import io
import warnings
from pathlib import Path

import pytest
import torch
import tqdm
from _support.scripts import records, step_losses
from _support.train import mlp_dataset, mse, run_args, train_mlp
from attn_train import (
    LoopConfig,
    NonFiniteLossError,
    ResumeError,
    SkippedImagesWarning,
    TrainingInterrupted,
    UnreadableDataError,
    collate_skip_unreadable,
    fit,
    lambda_lr,
    make_loader,
    start_run,
)
from safetensors.torch import load_file
from torch import nn


def test_accumulation_equals_the_big_batch(tmp_path):
    train_mlp(tmp_path / "big", batch_size=16, accum=1)
    train_mlp(tmp_path / "acc", batch_size=8, accum=2)
    big, acc = step_losses(tmp_path / "big"), step_losses(tmp_path / "acc")
    assert big.keys() == acc.keys() == {1, 2, 3, 4}
    for k in big:
        assert acc[k] == pytest.approx(big[k], rel=1e-5)
    a = load_file(tmp_path / "big" / "last" / "model.safetensors")
    b = load_file(tmp_path / "acc" / "last" / "model.safetensors")
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=1e-6, rtol=1e-5)
    train_mlp(tmp_path / "small", batch_size=8, accum=1)  # half the batch: a real difference
    c = load_file(tmp_path / "small" / "last" / "model.safetensors")
    assert max((a[k] - c[k]).abs().max() for k in a) > 1e-3


def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path):
    out = tmp_path / "run"
    with pytest.raises(NonFiniteLossError) as e:
        train_mlp(out, max_steps=8, save_every=2, debug_nan_at_step=5)
    message = str(e.value)
    assert "loss is nan at update 5" in message
    assert f"the last good checkpoint is {out / 'last'} (step 4)" in message
    state = torch.load(out / "last" / "trainer_state.pt", weights_only=True)
    assert state["progress"]["step"] == 4
    assert records(out)[-1]["event"] == "nonfinite_loss"
    assert max(step_losses(out)) == 4  # nothing after the bad update

    with pytest.raises(NonFiniteLossError, match="no checkpoint had been written yet"):
        train_mlp(tmp_path / "early", max_steps=8, save_every=None, debug_nan_at_step=1)


def test_stop_and_resume_is_exact(tmp_path):
    def evaluate() -> dict[str, float]:  # draws random numbers: must not shift training
        return {"score": torch.rand(()).item()}

    common = {"batch_size": 4, "accum": 2, "total": 10, "dropout": 0.2, "ema": 0.9}
    common.update(evaluate=evaluate, best_metric="score")
    straight = train_mlp(tmp_path / "straight", max_steps=10, **common)  # 4 updates per epoch
    train_mlp(tmp_path / "resumed", max_steps=5, save_every=3, **common)  # stops mid-epoch 1
    resumed = train_mlp(tmp_path / "resumed", max_steps=10, **common)
    assert straight["step"] == resumed["step"] == 10
    assert [r["event"] for r in records(tmp_path / "resumed") if r.get("event")].count(
        "resume"
    ) == 1
    for name in ("model.safetensors", "ema.safetensors"):
        a = load_file(tmp_path / "straight" / "last" / name)
        b = load_file(tmp_path / "resumed" / "last" / name)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name
    a, b = step_losses(tmp_path / "straight"), step_losses(tmp_path / "resumed")
    assert all(a[k] == b[k] for k in a)  # the same losses, update for update
    ema = load_file(tmp_path / "straight" / "last" / "ema.safetensors")
    model = load_file(tmp_path / "straight" / "last" / "model.safetensors")
    assert not all(torch.equal(ema[k], model[k]) for k in ema)  # the EMA really averages


def test_fit_takes_exactly_one_of_loss_fn_and_step_fn(tmp_path):
    run = start_run(run_args(tmp_path))
    model = nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = make_loader(mlp_dataset(), 8, run.d)
    with pytest.raises(TypeError, match="exactly one"):
        fit(run, model, optimizer, None, loader, LoopConfig(1))


def test_run_reads_a_file_of_the_checkpoint_being_resumed(tmp_path):
    train_mlp(tmp_path, max_steps=2, total=2)
    run = start_run(run_args(tmp_path))
    assert run.resume
    (run.last / "vocab.txt").write_text("abc", encoding="utf-8")
    assert run.read_last("vocab.txt", lambda p: p.read_text(encoding="utf-8")) == "abc"
    with pytest.raises(ResumeError, match="missing.txt"):
        run.read_last("missing.txt", lambda p: p.read_text(encoding="utf-8"))
    empty = start_run(run_args(tmp_path / "empty"))
    with pytest.raises(ValueError, match="no checkpoint"):
        empty.read_last("vocab.txt", Path.read_text)


def fit_tiny(out: Path, loss_fn=mse, items=None, batch_size=8, **config) -> dict:
    """fit() of a linear model on ``items`` (default: ``mlp_dataset()``'s 32 pairs; None items are
    unreadable ones); ``config``: LoopConfig fields."""
    run = start_run(run_args(out))
    model = nn.Linear(4, 2)
    data = mlp_dataset() if items is None else items
    loader = make_loader(data, batch_size, run.d, seed=0, collate_fn=collate_skip_unreadable)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    scheduler = lambda_lr(optimizer, lambda step: 1.0)
    cfg = LoopConfig(**{"max_steps": 4, "epochs": 100, "quiet": True, **config})
    return fit(run, model, optimizer, scheduler, loader, cfg, loss_fn=loss_fn)


def interrupt_at(call: int):
    """A loss function that is Ctrl-C'd at its ``call``-th call."""
    calls = iter(range(1, 10**6))

    def loss_fn(model, batch):
        if next(calls) == call:
            raise KeyboardInterrupt
        return mse(model, batch)

    return loss_fn


def test_ctrl_c_names_the_checkpoint_to_resume_from(tmp_path):
    out = tmp_path / "run"
    with pytest.raises(TrainingInterrupted) as e:
        fit_tiny(out, interrupt_at(3), save_every=1)
    assert str(e.value) == (
        f"the last checkpoint is {out / 'last'} (update 2); run the same command again to "
        "resume from it"
    )
    with pytest.raises(KeyboardInterrupt, match="no checkpoint had been written yet"):
        fit_tiny(tmp_path / "early", interrupt_at(1), save_every=None)


def test_unreadable_items_warn_above_the_limit_and_stop_when_all_are(tmp_path):
    pairs = mlp_dataset()
    with pytest.raises(UnreadableDataError, match="none of the 32 training items read in epoch 0"):
        fit_tiny(tmp_path / "none", items=[None] * 32)
    assert not (tmp_path / "none" / "last").exists()  # no untrained checkpoint
    some = [None if i % 4 == 0 else p for i, p in enumerate(pairs)]  # 25% unreadable
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fit_tiny(tmp_path / "some", items=some, max_steps=8)  # two epochs
        fit_tiny(tmp_path / "ok", items=some, warn_skipped_fraction=0.3)
    assert result["skipped_images"] == 16
    found = [str(w.message) for w in caught if issubclass(w.category, SkippedImagesWarning)]
    assert found == [
        "8 of 32 training items (25%) were unreadable images in epoch 0, more than "
        "--warn-skipped-fraction 0.1; they were skipped (check the data)"
    ]  # once a run, and not at all under the limit


class Bar(tqdm.tqdm):
    """A silent tqdm that remembers its instances."""

    made: list[Bar] = []

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **{**kwargs, "file": io.StringIO()})
        Bar.made.append(self)


@pytest.mark.parametrize("accum, max_steps", [(1, 6), (3, 3), (2, 5)])
def test_the_progress_bar_counts_the_updates_that_run(tmp_path, monkeypatch, accum, max_steps):
    monkeypatch.setattr(tqdm, "tqdm", Bar)
    Bar.made.clear()
    result = fit_tiny(tmp_path / "run", max_steps=max_steps, accum=accum, quiet=False)
    (bar,) = Bar.made  # one bar for the run: 4 batches an epoch, so several epochs
    assert bar.total == bar.n == result["step"] == max_steps
    Bar.made.clear()  # a resumed run counts on from where it stopped
    result = fit_tiny(tmp_path / "run", max_steps=max_steps + 2, accum=accum, quiet=False)
    (bar,) = Bar.made
    assert (bar.initial, bar.total, bar.n) == (max_steps, max_steps + 2, result["step"])
    Bar.made.clear()  # epochs end the run before max_steps: the bar knows
    fit_tiny(tmp_path / "short", max_steps=100, epochs=2, accum=accum, quiet=False)
    (bar,) = Bar.made
    assert bar.total == bar.n == 2 * (4 // accum)
