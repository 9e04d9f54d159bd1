"""Train a character-level GPT (attn_nlp.DecoderOnlyLM) on any text file, then sample from it.

    uv run scripts/train_char_lm.py make-data data/rhymes.txt        # a generated toy text
    uv run scripts/train_char_lm.py train --text data/rhymes.txt --out runs/charlm --steps 2000
    uv run scripts/train_char_lm.py sample --model runs/charlm/last --prompt "the cat" \
        --max-new-tokens 200 --temperature 0.8 --top-k 10

The vocabulary is the file's set of characters (stored in ``config.json``). Training reads
random windows of ``--context + 1`` characters (drawn from ``(seed, step)``, so a resumed
run sees the same batches), uses AdamW with warm-up + cosine decay, autocast, gradient
accumulation and DDP under torchrun; ``OUT/last`` is saved atomically and resumed from.
The last 10% of the text is held out for a validation loss.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import train_utils as tu  # noqa: E402

ANIMALS = "cat dog bird fox frog mouse horse goat duck bee".split()
PLACES = "the hill|the river|the old mill|the garden|the wood|the town".split("|")
VERBS = "ran to|sat by|sang near|hid in|looked at|walked past".split("|")


def make_text(n_lines: int, seed: int = 0) -> str:
    """Toy nursery-rhyme lines with a small grammar, e.g. 'the fox ran to the hill.'"""
    rng = random.Random(seed)
    lines = []
    for _ in range(n_lines):
        a, b = rng.sample(ANIMALS, 2)
        lines.append(f"the {a} {rng.choice(VERBS)} {rng.choice(PLACES)} with the {b}.")
    return "\n".join(lines) + "\n"


class CharVocab:
    """Characters <-> ids."""

    def __init__(self, chars: list[str]) -> None:
        self.chars = chars
        self.index = {c: i for i, c in enumerate(chars)}

    def encode(self, text: str) -> list[int]:
        unknown = sorted(set(text) - self.index.keys())
        if unknown:
            raise ValueError(f"characters not in the model's vocabulary: {unknown}")
        return [self.index[c] for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(self.chars[i] for i in ids)


def windows(data: torch.Tensor, batch: int, context: int, gen: torch.Generator) -> tuple:
    """``batch`` random windows: inputs ``(B, T)`` and next-character targets ``(B, T)``."""
    starts = torch.randint(0, len(data) - context - 1, (batch,), generator=gen)
    chunk = torch.stack([data[s : s + context + 1] for s in starts.tolist()])
    return chunk[:, :-1], chunk[:, 1:]


@torch.no_grad()
def val_loss(model, data: torch.Tensor, context: int, device, batches: int = 4) -> float:
    gen = torch.Generator().manual_seed(1234)  # the same windows every time
    model.eval()
    total = 0.0
    for _ in range(batches):
        x, y = windows(data, 32, context, gen)
        logits = model(x.to(device))
        total += F.cross_entropy(logits.flatten(0, 1), y.to(device).flatten()).item()
    model.train()
    return total / batches


def sample(model, vocab: CharVocab, prompt: str, **generation: Any) -> str:
    ids = torch.tensor([vocab.encode(prompt)], device=next(model.parameters()).device)
    out = model.generate(ids, **generation)
    return vocab.decode(out[0].tolist())


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    m = sub.add_parser("make-data", help="write a generated toy text")
    m.add_argument("out", type=Path)
    m.add_argument("--lines", type=int, default=5000)
    m.add_argument("--seed", type=int, default=0)

    t = sub.add_parser("train", help="train (resumes from OUT/last when present)")
    t.add_argument("--text", type=Path, required=True)
    t.add_argument("--out", type=Path, required=True)
    t.add_argument("--context", type=int, default=128)
    t.add_argument("--embed-dim", type=int, default=128)
    t.add_argument("--depth", type=int, default=4)
    t.add_argument("--heads", type=int, default=4)
    t.add_argument("--pos-embed", default="rope", choices=["rope", "learned"])
    t.add_argument("--dropout", type=float, default=0.1)
    t.add_argument("--steps", type=int, default=2000)
    t.add_argument("--batch-size", type=int, default=32)
    t.add_argument("--accum", type=int, default=1)
    t.add_argument("--lr", type=float, default=3e-3)
    t.add_argument("--warmup", type=int, default=100)
    t.add_argument("--weight-decay", type=float, default=0.1)
    t.add_argument("--clip", type=float, default=1.0)
    t.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16", "fp16"])
    t.add_argument("--eval-every", type=int, default=200)
    t.add_argument("--save-every", type=int, default=500)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--device", default=None)
    t.add_argument("--threads", type=int, default=None)
    t.add_argument("--no-resume", action="store_true")
    t.add_argument("--quiet", action="store_true")

    s = sub.add_parser("sample", help="generate text from a checkpoint")
    s.add_argument("--model", type=Path, required=True)
    s.add_argument("--prompt", default="\n")
    s.add_argument("--max-new-tokens", type=int, default=200)
    s.add_argument("--temperature", type=float, default=0.8)
    s.add_argument("--top-k", type=int, default=None)
    s.add_argument("--top-p", type=float, default=1.0)
    s.add_argument("--seed", type=int, default=0)
    return p


def train(args: argparse.Namespace) -> dict[str, Any]:
    from attn_nlp import DecoderOnlyLM, LMConfig, save_pretrained

    d, precision, log, last, resume = tu.start_run(args)
    text = args.text.read_text(encoding="utf-8")
    if len(text) < 10 * (args.context + 1):
        raise ValueError(f"{args.text} is too short for --context {args.context}")
    if resume:
        from attn_nlp import create_model

        chars = create_model(tu.find_checkpoint(last)).config.extra["chars"]
    else:
        chars = sorted(set(text))
    vocab = CharVocab(chars)
    data = torch.tensor(vocab.encode(text), dtype=torch.long)
    split = int(0.9 * len(data))
    train_data, val_data = data[:split], data[split:]

    config = LMConfig(
        vocab_size=len(chars),
        embed_dim=args.embed_dim,
        depth=args.depth,
        num_heads=args.heads,
        max_positions=args.context,
        pos_embed=args.pos_embed,
        dropout=args.dropout,
        extra={"chars": chars},
    )
    model = DecoderOnlyLM(config).to(d.device)
    ddp_model = tu.wrap_ddp(model, d)
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    optimizer = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": args.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=args.lr,
        betas=(0.9, 0.95),
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, tu.cosine_schedule(args.warmup, args.steps, floor=0.1)
    )
    scaler = tu.make_scaler(d.device, precision)
    progress = {"step": 0, "seed": args.seed}
    if resume:
        progress = tu.load_checkpoint(
            last, d, model=model, optimizer=optimizer, scheduler=scheduler, scaler=scaler
        )
        log.log({"event": "resume", **progress})
    else:
        log.log(
            {
                "event": "start",
                "chars": len(chars),
                "text": len(text),
                "params": sum(p.numel() for p in model.parameters()),
            }
        )

    def save() -> None:
        tu.save_checkpoint(
            last,
            d,
            model=model,
            optimizer=optimizer,
            scheduler=scheduler,
            scaler=scaler,
            progress=progress,
            write_files=lambda tmp: save_pretrained(model, tmp),
        )

    bar = None
    if d.is_main and not args.quiet:
        from tqdm import tqdm

        bar = tqdm(total=args.steps, initial=progress["step"], desc="train")
    losses: list[float] = []
    ddp_model.train()
    while progress["step"] < args.steps:
        step = progress["step"]
        total = 0.0
        for micro in range(args.accum):
            gen = torch.Generator().manual_seed(
                ((args.seed * 1000 + d.rank) * 100_003 + step) * 97 + micro
            )
            x, y = windows(train_data, args.batch_size, args.context, gen)
            with (
                tu.maybe_no_sync(ddp_model, micro == args.accum - 1),
                tu.autocast(d.device, precision),
            ):
                logits = ddp_model(x.to(d.device))
                loss = F.cross_entropy(logits.float().flatten(0, 1), y.to(d.device).flatten())
            scaler.scale(loss / args.accum).backward()
            total += loss.item() / args.accum
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        scheduler.step()
        progress["step"] += 1
        losses.append(tu.all_reduce_mean(total, d))
        if bar is not None:
            bar.update(1)
            bar.set_postfix(loss=f"{losses[-1]:.3f}")
        step = progress["step"]
        if step % args.eval_every == 0 or step == args.steps:
            record = {"step": step, "loss": losses[-1], "lr": scheduler.get_last_lr()[0]}
            if d.is_main:
                record["val_loss"] = val_loss(model, val_data, args.context, d.device)
            log.log(record, echo=bar is None)
        if step % args.save_every == 0 or step == args.steps:
            save()
    if bar is not None:
        bar.close()
    result: dict[str, Any] = {"step": progress["step"]}
    if losses:
        k = max(1, min(10, len(losses) // 4))
        result.update(first_loss=sum(losses[:k]) / k, last_loss=sum(losses[-k:]) / k)
    if d.is_main:
        torch.manual_seed(args.seed)
        prompt = text[: min(8, args.context // 2)]
        result["sample"] = sample(
            model.eval(),
            vocab,
            prompt,
            max_new_tokens=min(120, args.context - len(prompt)),
            temperature=0.8,
        )
        log.log({"event": "done", **result})
    tu.cleanup_distributed()
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = build_parser().parse_args(argv)
    if args.command == "make-data":
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(make_text(args.lines, args.seed), encoding="utf-8")
        print(f"wrote {args.lines} lines to {args.out}")
        return {}
    if args.command == "sample":
        from attn_nlp import create_model

        model = create_model(args.model)
        vocab = CharVocab(model.config.extra["chars"])
        torch.manual_seed(args.seed)
        n = min(args.max_new_tokens, model.config.max_positions - len(args.prompt))
        text = sample(
            model,
            vocab,
            args.prompt,
            max_new_tokens=n,
            temperature=args.temperature,
            top_k=args.top_k,
            top_p=args.top_p,
        )
        print(text)
        return {"sample": text}
    return train(args)


if __name__ == "__main__":
    main()
