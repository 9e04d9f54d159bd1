r"""Fine-tune (or train) an attn_vision classifier on ImageFolder train / val directories.

    # generated shapes (30 colour-shape classes), a tiny ViT from scratch
    uv run scripts/make_shapes.py data/shapes
    uv run scripts/finetune_vit.py --train-dir data/shapes/train --val-dir data/shapes/val \
        --model vit_tiny_patch16_224 --img-size 64 --patch-size 8 --out runs/vit-shapes
    # fine-tune timm's pretrained weights (downloaded once; or --pretrained path/to/file)
    uv run scripts/finetune_vit.py --model vit_base_patch16_224.augreg2_in21k_ft_in1k \
        --pretrained --train-dir ... --val-dir ... --layer-decay 0.75 --ema-decay 0.9998
    # start from a Hugging Face folder (transformers' save_pretrained) or hub id: its weights
    uv run scripts/finetune_vit.py --model hf-hub:google/vit-base-patch16-224 \
        --train-dir ... --val-dir ... --layer-decay 0.75
    # several processes (gloo on CPU, nccl on GPU); --batch-size is per process
    uv run torchrun --nproc-per-node 2 scripts/finetune_vit.py ...
    # from webdataset shards ({key}.jpg + {key}.cls, or a json field: --label-key)
    uv run scripts/finetune_vit.py --train-data 'data/shards/train/{00000..00007}.tar' \
        --classnames data/shards/classnames.txt --val-dir data/shards/val ...

timm's ``train.py`` in miniature, on ``attn_train.fit``: AdamW with timm's parameter groups
(``--layer-decay``), warm-up + cosine, label smoothing, an EMA of the weights
(``--ema-decay``), timm's training augmentation, top-1 / top-5 on ``--val-dir`` after every
epoch; unreadable images are skipped and counted. A ``--model`` folder
(``attn_vision.save_pretrained``'s, or a transformers ``ViTForImageClassification`` /
``Dinov2Model`` / ... one) or ``hf-hub:`` id brings its weights (a new head where its
classes differ). ``--out``/``last`` and ``best`` are ``attn_vision.create_model`` folders
(class names: ``pretrained_cfg["label_names"]``); rerunning the same command resumes exactly.
Details: docs/training.md.

Exit codes: 0 done, 1 the loss became NaN / inf, 2 bad input (a missing folder, an unknown
model, unavailable weights, no readable image, ...: one ``error:`` line, nothing written),
130 Ctrl-C (the line names the last checkpoint; the same command resumes from it).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import attn_core.cli  # noqa: F401  (first: Ctrl-C while torch loads -> one line, exit 130)
import attn_train as at
import attn_vision
import torch
import torch.nn.functional as F
from attn_train import ImageFolderDataset, cli
from attn_train import wds as shards
from torch import nn


def build_parser() -> argparse.ArgumentParser:
    p = cli.make_parser(__doc__)
    g = p.add_argument_group("model")
    g.add_argument(
        "--model",
        default="vit_tiny_patch16_224",
        help="attn_vision / timm name, a model folder (transformers' too) or hf-hub:<repo id>",
    )
    g.add_argument(
        "--pretrained",
        nargs="?",
        const=True,
        default=False,
        help="timm's weights for the name's tag (no value), or a checkpoint file",
    )
    g.add_argument("--img-size", type=int, default=None, help="input size (pos-embed resampled)")
    g.add_argument("--patch-size", type=int, default=None, help="ViT patch size (from scratch)")
    g.add_argument("--drop-path", type=float, default=0.1, help="stochastic depth rate")
    g.add_argument(
        "--set", nargs="*", default=[], metavar="KEY=VALUE", help="config overrides: depth=6 ..."
    )
    g.add_argument(
        "--grad-checkpointing", action="store_true", help="recompute activations (less memory)"
    )
    g = p.add_argument_group("data")
    g.add_argument("--train-dir", type=Path, help="ImageFolder: CLASS/IMAGE (or --train-data)")
    g.add_argument("--train-data", help="webdataset shards: 'DIR/{00000..00009}.tar'")
    g.add_argument("--classnames", type=Path, help="with --train-data: the classes, one a line")
    g.add_argument("--label-key", default="cls", help="with --train-data: cls, or a json field")
    shards.add_shard_args(g, dataset_type=False)  # --train-num-samples --dataset-resampled
    g.add_argument("--val-dir", type=Path, default=None, help="ImageFolder with the same classes")
    cli.add_image_loader_args(g)  # --workers --warn-skipped-fraction --eval-batch-size
    cli.add_augment_args(g)  # --no-augment --crop-pct --scale --hflip --aa --color-jitter --reprob
    g = p.add_argument_group("optimisation")
    cli.add_schedule_args(g, epochs=10, batch_size=64, lr=5e-4, warmup=100)
    cli.add_optimizer_args(g, wd=0.05, min_lr_ratio=0.01)  # --wd --min-lr-ratio --grad-clip
    g.add_argument("--label-smoothing", type=float, default=0.1, help="cross-entropy smoothing")
    g.add_argument("--layer-decay", type=float, default=None, help="e.g. 0.75 (ViT / Swin)")
    g.add_argument("--ema-decay", type=float, default=None, help="EMA of the weights, e.g. 0.9998")
    cli.add_run_args(p.add_argument_group("run"), log_every=20, save_every=500, fsdp=True)
    return p


def brings_weights(model: str) -> bool:
    """Whether ``--model`` comes with its weights: a folder (``save_pretrained``'s, a
    transformers one) or ``hf-hub:<repo id>``."""
    return model.startswith("hf-hub:") or Path(model).is_dir()


def weights_source(args: argparse.Namespace) -> str:
    """Where the starting weights come from, for the run's start record."""
    if brings_weights(args.model):
        return "the model's own"  # (a folder or hub id: --pretrained cannot add a file)
    return str(args.pretrained)


