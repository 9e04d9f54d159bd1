"""Train an attn_nlp.TextClassifier (Transformer encoder + pooling + head) on a CSV file.

    uv run scripts/train_text_classifier.py make-data data/reviews      # train.csv, dev.csv
    uv run scripts/train_text_classifier.py train --train data/reviews/train.csv \
        --dev data/reviews/dev.csv --out runs/reviews --epochs 5

The CSV has a header with ``text`` and ``label`` columns (labels are any strings). A BPE
vocabulary is trained on the texts with ``tokenizers``. Cross-entropy, AdamW with warm-up +
cosine decay, autocast, gradient accumulation, torchrun DDP, atomic ``OUT/last`` checkpoints
with exact resume, dev accuracy after each epoch (best kept in ``OUT/best``), JSONL log.
"""

from __future__ import annotations

import argparse
import csv
import random
import sys
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import train_utils as tu  # noqa: E402

GOOD = "great wonderful delightful brilliant moving charming superb fun".split()
BAD = "awful boring dull clumsy tedious bland painful messy".split()
THINGS = "film story acting music ending plot cast script".split()


def make_review(rng: random.Random) -> tuple[str, str]:
    """'the plot was not dull but the music was great' -> pos. Negation flips a clause."""
    clauses, score = [], 0
    for _ in range(rng.randint(1, 3)):
        good = rng.random() < 0.5
        negated = rng.random() < 0.3
        word = rng.choice(GOOD if good else BAD)
        clauses.append(f"the {rng.choice(THINGS)} was {'not ' if negated else ''}{word}")
        score += 1 if good != negated else -1
    if score == 0:  # break ties with a final verdict
        verdict = rng.random() < 0.5
        clauses.append("overall i " + ("loved it" if verdict else "hated it"))
        score = 1 if verdict else -1
    return " but ".join(clauses), "pos" if score > 0 else "neg"


def make_data(out: Path, n_train: int, n_dev: int, seed: int) -> None:
    rng = random.Random(seed)
    out.mkdir(parents=True, exist_ok=True)
    for name, n in (("train.csv", n_train), ("dev.csv", n_dev)):
        with (out / name).open("w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f)
            writer.writerow(["text", "label"])
            writer.writerows(make_review(rng) for _ in range(n))
    print(f"wrote {n_train} training and {n_dev} dev reviews to {out}")


def read_csv(path: Path) -> list[tuple[str, str]]:
    with path.open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        if reader.fieldnames is None or not {"text", "label"} <= set(reader.fieldnames):
            raise ValueError(f"{path}: needs a header with 'text' and 'label' columns")
        rows = []
        for i, row in enumerate(reader, 2):
            if not (row["text"] or "").strip() or not (row["label"] or "").strip():
                raise ValueError(f"{path}:{i}: empty text or label")
            rows.append((row["text"].strip(), row["label"].strip()))
    if not rows:
        raise ValueError(f"{path} has no rows")
    return rows


class Encoded(torch.utils.data.Dataset):
    def __init__(self, rows, tokenizer, labels: list[str], max_len: int) -> None:
        index = {label: i for i, label in enumerate(labels)}
        unknown = sorted({lab for _, lab in rows} - index.keys())
        if unknown:
            raise ValueError(f"labels not seen in training: {unknown}")
        ids = tokenizer.encode_target([t for t, _ in rows])
        self.items = [
            (x[:max_len] or [tokenizer.unk_id], index[lab])
            for x, (_, lab) in zip(ids, rows, strict=True)
        ]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int):
        return self.items[i]


def collate(batch, pad: int) -> dict[str, torch.Tensor]:
    ids = torch.full((len(batch), max(len(x) for x, _ in batch)), pad, dtype=torch.long)
    for i, (x, _) in enumerate(batch):
        ids[i, : len(x)] = torch.tensor(x)
    return {"ids": ids, "labels": torch.tensor([y for _, y in batch])}


@torch.no_grad()
def accuracy(model, loader, device) -> float:
    model.eval()
    right = total = 0
    for batch in loader:
        pred = model(batch["ids"].to(device)).argmax(-1).cpu()
        right += int((pred == batch["labels"]).sum())
        total += len(pred)
    model.train()
    return right / max(1, total)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    m = sub.add_parser("make-data", help="write generated train.csv / dev.csv")
    m.add_argument("out", type=Path)
    m.add_argument("--n-train", type=int, default=5000)
    m.add_argument("--n-dev", type=int, default=500)
    m.add_argument("--seed", type=int, default=0)

    t = sub.add_parser("train", help="train (resumes from OUT/last when present)")
    t.add_argument("--train", type=Path, required=True)
    t.add_argument("--dev", type=Path)
    t.add_argument("--out", type=Path, required=True)
    t.add_argument("--vocab-size", type=int, default=2000)
    t.add_argument("--max-len", type=int, default=64)
    t.add_argument("--embed-dim", type=int, default=64)
    t.add_argument("--depth", type=int, default=2)
    t.add_argument("--heads", type=int, default=4)
    t.add_argument("--pool", default="cls", choices=["cls", "mean"])
    t.add_argument("--dropout", type=float, default=0.1)
    t.add_argument("--epochs", type=int, default=5)
    t.add_argument("--max-steps", type=int, default=None)
    t.add_argument("--batch-size", type=int, default=32)
    t.add_argument("--accum", type=int, default=1)
    t.add_argument("--lr", type=float, default=1e-3)
    t.add_argument("--warmup", type=int, default=50)
    t.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16", "fp16"])
    t.add_argument("--log-every", type=int, default=20)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--device", default=None)
    t.add_argument("--threads", type=int, default=None)
    t.add_argument("--no-resume", action="store_true")
    return p


