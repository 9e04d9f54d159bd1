r"""Train a CLIP from scratch, or fine-tune a pretrained one, on image-caption CSVs.

    # the generated shapes data and the bundled demo model (docs/training.md)
    uv run scripts/make_shapes.py data/shapes
    uv run scripts/train_clip.py --model demo-shapes --train-data data/shapes/train.csv \
        --zeroshot-dir data/shapes/heldout --zeroshot-classnames data/shapes/classnames.txt \
        --out runs/demo-shapes
    # fine-tune OpenAI's ViT-B/32 (LiT: --lock-image; WiSE-FT: --wise-ft-alpha 0.5)
    uv run scripts/train_clip.py --model ViT-B-32 --pretrained openai --train-data my.csv ...
    # several processes (gloo on CPU, nccl on GPU); --batch-size is per process
    uv run torchrun --nproc-per-node 2 scripts/train_clip.py ...

Data: an open_clip-style CSV (``filepath,title``); unreadable images are skipped and
counted. After every epoch: zero-shot top-1 / top-5 on each ``--zeroshot-dir`` ImageFolder,
retrieval recall on ``--val-data``. Outputs in ``--out``: ``last/``, ``best/`` (by the first
zero-shot set), ``final/`` (open_clip layout), ``wise_ft/``, ``log.jsonl``; rerun the same
command to resume. Details (exact accumulation, DDP, init): docs/training.md.

Exit codes: 0 done, 1 the loss became NaN / inf, 2 bad input (a missing file, an unknown
model, unavailable weights, no readable image, ...: one ``error:`` line, nothing written),
130 Ctrl-C (the line names the last checkpoint; the same command resumes from it).
"""

from __future__ import annotations

import argparse
import copy
import math
import os
import warnings
from pathlib import Path
from typing import Any

import attn_clip
import attn_train as at
import torch
from attn_core.hub import save_state_dict
from attn_train import CsvImageTextDataset, ImageFolderDataset, collate_skip_unreadable
from attn_train.cli import (
    add_image_loader_args,
    add_optimizer_args,
    add_run_args,
    add_schedule_args,
    apply_overrides,
    make_parser,
    require_dir,
    require_file,
    run_main,
)


def build_parser() -> argparse.ArgumentParser:
    p = make_parser(__doc__)
    g = p.add_argument_group("model")
    g.add_argument(
        "--model",
        default="demo-shapes",
        help="architecture (open_clip name or demo-shapes), or a model folder to fine-tune",
    )
    g.add_argument(
        "--set",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="config overrides from scratch, e.g. vision.layers=2 text.width=64 embed_dim=128",
    )
    g.add_argument(
        "--pretrained", default=None, help="weights: a tag (openai, ...) or a checkpoint file"
    )
    g.add_argument("--lock-image", action="store_true", help="freeze the image tower (LiT)")
    g.add_argument(
        "--wise-ft-alpha",
        type=float,
        default=None,
        help="also write wise_ft/: (1 - a) * initial + a * fine-tuned weights",
    )
    g.add_argument(
        "--grad-checkpointing", action="store_true", help="recompute activations (less memory)"
    )
    g = p.add_argument_group("data")
    g.add_argument("--train-data", type=Path, required=True, help="CSV of image paths + captions")
    g.add_argument("--csv-img-key", default="filepath", help="the CSV's image path column")
    g.add_argument("--csv-caption-key", default="title", help="the CSV's caption column")
    g.add_argument("--csv-separator", default=None, help="default: tab or comma, from the header")
    g.add_argument("--val-data", type=Path, default=None, help="CSV scored by retrieval recall")
    g.add_argument(
        "--zeroshot-dir",
        type=Path,
        action="append",
        default=[],
        help="ImageFolder scored zero-shot after every epoch (repeatable; the first picks best/)",
    )
    g.add_argument("--zeroshot-classnames", type=Path, default=None, help="one class per line")
    g.add_argument(
        "--zeroshot-templates",
        nargs="+",
        default=["a photo of a {}."],
        help="zero-shot prompts ({} is the class name)",
    )
    g.add_argument("--no-augment", action="store_true", help="no random resized crop")
    add_image_loader_args(g)  # --workers --warn-skipped-fraction --eval-batch-size
    g = p.add_argument_group("optimisation")
    g.add_argument(
        "--loss", choices=["clip", "siglip"], default="clip", help="InfoNCE or sigmoid loss"
    )
    add_schedule_args(g, epochs=10, batch_size=128, lr=1e-3, warmup=100)
    add_optimizer_args(g, wd=0.1, min_lr_ratio=0.0, betas=(0.9, 0.98), eps=1e-6)
    g = p.add_argument_group("run")
    add_run_args(g, log_every=20, save_every=200)
    g.add_argument(
        "--export-fp16", type=Path, default=None, help="also write fp16 open_clip weights here"
    )
    return p