def build_model(args: argparse.Namespace, num_classes: int) -> nn.Module:
    """The attn_vision model with a ``num_classes``-way head (a fresh one after loading)."""
    overrides: dict[str, Any] = cli.parse_overrides(args.set)
    if args.img_size is not None:
        overrides["img_size"] = args.img_size
    if args.patch_size is not None:
        overrides["patch_size"] = args.patch_size
    own_weights = brings_weights(args.model)
    config = None if own_weights else attn_vision.get_model_config(args.model, **overrides)
    if own_weights or hasattr(config, "drop_path_rate"):  # (every family has it)
        overrides["drop_path_rate"] = args.drop_path
    try:
        if own_weights:  # its weights (--pretrained: nothing more to load)
            pretrained = None if args.pretrained in (True, False) else args.pretrained
            model = attn_vision.create_model(args.model, pretrained=pretrained, **overrides)
        elif args.pretrained is False:
            return attn_vision.create_model(args.model, num_classes=num_classes, **overrides)
        else:
            model = attn_vision.create_model(args.model, pretrained=args.pretrained, **overrides)
    except (TypeError, KeyError) as e:  # e.g. a --set value of the wrong type
        raise ValueError(f"cannot build {args.model!r}: {e}") from None
    if model.num_classes != num_classes:
        model.reset_classifier(num_classes)
        model.pretrained_cfg["num_classes"] = num_classes
    return model


def classnames(args: argparse.Namespace) -> list[str]:
    """The classes: ``--classnames``' lines with ``--train-data``, else the ImageFolder's."""
    if args.train_data is None:
        return ImageFolderDataset(args.train_dir).classes
    text = cli.read_text_file(args.classnames, "--classnames")
    names = [c.strip() for c in text.splitlines() if c.strip()]
    if not names:
        raise ValueError(f"--classnames {args.classnames} lists no class")
    return names


def train(args: argparse.Namespace) -> dict[str, Any]:
    if (args.train_dir is None) == (args.train_data is None):
        raise ValueError("give --train-dir (an ImageFolder) or --train-data (shards), one of them")
    if (args.train_data is None) != (args.classnames is None):
        raise ValueError("--classnames FILE (the classes the labels index) goes with --train-data")
    if args.train_data is not None:
        shards.uses_shards(args)  # checks the shard files and flags
    cli.require_dir(args.train_dir, "--train-dir")
    cli.require_dir(args.val_dir, "--val-dir")
    run = at.start_run(args)  # checks the run flags; writes nothing yet
    classes = classnames(args)  # the class list sizes the head
    model = build_model(args, len(classes)).to(run.d.device)
    model.pretrained_cfg["label_names"] = classes  # timm's field for the class names
    eval_tf = attn_vision.create_transform(model, crop_pct=args.crop_pct)
    aug = cli.augment_kwargs(args)  # timm's training pipeline
    train_tf = eval_tf if args.no_augment else attn_vision.create_transform(model, True, **aug)
    if args.train_data is not None:  # checks the data; resuming, the layout
        label = dict(label=args.label_key, classnames=classes)
        loader = shards.recipe_loader(args, run, train_tf, **label)
    else:
        data = ImageFolderDataset(args.train_dir, train_tf, seed=args.seed)
        data.check_readable()  # no image decodes: stop now, before anything is written
        loader = at.make_loader(
            data, args.batch_size, run.d, seed=args.seed, num_workers=args.workers
        )
    names = classes if args.train_data is not None else None  # labels the val folders
    val = ImageFolderDataset(args.val_dir, eval_tf, names) if args.val_dir is not None else None
    if val is not None and val.classes != classes:
        raise ValueError(f"{args.val_dir} has classes {val.classes}, train has {classes}")
    if args.grad_checkpointing:
        model.set_grad_checkpointing(True)
    model.train()
    ema = at.make_ema(model, args.ema_decay)

    max_steps, epochs = at.plan_steps(len(loader), args.accum, args.epochs, args.max_steps)
    optimizer, scheduler = at.adamw_cosine(model, args, max_steps, layer_decay=args.layer_decay)

    def loss_fn(model: nn.Module, batch: list[torch.Tensor]) -> torch.Tensor:
        logits = model(batch[0]).float()
        return F.cross_entropy(logits, batch[1], label_smoothing=args.label_smoothing)

    def evaluate() -> dict[str, float]:
        kw = dict(batch_size=args.eval_batch_size, device=run.d.device, precision=run.precision)
        m = at.classification_metrics(model.eval(), val, **kw)
        record = {f"val/{k}": v for k, v in m.items()}
        if ema is not None:
            m = at.classification_metrics(ema.module, val, **kw)
            record.update({f"val_ema/{k}": v for k, v in m.items()})
        return record

    config = at.LoopConfig.from_args(
        args,
        max_steps,
        epochs,
        best_metric="val/top1",
        start={"model": args.model, "pretrained": weights_source(args), "classes": len(classes)},
    )
    result = at.fit(
        run,
        model,
        optimizer,
        scheduler,
        loader,
        config,
        loss_fn=loss_fn,
        evaluate=evaluate if val is not None else None,
        write_files=shards.with_data_state(
            lambda folder: attn_vision.save_pretrained(model, folder), loader
        ),
        ema=ema,
    )
    run.close(result)
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    return train(build_parser().parse_args(argv))


if __name__ == "__main__":
    cli.run_main(main)
