"""DecoderOnlyLM: causality, RoPE / learned positions, KV-cache decoding."""

from __future__ import annotations

import pytest
import torch
from attn_nlp import DecoderOnlyLM, LMConfig


def lm(pos_embed: str = "rope", **kw) -> DecoderOnlyLM:
    cfg = LMConfig(
        vocab_size=30,
        embed_dim=32,
        depth=2,
        num_heads=4,
        max_positions=24,
        pos_embed=pos_embed,
        dropout=0.0,
        **kw,
    )
    return DecoderOnlyLM(cfg).eval()


@pytest.mark.parametrize("pos_embed", ["rope", "learned"])
def test_causal_and_cache_matches_full(pos_embed):
    model = lm(pos_embed)
    ids = torch.randint(0, 30, (2, 10))
    full = model(ids)
    assert full.shape == (2, 10, 30)
    changed = ids.clone()
    changed[:, 6:] = 0
    torch.testing.assert_close(model(changed)[:, :6], full[:, :6])
    caches = model.new_caches()
    steps = [model(ids[:, :4], caches=caches)]
    steps += [model(ids[:, t : t + 1], start_pos=t, caches=caches) for t in range(4, 10)]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-5)


def test_positions_matter():
    model = lm("rope")
    ids = torch.tensor([[1, 2, 3, 1, 2, 3]])
    logits = model(ids)
    assert not torch.allclose(logits[0, 0], logits[0, 3])  # same token, different position


@pytest.mark.parametrize(
    "settings",
    [{"do_sample": False}, {"num_beams": 3, "do_sample": False}, {"top_k": 5, "temperature": 0.7}],
)
def test_generate_cached_equals_uncached(settings):
    model = lm("rope", eos_id=2)
    prompt = torch.randint(3, 30, (2, 4))
    torch.manual_seed(0)
    a = model.generate(prompt, max_new_tokens=10, **settings)
    torch.manual_seed(0)
    b = model.generate(prompt, max_new_tokens=10, use_cache=False, **settings)
    assert torch.equal(a, b) and torch.equal(a[:, :4], prompt)


def test_context_limit_is_a_clear_error():
    model = lm()
    with pytest.raises(ValueError, match="max_positions=24"):
        model(torch.zeros(1, 25, dtype=torch.long))
    with pytest.raises(ValueError, match="decoder positions"):
        model.generate(torch.zeros(1, 4, dtype=torch.long), max_new_tokens=30)


def test_save_load_round_trip_and_unknown_config_keys(tmp_path):
    import json

    from attn_nlp import create_model, save_pretrained

    model = lm("learned", eos_id=2)
    save_pretrained(model, tmp_path)
    loaded = create_model(tmp_path)
    assert loaded.config == model.config  # "model_type" in config.json round-trips
    ids = torch.randint(0, 30, (2, 7))
    torch.testing.assert_close(loaded(ids), model(ids))
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "n_layer": 6}))
    with pytest.raises(ValueError, match=r"unknown LMConfig key\(s\) \['n_layer'\]"):
        create_model(tmp_path)
    with pytest.raises(ValueError, match=r"\['mlp_dim'\]"):
        LMConfig.from_dict({**model.config.to_dict(), "mlp_dim": 64})
