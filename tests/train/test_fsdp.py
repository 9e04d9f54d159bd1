"""``--fsdp`` (attn_train.fsdp: FSDP2) with 2 CPU processes (gloo), on scripts/finetune_vit.py
and scripts/train_clip.py with tiny models: losses and weights equal the DDP run, a run
stopped mid-way resumes to the uninterrupted run's weights, the checkpoint is sharded
(torch.distributed.checkpoint, one file per rank) next to whole weights, and a truncated or
hostile checkpoint is one clear error.

One ``torchrun`` launch runs every training (this file is its script: see ``worker``), so
the imports and the process group are paid for once.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parents[2]
VIT = [
    *("--model", "vit_tiny_patch16_224", "--img-size", "32", "--patch-size", "8"),
    *("--set", "depth=2", "embed_dim=32", "num_heads=2"),
    *("--batch-size", "8", "--max-steps", "4", "--save-every", "1", "--grad-clip", "1"),
]
CLIP = [
    *("--set", "embed_dim=32", "vision.image_size=32", "vision.width=32", "vision.layers=1"),
    *("text.width=16", "text.layers=1", "text.context_length=16"),
    *("--batch-size", "8", "--accum", "2", "--max-steps", "3", "--grad-clip", "1"),
]
COMMON = ["--threads", "1", "--quiet", "--device", "cpu", "--log-every", "1", "--warmup", "1"]
COMMON += ["--lr", "3e-3"]


def script(name: str):
    if str(ROOT / "scripts") not in sys.path:  # the scripts import scripts/_interrupt.py
        sys.path.insert(0, str(ROOT / "scripts"))
    spec = importlib.util.spec_from_file_location(
        f"fsdp_test_{name}", ROOT / "scripts" / f"{name}.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def vit_args(data: Path) -> list[str]:
    return ["--train-dir", str(data / "train"), "--val-dir", str(data / "val"), *VIT, *COMMON]


def clip_args(data: Path) -> list[str]:
    zs = ["--zeroshot-dir", str(data / "heldout"), "--zeroshot-classnames"]
    return ["--train-data", str(data / "train.csv"), *zs, str(data / "classnames.txt")] + [
        *CLIP,
        *COMMON,
    ]


# -- the torchrun worker -------------------------------------------------------------------


def worker(out: Path, data: Path) -> None:
    """Every run of the tests, in one torchrun launch; rank 0 writes ``out/errors.json``."""
    import attn_train.loop
    import torch.distributed as dist
    from attn_train import NonFiniteLossError

    # one process group for every run: a run leaves it at its end, and creating gloo groups
    # again and again in one process is flaky (a rank may dial the previous group's address)
    dist.init_process_group("gloo")
    attn_train.loop.cleanup_distributed = lambda: None
    barrier = dist.barrier

    fv, tc = script("finetune_vit"), script("train_clip")
    vit = vit_args(data)
    fv.main([*vit, "--out", str(out / "vit_ddp")])
    fv.main([*vit, "--fsdp", "--out", str(out / "vit_fsdp")])
    fv.main([*vit, "--precision", "bf16", "--out", str(out / "vit_ddp_bf16")])
    fv.main([*vit, "--precision", "bf16", "--fsdp", "--out", str(out / "vit_fsdp_bf16")])
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
    barrier()
    if dist.get_rank() == 0:
        (out / "errors.json").write_text(json.dumps(errors))
    dist.destroy_process_group()


# a pickle that would run `touch PWNED` when unpickled with plain pickle
HOSTILE = b"cposix\nsystem\n(S'touch PWNED'\ntR."


# -- the tests -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    from attn_train import shapes

    data = tmp_path_factory.mktemp("shapes")
    shapes.write_dataset(data, n_train=48, n_val=24, n_heldout=12, image_size=32)
    out = tmp_path_factory.mktemp("runs")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
    cmd += ["--master-port", str(port), __file__, str(out), str(data)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=out)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out


def records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]


def losses(out: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in records(out) if "loss" in r and "event" not in r}


def evals(out: Path) -> list[dict]:
    """The metrics of every evaluation (numbers only)."""
    skip = ("time", "event")
    return [
        {k: v for k, v in r.items() if k not in skip}
        for r in records(out)
        if r.get("event") == "eval"
    ]


def assert_weights_close(a: Path, b: Path, atol: float) -> None:
    wa, wb = load_file(a), load_file(b)
    assert wa.keys() == wb.keys()
    for k in wa:
        assert wa[k].dtype == wb[k].dtype == torch.float32, k
        torch.testing.assert_close(wa[k], wb[k], atol=atol, rtol=0, msg=k)


def test_fsdp_equals_ddp(runs):
    for name in ("vit", "clip"):
        ddp, fsdp = runs / f"{name}_ddp", runs / f"{name}_fsdp"
        assert records(fsdp)[0]["world_size"] == 2
        a, b = losses(ddp), losses(fsdp)
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
    a, b = losses(ddp), losses(fsdp)
    assert a.keys() == b.keys()
    for k in a:  # bf16 weights in the forward vs fp32 weights under autocast
        assert b[k] == pytest.approx(a[k], rel=2e-2)
    # the sharded master weights stay fp32, and so do the saved ones; AdamW turns bf16
    # rounding into whole lr-sized steps on a few near-zero gradients: compare the mean
    wa, wb = load_file(ddp / "last/model.safetensors"), load_file(fsdp / "last/model.safetensors")
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
    assert losses(out) == losses(runs / "vit_fsdp")  # steps 3, 4 logged by the resumed run
    straight = load_file(runs / "vit_fsdp/last/model.safetensors")
    again = load_file(out / "last/model.safetensors")
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
    torch.testing.assert_close(model.state_dict(), load_file(last / "model.safetensors"))


def test_a_bad_checkpoint_is_one_clear_error(runs):
    errors = json.loads((runs / "errors.json").read_text())
    assert errors["truncated"].startswith("cannot resume: ")
    assert "bad_truncated/last/dcp is truncated or corrupt" in errors["truncated"]
    assert "--no-resume" in errors["truncated"] and "\n" not in errors["truncated"]
    assert "refusing to load posix.system" in errors["hostile"]
    assert not (runs / "PWNED").exists()  # the worker ran in `runs`
    assert "was written without --fsdp" in errors["ddp_checkpoint"]


def test_fsdp_without_torchrun_is_one_error_line(tmp_path, capsys):
    from attn_train import cli, shapes

    shapes.write_dataset(tmp_path / "d", n_train=24, n_val=0, n_heldout=0, image_size=32)
    fv = script("finetune_vit")
    args = ["--train-dir", str(tmp_path / "d" / "train"), *VIT, *COMMON, "--fsdp"]
    for extra, message in [
        ([], "--fsdp shards the model over the processes of torchrun"),
        (["--ema-decay", "0.9"], "--ema-decay is not supported with --fsdp"),
        (["--precision", "fp16"], "--precision fp16 is not supported with --fsdp"),
    ]:
        with pytest.raises(SystemExit) as e:
            cli.run_main(lambda extra=extra: fv.main([*args, *extra, "--out", str(tmp_path / "o")]))
        err = capsys.readouterr().err
        assert e.value.code == 2 and err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "o").exists()


if __name__ == "__main__":
    worker(Path(sys.argv[1]), Path(sys.argv[2]))
