"""The one tiny CLIP of the tests: its open_clip config (``TINY_OC_CFG``, ``oc_cfg``),
reference models with non-trivial weights (LayerNorm scales / biases perturbed so swapped
or missing norms cannot hide), captions, and the session-scoped reference model and its
twin in attn_clip that the tests which only read them share.

tests/clip/conftest.py re-exports the fixtures and hands this module out as the ``h``
fixture."""

from __future__ import annotations

import copy

import open_clip
import pytest
import torch

TINY_OC_CFG = {
    "embed_dim": 32,
    "vision_cfg": {"image_size": 32, "patch_size": 8, "width": 64, "layers": 2, "head_width": 16},
    "text_cfg": {"context_length": 20, "vocab_size": 49408, "width": 48, "heads": 4, "layers": 2},
}

CAPTIONS = [
    "a photo of a dog",
    "a cat sitting on a mat, wearing a small red hat!",
    "",
    "Ünïcode & emoji 🙂 text " * 6,  # longer than 20 tokens: truncated
]


def oc_cfg(**updates) -> dict:
    """TINY_OC_CFG with ``vision_cfg`` / ``text_cfg`` / top-level keys updated."""
    cfg = copy.deepcopy(TINY_OC_CFG)
    for key, value in updates.items():
        if key in ("vision_cfg", "text_cfg"):
            cfg[key].update(value)
        else:
            cfg[key] = value
    return cfg


@torch.no_grad()
def perturb_(model: torch.nn.Module, std: float = 0.02) -> torch.nn.Module:
    """Add noise to every vector / scalar parameter (norms, biases, embeddings initialised to
    constants) in place; weight matrices are random already. Returns the model in eval mode."""
    for p in model.parameters():
        if p.ndim <= 1:
            p.add_(torch.randn_like(p) * std)
    return model.eval()


@torch.no_grad()
def random_fill_(model: torch.nn.Module, std: float = 0.02) -> torch.nn.Module:
    """Overwrite every parameter: norm scales ~ 1 + noise, all others ~ N(0, std^2)."""
    for name, p in model.named_parameters():
        if p.ndim == 1 and "norm" in name and name.endswith("weight"):
            p.normal_(1.0, 0.1)
        elif name.endswith("logit_scale"):
            p.fill_(2.6592)
        else:
            p.normal_(0.0, std)
    return model.eval()


def make_open_clip(cfg: dict) -> torch.nn.Module:
    """A random open_clip ``CLIP`` for ``cfg`` with perturbed weights."""
    return perturb_(open_clip.model.CLIP(**copy.deepcopy(cfg)))


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float() - b.float()).abs().max().item()


# the text vocabulary of the shrunk-depth parity models: the embedding is a lookup, and
# each preset's full-size table is checked on the meta device (tests/clip/test_convert.py)
SMALL_VOCAB = 4096


def small_vocab(tokens: torch.Tensor, vocab: int = SMALL_VOCAB) -> torch.Tensor:
    """CLIP tokens folded into ``vocab`` ids: padding stays 0, end-of-text (49407, the
    largest id, where argmax pooling reads) becomes ``vocab - 1``, the rest ``id % (vocab - 1)``."""
    out = tokens % (vocab - 1)
    out[tokens == 49407] = vocab - 1
    return out


def open_clip_inputs(
    ref: torch.nn.Module, name: str, vocab: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Two random images at ``ref``'s size and three captions in open_clip's tokenization
    for the config ``name`` (folded into ``vocab`` ids when given: ``small_vocab``)."""
    tokens = open_clip.get_tokenizer(name)(["a photo of a dog", "a cat on a mat", ""])
    if vocab is not None:
        tokens = small_vocab(tokens, vocab)
    return torch.randn(2, 3, *ref.visual.image_size), tokens


def save_checkpoint(sd: dict, path) -> str:
    """``sd`` written as open_clip's checkpoints are: safetensors for ``*.safetensors``, a
    ``torch.save`` file otherwise."""
    from safetensors.torch import save_file

    sd = {k: v.contiguous() for k, v in sd.items()}
    if str(path).endswith(".safetensors"):
        save_file(sd, str(path))
    else:
        torch.save(sd, path)
    return str(path)


@pytest.fixture(scope="session")
def tiny_open_clip() -> torch.nn.Module:
    """open_clip's ``CLIP`` for ``TINY_OC_CFG`` (seed 0, perturbed, eval): read, never
    changed, by the tests that share it."""
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return make_open_clip(oc_cfg())


@pytest.fixture(scope="session")
def tiny_clip(tiny_open_clip: torch.nn.Module) -> torch.nn.Module:
    """attn_clip's ``CLIP`` for ``TINY_OC_CFG`` holding ``tiny_open_clip``'s weights (eval)."""
    from attn_clip import CLIP, CLIPConfig, load_checkpoint

    model = CLIP(CLIPConfig.from_open_clip(oc_cfg()))
    return load_checkpoint(model, tiny_open_clip.state_dict()).eval()
