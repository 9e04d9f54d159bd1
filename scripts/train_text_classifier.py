r"""Train an attn_nlp.TextClassifier (Transformer encoder + pooling + head) on a CSV file.

    uv run scripts/train_text_classifier.py make-data data/reviews      # train.csv, dev.csv
    uv run scripts/train_text_classifier.py train --train data/reviews/train.csv \
        --dev data/reviews/dev.csv --out runs/reviews --epochs 5

The CSV has ``text`` and ``label`` columns (labels are any strings); a BPE vocabulary is
trained on the texts. Cross-entropy, AdamW with warm-up + cosine, the loop of
``attn_train.fit`` (autocast, accumulation, DDP, ``OUT/last`` with exact resume), dev
accuracy after each epoch (best kept in ``OUT/best``).

Exit codes: 0 done, 1 the loss became NaN / inf, 2 bad input (a missing or malformed CSV,
...: one ``error:`` line, nothing written), 130 Ctrl-C (the line names the last checkpoint;
the same command resumes from it).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import attn_core.cli  # noqa: F401  (first: Ctrl-C while torch loads -> one line, exit 130)
import attn_train as at
import torch
import torch.nn.functional as F
from attn_train import cli, synthetic


def build_parser() -> argparse.ArgumentParser:
    p = cli.make_parser(__doc__)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND", help="what to do")
    m = cli.add_subcommand(sub, "make-data", "write generated train.csv / dev.csv reviews")
    m.add_argument("out", type=Path, help="output folder")
    m.add_argument("--n-train", type=int, default=5000, help="training reviews")
    m.add_argument("--n-dev", type=int, default=500, help="dev reviews")
    m.add_argument("--seed", type=int, default=0, help="generator seed")

    t = cli.add_subcommand(
        sub,
        "train",
        "train (resumes from OUT/last when present)",
        "Train a Transformer-encoder text classifier on a CSV with 'text' and 'label' columns.\n"
        "Rerunning the same command resumes from OUT/last.",
    )
    t.add_argument("--train", type=Path, required=True, help="CSV with text,label columns")
    t.add_argument("--dev", type=Path, help="CSV scored (accuracy) after each epoch")
    t.add_argument("--vocab-size", type=int, default=2000, help="BPE vocabulary size")
    t.add_argument("--max-len", type=int, default=64, help="tokens kept per text")
    t.add_argument("--embed-dim", type=int, default=64, help="model width")
    t.add_argument("--depth", type=int, default=2, help="encoder blocks")
    t.add_argument("--heads", type=int, default=4, help="attention heads")
    t.add_argument(
        "--pool", default="cls", choices=["cls", "mean"], help="[cls] token or mean pooling"
    )
    t.add_argument("--dropout", type=float, default=0.1, help="dropout rate")
    cli.add_schedule_args(t, epochs=5, batch_size=32, lr=1e-3, warmup=50)
    cli.add_run_args(t, log_every=20, save_every=500)
    return p


def check_inputs(args: argparse.Namespace) -> None:
    """Every path and size a user can get wrong, before anything is built or written."""
    cli.require_file(args.train, "--train")
    cli.require_file(args.dev, "--dev")
    cli.require_positive(args, "max_len", "embed_dim", "depth", "heads", "vocab_size")
    cli.require_multiple(args, "embed_dim", "heads")


def train(args: argparse.Namespace) -> dict[str, Any]:
    from attn_nlp import BPETokenizer, ClassifierConfig, TextClassifier, save_pretrained

    check_inputs(args)
    run = at.start_run(args)  # checks the run flags; writes nothing yet
    rows = at.read_labelled_csv(args.train)
    dev_rows = at.read_labelled_csv(args.dev) if args.dev else None
    if run.resume:
        tokenizer = run.read_last("tokenizer.json", BPETokenizer.from_file)
    else:
        tokenizer = BPETokenizer.train([t for t, _ in rows], vocab_size=args.vocab_size)
    labels = sorted({lab for _, lab in rows})
    config = ClassifierConfig(
        vocab_size=tokenizer.vocab_size,
        num_classes=len(labels),
        embed_dim=args.embed_dim,
        depth=args.depth,
        num_heads=args.heads,
        mlp_dim=4 * args.embed_dim,
        max_positions=args.max_len + 1,
        pool=args.pool,
        dropout=args.dropout,
        pad_id=tokenizer.pad_id,
        labels=labels,
    )
    model = TextClassifier(config).to(run.d.device)
    data = at.LabelledTexts(rows, tokenizer, labels, args.max_len)
    loader = at.make_loader(data, args.batch_size, run.d, seed=args.seed)
    dev_loader = None
    if dev_rows is not None:
        dev = at.LabelledTexts(dev_rows, tokenizer, labels, args.max_len, f"--dev {args.dev}: ")
        dev_loader = torch.utils.data.DataLoader(dev, batch_size=128, collate_fn=dev.collate)
    max_steps, epochs = at.plan_steps(len(loader), args.accum, args.epochs, args.max_steps)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    scheduler = at.lambda_lr(optimizer, at.cosine_schedule(args.warmup, max_steps))

    def loss_fn(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return F.cross_entropy(model(batch["ids"]).float(), batch["labels"])

    def dev() -> dict[str, float]:
        return {"accuracy": at.accuracy(model, dev_loader, run.d.device)}

    config = at.LoopConfig.from_args(
        args,
        max_steps,
        epochs,
        eval_event="dev",
        best_metric="accuracy",
        start={"labels": labels, "vocab": tokenizer.vocab_size},
    )
    result = at.fit(
        run,
        model,
        optimizer,
        scheduler,
        loader,
        config,
        loss_fn=loss_fn,
        evaluate=dev if dev_loader is not None else None,
        write_files=lambda folder: save_pretrained(model, folder, tokenizer=tokenizer),
    )
    run.close(result)
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = build_parser().parse_args(argv)
    if args.command == "make-data":
        synthetic.write_reviews(args.out, args.n_train, args.n_dev, args.seed)
        print(f"wrote {args.n_train} training and {args.n_dev} dev reviews to {args.out}")
        return {}
    return train(args)


if __name__ == "__main__":
    cli.run_main(main)