def check_inputs(args: argparse.Namespace) -> None:
    """Every path and number a user can get wrong, before anything is built or written."""
    require_file(args.train_data, "--train-data")
    require_file(args.val_data, "--val-data")
    require_file(args.zeroshot_classnames, "--zeroshot-classnames")
    for folder in args.zeroshot_dir:
        require_dir(folder, "--zeroshot-dir")
    if args.export_fp16 is not None and args.export_fp16.is_dir():
        raise ValueError(f"--export-fp16 {args.export_fp16} is a folder, not a file")
    if args.wise_ft_alpha is not None and not 0.0 <= args.wise_ft_alpha <= 1.0:
        raise ValueError(f"--wise-ft-alpha must be in [0, 1], got {args.wise_ft_alpha}")


def build_model(args: argparse.Namespace) -> attn_clip.CLIP:
    """The CLIP to train (fp32, train mode): from scratch, or pretrained / a folder."""
    from_folder = os.path.isdir(args.model) or args.model.startswith(("local-dir:", "hf-hub:"))
    if args.set and (args.pretrained is not None or from_folder):
        raise ValueError("--set changes the architecture: only for training from scratch")
    if args.pretrained is None and not from_folder:
        config = apply_overrides(attn_clip.get_model_config(args.model).to_dict(), args.set)
        try:
            config = attn_clip.CLIPConfig.from_dict(config)
        except (TypeError, KeyError) as e:
            raise ValueError(f"--set {' '.join(args.set)}: {e}") from None
        if args.loss == "siglip" and config.init_logit_bias is None:
            config.init_logit_scale, config.init_logit_bias = math.log(10.0), -10.0  # SigLIP
        model = attn_clip.create_model(config)
        attn_clip.init_vision_like_open_clip(model)
    else:
        model = attn_clip.create_model(args.model, pretrained=args.pretrained)
        if args.loss == "siglip":
            attn_clip.add_logit_bias(model)  # init -10, as SigLIP's
    return model.train()


@torch.no_grad()
def evaluate(model, tokenizer, zs_sets, val_set, args, device) -> dict[str, float]:
    """Zero-shot top-1 / top-5 on every ImageFolder set, retrieval recall on ``val_set``."""
    model.eval()
    out: dict[str, float] = {}
    for name, dataset in zs_sets.items():
        batches = at.readable_batches(dataset, args.eval_batch_size)
        classnames = [c.replace("_", " ") for c in dataset.classes]
        m = attn_clip.evaluate_zero_shot(
            model, tokenizer, batches, classnames, args.zeroshot_templates, device=device
        )
        out[f"zeroshot/{name}/top1"], out[f"zeroshot/{name}/top5"] = m["top1"], m["top5"]
    if val_set is not None:
        batches = at.readable_batches(val_set, args.eval_batch_size)
        recall = attn_clip.evaluate_retrieval(model, batches, device=device)
        if not recall:
            message = f"--val-data {args.val_data}: no image is readable; recall skipped"
            warnings.warn(message, stacklevel=2)
        out.update({f"val/{k}": v for k, v in recall.items()})
    return out


