"""TextClassifier: pooling, padding invariance, gradients."""

from __future__ import annotations

import pytest
import torch
from attn_nlp import ClassifierConfig, TextClassifier


@pytest.mark.parametrize("pool", ["cls", "mean"])
def test_padding_does_not_change_the_prediction(pool):
    cfg = ClassifierConfig(
        vocab_size=50,
        num_classes=3,
        embed_dim=32,
        depth=2,
        num_heads=4,
        mlp_dim=64,
        max_positions=20,
        pool=pool,
        dropout=0.0,
    )
    model = TextClassifier(cfg).eval()
    ids = torch.randint(1, 50, (1, 6))
    padded = torch.cat((ids, torch.zeros(1, 4, dtype=torch.long)), dim=1)
    logits = model(ids)
    assert logits.shape == (1, 3)
    torch.testing.assert_close(model(padded), logits, atol=1e-5, rtol=1e-5)


def test_every_parameter_gets_a_gradient():
    model = TextClassifier(
        ClassifierConfig(
            vocab_size=50, num_classes=2, embed_dim=32, num_heads=4, mlp_dim=64, max_positions=20
        )
    )
    loss = torch.nn.functional.cross_entropy(
        model(torch.randint(1, 50, (4, 9))), torch.tensor([0, 1, 1, 0])
    )
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_bad_config():
    with pytest.raises(ValueError, match="pool"):
        TextClassifier(ClassifierConfig(pool="max"))


def test_save_load_round_trip_and_unknown_config_keys(tmp_path):
    import json

    from attn_nlp import create_model, save_pretrained

    cfg = ClassifierConfig(
        vocab_size=50, num_classes=3, embed_dim=32, num_heads=4, mlp_dim=64, labels=["a", "b", "c"]
    )
    model = TextClassifier(cfg).eval()
    save_pretrained(model, tmp_path)
    loaded = create_model(tmp_path)
    assert loaded.config == cfg  # "model_type" in config.json round-trips
    ids = torch.randint(1, 50, (2, 9))
    torch.testing.assert_close(loaded(ids), model(ids))
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "pooling": "max"}))
    with pytest.raises(ValueError, match=r"unknown ClassifierConfig key\(s\) \['pooling'\]"):
        create_model(tmp_path)
    with pytest.raises(ValueError, match="model_type 'marian'"):
        ClassifierConfig.from_dict({**cfg.to_dict(), "model_type": "marian"})
