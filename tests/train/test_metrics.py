"""attn_train.metrics: text accuracy, a language model's held-out loss, top-k accuracy over
readable batches."""

from __future__ import annotations

import math

import torch
from attn_train import accuracy, classification_metrics, next_token_loss, readable_batches
from torch import nn


class _Items(torch.utils.data.Dataset):
    """``(x, label)`` items; ``None`` (unreadable) at the given indices."""

    def __init__(self, n: int, unreadable: set[int]) -> None:
        self.n, self.unreadable = n, unreadable

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return None if i in self.unreadable else (torch.full((3,), float(i)), i % 3)


def test_readable_batches_drop_unreadable_items_and_empty_batches():
    batches = list(readable_batches(_Items(6, {0, 1, 4}), batch_size=2))
    assert [b[1].tolist() for b in batches] == [[2, 0], [2]]


def test_classification_metrics_top1_top5_over_readable_items():
    # logits favour class (x mod 3): right for every readable item
    def logits(x: torch.Tensor) -> torch.Tensor:
        return nn.functional.one_hot(x[:, 0].long() % 3, 7).float()

    m = classification_metrics(logits, _Items(6, {5}), batch_size=4, device=torch.device("cpu"))
    assert m["top1"] == m["top5"] == 1.0 and m["n"] == 5


def test_accuracy_of_dict_batches():
    model = nn.Embedding(4, 2)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1.0, 0], [0, 1], [1, 0], [0, 1]]))
    ids = torch.tensor([[0], [1], [2], [3]])
    loader = [{"ids": ids, "labels": torch.tensor([[0], [1], [1], [1]])}]
    assert accuracy(model, loader, "cpu") == 0.75


def test_next_token_loss_is_fixed_windows_and_uniform_is_log_vocab():
    class Uniform(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.zeros(*x.shape, 5)

    data = torch.randint(0, 5, (200,))
    assert math.isclose(next_token_loss(Uniform(), data, 8, "cpu"), math.log(5), rel_tol=1e-6)
    lm = nn.Sequential(nn.Embedding(5, 5))
    assert next_token_loss(lm, data, 8, "cpu") == next_token_loss(lm, data, 8, "cpu")
    assert not lm.training
