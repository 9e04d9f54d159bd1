"""Train a CLIP from scratch, or fine-tune a pretrained one, on image-caption CSVs.

    # the generated shapes data and the bundled demo model (docs/training.md)
    uv run scripts/make_shapes.py data/shapes
    uv run scripts/train_clip.py --model demo-shapes --train-data data/shapes/train.csv \
        --zeroshot-dir data/shapes/heldout --zeroshot-classnames data/shapes/classnames.txt \
        --out runs/demo-shapes
    # fine-tune OpenAI's ViT-B/32 (LiT: --lock-image; WiSE-FT: --wise-ft-alpha 0.5)
    uv run scripts/train_clip.py --model ViT-B-32 --pretrained openai --train-data my.csv ...
    # several processes (gloo on CPU, nccl on GPU); --batch-size is per process
    uv run torchrun --nproc-per-node 2 scripts/train_clip.py ...

Data: a CSV in open_clip's convention (``filepath,title``; ``--csv-img-key`` /
``--csv-caption-key``; comma or tab; paths relative to the CSV). Unreadable images are
skipped with a warning and counted. Zero-shot top-1 / top-5 on ImageFolder sets
(``--zeroshot-dir``, repeatable) is measured after every epoch with prompts
``--zeroshot-templates`` over the class names (the folder names, or the full list from
``--zeroshot-classnames``, so held-out folders are scored against every class).

Training: AdamW (no weight decay on gains, biases, the temperature and the class token),
linear warm-up then cosine decay, ``--loss clip`` (InfoNCE) or ``siglip`` (sigmoid; a
logit bias is added when the model has none), bf16/fp16 autocast, gradient accumulation
that gives exactly the large-batch loss (features of every micro-batch are cached and
each micro-batch is re-run against all of them, as open_clip's ``--accum-freq`` does),
optional gradient checkpointing. Under ``torchrun`` every rank contrasts its pairs
against the features of all ranks (differentiable all-gather); a distributed sampler
shows every sample once per epoch. A non-finite loss stops the run with a clear message
and leaves the last good checkpoint untouched.

Outputs in ``--out``: ``last/`` (and ``best/``, by the first zero-shot set) checkpoint
folders (``model.safetensors`` + ``open_clip_config.json``, loadable with
``attn_clip.create_model(folder)``; ``trainer_state.pt`` for exact resume -- rerun the
same command), ``final/`` in open_clip's layout (``attn_clip.save_pretrained``),
``wise_ft/`` with ``--wise-ft-alpha``, and ``log.jsonl``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))
import train_utils as tu  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
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
        "--pretrained", default=None, help="tag (openai, laion2b_s34b_b79k, ...) or a checkpoint"
    )
    g.add_argument("--lock-image", action="store_true", help="freeze the image tower (LiT)")
    g.add_argument(
        "--wise-ft-alpha",
        type=float,
        default=None,
        help="also write wise_ft/: (1 - a) * initial + a * fine-tuned weights",
    )
    g.add_argument("--grad-checkpointing", action="store_true")

    g = p.add_argument_group("data")
    g.add_argument("--train-data", type=Path, required=True, help="CSV of image paths + captions")
    g.add_argument("--csv-img-key", default="filepath")
    g.add_argument("--csv-caption-key", default="title")
    g.add_argument("--csv-separator", default=None, help="default: tab or comma, from the header")
    g.add_argument("--val-data", type=Path, default=None, help="CSV scored by retrieval recall")
    g.add_argument(
        "--zeroshot-dir", type=Path, action="append", default=[], help="ImageFolder (repeatable)"
    )
    g.add_argument("--zeroshot-classnames", type=Path, default=None, help="one class per line")
    g.add_argument("--zeroshot-templates", nargs="+", default=["a photo of a {}."])
    g.add_argument("--no-augment", action="store_true", help="no random resized crop")
    g.add_argument("--workers", type=int, default=0, help="DataLoader worker processes")

    g = p.add_argument_group("optimisation")
    g.add_argument("--loss", choices=["clip", "siglip"], default="clip")
    g.add_argument("--epochs", type=int, default=10)
    g.add_argument("--max-steps", type=int, default=None, help="total updates (sets the schedule)")
    g.add_argument("--batch-size", type=int, default=128, help="per process and micro-step")
    g.add_argument("--accum", type=int, default=1, help="micro-steps per update")
    g.add_argument("--lr", type=float, default=1e-3)
    g.add_argument("--wd", type=float, default=0.1)
    g.add_argument("--beta1", type=float, default=0.9)
    g.add_argument("--beta2", type=float, default=0.98)
    g.add_argument("--eps", type=float, default=1e-6)
    g.add_argument("--warmup", type=int, default=100, help="warm-up updates")
    g.add_argument("--min-lr-ratio", type=float, default=0.0, help="cosine floor, x --lr")
    g.add_argument("--grad-clip", type=float, default=None, help="max gradient norm")
    g.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16", "fp16"])

    g = p.add_argument_group("run")
    g.add_argument("--out", type=Path, required=True, help="run directory")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--device", default=None)
    g.add_argument("--threads", type=int, default=None, help="CPU threads per process")
    g.add_argument("--log-every", type=int, default=20)
    g.add_argument("--save-every", type=int, default=200, help="updates between checkpoints")
    g.add_argument("--eval-batch-size", type=int, default=256)
    g.add_argument(
        "--export-fp16", type=Path, default=None, help="also write final weights here (fp16)"
    )
    g.add_argument("--no-resume", action="store_true", help="start over even if OUT/last exists")
    g.add_argument("--quiet", action="store_true", help="no progress bar")
    g.add_argument("--debug-nan-at-step", type=int, default=None, help=argparse.SUPPRESS)
    return p


# -- model -------------------------------------------------------------------------------


def build_model(args: argparse.Namespace):
    """The CLIP to train (fp32 weights, train mode): from scratch, or pretrained / a folder."""
    import attn_clip
    from torch import nn

    from_folder = os.path.isdir(args.model) or args.model.startswith(("local-dir:", "hf-hub:"))
    if args.set and (args.pretrained is not None or from_folder):
        raise ValueError("--set changes the architecture: only for training from scratch")
    if args.pretrained is None and not from_folder:
        config = set_overrides(attn_clip.get_model_config(args.model), args.set)
        if args.loss == "siglip" and config.init_logit_bias is None:
            config.init_logit_scale, config.init_logit_bias = math.log(10.0), -10.0  # SigLIP
        model = attn_clip.create_model(config)  # preprocessing: config's size, OpenAI mean/std
        init_vision_like_open_clip(model)
        model.train()
    else:
        model = attn_clip.create_model(args.model, pretrained=args.pretrained)
        model.train()
        if args.loss == "siglip" and model.logit_bias is None:
            model.logit_bias = nn.Parameter(torch.tensor(-10.0))
            model.config.init_logit_bias = -10.0
    return model


@torch.no_grad()
def init_vision_like_open_clip(model) -> None:
    """Re-initialise the image tower for training from scratch the way open_clip's text
    tower is (and its class / position embeddings are): ``std = width ** -0.5``.

    The ViT trunk comes with timm's init (class token ~0, weights ``std=0.02``), meant
    for wide classifiers; in a narrow CLIP tower it makes every image embed almost
    identically at the start (cosine ~0.9999) and the contrastive loss sits at
    ``ln(batch)`` for a long time before it starts to fall.
    """
    trunk, width = model.visual.trunk, model.config.vision.width
    layers = model.config.vision.layers
    attn_std, fc_std = width**-0.5, (2 * width) ** -0.5
    proj_std = attn_std * (2 * layers) ** -0.5
    torch.nn.init.normal_(trunk.cls_token, std=attn_std)
    torch.nn.init.normal_(trunk.pos_embed, std=attn_std)
    for blk in trunk.blocks:
        torch.nn.init.normal_(blk.attn.qkv.weight, std=attn_std)
        torch.nn.init.normal_(blk.attn.proj.weight, std=proj_std)
        torch.nn.init.normal_(blk.mlp.fc1.weight, std=fc_std)
        torch.nn.init.normal_(blk.mlp.fc2.weight, std=proj_std)


def set_overrides(config, items: list[str]):
    """A copy of a ``CLIPConfig`` with ``KEY=VALUE`` overrides (``vision.layers=2``)."""
    from attn_clip import CLIPConfig

    d = config.to_dict()
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--set expects KEY=VALUE, got {item!r}")
        *parents, leaf = key.split(".")
        target = d
        for part in parents:
            target = target[part]
        if leaf not in target:
            raise ValueError(f"--set: unknown config key {key!r}")
        try:
            target[leaf] = json.loads(value)
        except json.JSONDecodeError:
            target[leaf] = value
    return CLIPConfig.from_dict(d)


def param_groups(model: torch.nn.Module, wd: float) -> list[dict[str, Any]]:
    """open_clip's split: no weight decay on gains, biases, scalars and the class token."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if p.ndim < 2 or "cls_token" in name or "logit_" in name:
            no_decay.append(p)
        else:
            decay.append(p)
    return [
        {"params": decay, "weight_decay": wd},
        {"params": no_decay, "weight_decay": 0.0},
    ]


