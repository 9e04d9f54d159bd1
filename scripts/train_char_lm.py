"""Train a character-level GPT (attn_nlp.DecoderOnlyLM) on any text file, then sample from it.

    uv run scripts/train_char_lm.py make-data data/rhymes.txt        # a generated toy text
    uv run scripts/train_char_lm.py train --text data/rhymes.txt --out runs/charlm --steps 2000
    uv run scripts/train_char_lm.py sample --model runs/charlm/last --prompt "the cat" \
        --max-new-tokens 200 --temperature 0.8 --top-k 10

The vocabulary is the file's set of characters (stored in ``config.json``). Training reads
random windows of ``--context + 1`` characters (window ``i`` of an epoch -- about one pass
over the text -- drawn from ``(seed, epoch, i)``, so a resumed run sees the same batches),
uses AdamW with warm-up + cosine decay and the loop of ``attn_train.fit`` (autocast,
gradient accumulation, DDP under torchrun, ``OUT/last`` saved atomically and resumed from).
The last 10% of the text is held out for a validation loss.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import attn_train as at
import torch
import torch.nn.functional as F
from attn_train import synthetic
from attn_train.cli import add_run_args, run_main


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


@torch.no_grad()
def val_loss(model, data: torch.Tensor, context: int, device, batches: int = 4) -> float:
    """Mean next-character loss on the same ``batches`` x 32 windows every time."""
    windows = at.RandomWindows(data, context, length=32 * batches, seed=1234)
    model.eval()
    total = 0.0
    for x, y in torch.utils.data.DataLoader(windows, batch_size=32):
        logits = model(x.to(device))
        total += F.cross_entropy(logits.flatten(0, 1), y.to(device).flatten()).item()
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
    t.add_argument("--eval-every", type=int, default=200)
    add_run_args(t, log_every=200, save_every=500)

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
    from attn_nlp import DecoderOnlyLM, LMConfig, create_model, save_pretrained

    run = at.start_run(args)
    text = args.text.read_text(encoding="utf-8")
    if len(text) < 10 * (args.context + 1):
        raise ValueError(f"{args.text} is too short for --context {args.context}")
    if run.resume:
        chars = create_model(at.find_checkpoint(run.last)).config.extra["chars"]
    else:
        chars = sorted(set(text))
    vocab = CharVocab(chars)
    data = torch.tensor(vocab.encode(text), dtype=torch.long)
    split = int(0.9 * len(data))
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
    model = DecoderOnlyLM(config).to(run.d.device)
    # an epoch: about one pass over the text, in whole updates
    per_update = args.batch_size * args.accum * run.d.world_size
    steps_per_epoch = max(1, split // (args.context * per_update))
    windows = at.RandomWindows(data[:split], args.context, steps_per_epoch * per_update, args.seed)
    loader = at.make_loader(windows, args.batch_size, run.d, shuffle=False, seed=args.seed)
    groups = at.param_groups(model, args.weight_decay, no_weight_decay=[])  # decay 2-d only
    optimizer = torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95))
    scheduler = at.lambda_lr(optimizer, at.cosine_schedule(args.warmup, args.steps, floor=0.1))

    def loss_fn(model: torch.nn.Module, batch: list[torch.Tensor]) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(model(x).float().flatten(0, 1), y.flatten())

    def evaluate() -> dict[str, float]:
        return {"val_loss": val_loss(model, data[split:], args.context, run.d.device)}

    config = at.LoopConfig.from_args(
        args,
        args.steps,
        -(-args.steps // steps_per_epoch),
        grad_clip=args.clip,
        eval_every=args.eval_every,
        eval_each_epoch=False,
        start={"chars": len(chars), "text": len(text)},
    )
    result = at.fit(
        run,
        model,
        optimizer,
        scheduler,
        loader,
        config,
        loss_fn=loss_fn,
        evaluate=evaluate,
        write_files=lambda folder: save_pretrained(model, folder),
    )
    if run.d.is_main:
        torch.manual_seed(args.seed)
        prompt = text[: min(8, args.context // 2)]
        n = min(120, args.context - len(prompt))
        result["sample"] = sample(model.eval(), vocab, prompt, max_new_tokens=n, temperature=0.8)
    run.close(result)
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = build_parser().parse_args(argv)
    if args.command == "make-data":
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(synthetic.rhymes(args.lines, args.seed), encoding="utf-8")
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
    run_main(main)
