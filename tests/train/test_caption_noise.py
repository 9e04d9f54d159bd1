"""Word dropout on a CoCa's caption decoder input (``attn_train.contrastive``,
``CoCa.forward(..., decoder_texts)``, ``train_clip.py --caption-input-noise``): only words are
replaced, and only by words of the batch; the decoder reads the noised captions while the
labels and the contrastive embeddings stay clean; without noise the step is open_clip's loss
bit for bit and draws no random number; an accumulated update's two passes see the same
noise; a noised run resumes to the same weights; the flag is refused where it does not apply.
And ``--lock-image-trunk`` (the other demo-shapes-coca recipe flag): the trunk stays, the
attentional pooler trains."""

from __future__ import annotations

import pytest
import torch
from _support.scripts import assert_bad_input, assert_same_weights, events, killed_at, step_losses
from _support.train import CLIP_TINY, COCA_TINY, RUN, shapes_data
from attn_train import StepContext, contrastive_step, read_progress
from attn_train.contrastive import noise_caption_inputs
from torch import nn

CAPTIONS = [
    "a small red circle at the top left",
    "a photo of a green square",
    "a large blue star at the bottom",
    "a yellow cross",
    "a medium purple triangle at the center",
    "a photo of a orange star",
]


@pytest.fixture(scope="module")
def coca():
    """demo-shapes-coca shrunk as the recipe tests shrink it (tests/_support/train.py)."""
    import attn_clip
    from attn_train.cli import apply_overrides

    sets = COCA_TINY[COCA_TINY.index("--set") + 1 :]
    config = apply_overrides(attn_clip.get_model_config("demo-shapes-coca").to_dict(), sets)
    torch.manual_seed(0)
    return attn_clip.create_model(attn_clip.CLIPConfig.from_dict(config)).train()


@pytest.fixture(scope="module")
def texts(coca) -> torch.Tensor:
    return coca.tokenizer()(CAPTIONS)  # (6, 16)


def special_ids(model) -> tuple[int, int, int]:
    tok = model.tokenizer()
    return tok.sot_token_id, tok.eot_token_id, model.pad_id


def test_only_words_are_replaced_and_only_by_words_of_the_batch(coca, texts):
    special = torch.tensor(special_ids(coca))
    is_word = ~torch.isin(texts, special)
    words = set(texts[is_word].tolist())
    assert noise_caption_inputs(texts, 0.0, special.tolist()) is texts

    every = noise_caption_inputs(texts, 1.0, special.tolist(), torch.Generator().manual_seed(1))
    assert torch.equal(every[~is_word], texts[~is_word])  # start, end of text, pads kept
    assert set(every[is_word].tolist()) <= words and not torch.equal(every, texts)
    again = noise_caption_inputs(texts, 1.0, special.tolist(), torch.Generator().manual_seed(1))
    assert torch.equal(every, again)  # a function of the generator's state

    # the rate: 3000 captions, each word replaced with probability 0.3 by one of W words
    # (itself with probability 1 / W)
    many = texts.repeat(500, 1)
    noised = noise_caption_inputs(many, 0.3, special.tolist(), torch.Generator().manual_seed(2))
    changed = (noised != many)[is_word.repeat(500, 1)].float().mean().item()
    assert changed == pytest.approx(0.3 * (1 - 1 / len(words)), abs=0.02)


@pytest.mark.parametrize(
    ("texts", "p", "match"),
    [
        (torch.ones(2, 4, dtype=torch.long), 1.5, "a probability in"),
        (torch.ones(2, 4, dtype=torch.long), -0.1, "a probability in"),
        (torch.ones(4, dtype=torch.long), 0.5, "must be \\(B, L\\) token ids"),
    ],
)
def test_bad_noise_arguments_are_refused(texts, p, match):
    with pytest.raises(ValueError, match=match):
        noise_caption_inputs(texts, p, [0])


