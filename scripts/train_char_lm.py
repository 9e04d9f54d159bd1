r"""Train a character-level GPT (attn_nlp.DecoderOnlyLM) on any text file, then sample from it.

    uv run scripts/train_char_lm.py make-data data/rhymes.txt        # a generated toy text
    uv run scripts/train_char_lm.py train --text data/rhymes.txt --out runs/charlm --steps 2000
    uv run scripts/train_char_lm.py sample --model runs/charlm/last --prompt "the cat" \
        --max-new-tokens 200 --temperature 0.8 --top-k 10

The vocabulary is the file's characters (kept in ``config.json``). Training reads random
windows of ``--context + 1`` characters (drawn from ``(seed, epoch, i)``: a resumed run sees
the same batches) with AdamW, warm-up + cosine and the loop of ``attn_train.fit``
(``OUT/last`` saved atomically, resumed from); the last 10% of the text gives a val loss.

Exit codes: 0 done, 1 the loss became NaN / inf, 2 bad input (a missing or too short text,
a missing model folder, ...: one ``error:`` line, nothing written), 130 Ctrl-C (the line
names the last checkpoint; the same command resumes from it).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import attn_core.cli  # noqa: F401  (first: Ctrl-C while torch loads -> one line, exit 130)
import attn_train as at
import torch
import torch.nn.functional as F
from attn_train import cli, synthetic


def sample(model, vocab: at.CharVocab, prompt: str, **generation: Any) -> str:
    """``prompt`` and the characters the model generates after it."""
    ids = torch.tensor([vocab.encode(prompt)], device=next(model.parameters()).device)
    out = model.generate(ids, **generation)
    return vocab.decode(out[0].tolist())


def read_chars(config_json: Path) -> list[str]:
    """The character set saved in a checkpoint's ``config.json``."""
    return json.loads(config_json.read_text(encoding="utf-8"))["extra"]["chars"]


def build_parser() -> argparse.ArgumentParser:
    p = cli.make_parser(__doc__)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND", help="what to do")
    m = cli.add_subcommand(sub, "make-data", "write a generated toy text (rhymes)")
    m.add_argument("out", type=Path, help="output text file")
    m.add_argument("--lines", type=int, default=5000, help="lines of text")
    m.add_argument("--seed", type=int, default=0, help="generator seed")

    t = cli.add_subcommand(
        sub,
        "train",
        "train (resumes from OUT/last when present)",
        "Train a character-level GPT on a UTF-8 text file.\n"
        "Rerunning the same command resumes from OUT/last.",
    )
    t.add_argument("--text", type=Path, required=True, help="UTF-8 text file to learn")
    t.add_argument("--context", type=int, default=128, help="characters per training window")
    t.add_argument("--embed-dim", type=int, default=128, help="model width")
    t.add_argument("--depth", type=int, default=4, help="decoder blocks")
    t.add_argument("--heads", type=int, default=4, help="attention heads")
    t.add_argument(
        "--pos-embed", default="rope", choices=["rope", "learned"], help="position encoding"
    )
    t.add_argument("--dropout", type=float, default=0.1, help="dropout rate")
    t.add_argument("--steps", type=int, default=2000, help="total updates")
    t.add_argument("--batch-size", type=int, default=32, help="per process and micro-step")
    t.add_argument("--accum", type=int, default=1, help="micro-steps per update")
    t.add_argument("--lr", type=float, default=3e-3, help="peak learning rate")
    t.add_argument("--warmup", type=int, default=100, help="warm-up updates")
    t.add_argument("--weight-decay", type=float, default=0.1, help="AdamW weight decay")
    t.add_argument("--clip", type=float, default=1.0, help="max gradient norm")
    t.add_argument("--eval-every", type=int, default=200, help="updates between val losses")
    cli.add_run_args(t, log_every=200, save_every=500)

    s = cli.add_subcommand(sub, "sample", "generate text from a checkpoint")
    s.add_argument("--model", type=Path, required=True, help="a checkpoint folder (OUT/last)")
    s.add_argument("--prompt", default="\n", help="text to continue (default: a newline)")
    s.add_argument("--max-new-tokens", type=int, default=200, help="characters to generate")
    s.add_argument("--temperature", type=float, default=0.8, help="sampling temperature")
    s.add_argument("--top-k", type=int, default=None, help="sample from the k likeliest only")
    s.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass")
    s.add_argument("--seed", type=int, default=0, help="sampling seed")
    return p


def train(args: argparse.Namespace) -> dict[str, Any]:
    from attn_nlp import DecoderOnlyLM, LMConfig, save_pretrained

    cli.require_positive(args, "context", "embed_dim", "depth", "heads")
    cli.require_multiple(args, "embed_dim", "heads")
    text = cli.read_text_file(args.text, "--text")
    if len(text) < 10 * (args.context + 1):
        raise ValueError(f"--text {args.text} is too short for --context {args.context}")
    run = at.start_run(args)  # checks the run flags; writes nothing yet
    chars = run.read_last("config.json", read_chars) if run.resume else sorted(set(text))
    vocab = at.CharVocab(chars)
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
        return {"val_loss": at.next_token_loss(model, data[split:], args.context, run.d.device)}

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

        cli.require_dir(args.model, "--model")
        if not args.prompt:
            raise ValueError("--prompt must not be empty")
        model = create_model(args.model)
        if "chars" not in getattr(model.config, "extra", {}):
            raise ValueError(f"--model {args.model} is not a character LM (no character set)")
        vocab = at.CharVocab(model.config.extra["chars"])
        torch.manual_seed(args.seed)
        n = min(args.max_new_tokens, model.config.max_positions - len(args.prompt))
        if n < 1:
            context = model.config.max_positions
            raise ValueError(f"--prompt is {len(args.prompt)} characters; the context is {context}")
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
    cli.run_main(main)
