"""attn_clip.save_weights / save_config: the pieces of save_pretrained, on their own."""

from __future__ import annotations

import json

import torch
from attn_clip import CLIP, CLIPConfig, create_model, save_config, save_weights
from attn_clip.convert import convert_open_clip
from safetensors.torch import load_file


def test_fp16_weights_file_and_config_folder(h, tmp_path):
    model = h.perturb_(CLIP(CLIPConfig.from_open_clip(h.oc_cfg())))
    save_weights(model, tmp_path / "half.safetensors", dtype=torch.float16)
    half = load_file(tmp_path / "half.safetensors")
    assert {v.dtype for v in half.values()} == {torch.float16}
    for k, v in convert_open_clip(half).items():
        assert torch.equal(v, model.state_dict()[k].half()), k
    folder = tmp_path / "ckpt"
    save_weights(model, folder / "open_clip_model.safetensors")
    save_config(model, folder)
    assert json.loads((folder / "open_clip_config.json").read_text())["model_cfg"]["embed_dim"]
    again = create_model(str(folder))
    for k, v in again.state_dict().items():
        assert torch.equal(v, model.state_dict()[k]), k
