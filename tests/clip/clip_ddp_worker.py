"""Worker for test_loss.py's 2-process gloo run (imported by module name in the children).

Every rank builds the same tiny two-tower model, wraps it in DDP, feeds its slice of a
shared global batch and records, per loss setting: the loss, the DDP-averaged parameter
gradients and the gradients on its local (leaf) features. The ``"coca"`` entry: the same
towers plus teacher-forced caption logits, trained with ``CoCaLoss``.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

B_LOCAL, D_IMG, D_TXT, E = 3, 10, 7, 6
L_CAP, V_CAP = 4, 5  # caption positions and vocabulary of the "coca" entry
COCA_WEIGHTS = dict(caption_loss_weight=2.0, clip_loss_weight=1.0)
CASES = {
    "clip": dict(local_loss=False, gather_with_grad=False),
    "clip_local": dict(local_loss=True, gather_with_grad=False),
    "clip_grad": dict(local_loss=False, gather_with_grad=True),
    "clip_local_grad": dict(local_loss=True, gather_with_grad=True),
    "siglip": None,
}


class Towers(nn.Module):
    def __init__(self, bias: bool) -> None:
        super().__init__()
        self.image = nn.Linear(D_IMG, E)
        self.text = nn.Linear(D_TXT, E)
        self.logit_scale = nn.Parameter(torch.tensor(2.3))
        self.logit_bias = nn.Parameter(torch.tensor(-1.5)) if bias else None

    def forward(self, x_img: torch.Tensor, x_txt: torch.Tensor):
        img = F.normalize(self.image(x_img), dim=-1)
        txt = F.normalize(self.text(x_txt), dim=-1)
        return img, txt, self.logit_scale.exp(), self.logit_bias


class CaptionTowers(Towers):
    """``Towers`` + caption logits ``(b, L_CAP, V_CAP)`` read from the text input."""

    def __init__(self) -> None:
        super().__init__(bias=False)
        self.caption = nn.Linear(D_TXT, L_CAP * V_CAP)

    def forward(self, x_img: torch.Tensor, x_txt: torch.Tensor):
        img, txt, scale, _ = super().forward(x_img, x_txt)
        return img, txt, scale, self.caption(x_txt).view(-1, L_CAP, V_CAP)


def caption_labels(world_size: int) -> torch.Tensor:
    """``(N, L_CAP)`` token ids, pad (0) after a random length; every rank's slice has the
    same number of real tokens (so the mean of the ranks' means is the global mean)."""
    g = torch.Generator().manual_seed(5)
    lengths = torch.tensor([4, 2, 3]).repeat(world_size)  # B_LOCAL = 3 rows a rank
    labels = torch.randint(1, V_CAP, (world_size * B_LOCAL, L_CAP), generator=g)
    pad = torch.arange(L_CAP)[None] >= lengths[:, None]
    return labels.masked_fill(pad, 0)


def data(world_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(123)
    n = world_size * B_LOCAL
    return torch.randn(n, D_IMG, generator=g), torch.randn(n, D_TXT, generator=g)


def make_model(bias: bool) -> Towers:
    torch.manual_seed(7)
    return Towers(bias)


def make_loss(case: str, **dist_kwargs):
    from attn_clip.loss import ClipLoss, CoCaLoss, SigLipLoss

    if case == "coca":
        return CoCaLoss(**COCA_WEIGHTS, gather_with_grad=True, **dist_kwargs)
    kwargs = CASES[case]
    return SigLipLoss(**dist_kwargs) if kwargs is None else ClipLoss(**kwargs, **dist_kwargs)


def run(rank: int, world_size: int, port: int, out_dir: str) -> None:
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        x_img, x_txt = data(world_size)
        sl = slice(rank * B_LOCAL, (rank + 1) * B_LOCAL)
        results = {}
        for case in CASES:
            model = make_model(bias=case == "siglip")
            ddp = nn.parallel.DistributedDataParallel(model)
            img, txt, scale, bias = ddp(x_img[sl], x_txt[sl])
            loss = make_loss(case)(img, txt, scale, bias)  # rank / world from torch.distributed
            loss.backward()
            grads = {n: p.grad.clone() for n, p in model.named_parameters()}
            # gradients on the local features themselves (leaf copies, no DDP involved)
            img_leaf = img.detach().requires_grad_()
            txt_leaf = txt.detach().requires_grad_()
            leaf_bias = None if bias is None else bias.detach()
            make_loss(case)(img_leaf, txt_leaf, scale.detach(), leaf_bias).backward()
            results[case] = {
                "loss": loss.detach(),
                "grads": grads,
                "feature_grads": (img_leaf.grad, txt_leaf.grad),
                "features": (img.detach(), txt.detach()),
            }
        torch.manual_seed(7)
        ddp = nn.parallel.DistributedDataParallel(model := CaptionTowers())
        img, txt, scale, logits = ddp(x_img[sl], x_txt[sl])
        labels = caption_labels(world_size)[sl]
        clip_loss, caption_loss = make_loss("coca")(img, txt, logits, labels, scale)
        (clip_loss + caption_loss).backward()
        results["coca"] = {
            "loss": (clip_loss.detach(), caption_loss.detach()),
            "grads": {n: p.grad.clone() for n, p in model.named_parameters()},
            "features": (img.detach(), txt.detach()),
            "logits": logits.detach(),
        }
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()