def test_decoder_texts_feed_only_the_decoder(coca, texts):
    torch.manual_seed(3)
    images = torch.randn(len(texts), 3, 32, 32)
    noised = noise_caption_inputs(texts, 1.0, special_ids(coca))
    with torch.no_grad():
        clean, same = coca(images, texts), coca(images, texts, texts)
        mixed, only_noised = coca(images, texts, noised), coca(images, noised)
    for a, b in zip(clean, same, strict=True):  # the same captions: the same outputs
        assert (a is None and b is None) or torch.equal(a, b)
    assert torch.equal(mixed.logits, only_noised.logits)  # the decoder read the noised ones
    assert not torch.allclose(mixed.logits, clean.logits)
    assert torch.equal(mixed.labels, texts[:, 1:])  # ... and is scored on the clean ones
    for field in ("text_embeds", "image_embeds", "logits_per_image"):
        assert torch.equal(getattr(mixed, field), getattr(clean, field)), field
    with pytest.raises(ValueError, match="the texts' shape"):
        coca(images, texts, noised[:, :-1])
    with pytest.raises(ValueError, match="must come with images and texts"):
        coca(None, texts, noised)


class Recorder(nn.Module):
    """The model, with every call's arguments and output kept."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model, self.calls = model, []

    def forward(self, *args):
        out = self.model(*args)
        self.calls.append((args, out, torch.is_grad_enabled()))
        return out


def step(model, micro, **noise) -> tuple[float, dict[str, torch.Tensor]]:
    """One update of ``contrastive_step(CoCaLoss(2, 1), **noise)`` -> (loss, gradients)."""
    import attn_clip

    model.zero_grad(set_to_none=True)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    ctx = StepContext(model, model, torch.device("cpu"), "fp32", scaler, check=lambda loss: None)
    loss = contrastive_step(attn_clip.CoCaLoss(2.0, 1.0), **noise)(micro, ctx)
    return loss, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_without_noise_the_step_is_open_clips_loss_and_draws_nothing(coca, texts):
    import attn_clip

    torch.manual_seed(4)
    images = torch.randn(len(texts), 3, 32, 32)
    torch.manual_seed(5)
    loss, got = step(coca, [(images, texts)])
    rng_after_step = torch.get_rng_state()

    torch.manual_seed(5)
    coca.zero_grad(set_to_none=True)
    out = coca(images, texts)
    fn = attn_clip.CoCaLoss(2.0, 1.0)
    reference = sum(fn(out.image_embeds, out.text_embeds, out.logits, out.labels, out.logit_scale))
    reference.backward()
    assert torch.equal(torch.get_rng_state(), rng_after_step)  # no extra draw
    assert loss == reference.item()
    want = {n: p.grad for n, p in coca.named_parameters() if p.grad is not None}
    assert got.keys() == want.keys()
    for k in want:
        assert torch.equal(got[k], want[k]), k


def test_noise_reaches_only_the_decoder_and_both_passes_of_an_update_see_the_same(coca, texts):
    import attn_clip

    torch.manual_seed(6)
    images = torch.randn(len(texts), 3, 32, 32)
    micro = [(images[:3], texts[:3]), (images[3:], texts[3:])]
    special = special_ids(coca)
    model = Recorder(coca)
    torch.manual_seed(7)
    loss, _ = step(model, micro, caption_input_noise=0.5, special_ids=special)

    # 2 micro-batches: a cached pass without gradients, then a live pass, each call
    # (images, clean texts, noised texts), the same noised texts in both passes
    assert [grad for *_, grad in model.calls] == [False, False, True, True]
    torch.manual_seed(7)  # the same global generator state: the same draws, in order
    expected = [noise_caption_inputs(t, 0.5, special) for _, t in micro]
    for j, (i, t) in enumerate(micro):
        for args, out, _ in (model.calls[j], model.calls[2 + j]):
            assert len(args) == 3 and args[0] is i and args[1] is t
            assert torch.equal(args[2], expected[j])
            assert torch.equal(out.labels, t[:, 1:])
    assert any(not torch.equal(e, t) for e, (_, t) in zip(expected, micro, strict=True))

    # the update's loss: the big batch's, clean contrastive term, noised decoder input
    with torch.no_grad():
        out = coca(images, texts, torch.cat(expected))
    fn = attn_clip.CoCaLoss(2.0, 1.0)
    want = sum(fn(out.image_embeds, out.text_embeds, out.logits, out.labels, out.logit_scale))
    assert loss == pytest.approx(want.item(), rel=1e-5)


def test_noise_needs_a_caption_loss_and_the_tokens_to_keep():
    import attn_clip

    with pytest.raises(ValueError, match="needs a CoCaLoss"):
        contrastive_step(attn_clip.ClipLoss(), caption_input_noise=0.1, special_ids=[0])
    with pytest.raises(ValueError, match="needs a CoCaLoss and the special_ids"):
        contrastive_step(attn_clip.CoCaLoss(2.0, 1.0), caption_input_noise=0.1)
    with pytest.raises(ValueError, match="must be in \\[0, 1\\]"):
        contrastive_step(attn_clip.CoCaLoss(2.0, 1.0), caption_input_noise=2.0, special_ids=[0])


# -- scripts/train_clip.py --caption-input-noise ----------------------------------------------


@pytest.fixture(scope="module")
def tc():
    import train_clip

    return train_clip


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return shapes_data(tmp_path_factory, image_size=64)


def coca_argv(data, *extra: str) -> list[str]:
    return ["--train-data", str(data / "train.csv"), *COCA_TINY, *RUN, "--batch-size", "8", *extra]


def test_a_noised_run_logs_its_rate_and_resumes_to_the_same_weights(tc, data, tmp_path):
    """kill -9 while update 4 is being written, rerun: the same weights and losses as the
    straight run, bit for bit (the noise comes from the checkpointed generator)."""
    argv = coca_argv(data, "--max-steps", "4", "--save-every", "2", "--no-augment")
    noised = [*argv, "--caption-input-noise", "0.5"]
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    tc.main([*noised, "--out", str(straight)])
    (start,) = events(straight, "start")
    assert start["caption_input_noise"] == 0.5

    killed_at(tc.main, [*noised, "--out", killed], step=4)
    assert read_progress(killed / "last")["step"] == 2
    tc.main([*noised, "--out", str(killed)])
    assert events(killed, "resume")[0]["step"] == 2
    assert_same_weights(straight / "last", killed / "last")
    assert step_losses(killed) == step_losses(straight)


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["--set", *CLIP_TINY, "--caption-input-noise", "0.2"], "is for CoCa models"),
        ([*COCA_TINY, "--caption-input-noise", "1.5"], "--caption-input-noise must be in [0, 1]"),
    ],
)
def test_the_flag_is_refused_where_it_does_not_apply(tc, data, tmp_path, capsys, argv, match):
    argv = ["--train-data", str(data / "train.csv"), *argv, *RUN]
    assert_bad_input(tc, argv, tmp_path / "run", match, capsys)


def test_lock_image_trunk_freezes_the_trunk_and_trains_the_pooler(tc, data, tmp_path):
    """--lock-image-trunk: two updates leave the image tower's trunk as it started (the
    run's initial weights: --wise-ft-alpha keeps them) and train its attentional pooler."""
    from _support.scripts import weights

    out = tmp_path / "run"
    argv = coca_argv(data, "--max-steps", "2", "--lock-image-trunk", "--wise-ft-alpha", "0")
    tc.main([*argv, "--out", str(out)])
    start, end = weights(out, "wise_ft_init.safetensors"), weights(out / "last")
    trunk = [k for k in start if k.startswith("visual.trunk.")]
    pool = [k for k in start if k.startswith("visual.attn_pool.")]
    assert trunk and pool
    assert all(torch.equal(start[k], end[k]) for k in trunk)
    assert not any(torch.equal(start[k], end[k]) for k in pool if k.endswith("weight"))
    (record,) = events(out, "start")
    frozen = sum(start[k].numel() for k in trunk)
    assert record["lock_image_trunk"] and record["trainable"] == record["params"] - frozen