# -- evaluation --------------------------------------------------------------------------


def _batches(loader, device):
    for batch, _ in loader:
        if batch is not None:
            yield [t.to(device) for t in batch]


@torch.no_grad()
def zero_shot_eval(model, tokenizer, dataset, templates, device, batch_size) -> dict[str, float]:
    """Top-1 / top-5 of zero-shot classification over ``dataset.classes``."""
    from attn_clip import build_zero_shot_classifier, zero_shot_logits
    from attn_clip.data import collate_skip_unreadable
    from attn_clip.shapes import class_text
    from torch.utils.data import DataLoader

    names = [class_text(c) for c in dataset.classes]
    classifier = build_zero_shot_classifier(
        model, tokenizer, names, templates, batch_size=None, device=device
    )
    loader = DataLoader(dataset, batch_size=batch_size, collate_fn=collate_skip_unreadable)
    k = min(5, len(names))
    correct1 = correct5 = n = 0
    for images, labels in _batches(loader, device):
        logits = zero_shot_logits(model, model.encode_image(images), classifier)
        top = logits.topk(k, dim=-1).indices
        correct1 += (top[:, 0] == labels).sum().item()
        correct5 += (top == labels[:, None]).any(dim=-1).sum().item()
        n += len(labels)
    return {"top1": correct1 / max(1, n), "top5": correct5 / max(1, n), "n": n}


