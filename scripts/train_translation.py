r"""Train an attn-nlp encoder-decoder Transformer on a TSV parallel corpus.

    # a generated English-number-words -> Chinese-numerals corpus (train.tsv, dev.tsv)
    uv run scripts/train_translation.py make-data numbers data/numbers
    # train (single process; or `torchrun --nproc-per-node 2 scripts/train_translation.py ...`)
    uv run scripts/train_translation.py train --train data/numbers/train.tsv \
        --dev data/numbers/dev.tsv --out runs/numbers --epochs 4
    uv run apps/translate.py --model runs/numbers/best "three hundred and five"

Each TSV line is ``source<TAB>target``; a shared BPE vocabulary is trained on both sides
(or ``--tokenizer tokenizer.json``). Label-smoothed cross-entropy, Adam with inverse-sqrt
warm-up, the loop of ``attn_train.fit`` (autocast, accumulation, DDP, ``OUT/last`` with
exact resume); after each epoch the dev set is scored with sacrebleu (BLEU, chrF, exact
match), the best by BLEU kept in ``OUT/best``.

Exit codes: 0 done, 1 the loss became NaN / inf, 2 bad input (a missing file, an unknown
preset or ``--set`` key, ...: one ``error:`` line, nothing written), 130 Ctrl-C (the line
names the last checkpoint; the same command resumes from it).
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
from attn_train import cli, synthetic


def build_parser() -> argparse.ArgumentParser:
    p = cli.make_parser(__doc__)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND", help="what to do")
    m = cli.add_subcommand(sub, "make-data", "write a generated parallel corpus (train/dev.tsv)")
    m.add_argument("kind", choices=["numbers", "dates"], help="which generated task")
    m.add_argument("out", type=Path, help="output folder")
    m.add_argument("--n-train", type=int, default=20000, help="training pairs")
    m.add_argument("--n-dev", type=int, default=500, help="dev pairs")
    m.add_argument("--seed", type=int, default=0, help="generator seed")

    t = cli.add_subcommand(
        sub,
        "train",
        "train (resumes from OUT/last when present)",
        "Train an encoder-decoder Transformer on a TSV parallel corpus.\n"
        "Rerunning the same command resumes from OUT/last.",
    )
    t.add_argument("--train", type=Path, required=True, help="TSV: source<TAB>target")
    t.add_argument("--dev", type=Path, help="TSV dev set scored after each epoch")
    t.add_argument("--tokenizer", type=Path, help="tokenizer.json to reuse (default: train BPE)")
    t.add_argument("--vocab-size", type=int, default=2000, help="BPE vocabulary size")
    t.add_argument("--preset", default="transformer-tiny", help="attn_nlp Transformer preset")
    t.add_argument(
        "--set", nargs="*", default=[], metavar="KEY=VALUE", help="config overrides: embed_dim=256"
    )
    t.add_argument("--max-len", type=int, default=64, help="truncate longer sequences")
    cli.add_schedule_args(t, epochs=10, batch_size=64, lr=1e-3, warmup=400)
    t.add_argument("--label-smoothing", type=float, default=0.1, help="cross-entropy smoothing")
    t.add_argument("--clip", type=float, default=1.0, help="max gradient norm")
    t.add_argument("--beams", type=int, default=4, help="beam size for dev decoding")
    t.add_argument("--dev-limit", type=int, default=500, help="dev pairs scored per epoch")
    cli.add_run_args(t, log_every=50, save_every=500)
    return p


def check_inputs(args: argparse.Namespace) -> dict[str, Any]:
    """Check the paths and ``--set`` before anything is built or written; the overrides."""
    from attn_nlp import TransformerConfig, get_config

    cli.require_file(args.train, "--train")
    cli.require_file(args.dev, "--dev")
    cli.require_file(args.tokenizer, "--tokenizer")
    cli.require_positive(args, "max_len", "beams")
    get_config(args.preset)  # ValueError naming the presets
    known = [f.name for f in dataclasses.fields(TransformerConfig)]
    return cli.parse_overrides(args.set, known=known)


def train(args: argparse.Namespace) -> dict[str, Any]:
    import attn_nlp
    from attn_nlp import BPETokenizer, Transformer, get_config, save_pretrained

    overrides = check_inputs(args)
    run = at.start_run(args)  # checks the run flags; writes nothing yet
    pairs = at.read_tsv(args.train)
    dev_pairs = at.read_tsv(args.dev)[: args.dev_limit] if args.dev else []
    if run.resume:
        tokenizer = run.read_last("tokenizer.json", BPETokenizer.from_file)
    elif args.tokenizer:
        try:
            tokenizer = BPETokenizer.from_file(args.tokenizer)
        except Exception as e:  # tokenizers raises a bare Exception
            raise ValueError(f"--tokenizer {args.tokenizer}: not a tokenizer.json ({e})") from None
    else:
        texts = [s for s, _ in pairs] + [t for _, t in pairs]
        tokenizer = BPETokenizer.train(texts, vocab_size=args.vocab_size)
    pad = tokenizer.pad_id
    ids = dict(pad_id=pad, bos_id=tokenizer.bos_id, eos_id=tokenizer.eos_id)
    fixed = dict(src_vocab_size=tokenizer.vocab_size, max_positions=max(args.max_len, 8), **ids)
    try:
        config = get_config(args.preset, **{**fixed, **overrides})  # --set wins
        model = Transformer(config).to(run.d.device)
    except (TypeError, ValueError, AssertionError) as e:  # e.g. embed_dim % num_heads != 0
        raise ValueError(f"cannot build {args.preset} with --set {args.set}: {e}") from None
    model.generation_config = model.generation_config.update(
        num_beams=args.beams, max_length=config.max_positions
    )
    data = at.TranslationPairs(pairs, tokenizer, config.max_positions)
    loader = at.make_loader(data, args.batch_size, run.d, seed=args.seed)
    max_steps, epochs = at.plan_steps(len(loader), args.accum, args.epochs, args.max_steps)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr, betas=(0.9, 0.98), eps=1e-9)
    scheduler = at.lambda_lr(optimizer, at.inverse_sqrt_schedule(args.warmup))

    def loss_fn(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        logits = model(batch["src"], batch["tgt_in"])
        return F.cross_entropy(
            logits.float().flatten(0, 1),
            batch["labels"].flatten(),
            ignore_index=pad,
            label_smoothing=args.label_smoothing,
        )

    def dev() -> dict[str, Any]:
        translator = attn_nlp.Translator(model.eval(), tokenizer, device=str(run.d.device))
        return attn_nlp.evaluate_translation(translator, dev_pairs, beams=args.beams)

    config = at.LoopConfig.from_args(
        args,
        max_steps,
        epochs,
        grad_clip=args.clip,
        eval_event="dev",
        best_metric="bleu",
        start={"pairs": len(data), "vocab": tokenizer.vocab_size},
    )
    result = at.fit(
        run,
        model,
        optimizer,
        scheduler,
        loader,
        config,
        loss_fn=loss_fn,
        evaluate=dev if dev_pairs else None,
        write_files=lambda folder: save_pretrained(model, folder, tokenizer=tokenizer),
    )
    run.close(result)
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = build_parser().parse_args(argv)
    if args.command == "make-data":
        synthetic.write_translation_corpus(args.kind, args.out, args.n_train, args.n_dev, args.seed)
        print(f"wrote {args.n_train} training and {args.n_dev} dev pairs to {args.out}")
        return {}
    return train(args)


if __name__ == "__main__":
    cli.run_main(main)
