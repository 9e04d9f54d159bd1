"""Fine-tune (or train) an attn_vision classifier on ImageFolder train / val directories.

    # generated shapes (30 colour-shape classes), a tiny ViT from scratch
    uv run scripts/make_shapes.py data/shapes
    uv run scripts/finetune_vit.py --train-dir data/shapes/train --val-dir data/shapes/val \
        --model vit_tiny_patch16_224 --img-size 64 --patch-size 8 --out runs/vit-shapes
    # fine-tune timm's pretrained weights (downloaded once; or --pretrained path/to/file)
    uv run scripts/finetune_vit.py --model vit_base_patch16_224.augreg2_in21k_ft_in1k \
        --pretrained --train-dir ... --val-dir ... --layer-decay 0.75 --ema-decay 0.9998
    # several processes (gloo on CPU, nccl on GPU); --batch-size is per process
    uv run torchrun --nproc-per-node 2 scripts/finetune_vit.py ...

The recipe is timm's ``train.py`` in miniature: AdamW (no weight decay on gains, biases,
position embedding and class token) with linear warm-up and cosine decay, label
smoothing, optional layer-wise learning-rate decay (``--layer-decay``, ViT / Swin) and an
EMA of the weights (``--ema-decay``, evaluated too), timm-style training augmentation
(random resized crop, horizontal flip, RandAugment or TrivialAugment or colour jitter,
random erasing) and timm's evaluation transform, bf16/fp16 autocast, gradient
accumulation, gradient checkpointing, top-1 / top-5 on the validation set after every
epoch. Unreadable images are skipped with a warning and counted.

Checkpoints (``--out``/``last``, ``best``): ``model.safetensors`` (+ ``ema.safetensors``),
``trainer_state.pt`` (optimizer, scheduler, scaler, RNG, progress) and ``config.json``
(``attn_vision.save_pretrained``: ``attn_vision.create_model(<out>/best)`` loads the model;
the class names are its ``pretrained_cfg["label_names"]``); written atomically. Rerunning
the same command resumes exactly. A non-finite loss stops the run with a clear message and
leaves the last good checkpoint untouched.
"""

from __future__ import annotations

import argparse
import copy
import json
import re
import sys
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).parent))
import train_utils as tu  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    g = p.add_argument_group("model")
    g.add_argument("--model", default="vit_tiny_patch16_224", help="attn_vision / timm name")
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
        "--set",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="model config overrides, e.g. depth=6 embed_dim=192 num_heads=3",
    )
    g.add_argument("--grad-checkpointing", action="store_true")

    g = p.add_argument_group("data")
    g.add_argument("--train-dir", type=Path, required=True, help="ImageFolder: CLASS/IMAGE")
    g.add_argument("--val-dir", type=Path, default=None, help="ImageFolder with the same classes")
    g.add_argument("--workers", type=int, default=0, help="DataLoader worker processes")
    g.add_argument("--no-augment", action="store_true", help="train with the eval transform")
    g.add_argument(
        "--crop-pct", type=float, default=None, help="eval center-crop fraction (default: timm's)"
    )
    g.add_argument("--scale", type=float, nargs=2, default=(0.08, 1.0), help="RRC area range")
    g.add_argument("--hflip", type=float, default=0.5)
    g.add_argument("--aa", choices=["rand", "trivial", "none"], default="rand", help="auto-aug")
    g.add_argument("--color-jitter", type=float, default=0.4, help="used when --aa none")
    g.add_argument("--reprob", type=float, default=0.25, help="random erasing probability")

    g = p.add_argument_group("optimisation")
    g.add_argument("--epochs", type=int, default=10)
    g.add_argument("--max-steps", type=int, default=None, help="total updates (sets the schedule)")
    g.add_argument("--batch-size", type=int, default=64, help="per process and micro-step")
    g.add_argument("--accum", type=int, default=1, help="micro-steps per update")
    g.add_argument("--lr", type=float, default=5e-4)
    g.add_argument("--wd", type=float, default=0.05)
    g.add_argument("--warmup", type=int, default=100, help="warm-up updates")
    g.add_argument("--min-lr-ratio", type=float, default=0.01, help="cosine floor, x --lr")
    g.add_argument("--label-smoothing", type=float, default=0.1)
    g.add_argument("--layer-decay", type=float, default=None, help="e.g. 0.75 (ViT / Swin)")
    g.add_argument("--ema-decay", type=float, default=None, help="e.g. 0.9998")
    g.add_argument("--grad-clip", type=float, default=None, help="max gradient norm")
    g.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16", "fp16"])

    g = p.add_argument_group("run")
    g.add_argument("--out", type=Path, required=True, help="run directory")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--device", default=None)
    g.add_argument("--threads", type=int, default=None, help="CPU threads per process")
    g.add_argument("--log-every", type=int, default=20)
    g.add_argument("--save-every", type=int, default=500, help="updates between checkpoints")
    g.add_argument("--eval-batch-size", type=int, default=256)
    g.add_argument("--no-resume", action="store_true", help="start over even if OUT/last exists")
    g.add_argument("--quiet", action="store_true", help="no progress bar")
    g.add_argument("--debug-nan-at-step", type=int, default=None, help=argparse.SUPPRESS)
    return p


