"""Knowledge-distillation losses: logits, hidden states, attention maps, CLIP embeddings.

* :func:`logit_distillation` -- Hinton et al. 2015: KL from the teacher's to the student's
  temperature-softened distribution, times ``T**2`` (so gradients keep their scale).
* :class:`HiddenStateDistiller` -- TinyBERT (Jiao et al. 2020): MSE between student and
  teacher hidden states of mapped layer pairs, through a learned projection when the widths
  differ (the projections are trained with the student and dropped afterwards).
* :func:`attention_distillation` -- TinyBERT / MiniLM: KL between the teacher's and the
  student's attention distributions per layer pair, per head or averaged over heads (when
  the head counts differ). The maps are the ``(B, H, L, L)`` weights attn_core's ``math``
  backend returns (``need_weights=True``); they do not change the model's outputs.
* :func:`clip_distillation` -- CLIP-KD (Yang et al. 2024) / TinyCLIP: the student's image and
  text embeddings pulled towards the teacher's (feature distillation, when the embedding
  widths agree or after a projection), plus the teacher's image-text similarity matrix as
  soft targets for the student's, in both directions.
* :func:`uniform_layer_map` -- which teacher layer each student layer learns from.

Every loss treats the teacher as fixed: its tensors are detached here, so gradients reach
only the student (and the projections). Each loss is zero when the student equals the
teacher.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "HiddenStateDistiller",
    "attention_distillation",
    "clip_distillation",
    "logit_distillation",
    "uniform_layer_map",
]


def uniform_layer_map(student_layers: int, teacher_layers: int) -> list[int]:
    """Teacher layer index for each student layer, spread evenly and ending at the last
    (TinyBERT's uniform strategy): 4 of 12 -> ``[2, 5, 8, 11]``."""
    if not 0 < student_layers <= teacher_layers:
        raise ValueError(
            f"need 0 < student layers <= teacher layers, got {student_layers} and {teacher_layers}"
        )
    step = teacher_layers // student_layers
    offset = teacher_layers - step * student_layers - 1  # so the last maps to the last
    return [(i + 1) * step + offset for i in range(student_layers)]


def _soft_kl(student_logits: torch.Tensor, teacher_logits: torch.Tensor, T: float) -> torch.Tensor:
    """``T**2 * KL(softmax(teacher / T) || softmax(student / T))`` over the last dim, averaged
    over the other dims."""
    s = F.log_softmax(student_logits.float() / T, dim=-1)
    t = F.log_softmax(teacher_logits.detach().float() / T, dim=-1)
    kl = F.kl_div(s.flatten(0, -2), t.flatten(0, -2), log_target=True, reduction="batchmean")
    return kl * T**2


def logit_distillation(
    student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float = 2.0
) -> torch.Tensor:
    """Hinton's soft-target loss for ``(..., K)`` logits (classes on the last dim)."""
    if student_logits.shape != teacher_logits.shape:
        raise ValueError(
            f"student and teacher logits differ: {tuple(student_logits.shape)} vs "
            f"{tuple(teacher_logits.shape)}"
        )
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    return _soft_kl(student_logits, teacher_logits, temperature)


class HiddenStateDistiller(nn.Module):
    """MSE between student hidden states and the teacher's of the mapped layers.

    Args:
        student_dim, teacher_dim: hidden widths; when they differ each pair gets its own
            ``nn.Linear(student_dim, teacher_dim)`` (``proj.{i}``), trained with the student.
        layer_map: teacher layer of each student layer (:func:`uniform_layer_map`).
    """

    def __init__(self, student_dim: int, teacher_dim: int, layer_map: Sequence[int]) -> None:
        super().__init__()
        self.layer_map = list(layer_map)
        same = student_dim == teacher_dim
        self.proj = nn.ModuleList(
            nn.Identity() if same else nn.Linear(student_dim, teacher_dim) for _ in layer_map
        )

    def forward(
        self, student: Sequence[torch.Tensor], teacher: Sequence[torch.Tensor]
    ) -> torch.Tensor:
        """``student[i]`` ``(B, L, Ds)`` for every student layer, ``teacher[j]`` ``(B, L, Dt)``
        for every teacher layer -> the mean over pairs of the MSE."""
        if len(student) != len(self.layer_map):
            raise ValueError(
                f"expected {len(self.layer_map)} student hidden states, got {len(student)}"
            )
        losses = [
            F.mse_loss(proj(s).float(), teacher[j].detach().float())
            for proj, s, j in zip(self.proj, student, self.layer_map, strict=True)
        ]
        return torch.stack(losses).mean()


def attention_distillation(
    student: Sequence[torch.Tensor],
    teacher: Sequence[torch.Tensor],
    layer_map: Sequence[int],
    average_heads: bool = False,
    eps: float = 1e-8,
) -> torch.Tensor:
    """KL(teacher || student) between attention distributions ``(B, H, L, L)`` (rows sum to
    one) of the mapped layer pairs, averaged over pairs, heads and query rows. With
    ``average_heads`` (needed when the head counts differ) the maps are averaged over heads
    first."""
    if len(student) != len(layer_map):
        raise ValueError(f"expected {len(layer_map)} student attention maps, got {len(student)}")
    losses = []
    for s, j in zip(student, layer_map, strict=True):
        t = teacher[j].detach()
        if average_heads:
            s, t = s.mean(1, keepdim=True), t.mean(1, keepdim=True)
        if s.shape != t.shape:
            raise ValueError(
                f"attention maps differ: student {tuple(s.shape)} vs teacher {tuple(t.shape)} "
                "(average_heads=True when the head counts differ)"
            )
        s, t = s.float().clamp_min(eps), t.float().clamp_min(eps)
        losses.append((t * (t.log() - s.log())).sum(-1).mean())
    return torch.stack(losses).mean()


def clip_distillation(
    student_image: torch.Tensor,
    student_text: torch.Tensor,
    teacher_image: torch.Tensor,
    teacher_text: torch.Tensor,
    logit_scale: torch.Tensor | float,
    teacher_logit_scale: torch.Tensor | float | None = None,
    feature_weight: float = 1.0,
    similarity_weight: float = 1.0,
) -> torch.Tensor:
    """Feature + similarity distillation of a CLIP, for L2-normalised ``(B, E)`` embeddings.

    ``feature_weight * (MSE(s_img, t_img) + MSE(s_txt, t_txt))`` (needs equal widths:
    project the student's first otherwise) ``+ similarity_weight * (KL over image->text rows
    + KL over text->image rows)`` between the teacher's ``teacher_logit_scale * t_img @
    t_txt.T`` (default: the student's scale) and the student's ``logit_scale * s_img @
    s_txt.T`` (the temperature is the logit scale itself, as in CLIP's own loss).
    """
    t_img, t_txt = teacher_image.detach().float(), teacher_text.detach().float()
    s_img, s_txt = student_image.float(), student_text.float()
    if s_img.shape[0] != t_img.shape[0] or s_txt.shape[0] != t_txt.shape[0]:
        raise ValueError("student and teacher embeddings must cover the same batch")
    scale = logit_scale
    t_scale = scale if teacher_logit_scale is None else teacher_logit_scale
    if isinstance(t_scale, torch.Tensor):
        t_scale = t_scale.detach()
    loss = s_img.new_zeros(())
    if feature_weight:
        if s_img.shape != t_img.shape or s_txt.shape != t_txt.shape:
            raise ValueError(
                f"feature distillation needs equal embedding widths: student "
                f"{tuple(s_img.shape)} vs teacher {tuple(t_img.shape)} (project the student's)"
            )
        loss = loss + feature_weight * (F.mse_loss(s_img, t_img) + F.mse_loss(s_txt, t_txt))
    if similarity_weight:
        s_sim, t_sim = scale * s_img @ s_txt.T, t_scale * t_img @ t_txt.T  # (B, B)
        kl = _soft_kl(s_sim, t_sim, 1.0) + _soft_kl(s_sim.T, t_sim.T, 1.0)
        loss = loss + similarity_weight * kl
    return loss
