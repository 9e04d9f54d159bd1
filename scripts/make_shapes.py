"""Write the generated captioned-shapes data set (see attn_train.shapes).

    uv run scripts/make_shapes.py data/shapes                       # 8000 / 600 / 600 images
    uv run scripts/make_shapes.py data/tiny --n-train 64 --n-val 16 --n-heldout 16
    uv run scripts/make_shapes.py data/shards --format wds --shard-size 1000   # train/*.tar

Layout: ``train/``, ``val/`` (seen colour-shape pairs) and ``heldout/`` (pairs never in
``train``) as ImageFolders (class = ``colour_shape``), ``train.csv`` / ``val.csv`` /
``heldout.csv`` in open_clip's convention (``filepath,title``), ``classnames.txt`` (all
30 classes, for zero-shot) and ``meta.json``. ``--format wds`` writes the training split as
webdataset shards in img2dataset's layout instead (``train/00000.tar`` of ``--shard-size``
samples: ``{key}.jpg`` / ``.txt`` / ``.json`` / ``.cls``, ``train/00000.parquet`` beside it;
no ``train.csv``): train from them with ``--train-data 'DIR/train/{00000..000NN}.tar'``
(the pattern is printed and in ``meta.json``). Same arguments, same files.

Exit codes: 0 done, 2 bad input (one ``error:`` line, nothing written), 130 Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from attn_core.cli import make_parser, run  # first: Ctrl-C while torch loads -> exit 130
from attn_train import shapes


def build_parser() -> argparse.ArgumentParser:
    p = make_parser(__doc__)
    p.add_argument("out", type=Path, help="output folder")
    p.add_argument("--n-train", type=int, default=8000, help="training images (seen pairs)")
    p.add_argument("--n-val", type=int, default=600, help="validation images (seen pairs)")
    p.add_argument("--n-heldout", type=int, default=600, help="images of the held-out pairs")
    p.add_argument("--image-size", type=int, default=64, help="pixels per side (>= 16)")
    p.add_argument("--seed", type=int, default=0, help="generator seed")
    p.add_argument(
        "--captions",
        choices=["mixed", "full"],
        default="mixed",
        help="training captions: varied templates (mixed) or always the full one",
    )
    p.add_argument(
        "--uncoloured",
        type=float,
        default=0.0,
        help="add this fraction of black / grey / white training shapes (not classes)",
    )
    p.add_argument(
        "--format",
        choices=["folder", "wds"],
        default="folder",
        help="the training split as an ImageFolder + CSV, or as webdataset shards",
    )
    p.add_argument("--shard-size", type=int, default=1000, help="samples per shard (--format wds)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def main(argv: list[str] | None = None) -> dict:
    args = build_parser().parse_args(argv)
    if min(args.n_train, args.n_val, args.n_heldout, args.uncoloured) < 0 or args.image_size < 16:
        raise ValueError("counts must be >= 0 and --image-size >= 16")
    if args.shard_size < 1:
        raise ValueError(f"--shard-size must be >= 1, got {args.shard_size}")
    if args.out.exists() and not args.out.is_dir():
        raise ValueError(f"{args.out} is a file, not a folder")
    meta = shapes.write_dataset(
        args.out,
        n_train=args.n_train,
        n_val=args.n_val,
        n_heldout=args.n_heldout,
        seed=args.seed,
        image_size=args.image_size,
        caption_style=args.captions,
        progress=not args.quiet,
        uncoloured=args.uncoloured,
        shard_size=args.shard_size if args.format == "wds" else None,
    )
    print(f"wrote {json.dumps(meta['counts'])} images to {args.out}")
    if "train_shards" in meta:
        print(f"training shards: {args.out / meta['train_shards']}")
    print(f"held-out pairs: {', '.join(meta['heldout'])}")
    return meta


if __name__ == "__main__":
    run(main)