@torch.no_grad()
def retrieval_eval(model, dataset, device, batch_size) -> dict[str, float]:
    """Image->text / text->image recall@1,5,10 over a captioned set (one caption each)."""
    from attn_clip import retrieval_metrics
    from attn_clip.data import collate_skip_unreadable
    from torch.utils.data import DataLoader

    loader = DataLoader(dataset, batch_size=batch_size, collate_fn=collate_skip_unreadable)
    img, txt = [], []
    for images, texts in _batches(loader, device):
        img.append(model.encode_image(images, normalize=True))
        txt.append(model.encode_text(texts, normalize=True))
    return retrieval_metrics(torch.cat(img), torch.cat(txt))


def evaluate(model, tokenizer, zs_sets, val_set, args, device) -> dict[str, float]:
    was_training = model.training
    model.eval()
    out: dict[str, float] = {}
    for name, dataset in zs_sets.items():
        m = zero_shot_eval(
            model, tokenizer, dataset, args.zeroshot_templates, device, args.eval_batch_size
        )
        out[f"zeroshot/{name}/top1"], out[f"zeroshot/{name}/top5"] = m["top1"], m["top5"]
    if val_set is not None:
        m = retrieval_eval(model, val_set, device, args.eval_batch_size)
        out.update({f"val/{k}": v for k, v in m.items()})
    model.train(was_training)
    return out


# -- one update --------------------------------------------------------------------------


def contrastive_step(ddp_model, model, loss_fn, micro, precision, device, scaler, lock_image):
    """Forward/backward for one update over the micro-batches ``[(images, texts), ...]``.

    One micro-batch: plain. Several: their features are first computed without
    gradients, then each micro-batch is re-run and scored against all the cached
    features (its own live), so the summed gradients equal those of one big batch. The
    temperature / bias take part only in the last pass (their gradient is already the
    full one there). Returns the (big-batch) loss and a function that runs the backward
    passes (called after the NaN check, so a bad step touches no gradient).
    """
    last = len(micro) - 1
    if last == 0:
        images, texts = micro[0]
        with tu.autocast(device, precision):
            out = ddp_model(images, texts)
            loss = loss_fn(out.image_embeds, out.text_embeds, out.logit_scale, out.logit_bias)
        return loss, lambda: scaler.scale(loss).backward()

    with torch.no_grad(), tu.autocast(device, precision):
        cached = [model(images, texts) for images, texts in micro]
    img_cache = [c.image_embeds for c in cached]
    txt_cache = [c.text_embeds for c in cached]

    def backward() -> None:
        for j, (images, texts) in enumerate(micro):
            with tu.maybe_no_sync(ddp_model, j == last), tu.autocast(device, precision):
                out = ddp_model(images, texts)
                img = torch.cat(img_cache[:j] + [out.image_embeds] + img_cache[j + 1 :])
                if lock_image:  # no gradient can reach the image tower: use the cache
                    img = torch.cat(img_cache)
                txt = torch.cat(txt_cache[:j] + [out.text_embeds] + txt_cache[j + 1 :])
                scale, bias = out.logit_scale, out.logit_bias
                if j != last:
                    scale = scale.detach()
                    bias = bias.detach() if bias is not None else None
                loss = loss_fn(img, txt, scale, bias)
            scaler.scale(loss).backward()  # DDP decided at forward time whether to sync

    # the loss value, for the NaN check before any gradient is touched
    with torch.no_grad(), tu.autocast(device, precision):
        value = loss_fn(
            torch.cat(img_cache),
            torch.cat(txt_cache),
            cached[-1].logit_scale,
            cached[-1].logit_bias,
        )
    return value, backward


