"""Contrastive losses: ``ClipLoss`` (symmetric InfoNCE), ``SigLipLoss`` (pairwise sigmoid),
and ``CoCaLoss`` (CoCa's: ``ClipLoss`` + the caption cross-entropy).

Shape legend: ``b`` local batch (this rank), ``W`` world size, ``N = W * b`` global
batch, ``E`` embedding width. Features are L2-normalized ``(b, E)``; ``logit_scale`` is
``exp(model.logit_scale)`` (a scalar); ``logit_bias`` a scalar or None.

Under ``torch.distributed`` (one process per rank, equal local batches) every rank
contrasts its pairs against the whole global batch:

* ``ClipLoss(gather_with_grad=True)`` -- features are gathered with a differentiable
  all-gather, which back-propagates into the other ranks. After DDP averages the
  gradients they equal those of the single-process loss on the concatenated batch, with
  ``local_loss`` True (each rank computes only its own ``b`` rows/columns: ``O(b * N)``
  logits) or False (``O(N * N)``).
* ``gather_with_grad=False`` (open_clip's default) gathers without autograd: gradients
  reach only the local features, so after DDP averaging the tower gradients are ``1 / W``
  of the single-process ones (``local_loss=False``; ``logit_scale``'s stays exact) or
  miss the cross-rank terms (``local_loss=True``); the loss value is the same. Prefer
  ``gather_with_grad=True``.
* ``SigLipLoss`` gathers text features with autograd and adds the negatives against the
  other ranks' captions; after DDP averaging it also matches the single-process loss.

* ``CoCaLoss``'s contrastive part is ``ClipLoss`` (the same gathering); its caption part
  is a mean over this rank's tokens, as in open_clip (DDP then averages the ranks' means).

All three mirror open_clip's ``ClipLoss`` / ``SigLipLoss`` / ``CoCaLoss`` values and
gradients.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

__all__ = ["ClipLoss", "CoCaLoss", "SigLipLoss", "create_loss", "gather_features"]


def _dist_info(rank: int | None, world_size: int | None) -> tuple[int, int]:
    initialized = dist.is_available() and dist.is_initialized()
    if rank is None:
        rank = dist.get_rank() if initialized else 0
    if world_size is None:
        world_size = dist.get_world_size() if initialized else 1
    return rank, world_size


class _AllGatherWithGrad(torch.autograd.Function):
    """``all_gather`` whose backward sums every rank's gradient for this rank's slice."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = [torch.empty_like(x) for _ in range(dist.get_world_size())]
        dist.all_gather(out, x.contiguous())
        return tuple(out)

    @staticmethod
    def backward(ctx, *grads: torch.Tensor) -> torch.Tensor:
        g = torch.stack(grads)  # (W, b, E): this rank's loss w.r.t. every rank's features
        dist.all_reduce(g)  # summed over the ranks' losses
        return g[dist.get_rank()]


