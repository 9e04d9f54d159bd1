"""scripts/train_clip.py fine-tunes a CLIP whose text tower is a Hugging Face one (a tiny
random-init xlm-roberta-base-ViT-B-32 folder with its sentencepiece tokenizer,
tests/_support/multilingual.py) on the generated shapes: with the text tower training, the
encoder and both towers change, a run killed mid-checkpoint resumes to the same weights, and
final/ loads with its tokenizer; with ``--lock-text`` the encoder stays as it was (open_clip's
``HFTextEncoder.lock``: its projection still trains)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch
from _support.multilingual import save_tiny_multilingual
from _support.scripts import assert_same_weights, events, killed_at, step_losses
from _support.train import RUN, shapes_data


@pytest.fixture(scope="module")
def tc():
    import train_clip

    return train_clip


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return shapes_data(tmp_path_factory, image_size=64)


@pytest.fixture(scope="module")
def folder(data, tmp_path_factory) -> Path:
    """The tiny XLM-R CLIP, its tokenizer also trained on the shapes' captions."""
    with open(data / "train.csv", newline="", encoding="utf-8") as f:
        captions = [row["title"] for row in csv.DictReader(f)]
    return save_tiny_multilingual(
        tmp_path_factory.mktemp("hf_text") / "xlmr", extra_corpus=captions
    )


def argv(data: Path, folder: Path, out: Path, *extra: str) -> list[str]:
    """4 updates of 8 pairs from the folder, a checkpoint every 2, zero-shot after the epoch."""
    return [
        "--model", str(folder), "--train-data", str(data / "train.csv"),
        "--zeroshot-dir", str(data / "heldout"),
        "--zeroshot-classnames", str(data / "classnames.txt"),
        *RUN, "--batch-size", "8", "--max-steps", "4", "--save-every", "2",
        "--out", str(out), *extra,
    ]  # fmt: skip


def _changed(before: dict, after: dict, prefix: str) -> tuple[bool, bool]:
    """``(any, all)`` of the ``prefix`` tensors changed between two state dicts."""
    diffs = [not torch.equal(v, after[k]) for k, v in before.items() if k.startswith(prefix)]
    assert diffs, prefix
    return any(diffs), all(diffs)


def test_the_text_tower_trains_and_a_killed_run_resumes_exactly(tc, data, folder, tmp_path):
    import attn_clip

    straight = tmp_path / "straight"
    result = tc.main(argv(data, folder, straight))
    assert result["step"] == 4 and all(
        torch.isfinite(torch.tensor([*step_losses(straight).values()]))
    )
    assert 0 <= events(straight, "eval")[-1]["zeroshot/heldout/top1"] <= 1
    start = attn_clip.create_model(str(folder)).state_dict()
    model, _, tokenizer = attn_clip.create_model_and_transforms(str(straight / "final"))
    assert isinstance(model.text, attn_clip.HFTextTower)
    end = model.state_dict()
    assert _changed(start, end, "text.encoder.blocks.") == (True, True)
    assert _changed(start, end, "text.proj.")[1] and _changed(start, end, "visual.")[0]
    _, _, original = attn_clip.create_model_and_transforms(str(folder))
    texts = ["a red circle", "ein roter Kreis", "一只猫的照片"]
    assert tokenizer.tokenizer_class == "XLMRobertaTokenizer"
    assert torch.equal(tokenizer(texts), original(texts))

    killed = tmp_path / "killed"  # kill -9 while update 4's checkpoint is written
    killed_at(tc.main, argv(data, folder, killed), step=4)
    assert max(step_losses(killed)) == 4 and not events(killed, "done")
    assert tc.main(argv(data, folder, killed))["step"] == 4  # the same command resumes
    assert events(killed, "resume")[0]["step"] == 2
    assert_same_weights(straight / "last", killed / "last")
    assert {k: v for k, v in step_losses(killed).items() if k > 2} == {
        k: v for k, v in step_losses(straight).items() if k > 2
    }


@pytest.mark.parametrize("freeze_norm", [True, False])
def test_lock_text_freezes_the_encoder(tc, data, folder, tmp_path, freeze_norm):
    """--lock-text: the encoder's weights are the folder's after training (its projection
    and the image tower train), as open_clip's lock of an HF text tower leaves them; without
    --lock-text-freeze-layer-norm (open_clip's default) the RoBERTa LayerNorms train."""
    import attn_clip

    out = tmp_path / "locked"
    flags = ["--lock-text", *(["--lock-text-freeze-layer-norm"] if freeze_norm else [])]
    tc.main(argv(data, folder, out, *flags))
    start = attn_clip.create_model(str(folder)).state_dict()
    end = attn_clip.create_model(str(out / "final")).state_dict()
    norms = {k for k in start if k.startswith("text.encoder.") and "norm" in k}
    assert norms
    weights = {k: v for k, v in start.items() if k.startswith("text.encoder.") and k not in norms}
    assert _changed(weights, end, "text.encoder.") == (False, False)
    assert _changed({k: start[k] for k in norms}, end, "text.encoder.")[0] == (not freeze_norm)
    assert _changed(start, end, "text.proj.")[1] and _changed(start, end, "visual.")[0]


def test_lock_text_flags_need_lock_text(tc, data, folder, tmp_path):
    with pytest.raises(ValueError, match="need --lock-text"):
        tc.main(argv(data, folder, tmp_path / "x", "--lock-text-unlocked-layers", "1"))
    assert not (tmp_path / "x").exists()