# -- model and optimizer -----------------------------------------------------------------


def build_model(args: argparse.Namespace, num_classes: int) -> nn.Module:
    """The attn_vision model with a ``num_classes``-way head (a fresh one after loading)."""
    import attn_vision

    overrides: dict[str, Any] = parse_overrides(args.set)
    if args.img_size is not None:
        overrides["img_size"] = args.img_size
    if args.patch_size is not None:
        overrides["patch_size"] = args.patch_size
    config = attn_vision.get_model_config(args.model, **overrides)
    if hasattr(config, "drop_path_rate"):
        overrides["drop_path_rate"] = args.drop_path
    if args.pretrained is False:
        return attn_vision.create_model(args.model, num_classes=num_classes, **overrides)
    model = attn_vision.create_model(args.model, pretrained=args.pretrained, **overrides)
    if model.num_classes != num_classes:
        model.reset_classifier(num_classes)
        model.pretrained_cfg["num_classes"] = num_classes
    return model


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """``["depth=6", "qkv_bias=false"]`` -> ``{"depth": 6, "qkv_bias": False}`` (JSON values)."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--set expects KEY=VALUE, got {item!r}")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def layer_id(name: str, num_layers: int, depths: list[int] | None) -> int:
    """0 for the embeddings, ``i + 1`` for block ``i``, ``num_layers + 1`` for the head."""
    if name.startswith(("cls_token", "pos_embed", "patch_embed", "reg_token")):
        return 0
    m = re.match(r"blocks\.(\d+)\.", name)
    if m:
        return int(m[1]) + 1
    m = re.match(r"layers\.(\d+)\.(?:blocks\.(\d+)|downsample)", name)
    if m and depths is not None:
        stage, block = int(m[1]), m[2]
        return sum(depths[:stage]) + (int(block) + 1 if block is not None else 0)
    return num_layers + 1


def param_groups(model: nn.Module, wd: float, layer_decay: float | None) -> list[dict]:
    """timm's optimizer groups: no weight decay on 1-d params, position embedding, class
    token; with ``layer_decay``, lr scale ``decay ** (num_layers + 1 - layer_id)``."""
    depths = list(getattr(model.config, "depths", [])) or None
    num_layers = sum(depths) if depths else getattr(model.config, "depth", None)
    if layer_decay is not None and num_layers is None:
        raise ValueError("--layer-decay supports ViT and Swin models")
    skip = ("pos_embed", "cls_token", "reg_token", "relative_position_bias_table")
    groups: dict[tuple[int, bool], dict] = {}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        no_decay = p.ndim <= 1 or name.endswith(".bias") or any(s in name for s in skip)
        lid = layer_id(name, num_layers, depths) if layer_decay is not None else 0
        scale = layer_decay ** (num_layers + 1 - lid) if layer_decay is not None else 1.0
        group = groups.setdefault(
            (lid, no_decay),
            {"params": [], "weight_decay": 0.0 if no_decay else wd, "lr_scale": scale},
        )
        group["params"].append(p)
    return list(groups.values())


class ModelEma(nn.Module):
    """Exponential moving average of a model's weights (timm's ``ModelEmaV3``, with warm-up:
    the decay is ``min(decay, (1 + step) / (10 + step))``)."""

    def __init__(self, model: nn.Module, decay: float) -> None:
        super().__init__()
        self.module = copy.deepcopy(model).eval().requires_grad_(False)
        self.decay = decay

    @torch.no_grad()
    def update(self, model: nn.Module, step: int) -> None:
        decay = min(self.decay, (1 + step) / (10 + step))
        ema = self.module.state_dict()
        for k, v in model.state_dict().items():
            if v.dtype.is_floating_point:
                ema[k].lerp_(v.detach(), 1 - decay)
            else:
                ema[k].copy_(v)


# -- data --------------------------------------------------------------------------------


def train_transform(args: argparse.Namespace, data_cfg: dict[str, Any]):
    """timm's training pipeline from torchvision pieces."""
    from torchvision import transforms as T

    size = data_cfg["input_size"][1:]
    interp = T.InterpolationMode(data_cfg["interpolation"])
    steps: list[Any] = [T.RandomResizedCrop(size, scale=tuple(args.scale), interpolation=interp)]
    if args.hflip > 0:
        steps.append(T.RandomHorizontalFlip(args.hflip))
    if args.aa == "rand":
        steps.append(T.RandAugment(num_ops=2, magnitude=9, interpolation=interp))
    elif args.aa == "trivial":
        steps.append(T.TrivialAugmentWide(interpolation=interp))
    elif args.color_jitter > 0:
        steps.append(T.ColorJitter(*(args.color_jitter,) * 3))
    steps += [T.ToTensor(), T.Normalize(data_cfg["mean"], data_cfg["std"])]
    if args.reprob > 0:
        steps.append(T.RandomErasing(p=args.reprob, value="random"))
    return T.Compose(steps)


