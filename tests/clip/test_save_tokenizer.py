"""A model whose Hugging Face tokenizer comes from a local folder carries that tokenizer's
files when saved (``save_pretrained``, the training scripts' checkpoints): the saved folder
tokenizes the same after the tokenizer's folder is gone."""

from __future__ import annotations

import shutil

import attn_clip
import torch
from _support.multilingual import save_tiny_multilingual


def test_saved_folder_keeps_its_tokenizer(tmp_path):
    source = save_tiny_multilingual(tmp_path / "source")  # weights + tokenizer files
    model, _, tokenizer = attn_clip.create_model_and_transforms(str(source))
    texts = ["a red circle", "ein roter Kreis", "一只猫的照片", ""]
    ids = tokenizer(texts)
    saved = attn_clip.save_pretrained(model, tmp_path / "saved")
    assert (saved / "tokenizer_config.json").is_file() and not (saved / "config.json").exists()
    shutil.rmtree(source)
    again, _, tokenizer = attn_clip.create_model_and_transforms(str(saved))
    assert torch.equal(tokenizer(texts), ids)
    assert torch.equal(again.encode_text(ids), model.encode_text(ids))
