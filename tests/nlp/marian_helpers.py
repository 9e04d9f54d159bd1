"""Tiny random Marian checkpoints in the real on-disk format (used by tests/nlp, tests/apps).

``make_marian(tmp, ...)`` builds a ``transformers.MarianMTModel`` from a small
``MarianConfig``, gives it informative random weights (std 0.02 init makes every output
the same), and saves it with ``save_pretrained`` (or as an old-style
``pytorch_model.bin``) plus, optionally, a ``generation_config.json`` and a real Marian
sentencepiece tokenizer trained on generated text.
"""

from __future__ import annotations

import json
import random
import warnings
from pathlib import Path

import torch

PAD = 59  # last id of a 60-token vocabulary, like opus-mt (pad = vocab_size - 1)
VOCAB = 60

WORDS = (
    "i you we they love like see learn read write deep machine models data small big red "
    "blue green cat dog bird tree house river book music code train test fast slow good"
).split()


def marian_config(shared: bool = True, **overrides):
    from transformers import MarianConfig

    base = dict(
        vocab_size=VOCAB,
        decoder_vocab_size=VOCAB if shared else VOCAB + 5,
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=64,
        pad_token_id=PAD,
        decoder_start_token_id=PAD,
        eos_token_id=0,
        forced_eos_token_id=0,
        activation_function="swish",
        scale_embedding=True,
        share_encoder_decoder_embeddings=shared,
    )
    return MarianConfig(**{**base, **overrides})


def randomize(model: torch.nn.Module, seed: int, eos_bias: float = 0.0) -> None:
    """Weights with std 0.3 (LayerNorm gains near 1) so outputs depend on the input."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "embed_positions" in name:  # static sinusoids, not learned
                continue
            if "layer_norm" in name and name.endswith("weight"):
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.3 * torch.randn(p.shape, generator=gen))
        bias = 0.5 * torch.randn(model.final_logits_bias.shape, generator=gen)
        bias[0, 0] += eos_bias  # make EOS (id 0) likely enough that beams finish early
        model.final_logits_bias.copy_(bias)


def make_marian(
    directory: Path,
    *,
    shared: bool = True,
    seed: int = 0,
    eos_bias: float = 0.0,
    fmt: str = "safetensors",
    generation: dict | None = None,
    **config,
) -> Path:
    from transformers import MarianMTModel

    model = MarianMTModel(marian_config(shared, **config)).eval()
    randomize(model, seed, eos_bias)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    if fmt == "bin":  # the pre-safetensors format: every key, tied copies included
        (directory / "model.safetensors").unlink()
        torch.save(model.state_dict(), directory / "pytorch_model.bin")
    if generation is not None:
        gen = json.loads((directory / "generation_config.json").read_text())
        gen.update(generation)
        (directory / "generation_config.json").write_text(json.dumps(gen))
    return directory


def sentences(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choices(WORDS, k=rng.randint(2, 8))) for _ in range(n)]


def add_marian_tokenizer(directory: Path) -> Path:
    """Train a tiny sentencepiece model and save a real MarianTokenizer next to the weights."""
    import sentencepiece as spm
    from transformers import MarianTokenizer

    text = directory / "corpus.txt"
    text.write_text("\n".join(sentences(400)), encoding="utf-8")
    prefix = directory / "spm"
    spm.SentencePieceTrainer.train(
        input=str(text),
        model_prefix=str(prefix),
        vocab_size=VOCAB - 3,
        model_type="unigram",
        character_coverage=1.0,
        minloglevel=2,
    )
    pieces = [line.split("\t")[0] for line in (directory / "spm.vocab").read_text().splitlines()]
    pieces = [p for p in pieces if p not in ("<unk>", "<s>", "</s>")]
    vocab = {"</s>": 0, "<unk>": 1}
    for piece in pieces:
        vocab.setdefault(piece, len(vocab))
    vocab["<pad>"] = PAD
    assert len(vocab) <= VOCAB and max(vocab.values()) == PAD
    (directory / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    with warnings.catch_warnings():  # "Recommended: pip install sacremoses"
        warnings.filterwarnings("ignore", message=".*sacremoses")
        tok = MarianTokenizer(
            source_spm=str(prefix) + ".model",
            target_spm=str(prefix) + ".model",
            vocab=str(directory / "vocab.json"),
        )
    tok.save_pretrained(directory)
    return directory


def marian_checkpoint(directory: Path) -> Path:
    """Shared embeddings, opus-mt style generation settings and a real tokenizer."""
    make_marian(
        directory,
        eos_bias=2.0,
        generation={"bad_words_ids": [[PAD]], "num_beams": 4, "max_length": 24},
    )
    return add_marian_tokenizer(directory)