@torch.no_grad()
def evaluate(model: nn.Module, loader, device, precision: str) -> dict[str, float]:
    """Top-1 / top-5 accuracy and mean cross-entropy over a loader."""
    was_training = model.training
    model.eval()
    correct1 = correct5 = n = 0
    loss_sum = 0.0
    for batch, _ in loader:
        if batch is None:
            continue
        images, labels = batch[0].to(device), batch[1].to(device)
        with tu.autocast(device, precision):
            logits = model(images).float()
        k = min(5, logits.shape[-1])
        top = logits.topk(k, dim=-1).indices
        correct1 += (top[:, 0] == labels).sum().item()
        correct5 += (top == labels[:, None]).any(dim=-1).sum().item()
        loss_sum += F.cross_entropy(logits, labels, reduction="sum").item()
        n += len(labels)
    model.train(was_training)
    n = max(1, n)
    return {"top1": correct1 / n, "top5": correct5 / n, "loss": loss_sum / n}


# -- training ----------------------------------------------------------------------------


def train(args: argparse.Namespace) -> dict[str, Any]:
    import attn_vision
    from attn_clip.data import ImageFolderDataset, collate_skip_unreadable
    from safetensors.torch import load_model, save_model
    from torch.utils.data import DataLoader

    if args.accum < 1 or args.batch_size < 1:
        raise ValueError("--accum and --batch-size must be >= 1")
    d, precision, log, last, resume = tu.start_run(args)

    probe = ImageFolderDataset(args.train_dir)  # class list first: it sizes the head
    classes = probe.classes
    model = build_model(args, len(classes)).to(d.device)
    data_cfg = attn_vision.resolve_data_config(model, crop_pct=args.crop_pct)
    eval_tf = attn_vision.create_transform(model, crop_pct=args.crop_pct)
    train_tf = eval_tf if args.no_augment else train_transform(args, data_cfg)
    data = ImageFolderDataset(args.train_dir, train_tf, seed=args.seed)
    val_loader = None
    if args.val_dir is not None:
        val = ImageFolderDataset(args.val_dir, eval_tf)
        if val.classes != classes:
            raise ValueError(f"{args.val_dir} has classes {val.classes}, train has {classes}")
        val_loader = DataLoader(
            val, batch_size=args.eval_batch_size, collate_fn=collate_skip_unreadable
        )
    if args.grad_checkpointing:
        model.set_grad_checkpointing(True)
    model.train()
    ema = ModelEma(model, args.ema_decay) if args.ema_decay is not None else None

    ddp_model = tu.wrap_ddp(model, d)
    groups = param_groups(model, args.wd, args.layer_decay)
    optimizer = torch.optim.AdamW(groups, lr=args.lr)
    loader, sampler = tu.make_loader(
        data,
        args.batch_size,
        d,
        seed=args.seed,
        collate_fn=collate_skip_unreadable,
        num_workers=args.workers,
    )
    steps_per_epoch = len(loader) // args.accum
    if steps_per_epoch == 0:
        raise ValueError(
            f"an epoch has {len(loader)} batches per process, fewer than --accum {args.accum}"
        )
    max_steps = args.max_steps or args.epochs * steps_per_epoch
    epochs = max(args.epochs, -(-max_steps // steps_per_epoch))
    base = tu.cosine_schedule(args.warmup, max_steps, args.min_lr_ratio)
    # one LambdaLR multiplier per group: the layer-decay scale times the schedule
    lambdas = [lambda step, s=g["lr_scale"]: s * base(step) for g in groups]
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambdas)
    scaler = tu.make_scaler(d.device, precision)

    progress = {"step": 0, "epoch": 0, "batches": 0, "skipped_images": 0, "best": -1.0}
    progress["seed"] = args.seed
    if resume:
        progress = tu.load_checkpoint(
            last, d, model=model, optimizer=optimizer, scheduler=scheduler, scaler=scaler
        )
        found = tu.find_checkpoint(last)
        if ema is not None and (found / "ema.safetensors").is_file():
            load_model(ema.module, str(found / "ema.safetensors"), device=str(d.device))
        log.log({"event": "resume", "from": str(last), **progress})
    else:
        log.log(
            {
                "event": "start",
                "model": args.model,
                "pretrained": str(args.pretrained),
                "params": sum(p.numel() for p in model.parameters()),
                "classes": len(classes),
                "samples": len(data),
                "global_batch": args.batch_size * args.accum * d.world_size,
                "steps": max_steps,
                "precision": precision,
                "world_size": d.world_size,
            }
        )

    model.pretrained_cfg["label_names"] = classes  # timm's field for the class names

    def write_files(directory: Path) -> None:  # a folder attn_vision.create_model loads
        attn_vision.save_pretrained(model, directory)
        if ema is not None:
            save_model(ema.module, str(directory / "ema.safetensors"))

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

    result: dict[str, Any] = {}
    losses: list[float] = []
    while progress["step"] < max_steps and progress["epoch"] < epochs:
        epoch = progress["epoch"]
        sampler.set_epoch(epoch)
        data.set_epoch(epoch)
        sampler.skip(progress["batches"] * args.batch_size)
        ddp_model.train()
        bar = None
        if d.is_main and not args.quiet:
            from tqdm import tqdm

            bar = tqdm(total=len(loader), desc=f"epoch {epoch}", leave=False)
        optimizer.zero_grad(set_to_none=True)
        running, micro, stopped = 0.0, 0, False
        for batch, skipped in loader:
            if progress["step"] >= max_steps:
                stopped = True
                break
            progress["batches"] += 1
            progress["skipped_images"] += round(tu.all_reduce_sum(skipped, d))
            if bar is not None:
                bar.update(1)
            micro += 1
            sync = micro % args.accum == 0
            n = 0 if batch is None else len(batch[1])
            if d.enabled:  # every rank must run backward: trim to the smallest local batch
                n = tu.all_reduce_min(n, d)
            if n > 0:
                images, labels = batch[0][:n].to(d.device), batch[1][:n].to(d.device)
                with tu.maybe_no_sync(ddp_model, sync), tu.autocast(d.device, precision):
                    logits = ddp_model(images)
                    loss = F.cross_entropy(
                        logits.float(), labels, label_smoothing=args.label_smoothing
                    )
                if args.debug_nan_at_step == progress["step"] + 1:
                    loss = loss * float("nan")
                try:
                    tu.check_finite(
                        loss, d, checkpoint=last, step=progress["step"] + 1, epoch=epoch, log=log
                    )
                except tu.NonFiniteLossError:
                    if bar is not None:
                        bar.close()
                    tu.cleanup_distributed()
                    raise
                with tu.maybe_no_sync(ddp_model, sync):
                    scaler.scale(loss / args.accum).backward()
                running += loss.item() / args.accum
            if not sync:
                continue
            scaler.unscale_(optimizer)
            if args.grad_clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            scheduler.step()
            progress["step"] += 1
            if ema is not None:
                ema.update(model, progress["step"])
            step_loss, running = tu.all_reduce_mean(running, d), 0.0
            losses.append(step_loss)
            if progress["step"] % args.log_every == 0 or progress["step"] == 1:
                log.log(
                    {
                        "step": progress["step"],
                        "epoch": epoch,
                        "loss": step_loss,
                        "lr": max(scheduler.get_last_lr()),
                    },
                    echo=bar is None,
                )
                if bar is not None:
                    bar.set_postfix(loss=f"{step_loss:.3f}")
            if progress["step"] % args.save_every == 0:
                save("last")
        if bar is not None:
            bar.close()
        if not stopped:
            progress["epoch"] += 1
            progress["batches"] = 0
        save_best = False
        if val_loader is not None and d.is_main:
            metrics = evaluate(model, val_loader, d.device, precision)
            record = {f"val/{k}": v for k, v in metrics.items()}
            if ema is not None:
                ema_metrics = evaluate(ema.module, val_loader, d.device, precision)
                record.update({f"val_ema/{k}": v for k, v in ema_metrics.items()})
            log.log({"event": "eval", "step": progress["step"], "epoch": epoch, **record})
            result.update(record)
            save_best = metrics["top1"] > progress["best"]
            progress["best"] = max(progress["best"], metrics["top1"])
        if tu.all_reduce_mean(float(save_best), d) > 0:
            save("best")
        save("last")
    tu.cleanup_distributed()
    if losses:
        k = max(1, min(5, len(losses) // 2))
        result.update(first_loss=sum(losses[:k]) / k, last_loss=sum(losses[-k:]) / k)
    result.update(step=progress["step"], skipped_images=progress["skipped_images"])
    result["out"] = str(args.out)
    log.log({"event": "done", **result})
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    return train(build_parser().parse_args(argv))


if __name__ == "__main__":
    try:
        main()
    except tu.NonFiniteLossError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(1) from None
