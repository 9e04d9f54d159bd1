"""``CLIP.text.lock`` (train_clip.py's ``--lock-text``) freezes exactly what open_clip's
``lock_text_tower`` freezes, for every number of unlocked groups: a random-init open_clip
CLIP saved in its own format, loaded by us, both locked, the flags compared per open_clip
parameter name (ours exported like weights). The Hugging Face towers' lock is in
tests/clip/test_parity_hf_text.py."""

from __future__ import annotations

import json

import open_clip
import pytest
import torch
from attn_clip import create_model, to_open_clip
from safetensors.torch import save_file

CFG = {
    "embed_dim": 32,
    "vision_cfg": {"image_size": 32, "layers": 1, "width": 32, "patch_size": 16, "head_width": 16},
    "text_cfg": {"context_length": 12, "vocab_size": 100, "width": 32, "heads": 2, "layers": 3},
}


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    torch.manual_seed(0)
    ref = open_clip.model.CLIP(**CFG)
    folder = tmp_path_factory.mktemp("lock")
    save_file(ref.state_dict(), str(folder / "open_clip_model.safetensors"))
    (folder / "open_clip_config.json").write_text(json.dumps({"model_cfg": CFG}))
    return ref, create_model(str(folder))


@pytest.mark.parametrize("unlocked", [0, 1, 2, 3, 4, 5, 9])
def test_lock_freezes_what_open_clip_freezes(pair, unlocked):
    ref, ours = pair
    for m in (ref, ours):
        m.requires_grad_(True)
    ref.lock_text_tower(unlocked)
    ours.text.lock(unlocked)
    want = {k: p.requires_grad for k, p in ref.named_parameters()}
    flags = {k: torch.full(p.shape, float(p.requires_grad)) for k, p in ours.named_parameters()}
    got = {k: bool(t.all()) for k, t in to_open_clip(flags, ours.config.vision).items()}
    assert {k: got[k] for k in want} == want
    frozen = sum(not v for v in want.values())  # 5 groups: embeddings, 2 blocks, last, proj
    assert (frozen > 0) == (unlocked < 5) and all(want[k] for k in want if k.startswith("visual."))


def test_bad_arguments_are_clear_errors(pair):
    _, ours = pair
    with pytest.raises(ValueError, match="unlocked_layers must be >= 0"):
        ours.text.lock(-1)
    with pytest.raises(ValueError, match="freeze_layer_norm=False is not supported"):
        ours.text.lock(0, freeze_layer_norm=False)
