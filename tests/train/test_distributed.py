"""Training with 2 CPU processes under ``torchrun`` (gloo): DDP equals one process on the same
global batch (attn_train.fit with accumulation, scripts/finetune_vit.py and
scripts/train_clip.py, also from webdataset shards), a CoCa trains under DDP with the
caption loss (each rank's token mean, as open_clip's), scripts/train_translation.py runs and
checkpoints both ranks, and ``--fsdp`` (attn_train.fsdp: FSDP2) on finetune_vit and
train_clip: losses and weights equal the DDP run, a run stopped mid-way resumes to the
uninterrupted run's weights, the checkpoint is sharded (torch.distributed.checkpoint, one
file per rank) next to whole weights, and a truncated or hostile checkpoint is one clear
error.

One ``torchrun`` launch runs every distributed training of the test suite (this file is its
script: see ``worker``), so the interpreters, imports and the process group are paid for
once; the one-process references run in the test process.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch
from _support.scripts import records, step_losses, torchrun, weights
from _support.train import CLIP_TINY, COCA_TINY, VIT_TINY, shapes_data, train_mlp

VIT = [*VIT_TINY, "--batch-size", "8", "--max-steps", "4", "--save-every", "2"]
VIT += ["--grad-clip", "1"]
CLIP = ["--set", *CLIP_TINY, "--batch-size", "8", "--accum", "2", "--max-steps", "3"]
CLIP += ["--grad-clip", "1"]
NLP = ["--set", "embed_dim=32", "mlp_dim=64", "num_heads=4", "dropout=0.1"]
NLP += ["--batch-size", "16", "--max-steps", "4", "--save-every", "2"]
COMMON = ["--threads", "1", "--quiet", "--device", "cpu", "--log-every", "1", "--warmup", "1"]
COMMON += ["--lr", "3e-3"]


def vit_args(data: Path) -> list[str]:
    return ["--train-dir", str(data / "train"), "--val-dir", str(data / "val"), *VIT, *COMMON]


def clip_args(data: Path) -> list[str]:
    zs = ["--zeroshot-dir", str(data / "heldout"), "--zeroshot-classnames"]
    return ["--train-data", str(data / "train.csv"), *zs, str(data / "classnames.txt")] + [
        *CLIP,
        *COMMON,
    ]


def clip_shard_args(shards: Path) -> list[str]:
    """train_clip from 8 shards of 8 samples (attn_train.wds): with 8 a process, rank r's
    batch j is shard order[r + 2 j]; one process's batch j of 16, order[2 j] + order[2 j + 1].
    At lr 1e-4: AdamW's normalized step turns the gathered sums' float rounding into weight
    differences in proportion to lr (measured: 7.1e-6 at 3e-3, 5.7e-7 at 3e-4, 1.5e-7 at
    1e-4), and these weights are compared at 1e-6."""
    shards = str(shards / "train" / "{00000..00007}.tar")
    return ["--train-data", shards, *CLIP, *COMMON, "--lr", "1e-4"]


def coca_args(data: Path) -> list[str]:
    return [
        "--train-data",
        str(data / "train.csv"),
        *COCA_TINY,
        *CLIP[len(CLIP_TINY) + 1 :],
        *COMMON,
    ]


def translation_args(corpus: Path) -> list[str]:
    return ["train", "--train", str(corpus / "train.tsv"), *NLP, *COMMON]


def without(args: list[str], flag: str) -> list[str]:
    """``args`` without ``flag`` and its value."""
    i = args.index(flag)
    return args[:i] + args[i + 2 :]


# -- the torchrun worker -------------------------------------------------------------------


def worker(out: Path, data: Path, corpus: Path, shards: Path) -> None:
    """Every run of the tests, in one torchrun launch; rank 0 writes ``out/errors.json``."""
    import attn_train.loop
    import finetune_vit as fv
    import torch.distributed as dist
    import train_clip as tc
    import train_translation as tt
    from attn_train import NonFiniteLossError

    # one process group for every run: a run leaves it at its end, and creating gloo groups
    # again and again in one process is flaky (a rank may dial the previous group's address)
    dist.init_process_group("gloo")
    attn_train.loop.cleanup_distributed = lambda: None
    barrier = dist.barrier

    train_mlp(out / "mlp_ddp", batch_size=4, accum=2, max_steps=4)  # 2 x 4 x 2 = 16 a step
    vit = vit_args(data)
    # drop path draws from each rank's RNG; augmentation is seeded by item, so it may stay
    fv.main([*vit, "--drop-path", "0", "--out", str(out / "vit_ddp_no_drop_path")])
    fv.main([*vit, "--out", str(out / "vit_ddp")])
    fv.main([*vit, "--fsdp", "--out", str(out / "vit_fsdp")])
    bf16 = [*vit, "--precision", "bf16", "--save-every", "100"]  # read: losses, last weights
    fv.main([*bf16, "--out", str(out / "vit_ddp_bf16")])
    fv.main([*bf16, "--fsdp", "--out", str(out / "vit_fsdp_bf16")])
    stopped = [*vit, "--fsdp", "--out", str(out / "vit_resumed")]
    try:  # a NaN at update 3 stops every rank; last/ holds update 2
        fv.main([*stopped, "--debug-nan-at-step", "3"])
    except NonFiniteLossError:
        pass
    fv.main(stopped)  # the same command resumes from last/

    barrier()
    bad = {"truncated": out / "bad_truncated", "hostile": out / "bad_hostile"}
    bad["ddp_checkpoint"] = out / "vit_ddp"
    if dist.get_rank() == 0:
        for folder in (bad["truncated"], bad["hostile"]):
            shutil.copytree(out / "vit_resumed" / "last", folder / "last")
        shard = bad["truncated"] / "last" / "dcp" / "__1_0.distcp"
        shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
        (bad["hostile"] / "last" / "dcp" / ".metadata").write_bytes(HOSTILE)
    barrier()
    errors = {}
    for name, folder in bad.items():
        try:
            fv.main([*vit, "--fsdp", "--out", str(folder)])
            errors[name] = None
        except ValueError as e:
            errors[name] = str(e)

    clip = clip_args(data)
    tc.main([*clip, "--out", str(out / "clip_ddp")])
    tc.main([*clip, "--fsdp", "--out", str(out / "clip_fsdp")])
    tc.main([*clip_shard_args(shards), "--out", str(out / "clip_shards_ddp")])
    tc.main([*coca_args(data), "--out", str(out / "coca_ddp")])
    tt.main([*translation_args(corpus), "--out", str(out / "translation_ddp")])
    barrier()
    if dist.get_rank() == 0:
        (out / "errors.json").write_text(json.dumps(errors))
    dist.destroy_process_group()


# a pickle that would run `touch PWNED` when unpickled with plain pickle
HOSTILE = b"cposix\nsystem\n(S'touch PWNED'\ntR."


# -- the launch and the one-process references -----------------------------------------------


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return shapes_data(tmp_path_factory)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    from attn_train import synthetic

    out = tmp_path_factory.mktemp("numbers")
    synthetic.write_translation_corpus("numbers", out, n_train=160, n_dev=8, seed=0)
    return out


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    """64 generated training samples as 8 webdataset shards of 8 (32 px)."""
    from attn_train import shapes

    root = tmp_path_factory.mktemp("shards")
    shapes.write_dataset(root, n_train=64, n_val=0, n_heldout=0, image_size=32, shard_size=8)
    return root


@pytest.fixture(scope="module")
def runs(data, corpus, shards, tmp_path_factory) -> Path:
    """The worker's runs. (The longest set-up of tests/train, ~29 s on 2 busy cores: two
    interpreters that import torch and the packages, then 14 short trainings and 3 refused
    resumes, 5 of them FSDP runs whose sharded checkpoints cost ~0.5 s each save; it replaces
    5 launches.)"""
    out = tmp_path_factory.mktemp("runs")
    torchrun([__file__, out, data, corpus, shards], cwd=out)
    return out


@pytest.fixture(scope="module")
def single(data, shards, tmp_path_factory) -> Path:
    """The same trainings in this one process, on the same global batch."""
    import finetune_vit as fv
    import train_clip as tc

    out = tmp_path_factory.mktemp("single")
    train_mlp(out / "mlp", batch_size=16, accum=1, max_steps=4)
    vit = without(vit_args(data), "--batch-size")
    fv.main([*vit, "--batch-size", "16", "--drop-path", "0", "--out", str(out / "vit")])
    clip = without(clip_args(data), "--batch-size")
    tc.main([*clip, "--batch-size", "16", "--out", str(out / "clip")])
    clip = without(clip_shard_args(shards), "--batch-size")
    tc.main([*clip, "--batch-size", "16", "--out", str(out / "clip_shards")])
    return out


def evals(out: Path) -> list[dict]:
    """The metrics of every evaluation (numbers only)."""
    skip = ("time", "event")
    return [
        {k: v for k, v in r.items() if k not in skip}
        for r in records(out)
        if r.get("event") == "eval"
    ]


def assert_weights_close(a: Path, b: Path, atol: float) -> None:
    wa, wb = weights(a.parent, a.name), weights(b.parent, b.name)
    assert wa.keys() == wb.keys()
    for k in wa:
        assert wa[k].dtype == wb[k].dtype == torch.float32, k
        torch.testing.assert_close(wa[k], wb[k], atol=atol, rtol=0, msg=k)


# -- DDP ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "ddp, one, atol",
    [
        ("mlp_ddp", "mlp", 1e-5),  # 2 ranks x 4 x accumulation 2 vs 16
        # AdamW turns float-rounding-sized gradient differences on near-zero gradients into
        # visible ones (its update is ~lr * sign(g) early on): compare to a small part of lr
        ("vit_ddp_no_drop_path", "vit", 3e-4),
        ("clip_ddp", "clip", 3e-4),  # 2 ranks x 8 x accumulation 2 vs 16 x 2, features gathered
    ],
)
def test_two_processes_equal_one_process(runs, single, ddp, one, atol):
    start = records(runs / ddp)[0]
    assert (
        start["world_size"] == 2
        and start["global_batch"] == records(single / one)[0]["global_batch"]
    )
    a, b = step_losses(single / one), step_losses(runs / ddp)
    assert a.keys() == b.keys() and len(a) >= 3
    for k in a:  # the loss gathered over both ranks is the one-process loss
        assert b[k] == pytest.approx(a[k], rel=1e-5), k
    last = "last/model.safetensors"
    assert_weights_close(single / one / last, runs / ddp / last, atol)
    state = torch.load(runs / ddp / "last" / "trainer_state.pt", weights_only=True)
    assert len(state["rng"]) == 2  # both ranks' random state, for an exact resume


def test_two_processes_from_shards_equal_one_process(runs, single):
    """2 ranks x 8 x accumulation 2 from shards vs one process of 16 x 2: the same global
    batches (3 updates: 2 epochs, the shards reshuffled for the second), gloo."""
    ddp, one = runs / "clip_shards_ddp", single / "clip_shards"
    start = records(ddp)[0]
    assert start["world_size"] == 2 and start["global_batch"] == records(one)[0]["global_batch"]
    a, b = step_losses(one), step_losses(ddp)
    assert sorted(a) == sorted(b) == [1, 2, 3]
    for k in a:
        assert b[k] == pytest.approx(a[k], rel=1e-6, abs=1e-6), k
    last = "last/model.safetensors"
    assert_weights_close(one / last, ddp / last, 1e-6)  # (1.5e-7 measured: clip_shard_args)
    layout = json.loads((ddp / "last" / "shards.json").read_text())
    assert layout["world_size"] == 2 and layout["shards"] == 8


def test_coca_trains_under_ddp(runs):
    """2 ranks x 8 x accumulation 2: the contrastive term over the gathered batch, the
    caption term each rank's mean (open_clip's), so the loss is close to, not equal to, one
    process's on 16; it falls, both ranks' RNG states are saved, final/ is a CoCa."""
    import attn_clip

    out = runs / "coca_ddp"
    start = records(out)[0]
    assert start["world_size"] == 2 and start["loss"] == "coca" and start["global_batch"] == 32
    losses = step_losses(out)
    assert sorted(losses) == [1, 2, 3] and losses[3] < losses[1], losses
    state = torch.load(out / "last" / "trainer_state.pt", weights_only=True)
    assert len(state["rng"]) == 2
    assert isinstance(attn_clip.create_model(str(out / "final")), attn_clip.CoCa)


def test_train_translation_runs_under_torchrun(runs):
    out = runs / "translation_ddp"
    assert records(out)[0]["world_size"] == 2 and max(step_losses(out)) == 4
    state = torch.load(out / "last" / "trainer_state.pt", weights_only=True)
    assert len(state["rng"]) == 2 and state["progress"]["step"] == 4


# -- FSDP ---------------------------------------------------------------------------------


def test_fsdp_equals_ddp(runs):
    for name in ("vit", "clip"):
        ddp, fsdp = runs / f"{name}_ddp", runs / f"{name}_fsdp"
        assert records(fsdp)[0]["world_size"] == 2
        a, b = step_losses(ddp), step_losses(fsdp)
        assert a.keys() == b.keys() and len(a) >= 3
        for k in a:
            assert b[k] == pytest.approx(a[k], rel=1e-6, abs=1e-6), (name, k)
        assert [len(e) for e in evals(ddp)] == [len(e) for e in evals(fsdp)] != []
        for ea, eb in zip(evals(ddp), evals(fsdp), strict=True):  # rank 0, gathered weights
            assert eb == pytest.approx(ea, rel=1e-5, abs=1e-6)
    assert_weights_close(
        runs / "vit_ddp/last/model.safetensors", runs / "vit_fsdp/last/model.safetensors", 1e-5
    )
    final = "final/open_clip_model.safetensors"  # written by the recipe after fit()
    assert_weights_close(runs / "clip_ddp" / final, runs / "clip_fsdp" / final, 1e-5)


def test_fsdp_bf16_mixed_precision_trains_like_ddp_bf16(runs):
    ddp, fsdp = runs / "vit_ddp_bf16", runs / "vit_fsdp_bf16"
    assert records(fsdp)[0]["precision"] == "bf16"
    a, b = step_losses(ddp), step_losses(fsdp)
    assert a.keys() == b.keys()
    for k in a:  # bf16 weights in the forward vs fp32 weights under autocast
        assert b[k] == pytest.approx(a[k], rel=2e-2)
    # the sharded master weights stay fp32, and so do the saved ones; AdamW turns bf16
    # rounding into whole lr-sized steps on a few near-zero gradients: compare the mean
    wa, wb = weights(ddp / "last"), weights(fsdp / "last")
    assert wa.keys() == wb.keys() and {v.dtype for v in [*wa.values(), *wb.values()]} == {
        torch.float32
    }
    diff = torch.cat([(wa[k] - wb[k]).abs().flatten() for k in wa])
    assert diff.mean() < 5e-4, diff.mean()


def test_stopped_run_resumes_to_the_uninterrupted_weights(runs):
    out = runs / "vit_resumed"
    assert sum(r.get("event") == "nonfinite_loss" for r in records(out)) == 1
    resumed = [r for r in records(out) if r.get("event") == "resume"]
    assert len(resumed) == 1 and resumed[0]["step"] == 2
    assert step_losses(out) == step_losses(runs / "vit_fsdp")  # 3, 4 logged by the resumed run
    straight, again = weights(runs / "vit_fsdp/last"), weights(out / "last")
    assert all(torch.equal(straight[k], again[k]) for k in straight)


def test_the_checkpoint_is_sharded_per_rank(runs):
    last = runs / "vit_fsdp" / "last"
    names = {p.name for p in (last / "dcp").iterdir()}
    assert names == {".metadata", "__0_0.distcp", "__1_0.distcp"}
    state = torch.load(last / "trainer_state.pt", weights_only=True)
    assert state["sharded"] is True and state["optimizer"] is None  # in dcp/, per rank
    assert len(state["rng"]) == 2
    import attn_vision

    model = attn_vision.create_model(last)  # and still a model folder with whole weights
    torch.testing.assert_close(model.state_dict(), weights(last))


def test_a_bad_checkpoint_is_one_clear_error(runs):
    errors = json.loads((runs / "errors.json").read_text())
    assert errors["truncated"].startswith("cannot resume: ")
    assert "bad_truncated/last/dcp is truncated or corrupt" in errors["truncated"]
    assert "--no-resume" in errors["truncated"] and "\n" not in errors["truncated"]
    assert "refusing to load posix.system" in errors["hostile"]
    assert not (runs / "PWNED").exists()  # the worker ran in `runs`
    assert "was written without --fsdp" in errors["ddp_checkpoint"]


def test_fsdp_without_torchrun_is_one_error_line(data, tmp_path, capsys):
    import finetune_vit as fv
    from _support.scripts import cli

    args = ["--train-dir", str(data / "train"), *VIT, *COMMON, "--fsdp"]
    for extra, message in [
        ([], "--fsdp shards the model over the processes of torchrun"),
        (["--ema-decay", "0.9"], "--ema-decay is not supported with --fsdp"),
        (["--precision", "fp16"], "--precision fp16 is not supported with --fsdp"),
    ]:
        argv = [*args, *extra, "--out", str(tmp_path / "o")]
        code, lines = cli(lambda argv=argv: fv.main(argv), capsys)
        assert code == 2 and len(lines) == 1 and message in lines[0], lines
    assert not (tmp_path / "o").exists()


if __name__ == "__main__":
    worker(*map(Path, sys.argv[1:5]))
