"""Train an attn-nlp encoder-decoder Transformer on a TSV parallel corpus.

    # a generated English-number-words -> Chinese-numerals corpus (train.tsv, dev.tsv)
    uv run scripts/train_translation.py make-data numbers data/numbers
    # train (single process; or `torchrun --nproc-per-node 2 scripts/train_translation.py ...`)
    uv run scripts/train_translation.py train --train data/numbers/train.tsv \
        --dev data/numbers/dev.tsv --out runs/numbers --epochs 4
    uv run apps/translate.py --model runs/numbers/best "three hundred and five"

Each TSV line is ``source<TAB>target``. A shared BPE vocabulary is trained on both sides
with the ``tokenizers`` library (or ``--tokenizer tokenizer.json``). Training uses
label-smoothed cross-entropy, Adam with inverse-sqrt warm-up, bf16/fp16 autocast,
gradient accumulation and DDP under torchrun; ``OUT/last`` is written atomically every
``--save-every`` steps and each epoch, and a rerun resumes from it exactly. After each
epoch the dev set is translated and scored with sacrebleu (BLEU, chrF, exact match);
the best checkpoint by BLEU is kept in ``OUT/best``. Logs: console + ``OUT/log.jsonl``.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import zlib
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import train_utils as tu  # noqa: E402

# -- generated corpora -------------------------------------------------------------------

ONES = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen "
    "fourteen fifteen sixteen seventeen eighteen nineteen"
).split()
TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()
ZH_DIGITS = "零一二三四五六七八九"
MONTHS = (
    "January February March April May June July August September October November December"
).split()


def english_number(n: int) -> str:
    """0 <= n < 1e6 in British English words: 'three thousand four hundred and five'."""

    def below_100(k: int) -> str:
        return ONES[k] if k < 20 else TENS[k // 10] + (f"-{ONES[k % 10]}" if k % 10 else "")

    def below_1000(k: int) -> str:
        hundreds, rest = divmod(k, 100)
        if not hundreds:
            return below_100(rest)
        return f"{ONES[hundreds]} hundred" + (f" and {below_100(rest)}" if rest else "")

    if n == 0:
        return "zero"
    thousands, rest = divmod(n, 1000)
    words = f"{below_1000(thousands)} thousand" if thousands else ""
    if rest:
        glue = " and " if thousands and rest < 100 else " "
        words = (words + glue if words else "") + below_1000(rest)
    return words


def chinese_number(n: int) -> str:
    """0 <= n < 1e8 in Chinese numerals: 3405 -> 三千四百零五, 15 -> 十五."""

    def group(k: int) -> str:  # 0 < k < 10000
        out, zero = "", False
        for power, unit in ((3, "千"), (2, "百"), (1, "十"), (0, "")):
            digit = k // 10**power % 10
            if digit == 0:
                zero = bool(out)
            else:
                out += ("零" if zero else "") + ZH_DIGITS[digit] + unit
                zero = False
        return out

    if n == 0:
        return "零"
    high, low = divmod(n, 10000)
    out = group(high) + "万" if high else ""
    if low:
        out += ("零" if high and low < 1000 else "") + group(low)
    return out[1:] if out.startswith("一十") else out


def make_pair(kind: str, rng: random.Random) -> tuple[str, str]:
    """One generated (English, Chinese) pair: a number or a date."""
    if kind == "numbers":
        r = rng.random()
        if r < 0.25:
            n = rng.randrange(100)
        elif r < 0.4:  # round numbers: 3000, 50000, 700000
            n = rng.randrange(1, 10) * 10 ** rng.randrange(1, 6)
        elif r < 0.6:
            n = rng.randrange(10_000)
        else:
            n = rng.randrange(1_000_000)
        return english_number(n), chinese_number(n)
    year, month, day = rng.randrange(1900, 2100), rng.randrange(1, 13), rng.randrange(1, 29)
    return f"{MONTHS[month - 1]} {day}, {year}", f"{year}年{month}月{day}日"


def held_out(source: str) -> bool:
    """A fixed 2% of all possible sources (by hash) is reserved for the dev set."""
    return zlib.crc32(source.encode("utf-8")) % 50 == 0


def make_data(kind: str, out: Path, n_train: int, n_dev: int, seed: int) -> None:
    """Write ``train.tsv`` and ``dev.tsv``, both drawn from the same distribution.

    Training pairs repeat (frequent short inputs stay frequent); dev sources come only
    from the held-out 2% of the input space, so no dev source is ever trained on.
    """
    rng = random.Random(seed)
    train: list[tuple[str, str]] = []
    dev: dict[str, str] = {}
    while len(train) < n_train or len(dev) < n_dev:
        src, tgt = make_pair(kind, rng)
        if held_out(src):
            if len(dev) < n_dev:
                dev[src] = tgt
        elif len(train) < n_train:
            train.append((src, tgt))
    out.mkdir(parents=True, exist_ok=True)
    for name, part in (("dev.tsv", list(dev.items())), ("train.tsv", train)):
        (out / name).write_text("".join(f"{s}\t{t}\n" for s, t in part), encoding="utf-8")
    print(f"wrote {n_train} training and {n_dev} dev pairs to {out}")


# -- data --------------------------------------------------------------------------------


def read_tsv(path: Path) -> list[tuple[str, str]]:
    """``source<TAB>target`` lines; blank lines skipped, malformed ones rejected."""
    pairs = []
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split("\t")
        if len(parts) != 2 or not parts[0].strip() or not parts[1].strip():
            raise ValueError(f"{path}:{i}: expected 'source<TAB>target', got {line[:60]!r}")
        pairs.append((parts[0].strip(), parts[1].strip()))
    if not pairs:
        raise ValueError(f"{path} has no sentence pairs")
    return pairs


class ParallelData(torch.utils.data.Dataset):
    """Encoded pairs: source ids + EOS, target ids (BOS/EOS added in :func:`collate`)."""

    def __init__(self, pairs: list[tuple[str, str]], tokenizer, max_len: int) -> None:
        src = tokenizer.encode([s for s, _ in pairs])
        tgt = tokenizer.encode_target([t for _, t in pairs])
        eos = tokenizer.eos_id
        self.items = [
            (s[: max_len - 1] + [eos] if len(s) > max_len else s, t[: max_len - 1])
            for s, t in zip(src, tgt, strict=True)
        ]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> tuple[list[int], list[int]]:
        return self.items[i]


def collate(batch, pad: int, bos: int, eos: int) -> dict[str, torch.Tensor]:
    """Pad sources ``(B, S)``, decoder inputs ``[BOS] + y`` and labels ``y + [EOS]`` ``(B, T)``."""

    def pad_rows(rows: list[list[int]]) -> torch.Tensor:
        out = torch.full((len(rows), max(map(len, rows))), pad, dtype=torch.long)
        for i, r in enumerate(rows):
            out[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        return out

    return {
        "src": pad_rows([s for s, _ in batch]),
        "tgt_in": pad_rows([[bos] + t for _, t in batch]),
        "labels": pad_rows([t + [eos] for _, t in batch]),
    }


# -- evaluation --------------------------------------------------------------------------


@torch.no_grad()
def evaluate(model, tokenizer, pairs, device, beams: int, batch_size: int = 64) -> dict[str, float]:
    """Translate the dev sources; sacrebleu BLEU / chrF and exact-match accuracy."""
    import sacrebleu
    from attn_nlp import Translator

    translator = Translator(model, tokenizer, device=str(device))
    sources, refs = [s for s, _ in pairs], [t for _, t in pairs]
    hyps = translator.translate(sources, beams=beams, batch_size=batch_size)
    cjk = any("\u4e00" <= ch <= "\u9fff" for ref in refs[:50] for ch in ref)
    bleu = sacrebleu.corpus_bleu(hyps, [refs], tokenize="zh" if cjk else "13a")
    chrf = sacrebleu.corpus_chrf(hyps, [refs])
    same = [h.replace(" ", "") == r.replace(" ", "") for h, r in zip(hyps, refs, strict=True)]
    exact = sum(same) / len(refs)
    return {"bleu": bleu.score, "chrf": chrf.score, "exact": exact, "example": hyps[0]}


# -- training ----------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    m = sub.add_parser("make-data", help="write a generated parallel corpus")
    m.add_argument("kind", choices=["numbers", "dates"])
    m.add_argument("out", type=Path)
    m.add_argument("--n-train", type=int, default=20000)
    m.add_argument("--n-dev", type=int, default=500)
    m.add_argument("--seed", type=int, default=0)

    t = sub.add_parser("train", help="train (resumes from OUT/last when present)")
    t.add_argument("--train", type=Path, required=True, help="TSV: source<TAB>target")
    t.add_argument("--dev", type=Path, help="TSV dev set scored after each epoch")
    t.add_argument("--out", type=Path, required=True, help="run directory")
    t.add_argument("--tokenizer", type=Path, help="tokenizer.json to reuse (default: train BPE)")
    t.add_argument("--vocab-size", type=int, default=2000)
    t.add_argument("--preset", default="transformer-tiny")
    t.add_argument(
        "--set",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="config overrides, e.g. embed_dim=256 dropout=0.2",
    )
    t.add_argument("--max-len", type=int, default=64, help="truncate longer sequences")
    t.add_argument("--epochs", type=int, default=10)
    t.add_argument("--max-steps", type=int, default=None, help="stop after this many updates")
    t.add_argument("--batch-size", type=int, default=64, help="per process and micro-step")
    t.add_argument("--accum", type=int, default=1, help="gradient accumulation micro-steps")
    t.add_argument("--lr", type=float, default=1e-3)
    t.add_argument("--warmup", type=int, default=400)
    t.add_argument("--label-smoothing", type=float, default=0.1)
    t.add_argument("--clip", type=float, default=1.0)
    t.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16", "fp16"])
    t.add_argument("--beams", type=int, default=4, help="beam size for dev decoding")
    t.add_argument("--dev-limit", type=int, default=500, help="dev pairs scored per epoch")
    t.add_argument("--log-every", type=int, default=50)
    t.add_argument("--save-every", type=int, default=500)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--device", default=None)
    t.add_argument("--threads", type=int, default=None, help="CPU threads per process")
    t.add_argument("--no-resume", action="store_true", help="start over even if OUT/last exists")
    t.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def parse_overrides(items: list[str]) -> dict[str, Any]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--set expects KEY=VALUE, got {item!r}")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def train(args: argparse.Namespace) -> dict[str, Any]:
    from attn_nlp import BPETokenizer, Transformer, get_config, save_pretrained

    d, precision, log, last, resume = tu.start_run(args)
    pairs = read_tsv(args.train)
    dev_pairs = read_tsv(args.dev)[: args.dev_limit] if args.dev else []

    if resume:
        tokenizer = BPETokenizer.from_file(tu.find_checkpoint(last) / "tokenizer.json")
    elif args.tokenizer:
        tokenizer = BPETokenizer.from_file(args.tokenizer)
    else:
        texts = [s for s, _ in pairs] + [t for _, t in pairs]
        tokenizer = BPETokenizer.train(texts, vocab_size=args.vocab_size)

    overrides = parse_overrides(args.set)
    config = get_config(
        args.preset,
        **{
            "src_vocab_size": tokenizer.vocab_size,
            "pad_id": tokenizer.pad_id,
            "bos_id": tokenizer.bos_id,
            "eos_id": tokenizer.eos_id,
            "max_positions": max(args.max_len, 8),
            **overrides,
        },
    )
    model = Transformer(config).to(d.device)
    model.generation_config = model.generation_config.update(
        num_beams=args.beams, max_length=config.max_positions
    )
    ddp_model = tu.wrap_ddp(model, d)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr, betas=(0.9, 0.98), eps=1e-9)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, tu.inverse_sqrt_schedule(args.warmup))
    scaler = tu.make_scaler(d.device, precision)

    data = ParallelData(pairs, tokenizer, config.max_positions)
    pad, bos, eos = tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id
    loader, sampler = tu.make_loader(
        data, args.batch_size, d, seed=args.seed, collate_fn=lambda b: collate(b, pad, bos, eos)
    )
    progress = {"step": 0, "epoch": 0, "batches": 0, "best_bleu": -1.0, "seed": args.seed}
    if resume:
        progress = tu.load_checkpoint(
            last, d, model=model, optimizer=optimizer, scheduler=scheduler, scaler=scaler
        )
        log.log({"event": "resume", "from": str(last), **progress})
    else:
        n_params = sum(p.numel() for p in model.parameters())
        log.log(
            {
                "event": "start",
                "params": n_params,
                "pairs": len(data),
                "vocab": tokenizer.vocab_size,
                "precision": precision,
                "world_size": d.world_size,
            }
        )

    def write_files(directory: Path) -> None:
        save_pretrained(model, directory, tokenizer=tokenizer)  # config, weights, tokenizer

    def save(name: str) -> None:
        tu.save_checkpoint(
            args.out / name,
            d,
            model=model,
            optimizer=optimizer,
            scheduler=scheduler,
            scaler=scaler,
            progress=progress,
            write_files=write_files,
        )

    max_steps = args.max_steps or args.epochs * len(loader) // args.accum
    done = progress["step"] >= max_steps
    result: dict[str, Any] = {}
    losses: list[float] = []
    while not done and progress["epoch"] < args.epochs:
        sampler.set_epoch(progress["epoch"])
        sampler.skip(progress["batches"] * args.batch_size)
        ddp_model.train()
        bar = None
        if d.is_main and not args.quiet:
            from tqdm import tqdm

            bar = tqdm(total=len(loader), desc=f"epoch {progress['epoch']}", leave=False)
        running, micro = 0.0, 0
        optimizer.zero_grad(set_to_none=True)  # drop a partial accumulation from last epoch
        stopped = False
        for batch in loader:
            if progress["step"] >= max_steps:
                stopped = True
                break
            batch = {k: v.to(d.device) for k, v in batch.items()}
            micro += 1
            sync = micro % args.accum == 0
            with tu.maybe_no_sync(ddp_model, sync), tu.autocast(d.device, precision):
                logits = ddp_model(batch["src"], batch["tgt_in"])
                loss = F.cross_entropy(
                    logits.float().flatten(0, 1),
                    batch["labels"].flatten(),
                    ignore_index=pad,
                    label_smoothing=args.label_smoothing,
                )
            scaler.scale(loss / args.accum).backward()
            running += loss.item() / args.accum
            progress["batches"] += 1
            if bar is not None:
                bar.update(1)
            if not sync:
                continue
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            scheduler.step()
            progress["step"] += 1
            step_loss, running = tu.all_reduce_mean(running, d), 0.0
            losses.append(step_loss)
            if progress["step"] % args.log_every == 0 or progress["step"] == 1:
                log.log(
                    {
                        "step": progress["step"],
                        "epoch": progress["epoch"],
                        "loss": step_loss,
                        "lr": scheduler.get_last_lr()[0],
                    },
                    echo=bar is None,
                )
                if bar is not None:
                    bar.set_postfix(loss=f"{step_loss:.3f}")
            if progress["step"] % args.save_every == 0:
                save("last")
        if bar is not None:
            bar.close()
        if not stopped:  # a full epoch: the next one starts from its first batch
            progress["epoch"] += 1
            progress["batches"] = 0
        done = progress["step"] >= max_steps
        save_best = False
        if dev_pairs and d.is_main:
            metrics = evaluate(model.eval(), tokenizer, dev_pairs, d.device, args.beams)
            log.log(
                {"event": "dev", "step": progress["step"], "epoch": progress["epoch"], **metrics}
            )
            result.update(metrics)
            save_best = metrics["bleu"] > progress["best_bleu"]
            progress["best_bleu"] = max(progress["best_bleu"], metrics["bleu"])
        if tu.all_reduce_mean(float(save_best), d) > 0:  # rank 0 decides for everyone
            save("best")
        save("last")
    tu.cleanup_distributed()
    if losses:
        k = max(1, min(5, len(losses) // 2))
        result.update(first_loss=sum(losses[:k]) / k, last_loss=sum(losses[-k:]) / k)
    result.update({"step": progress["step"], "out": str(args.out)})
    log.log({"event": "done", **{k: v for k, v in result.items() if k != "example"}})
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = build_parser().parse_args(argv)
    if args.command == "make-data":
        make_data(args.kind, args.out, args.n_train, args.n_dev, args.seed)
        return {}
    return train(args)


if __name__ == "__main__":
    main()