def _all_gather(x: torch.Tensor, with_grad: bool) -> list[torch.Tensor]:
    """Every rank's ``(b, E)`` tensor, in rank order (differentiable when ``with_grad``)."""
    if with_grad:
        return list(_AllGatherWithGrad.apply(x))
    out = [torch.empty_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(out, x.contiguous())
    return out


def gather_features(
    image_features: torch.Tensor,
    text_features: torch.Tensor,
    *,
    local_loss: bool = False,
    gather_with_grad: bool = False,
    rank: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """All ranks' ``(b, E)`` features -> ``(N, E)`` each, in rank order.

    Without ``gather_with_grad`` the local slice is put back as the live tensor (unless
    ``local_loss``, where the local features are used directly), so local gradients flow.
    """
    images = _all_gather(image_features, gather_with_grad)
    texts = _all_gather(text_features, gather_with_grad)
    if not gather_with_grad and not local_loss:
        images[rank], texts[rank] = image_features, text_features
    return torch.cat(images), torch.cat(texts)


class ClipLoss(nn.Module):
    """Symmetric cross-entropy over image->text and text->image logits (CLIP's InfoNCE).

    ``rank`` / ``world_size`` default to ``torch.distributed``'s when it is initialized.
    """

    def __init__(
        self,
        local_loss: bool = False,
        gather_with_grad: bool = False,
        cache_labels: bool = False,
        rank: int | None = None,
        world_size: int | None = None,
    ) -> None:
        super().__init__()
        self.local_loss = local_loss
        self.gather_with_grad = gather_with_grad
        self.cache_labels = cache_labels
        self.rank, self.world_size = rank, world_size
        self._labels: dict[tuple[torch.device, int], torch.Tensor] = {}

    def labels(self, device: torch.device, num_logits: int, rank: int, world: int) -> torch.Tensor:
        """Index of each row's positive column: ``arange(b)`` (+ ``rank * b`` for local loss)."""
        key = (device, num_logits)
        if key in self._labels:
            return self._labels[key]
        labels = torch.arange(num_logits, device=device, dtype=torch.long)
        if world > 1 and self.local_loss:
            labels = labels + num_logits * rank
        if self.cache_labels:
            self._labels[key] = labels
        return labels

    def get_logits(
        self,
        image_features: torch.Tensor,
        text_features: torch.Tensor,
        logit_scale: torch.Tensor | float,
        logit_bias: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(logits_per_image, logits_per_text)``: ``(b, N)`` with local loss, else ``(N, N)``."""
        rank, world = _dist_info(self.rank, self.world_size)
        if world > 1:
            all_images, all_texts = gather_features(
                image_features,
                text_features,
                local_loss=self.local_loss,
                gather_with_grad=self.gather_with_grad,
                rank=rank,
            )
            if self.local_loss:
                per_image = logit_scale * image_features @ all_texts.T  # (b, N)
                per_text = logit_scale * text_features @ all_images.T  # (b, N)
            else:
                per_image = logit_scale * all_images @ all_texts.T  # (N, N)
                per_text = per_image.T
        else:
            per_image = logit_scale * image_features @ text_features.T
            per_text = logit_scale * text_features @ image_features.T
        if logit_bias is not None:
            per_image, per_text = per_image + logit_bias, per_text + logit_bias
        return per_image, per_text

    def forward(
        self,
        image_features: torch.Tensor,
        text_features: torch.Tensor,
        logit_scale: torch.Tensor | float,
        logit_bias: torch.Tensor | None = None,
        output_dict: bool = False,
    ) -> torch.Tensor | dict[str, torch.Tensor]:
        """Mean of the two cross-entropies (a scalar, or ``{"contrastive_loss": ...}``)."""
        if image_features.shape != text_features.shape:
            raise ValueError(
                f"image and text features must both be (b, E); got "
                f"{tuple(image_features.shape)} and {tuple(text_features.shape)}"
            )
        per_image, per_text = self.get_logits(
            image_features, text_features, logit_scale, logit_bias
        )
        rank, world = _dist_info(self.rank, self.world_size)
        labels = self.labels(image_features.device, per_image.shape[0], rank, world)
        loss = (F.cross_entropy(per_image, labels) + F.cross_entropy(per_text, labels)) / 2
        return {"contrastive_loss": loss} if output_dict else loss


class SigLipLoss(nn.Module):
    """Sigmoid loss (Zhai et al. 2023): every image-text pair is a binary classification.

    ``loss = -sum_ij log sigmoid(z_ij * (scale * <img_i, txt_j> + bias)) / b`` with
    ``z_ij = +1`` for matching pairs and ``-1`` otherwise; the pairs against the other
    ranks' captions are all negatives.
    """

    def __init__(self, rank: int | None = None, world_size: int | None = None) -> None:
        super().__init__()
        self.rank, self.world_size = rank, world_size

    @staticmethod
    def _pair_loss(
        image_features: torch.Tensor,
        text_features: torch.Tensor,
        logit_scale: torch.Tensor | float,
        logit_bias: torch.Tensor | float | None,
        negative_only: bool,
    ) -> torch.Tensor:
        logits = logit_scale * image_features @ text_features.T  # (b, b)
        if logit_bias is not None:
            logits = logits + logit_bias
        b = image_features.shape[0]
        labels = -torch.ones_like(logits)
        if not negative_only:
            labels = labels + 2 * torch.eye(b, device=logits.device, dtype=logits.dtype)
        return -F.logsigmoid(labels * logits).sum() / b

    def forward(
        self,
        image_features: torch.Tensor,
        text_features: torch.Tensor,
        logit_scale: torch.Tensor | float,
        logit_bias: torch.Tensor | float | None,
        output_dict: bool = False,
    ) -> torch.Tensor | dict[str, torch.Tensor]:
        if image_features.shape != text_features.shape:
            raise ValueError(
                f"image and text features must both be (b, E); got "
                f"{tuple(image_features.shape)} and {tuple(text_features.shape)}"
            )
        loss = self._pair_loss(image_features, text_features, logit_scale, logit_bias, False)
        rank, world = _dist_info(self.rank, self.world_size)
        if world > 1:
            all_texts = _all_gather(text_features, with_grad=True)
            for r, texts in enumerate(all_texts):
                if r != rank:
                    loss = loss + self._pair_loss(
                        image_features, texts, logit_scale, logit_bias, True
                    )
        return {"contrastive_loss": loss} if output_dict else loss


class CoCaLoss(ClipLoss):
    """CoCa's loss (open_clip's ``CoCaLoss``): ``clip_loss_weight * ClipLoss`` and
    ``caption_loss_weight * cross-entropy`` of the teacher-forced caption logits, label
    tokens equal to ``pad_id`` ignored (open_clip's tokenizer pads with 0).

    Shapes: ``logits`` ``(b, L, V)`` (``L`` predicted positions, ``V`` vocabulary),
    ``labels`` ``(b, L)`` token ids -- ``CoCaOutput.logits`` / ``.labels``. Returns the
    weighted ``(contrastive_loss, caption_loss)`` (open_clip's order; their sum is what is
    trained), or the dict ``{"contrastive_loss", "caption_loss"}`` with ``output_dict``.

    ``num_tokens`` (keyword): divide the summed caption cross-entropy by this many tokens
    instead of the batch's own non-pad count, so that the micro-batches of one update
    (:func:`attn_train.contrastive_step`) add up to the loss of their concatenation; count
    them with :meth:`count_tokens`. A weight of 0 gives a zero term that keeps its graph
    (every parameter still gets a gradient, which DDP needs).
    """

    def __init__(
        self,
        caption_loss_weight: float,
        clip_loss_weight: float,
        pad_id: int = 0,
        local_loss: bool = False,
        gather_with_grad: bool = False,
        cache_labels: bool = False,
        rank: int | None = None,
        world_size: int | None = None,
    ) -> None:
        super().__init__(local_loss, gather_with_grad, cache_labels, rank, world_size)
        self.caption_loss_weight = caption_loss_weight
        self.clip_loss_weight = clip_loss_weight
        self.pad_id = pad_id

    def count_tokens(self, labels: torch.Tensor) -> int:
        """How many of ``labels`` ``(b, L)`` are scored (not ``pad_id``)."""
        return int((labels != self.pad_id).sum())

    def contrastive(
        self,
        image_features: torch.Tensor,
        text_features: torch.Tensor,
        logit_scale: torch.Tensor | float,
        logit_bias: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``clip_loss_weight * ClipLoss(...)`` (a scalar)."""
        loss = super().forward(image_features, text_features, logit_scale, logit_bias)
        return self.clip_loss_weight * loss

    def captioning(
        self, logits: torch.Tensor, labels: torch.Tensor, num_tokens: int | None = None
    ) -> torch.Tensor:
        """``caption_loss_weight *`` the mean cross-entropy of the non-pad tokens (or their
        sum over ``num_tokens``); ``logits`` ``(b, L, V)``, ``labels`` ``(b, L)``."""
        if logits.ndim != 3 or labels.shape != logits.shape[:2]:
            raise ValueError(
                f"caption logits must be (b, L, V) and labels (b, L); got "
                f"{tuple(logits.shape)} and {tuple(labels.shape)}"
            )
        # (b * L, V) rows: the same value as open_clip's cross_entropy(logits.permute(0, 2,
        # 1), labels), without the strided (b, V, L) layout (several times slower on CPU)
        flat, target = logits.reshape(-1, logits.shape[-1]), labels.reshape(-1)
        if num_tokens is None:
            loss = F.cross_entropy(flat, target, ignore_index=self.pad_id)
        else:
            loss = F.cross_entropy(flat, target, ignore_index=self.pad_id, reduction="sum")
            loss = loss / max(num_tokens, 1)
        return self.caption_loss_weight * loss

    def forward(
        self,
        image_features: torch.Tensor,
        text_features: torch.Tensor,
        logits: torch.Tensor,
        labels: torch.Tensor,
        logit_scale: torch.Tensor | float,
        output_dict: bool = False,
        *,
        logit_bias: torch.Tensor | None = None,
        num_tokens: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor] | dict[str, torch.Tensor]:
        clip_loss = self.contrastive(image_features, text_features, logit_scale, logit_bias)
        caption_loss = self.captioning(logits, labels, num_tokens)
        if output_dict:
            return {"contrastive_loss": clip_loss, "caption_loss": caption_loss}
        return clip_loss, caption_loss


COCA_LOSS_WEIGHTS = {"caption_loss_weight": 2.0, "clip_loss_weight": 1.0}  # open_clip's defaults


def create_loss(
    model: nn.Module,
    loss: str = "clip",
    *,
    caption_loss_weight: float | None = None,
    clip_loss_weight: float | None = None,
) -> nn.Module:
    """The loss to train ``model`` (an :class:`attn_clip.CLIP` / ``CoCa``) with, features
    gathered with gradients under DDP: a CoCa gets ``CoCaLoss`` (weights default to
    open_clip's 2.0 / 1.0; pads are ``model.pad_id``), a CLIP ``ClipLoss`` (``loss="clip"``)
    or ``SigLipLoss`` (``"siglip"``). A ``ValueError`` for ``"siglip"`` on a CoCa, or for
    caption / clip weights other than the defaults on a model that is not one."""
    if loss not in ("clip", "siglip"):
        raise ValueError(f"loss must be 'clip' or 'siglip', got {loss!r}")
    given = {"caption_loss_weight": caption_loss_weight, "clip_loss_weight": clip_loss_weight}
    weights = {k: COCA_LOSS_WEIGHTS[k] if v is None else v for k, v in given.items()}
    if not model.config.is_coca:
        if weights != COCA_LOSS_WEIGHTS:
            raise ValueError("the caption / clip loss weights are for CoCa models, not a CLIP")
        return ClipLoss(gather_with_grad=True) if loss == "clip" else SigLipLoss()
    if loss == "siglip":
        raise ValueError("loss 'siglip': a CoCa trains with CoCa's loss (ClipLoss + captions)")
    return CoCaLoss(pad_id=model.pad_id, gather_with_grad=True, **weights)