# -- training ----------------------------------------------------------------------------


def train(args: argparse.Namespace) -> dict[str, Any]:
    import attn_clip
    from attn_clip.data import CsvImageTextDataset, ImageFolderDataset, collate_skip_unreadable

    if args.wise_ft_alpha is not None and not 0.0 <= args.wise_ft_alpha <= 1.0:
        raise ValueError(f"--wise-ft-alpha must be in [0, 1], got {args.wise_ft_alpha}")
    if args.accum < 1 or args.batch_size < 1:
        raise ValueError("--accum and --batch-size must be >= 1")

    d, precision, log, last, resume = tu.start_run(args)

    model = build_model(args).to(d.device)
    model.train()
    if args.lock_image:
        for p in model.visual.parameters():
            p.requires_grad_(False)
    if args.grad_checkpointing:
        model.set_grad_checkpointing(True)
    tokenizer = attn_clip.get_tokenizer(model.config)
    train_tf = attn_clip.image_transform(model.preprocess_cfg, is_train=not args.no_augment)
    eval_tf = attn_clip.image_transform(model.preprocess_cfg)

    data = CsvImageTextDataset(
        args.train_data,
        train_tf,
        tokenizer,
        img_key=args.csv_img_key,
        caption_key=args.csv_caption_key,
        sep=args.csv_separator,
        seed=args.seed,
    )
    classnames = None
    if args.zeroshot_classnames is not None:
        lines = args.zeroshot_classnames.read_text(encoding="utf-8").splitlines()
        classnames = [c.strip() for c in lines if c.strip()]
    zs_sets = {p.name: ImageFolderDataset(p, eval_tf, classnames) for p in args.zeroshot_dir}
    val_set = None
    if args.val_data is not None:
        val_set = CsvImageTextDataset(
            args.val_data,
            eval_tf,
            tokenizer,
            img_key=args.csv_img_key,
            caption_key=args.csv_caption_key,
            sep=args.csv_separator,
        )

    ddp_model = tu.wrap_ddp(model, d)
    if args.loss == "clip":
        loss_fn = attn_clip.ClipLoss(gather_with_grad=True)
    else:
        loss_fn = attn_clip.SigLipLoss()
    optimizer = torch.optim.AdamW(
        param_groups(model, args.wd), lr=args.lr, betas=(args.beta1, args.beta2), eps=args.eps
    )
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
    epochs = max(args.epochs, math.ceil(max_steps / steps_per_epoch))
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, tu.cosine_schedule(args.warmup, max_steps, args.min_lr_ratio)
    )
    scaler = tu.make_scaler(d.device, precision)

    args.out.mkdir(parents=True, exist_ok=True)
    init_path = args.out / "wise_ft_init.safetensors"
    progress = {
        "step": 0,
        "epoch": 0,
        "batches": 0,
        "skipped_images": 0,
        "best": -1.0,
        "seed": args.seed,
    }
    if resume:
        progress = tu.load_checkpoint(
            last, d, model=model, optimizer=optimizer, scheduler=scheduler, scaler=scaler
        )
        log.log({"event": "resume", "from": str(last), **progress})
    else:
        if args.wise_ft_alpha is not None and d.is_main:
            from safetensors.torch import save_model

            save_model(model, str(init_path))
        log.log(
            {
                "event": "start",
                "model": args.model,
                "pretrained": args.pretrained,
                "params": sum(p.numel() for p in model.parameters()),
                "trainable": sum(p.numel() for p in model.parameters() if p.requires_grad),
                "samples": len(data),
                "global_batch": args.batch_size * args.accum * d.world_size,
                "steps": max_steps,
                "loss": args.loss,
                "precision": precision,
                "world_size": d.world_size,
            }
        )

    def write_files(directory: Path) -> None:
        meta = {
            "model_cfg": model.config.to_open_clip(),
            "preprocess_cfg": asdict(model.preprocess_cfg),
        }
        (directory / "open_clip_config.json").write_text(json.dumps(meta, indent=2))

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
        if args.lock_image:
            model.visual.eval()
        bar = None
        if d.is_main and not args.quiet:
            from tqdm import tqdm

            bar = tqdm(total=len(loader), desc=f"epoch {epoch}", leave=False)
        micro: list[tuple[torch.Tensor, torch.Tensor]] = []
        stopped = False
        for batch, skipped in loader:
            if progress["step"] >= max_steps:
                stopped = True
                break
            progress["batches"] += 1
            if bar is not None:
                bar.update(1)
            progress["skipped_images"] += round(tu.all_reduce_sum(skipped, d))
            n = 0 if batch is None else len(batch[0])
            if d.enabled:  # the all-gather needs equal local batches: trim to the smallest
                n = tu.all_reduce_min(n, d)
            if n > 0:
                images, texts = batch
                micro.append((images[:n].to(d.device), texts[:n].to(d.device)))
            if progress["batches"] % args.accum:
                continue
            if not micro:  # every image of this update was unreadable
                continue
            loss, backward = contrastive_step(
                ddp_model, model, loss_fn, micro, precision, d.device, scaler, args.lock_image
            )
            micro = []
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
            backward()
            scaler.unscale_(optimizer)
            if args.grad_clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            scheduler.step()
            model.clamp_logit_scale_()
            progress["step"] += 1
            step_loss = tu.all_reduce_mean(loss.item(), d)
            losses.append(step_loss)
            if progress["step"] % args.log_every == 0 or progress["step"] == 1:
                log.log(
                    {
                        "step": progress["step"],
                        "epoch": epoch,
                        "loss": step_loss,
                        "lr": scheduler.get_last_lr()[0],
                        "logit_scale": model.logit_scale.exp().item(),
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
        if d.is_main and (zs_sets or val_set is not None):
            metrics = evaluate(model, tokenizer, zs_sets, val_set, args, d.device)
            log.log({"event": "eval", "step": progress["step"], "epoch": epoch, **metrics})
            result.update(metrics)
            if zs_sets:
                key = f"zeroshot/{next(iter(zs_sets))}/top1"
                save_best = metrics[key] > progress["best"]
                progress["best"] = max(progress["best"], metrics[key])
        if tu.all_reduce_mean(float(save_best), d) > 0:
            save("best")
        save("last")

    if d.is_main:
        finish(args, model, tokenizer, zs_sets, val_set, init_path, log, result)
    tu.barrier(d)
    tu.cleanup_distributed()
    if losses:
        k = max(1, min(5, len(losses) // 2))
        result.update(first_loss=sum(losses[:k]) / k, last_loss=sum(losses[-k:]) / k)
    result.update(step=progress["step"], skipped_images=progress["skipped_images"])
    result["out"] = str(args.out)
    log.log({"event": "done", **result})
    return result


def finish(args, model, tokenizer, zs_sets, val_set, init_path, log, result) -> None:
    """Write ``final/`` (open_clip layout), ``--export-fp16``, and the WiSE-FT model."""
    import attn_clip
    from attn_clip.convert import to_open_clip
    from safetensors.torch import load_file, save_file

    model.eval()
    attn_clip.save_pretrained(model, args.out / "final")
    if args.export_fp16 is not None:
        sd = {k: v.detach().cpu().half().contiguous() for k, v in model.state_dict().items()}
        args.export_fp16.parent.mkdir(parents=True, exist_ok=True)
        tmp = args.export_fp16.with_name(args.export_fp16.name + ".tmp")
        save_file(to_open_clip(sd), str(tmp))
        tmp.replace(args.export_fp16)
        log.log({"event": "export", "path": str(args.export_fp16)})
    if args.wise_ft_alpha is not None:
        a = args.wise_ft_alpha
        init = load_file(str(init_path), device=str(next(model.parameters()).device))
        state = model.state_dict()
        mixed = {k: (1 - a) * init[k] + a * state[k] for k in state}
        wise = build_model(args)
        wise.load_state_dict(mixed)
        device = next(model.parameters()).device
        wise.to(device).eval()
        attn_clip.save_pretrained(wise, args.out / "wise_ft")
        if zs_sets or val_set is not None:
            metrics = evaluate(wise, tokenizer, zs_sets, val_set, args, device)
            log.log({"event": "eval_wise_ft", "alpha": a, **metrics})
            result.update({f"wise_ft/{k}": v for k, v in metrics.items()})


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = build_parser().parse_args(argv)
    return train(args)


if __name__ == "__main__":
    try:
        main()
    except tu.NonFiniteLossError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(1) from None
