"""Distillation losses: zero when the student equals the teacher, gradients only to the
student, the layer map, shape checks."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from attn_train.distill import (
    HiddenStateDistiller,
    attention_distillation,
    clip_distillation,
    logit_distillation,
    uniform_layer_map,
)


def test_uniform_layer_map():
    assert uniform_layer_map(4, 12) == [2, 5, 8, 11]
    assert uniform_layer_map(3, 8) == [3, 5, 7]
    assert uniform_layer_map(2, 2) == [0, 1]
    with pytest.raises(ValueError, match="student layers"):
        uniform_layer_map(5, 4)


def test_logit_distillation_zero_at_equal_and_matches_the_formula():
    t = torch.randn(4, 7)
    assert logit_distillation(t.clone(), t).item() == pytest.approx(0.0, abs=1e-6)
    s = torch.randn(4, 7, requires_grad=True)
    T = 3.0
    p = F.softmax(t / T, -1)
    expected = (p * (p.log() - F.log_softmax(s / T, -1))).sum(-1).mean() * T**2
    torch.testing.assert_close(logit_distillation(s, t, T), expected)
    with pytest.raises(ValueError, match="differ"):
        logit_distillation(s, t[:, :3])


def test_gradients_reach_only_the_student():
    teacher = torch.nn.Linear(8, 5)
    student = torch.nn.Linear(8, 5)
    x = torch.randn(3, 8)
    logit_distillation(student(x), teacher(x)).backward()
    assert student.weight.grad is not None and teacher.weight.grad is None


def test_hidden_state_distiller_projects_different_widths():
    teacher = [torch.randn(2, 5, 16) for _ in range(4)]
    same = HiddenStateDistiller(16, 16, [1, 3])
    assert same([teacher[1], teacher[3]], teacher).item() == 0.0
    assert len(list(same.parameters())) == 0
    narrow = HiddenStateDistiller(8, 16, [1, 3])
    student = [torch.randn(2, 5, 8, requires_grad=True) for _ in range(2)]
    loss = narrow(student, [t.requires_grad_() for t in teacher])
    loss.backward()
    assert narrow.proj[0].weight.grad is not None and student[0].grad is not None
    assert teacher[1].grad is None
    with pytest.raises(ValueError, match="2 student hidden states"):
        narrow(student[:1], teacher)


def test_attention_distillation_per_head_and_head_averaged():
    teacher = [torch.randn(2, 4, 6, 6).softmax(-1) for _ in range(3)]
    assert attention_distillation([teacher[2]], teacher, [2]).item() == pytest.approx(0, abs=1e-6)
    student = torch.randn(2, 2, 6, 6, requires_grad=True)
    with pytest.raises(ValueError, match="average_heads"):
        attention_distillation([student.softmax(-1)], teacher, [2])
    loss = attention_distillation([student.softmax(-1)], teacher, [2], average_heads=True)
    assert loss.item() > 0
    loss.backward()
    assert student.grad is not None


def test_clip_distillation_zero_at_equal_and_positive_otherwise():
    img = F.normalize(torch.randn(6, 16), dim=-1)
    txt = F.normalize(torch.randn(6, 16), dim=-1)
    assert clip_distillation(img, txt, img, txt, 50.0).item() == pytest.approx(0, abs=1e-5)
    s_img = F.normalize(torch.randn(6, 16), dim=-1).requires_grad_()
    scale = torch.tensor(20.0, requires_grad=True)
    t_scale = torch.tensor(50.0)
    loss = clip_distillation(s_img, txt, img, txt, scale, teacher_logit_scale=t_scale)
    assert loss.item() > 0
    loss.backward()
    assert s_img.grad is not None and scale.grad is not None
    sim_only = clip_distillation(s_img, txt, img, txt, scale, t_scale, feature_weight=0.0)
    assert 0 < sim_only.item() < loss.item()
    with pytest.raises(ValueError, match="equal embedding widths"):
        clip_distillation(torch.randn(6, 8), torch.randn(6, 8), img, txt, 10.0)