def train(args: argparse.Namespace) -> dict[str, Any]:
    from attn_nlp import BPETokenizer, ClassifierConfig, TextClassifier, save_pretrained

    d, precision, log, last, resume = tu.start_run(args)
    rows = read_csv(args.train)
    if resume:
        tokenizer = BPETokenizer.from_file(tu.find_checkpoint(last) / "tokenizer.json")
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
    model = TextClassifier(config).to(d.device)
    ddp_model = tu.wrap_ddp(model, d)
    data = Encoded(rows, tokenizer, labels, args.max_len)
    loader, sampler = tu.make_loader(
        data, args.batch_size, d, seed=args.seed, collate_fn=lambda b: collate(b, tokenizer.pad_id)
    )
    dev_loader = None
    if args.dev:
        dev = Encoded(read_csv(args.dev), tokenizer, labels, args.max_len)
        dev_loader = torch.utils.data.DataLoader(
            dev, batch_size=128, collate_fn=lambda b: collate(b, tokenizer.pad_id)
        )
    max_steps = args.max_steps or args.epochs * len(loader) // args.accum
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, tu.cosine_schedule(args.warmup, max_steps)
    )
    scaler = tu.make_scaler(d.device, precision)
    progress = {"step": 0, "epoch": 0, "batches": 0, "best_acc": -1.0, "seed": args.seed}
    if resume:
        progress = tu.load_checkpoint(
            last, d, model=model, optimizer=optimizer, scheduler=scheduler, scaler=scaler
        )
        log.log({"event": "resume", **progress})
    else:
        log.log(
            {"event": "start", "rows": len(rows), "labels": labels, "vocab": tokenizer.vocab_size}
        )

    def save(name: str) -> None:
        tu.save_checkpoint(
            args.out / name,
            d,
            model=model,
            optimizer=optimizer,
            scheduler=scheduler,
            scaler=scaler,
            progress=progress,
            write_files=lambda tmp: save_pretrained(model, tmp, tokenizer=tokenizer),
        )

    losses: list[float] = []
    result: dict[str, Any] = {}
    done = progress["step"] >= max_steps
    while not done and progress["epoch"] < args.epochs:
        sampler.set_epoch(progress["epoch"])
        sampler.skip(progress["batches"] * args.batch_size)
        optimizer.zero_grad(set_to_none=True)
        ddp_model.train()
        running, micro = 0.0, 0
        stopped = False
        for batch in loader:
            if progress["step"] >= max_steps:
                stopped = True
                break
            micro += 1
            sync = micro % args.accum == 0
            with tu.maybe_no_sync(ddp_model, sync), tu.autocast(d.device, precision):
                logits = ddp_model(batch["ids"].to(d.device))
                loss = F.cross_entropy(logits.float(), batch["labels"].to(d.device))
            scaler.scale(loss / args.accum).backward()
            running += loss.item() / args.accum
            progress["batches"] += 1
            if not sync:
                continue
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            scheduler.step()
            progress["step"] += 1
            losses.append(tu.all_reduce_mean(running, d))
            running = 0.0
            if progress["step"] % args.log_every == 0:
                log.log(
                    {"step": progress["step"], "loss": losses[-1], "lr": scheduler.get_last_lr()[0]}
                )
        if not stopped:  # a full epoch: the next one starts from its first batch
            progress["epoch"] += 1
            progress["batches"] = 0
        done = progress["step"] >= max_steps
        better = False
        if dev_loader is not None and d.is_main:
            acc = accuracy(model, dev_loader, d.device)
            result["dev_accuracy"] = acc
            log.log(
                {
                    "event": "dev",
                    "epoch": progress["epoch"],
                    "step": progress["step"],
                    "accuracy": acc,
                }
            )
            better = acc > progress["best_acc"]
            progress["best_acc"] = max(progress["best_acc"], acc)
        if tu.all_reduce_mean(float(better), d) > 0:
            save("best")
        save("last")
    tu.cleanup_distributed()
    if losses:
        k = max(1, min(5, len(losses) // 4))
        result.update(first_loss=sum(losses[:k]) / k, last_loss=sum(losses[-k:]) / k)
    result["step"] = progress["step"]
    log.log({"event": "done", **result})
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = build_parser().parse_args(argv)
    if args.command == "make-data":
        make_data(args.out, args.n_train, args.n_dev, args.seed)
        return {}
    return train(args)


if __name__ == "__main__":
    main()
