r"""Distil a trained text classifier into a smaller one (TinyBERT's recipe, one stage).

    uv run scripts/train_text_classifier.py make-data data/reviews
    uv run scripts/train_text_classifier.py train --train data/reviews/train.csv \
        --dev data/reviews/dev.csv --out runs/teacher --embed-dim 128 --depth 4
    uv run scripts/distill_text_classifier.py --teacher runs/teacher/best \
        --train data/reviews/train.csv --dev data/reviews/dev.csv --out runs/student \
        --embed-dim 64 --depth 2 --heads 2

The student (the teacher's tokenizer, fewer / narrower blocks) learns from the labels and
from the teacher: its softened logits (``--temperature``), the hidden states of the mapped
blocks (``attn_train.distill.uniform_layer_map``; projected when the widths differ) and the
attention distributions of those blocks (head-averaged when the head counts differ). The
loss weights are ``--w-label --w-logits --w-hidden --w-attention``. ``OUT/last`` and
``OUT/best`` hold the student and the hidden-state projections (for exact resume);
``OUT/best/student`` and ``OUT/last/student`` are classifier folders like
``train_text_classifier.py``'s.

Exit codes: 0 done, 1 the loss became NaN / inf, 2 bad input (one ``error:`` line, nothing
written), 130 Ctrl-C (the line names the last checkpoint; the same command resumes).
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

import attn_core.cli  # noqa: F401  (first: Ctrl-C while torch loads -> one line, exit 130)
import attn_train as at
import torch
import torch.nn.functional as F
from attn_train import cli, distill
from torch import nn


def build_parser() -> argparse.ArgumentParser:
    p = cli.make_parser(__doc__)
    g = p.add_argument_group("models")
    g.add_argument("--teacher", type=Path, required=True, help="a trained classifier folder")
    g.add_argument("--embed-dim", type=int, default=64, help="student width")
    g.add_argument("--depth", type=int, default=1, help="student encoder blocks")
    g.add_argument("--heads", type=int, default=2, help="student attention heads")
    g = p.add_argument_group("data")
    g.add_argument("--train", type=Path, required=True, help="CSV with text,label columns")
    g.add_argument("--dev", type=Path, help="CSV scored (accuracy) after each epoch")
    g.add_argument("--max-len", type=int, default=64, help="tokens kept per text")
    g = p.add_argument_group("distillation")
    g.add_argument("--temperature", type=float, default=2.0, help="softens both logits")
    g.add_argument("--w-label", type=float, default=1.0, help="cross-entropy on the labels")
    g.add_argument("--w-logits", type=float, default=1.0, help="KL to the teacher's logits")
    g.add_argument("--w-hidden", type=float, default=1.0, help="hidden-state MSE")
    g.add_argument("--w-attention", type=float, default=1.0, help="attention-map KL")
    cli.add_schedule_args(g, epochs=5, batch_size=32, lr=1e-3, warmup=50)
    cli.add_run_args(p.add_argument_group("run"), log_every=20, save_every=500)
    return p


class Distillation(nn.Module):
    """What is trained: the student and the hidden-state projections (checkpointed together)."""

    def __init__(self, student: nn.Module, hidden: distill.HiddenStateDistiller) -> None:
        super().__init__()
        self.student, self.hidden = student, hidden

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.student(ids)


def train(args: argparse.Namespace) -> dict[str, Any]:
    from attn_nlp import BPETokenizer, TextClassifier, create_model, save_pretrained

    cli.require_dir(args.teacher, "--teacher")
    cli.require_file(args.teacher / "tokenizer.json", "--teacher tokenizer")
    cli.require_file(args.train, "--train")
    cli.require_file(args.dev, "--dev")
    cli.require_positive(args, "max_len", "embed_dim", "depth", "heads", "temperature")
    cli.require_multiple(args, "embed_dim", "heads")
    teacher = create_model(args.teacher)
    if not isinstance(teacher, TextClassifier):
        raise ValueError(f"--teacher {args.teacher} is not a text classifier folder")
    tc = teacher.config
    if args.depth > tc.depth:
        raise ValueError(f"--depth {args.depth} is deeper than the teacher ({tc.depth})")
    tokenizer = BPETokenizer.from_file(args.teacher / "tokenizer.json")
    rows = at.read_labelled_csv(args.train)
    unknown = sorted({lab for _, lab in rows} - set(tc.labels))
    if unknown:
        raise ValueError(f"--train has labels the teacher does not know: {unknown}")
    run = at.start_run(args)  # checks the run flags; writes nothing yet
    device = run.d.device
    teacher.to(device).eval().requires_grad_(False)
    config = dataclasses.replace(
        tc, embed_dim=args.embed_dim, depth=args.depth, num_heads=args.heads,
        mlp_dim=4 * args.embed_dim, max_positions=args.max_len + 1,
    )  # fmt: skip
    layer_map = distill.uniform_layer_map(args.depth, tc.depth)
    hidden = distill.HiddenStateDistiller(args.embed_dim, tc.embed_dim, layer_map)
    model = Distillation(TextClassifier(config), hidden).to(device)
    data = at.LabelledTexts(rows, tokenizer, tc.labels, args.max_len)
    loader = at.make_loader(data, args.batch_size, run.d, seed=args.seed)
    dev_loader = None
    if args.dev is not None:
        rows = at.read_labelled_csv(args.dev)
        dev = at.LabelledTexts(rows, tokenizer, tc.labels, args.max_len, f"--dev {args.dev}: ")
        dev_loader = torch.utils.data.DataLoader(dev, batch_size=128, collate_fn=dev.collate)
    max_steps, epochs = at.plan_steps(len(loader), args.accum, args.epochs, args.max_steps)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    scheduler = at.lambda_lr(optimizer, at.cosine_schedule(args.warmup, max_steps))

    def loss_fn(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        wrapped = at.unwrap(model)
        with torch.no_grad():
            t_logits, t_hidden, t_attn = teacher(batch["ids"], return_layers=True)
        logits, hidden, attn = wrapped.student(batch["ids"], return_layers=True)
        loss = args.w_label * F.cross_entropy(logits.float(), batch["labels"])
        loss = loss + args.w_logits * distill.logit_distillation(logits, t_logits, args.temperature)
        loss = loss + args.w_hidden * wrapped.hidden(hidden, t_hidden)
        average = args.heads != tc.num_heads
        att = distill.attention_distillation(attn, t_attn, layer_map, average_heads=average)
        return loss + args.w_attention * att

    def dev() -> dict[str, float]:
        return {"accuracy": at.accuracy(model.student, dev_loader, device)}

    teacher_acc = at.accuracy(teacher, dev_loader, device) if dev_loader is not None else None
    params = [sum(p.numel() for p in m.parameters()) for m in (teacher, model.student)]
    start = {"teacher_params": params[0], "student_params": params[1], "layer_map": layer_map}
    loop = at.LoopConfig.from_args(
        args, max_steps, epochs, eval_event="dev", best_metric="accuracy",
        start={**start, "teacher_accuracy": teacher_acc},
    )  # fmt: skip
    result = at.fit(
        run,
        model,
        optimizer,
        scheduler,
        loader,
        loop,
        loss_fn=loss_fn,
        evaluate=dev if dev_loader is not None else None,
        write_files=lambda folder: save_pretrained(
            model.student, folder / "student", tokenizer=tokenizer
        ),
    )
    result.update(start, teacher_accuracy=teacher_acc)
    run.close(result)
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    return train(build_parser().parse_args(argv))


if __name__ == "__main__":
    cli.run_main(main)