def train(args: argparse.Namespace) -> dict[str, Any]:
    check_inputs(args)
    run = at.start_run(args)  # checks the run flags; writes nothing yet
    device = run.d.device
    model = build_model(args).to(device)
    if args.lock_image:
        model.visual.requires_grad_(False)
    if args.grad_checkpointing:
        model.set_grad_checkpointing(True)
    tokenizer = attn_clip.get_tokenizer(model.config)
    train_tf = attn_clip.image_transform(model.preprocess_cfg, is_train=not args.no_augment)
    eval_tf = attn_clip.image_transform(model.preprocess_cfg)
    csv = dict(img_key=args.csv_img_key, caption_key=args.csv_caption_key, sep=args.csv_separator)
    data = CsvImageTextDataset(args.train_data, train_tf, tokenizer, seed=args.seed, **csv)
    data.check_readable()  # no image decodes: stop now, before anything is written
    val_set = (
        CsvImageTextDataset(args.val_data, eval_tf, tokenizer, **csv) if args.val_data else None
    )
    names = None
    if args.zeroshot_classnames is not None:
        lines = args.zeroshot_classnames.read_text(encoding="utf-8").splitlines()
        names = [c.strip() for c in lines if c.strip()]
    zs_sets = {p.name: ImageFolderDataset(p, eval_tf, names) for p in args.zeroshot_dir}

    loader = at.make_loader(
        data,
        args.batch_size,
        run.d,
        seed=args.seed,
        collate_fn=collate_skip_unreadable,
        num_workers=args.workers,
    )
    max_steps, epochs = at.plan_steps(len(loader), args.accum, args.epochs, args.max_steps)
    groups = at.param_groups(model, args.wd, no_weight_decay=["*cls_token"])  # + 1-d, scalars
    optimizer = torch.optim.AdamW(groups, lr=args.lr, betas=(args.beta1, args.beta2), eps=args.eps)
    scheduler = at.lambda_lr(
        optimizer, at.cosine_schedule(args.warmup, max_steps, args.min_lr_ratio)
    )
    if args.loss == "clip":
        loss_fn = attn_clip.ClipLoss(gather_with_grad=True)  # features gathered with gradients
    else:
        loss_fn = attn_clip.SigLipLoss()
    init_path = args.out / "wise_ft_init.safetensors"
    if args.wise_ft_alpha is not None and run.resume and not init_path.is_file():
        raise ValueError(
            f"--wise-ft-alpha: {run.last} was trained without it (no {init_path.name}); "
            "start fresh with --no-resume"
        )
    if args.wise_ft_alpha is not None and not run.resume and run.d.is_main:
        save_state_dict(model.state_dict(), init_path)

    def train_mode(m: torch.nn.Module) -> None:
        m.train()
        if args.lock_image:
            model.visual.eval()

    def after_update() -> dict[str, float]:
        model.clamp_logit_scale_()
        return {"logit_scale": model.logit_scale.exp().item()}

    def run_eval() -> dict[str, float]:
        return evaluate(model, tokenizer, zs_sets, val_set, args, device)

    config = at.LoopConfig.from_args(
        args,
        max_steps,
        epochs,
        best_metric=f"zeroshot/{args.zeroshot_dir[0].name}/top1" if zs_sets else None,
        start={"model": args.model, "pretrained": args.pretrained, "loss": args.loss},
    )
    result = at.fit(
        run,
        model,
        optimizer,
        scheduler,
        loader,
        config,
        step_fn=at.contrastive_step(loss_fn, args.lock_image),
        evaluate=run_eval if zs_sets or val_set is not None else None,
        write_files=lambda folder: attn_clip.save_config(model, folder),  # + model.safetensors
        train_mode=train_mode,
        after_update=after_update,
    )
    if run.d.is_main:
        result.update(finish(args, model, tokenizer, zs_sets, val_set, init_path, run.log))
    run.close(result)
    return result


def finish(args, model, tokenizer, zs_sets, val_set, init_path, log) -> dict[str, float]:
    """Write ``final/`` (open_clip layout), ``--export-fp16`` and the WiSE-FT model."""
    from safetensors.torch import load_file

    model.eval()
    attn_clip.save_pretrained(model, args.out / "final")
    if args.export_fp16 is not None:
        attn_clip.save_weights(model, args.export_fp16, dtype=torch.float16)
        log.log({"event": "export", "path": str(args.export_fp16)})
    if args.wise_ft_alpha is None:
        return {}
    a, device = args.wise_ft_alpha, next(model.parameters()).device
    wise = copy.deepcopy(model)  # the same architecture; every weight is replaced
    wise.load_state_dict(attn_clip.wise_ft(load_file(str(init_path), device=str(device)), model, a))
    wise.to(device).eval()
    attn_clip.save_pretrained(wise, args.out / "wise_ft")
    if not zs_sets and val_set is None:
        return {}
    metrics = evaluate(wise, tokenizer, zs_sets, val_set, args, device)
    log.log({"event": "eval_wise_ft", "alpha": a, **metrics})
    return {f"wise_ft/{k}": v for k, v in metrics.items()}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    return train(build_parser().parse_args(argv))


if __name__ == "__main__":
    run_main(main)
