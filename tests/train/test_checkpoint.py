"""attn_train.checkpoint: directories are swapped in atomically, a crash leaves the last
complete checkpoint, and everything (EMA included) comes back exactly."""

from __future__ import annotations

import os
import shutil

import pytest
import torch
from attn_train import (
    Distributed,
    ResumeError,
    find_checkpoint,
    load_checkpoint,
    read_checkpoint_file,
    read_progress,
)
from attn_train import save_checkpoint as save
from torch import nn


def parts(seed: int = 0):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(3, 4), nn.LayerNorm(4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(2, 3)).sum().backward()
    optimizer.step()  # some optimizer state
    return model, optimizer


def test_round_trip_restores_weights_optimizer_rng_and_progress(tmp_path):
    d = Distributed()
    model, optimizer = parts(0)
    torch.manual_seed(7)
    save(tmp_path / "last", d, model=model, optimizer=optimizer, progress={"step": 3, "seed": 0})
    expected = torch.rand(3)  # what the RNG gives right after the save

    other, other_opt = parts(1)
    progress = load_checkpoint(tmp_path / "last", d, model=other, optimizer=other_opt)
    assert progress == {"step": 3, "seed": 0} == read_progress(tmp_path / "last")
    assert all(
        torch.equal(a, b)
        for a, b in zip(model.state_dict().values(), other.state_dict().values(), strict=True)
    )  # noqa: E501
    assert str(other_opt.state_dict()) == str(optimizer.state_dict())
    assert torch.equal(torch.rand(3), expected)
    assert {p.name for p in (tmp_path / "last").iterdir()} == {
        "model.safetensors",
        "trainer_state.pt",
    }


def test_a_crash_while_writing_leaves_the_previous_checkpoint(tmp_path):
    d = Distributed()
    model, optimizer = parts()
    save(tmp_path / "last", d, model=model, optimizer=optimizer, progress={"step": 1})

    def crash(folder):
        (folder / "config.json").write_text("{")
        raise KeyboardInterrupt  # as if killed half-way

    with pytest.raises(KeyboardInterrupt):
        save(
            tmp_path / "last",
            d,
            model=model,
            optimizer=optimizer,
            progress={"step": 2},
            write_files=crash,
        )
    assert read_progress(tmp_path / "last") == {"step": 1}
    assert not (tmp_path / "last" / "config.json").exists()
    # killed between the two renames of the swap: only NAME.old is there
    os.replace(tmp_path / "last", tmp_path / "last.old")
    assert find_checkpoint(tmp_path / "last") == tmp_path / "last.old"
    assert load_checkpoint(tmp_path / "last", d, model=model)["step"] == 1
    save(tmp_path / "last", d, model=model, optimizer=optimizer, progress={"step": 3})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last"]  # .tmp and .old cleaned up
    assert read_progress(tmp_path / "last") == {"step": 3}
    shutil.rmtree(tmp_path / "last")
    assert find_checkpoint(tmp_path / "last") is None and read_progress(tmp_path / "last") is None
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        load_checkpoint(tmp_path / "last", d, model=model)


def test_ema_is_saved_and_restored(tmp_path):
    from timm.utils import ModelEmaV3

    d = Distributed()
    model, optimizer = parts(0)
    ema = ModelEmaV3(model, decay=0.5)
    for step in range(1, 4):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.1)
        ema.update(model, step=step)
    save(tmp_path / "last", d, model=model, optimizer=optimizer, ema=ema, progress={"step": 3})
    assert (tmp_path / "last" / "ema.safetensors").is_file()

    other, other_opt = parts(1)
    other_ema = ModelEmaV3(other, decay=0.5)
    load_checkpoint(tmp_path / "last", d, model=other, optimizer=other_opt, ema=other_ema)
    for a, b in zip(
        ema.module.state_dict().values(), other_ema.module.state_dict().values(), strict=True
    ):  # noqa: E501
        assert torch.equal(a, b)
    assert not torch.equal(other_ema.module[0].weight, other[0].weight)

    save(tmp_path / "plain", d, model=model, optimizer=optimizer, progress={"step": 3})
    with pytest.raises(FileNotFoundError, match="ema.safetensors"):
        load_checkpoint(tmp_path / "plain", d, model=other, ema=other_ema)


@pytest.mark.parametrize("name", ["model.safetensors", "trainer_state.pt"])
def test_a_truncated_checkpoint_is_one_line_that_says_how_to_start_over(tmp_path, name):
    d = Distributed()
    model, optimizer = parts(0)
    save(tmp_path / "last", d, model=model, optimizer=optimizer, progress={"step": 3})
    path = tmp_path / "last" / name
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(ResumeError) as e:
        load_checkpoint(tmp_path / "last", d, model=model, optimizer=optimizer)
    message = str(e.value)
    assert "\n" not in message and f"{path} is truncated or corrupt" in message
    assert "--no-resume" in message and f"remove {tmp_path / 'last'}" in message


def test_a_checkpoint_of_another_model_is_named(tmp_path):
    d = Distributed()
    model, optimizer = parts(0)
    save(tmp_path / "last", d, model=model, optimizer=optimizer, progress={"step": 3})
    wider = nn.Sequential(nn.Linear(3, 5), nn.LayerNorm(5))
    with pytest.raises(ResumeError, match=r"model.safetensors does not fit this run \(.*size"):
        load_checkpoint(tmp_path / "last", d, model=wider)
    assert read_checkpoint_file(tmp_path / "last" / "trainer_state.pt", lambda p: p.name)
    with pytest.raises(ResumeError, match=r"tokenizer.json is truncated or corrupt"):
        read_checkpoint_file(tmp_path / "last" / "tokenizer.json", lambda p: p.read_text())
