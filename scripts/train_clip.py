r"""Train a CLIP from scratch, or fine-tune a pretrained one, on image-caption CSVs.

    # the generated shapes data and the bundled demo model (docs/training.md)
    uv run scripts/make_shapes.py data/shapes
    uv run scripts/train_clip.py --model demo-shapes --train-data data/shapes/train.csv \
        --zeroshot-dir data/shapes/heldout --zeroshot-classnames data/shapes/classnames.txt \
        --out runs/demo-shapes
    # fine-tune OpenAI's ViT-B/32 (LiT: --lock-image; WiSE-FT: --wise-ft-alpha 0.5)
    uv run scripts/train_clip.py --model ViT-B-32 --pretrained openai --train-data my.csv ...
    # a CoCa (contrastive + captions; the bundled captioner: docs/training.md)
    uv run scripts/train_clip.py --model coca_ViT-B-32 --pretrained laion2b_s13b_b90k ...
    # several processes (gloo on CPU, nccl on GPU); --batch-size is per process
    uv run torchrun --nproc-per-node 2 scripts/train_clip.py ...
    # webdataset shards (img2dataset's layout; make_shapes.py --format wds writes some)
    uv run scripts/train_clip.py --train-data 'data/shards/train/{00000..00007}.tar' ...

Data: an open_clip-style CSV (``filepath,title``), or webdataset shards (``{key}.jpg`` +
``{key}.txt``; split by process and worker, ``--train-num-samples`` an epoch, resumed
exactly: attn_train.wds); unreadable images and bad samples are skipped and counted. After
every epoch: zero-shot top-1 / top-5 on each ``--zeroshot-dir`` ImageFolder, retrieval recall
on ``--val-data``. Outputs in ``--out``: ``last/``, ``best/`` (by the first
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
import attn_core.cli  # noqa: F401  (first: Ctrl-C while torch loads -> one line, exit 130)
import attn_train as at
import torch
from attn_core.hub import read_state_dict, save_state_dict
from attn_train import CsvImageTextDataset, cli
from attn_train import wds as shards


def build_parser() -> argparse.ArgumentParser:
    p = cli.make_parser(__doc__)
    g = p.add_argument_group("model")
    g.add_argument("--model", default="demo-shapes", help="open_clip name, or a model folder")
    g.add_argument(
        "--set", nargs="*", default=[], metavar="KEY=VALUE", help="from scratch: vision.layers=2"
    )
    g.add_argument("--pretrained", default=None, help="a tag (openai, ...) or a checkpoint file")
    g.add_argument("--init-image-from", metavar="MODEL", help="ViT trunk from: folder, demo-shapes")
    g.add_argument("--lock-image", action="store_true", help="freeze the image tower (LiT)")
    g.add_argument("--lock-image-trunk", action="store_true", help="freeze its trunk, not pooler")
    g.add_argument("--lock-text", action="store_true", help="freeze the text tower (open_clip's)")
    g.add_argument("--lock-text-unlocked-layers", type=int, default=0, metavar="N",
                   help="with --lock-text: its last N layer groups train")  # fmt: skip
    g.add_argument("--lock-text-freeze-layer-norm", action="store_true",
                   help="with --lock-text: LayerNorms frozen too (HF towers)")  # fmt: skip
    g.add_argument("--wise-ft-alpha", type=float, help="also write wise_ft/: WiSE-FT weights")
    g.add_argument("--grad-checkpointing", action="store_true", help="recompute activations")
    g.add_argument(
        "--ema-decay", type=float, help="keep an EMA of the weights (0.998): final/ holds it"
    )
    g = p.add_argument_group("data")
    g.add_argument("--train-data", type=Path, required=True, help="CSV, or .tar shards {0..9}")
    shards.add_shard_args(g)  # --dataset-type --train-num-samples --dataset-resampled
    g.add_argument("--csv-img-key", default="filepath", help="the CSV's image path column")
    g.add_argument("--csv-caption-key", default="title", help="the CSV's caption column")
    g.add_argument("--csv-separator", default=None, help="default: tab or comma, from the header")
    g.add_argument("--val-data", type=Path, default=None, help="CSV scored by retrieval recall")
    cli.add_zero_shot_args(g)  # --zeroshot-dir (the first picks best/) -classnames -templates
    g.add_argument("--no-augment", action="store_true", help="no random resized crop")
    cli.add_image_loader_args(g)  # --workers --warn-skipped-fraction --eval-batch-size
    g = p.add_argument_group("optimisation")
    g.add_argument("--loss", choices=["clip", "siglip"], default="clip", help="InfoNCE or sigmoid")
    g.add_argument("--caption-loss-weight", type=float, help="CoCa (default 2.0: open_clip's)")
    g.add_argument("--clip-loss-weight", type=float, help="CoCa (default 1.0: open_clip's)")
    g.add_argument("--caption-input-noise", type=float, default=0.0, metavar="P",
                   help="CoCa: word dropout on the decoder's input")  # fmt: skip
    cli.add_schedule_args(g, epochs=10, batch_size=128, lr=1e-3, warmup=100)
    cli.add_optimizer_args(g, wd=0.1, min_lr_ratio=0.0, betas=(0.9, 0.98), eps=1e-6)
    cli.add_run_args(g := p.add_argument_group("run"), log_every=20, save_every=200, fsdp=True)
    g.add_argument("--export-fp16", type=Path, help="also write fp16 open_clip weights here")
    return p


def check_inputs(args: argparse.Namespace) -> None:
    """Every path and number a user can get wrong, before anything is built or written."""
    if not shards.uses_shards(args):  # (a shard list is checked there)
        cli.require_file(args.train_data, "--train-data")
    cli.require_file(args.val_data, "--val-data")
    cli.require_file(args.zeroshot_classnames, "--zeroshot-classnames")
    for folder in args.zeroshot_dir:
        cli.require_dir(folder, "--zeroshot-dir")
    if args.export_fp16 is not None and args.export_fp16.is_dir():
        raise ValueError(f"--export-fp16 {args.export_fp16} is a folder, not a file")
    if args.wise_ft_alpha is not None and not 0.0 <= args.wise_ft_alpha <= 1.0:
        raise ValueError(f"--wise-ft-alpha must be in [0, 1], got {args.wise_ft_alpha}")
    if not 0.0 <= args.caption_input_noise <= 1.0:
        raise ValueError(f"--caption-input-noise must be in [0, 1], got {args.caption_input_noise}")
    n = args.lock_text_unlocked_layers
    if n < 0:
        raise ValueError(f"--lock-text-unlocked-layers must be >= 0, got {n}")
    if not args.lock_text and (n or args.lock_text_freeze_layer_norm):
        raise ValueError("--lock-text-unlocked-layers / -freeze-layer-norm need --lock-text")


def build_model(args: argparse.Namespace) -> attn_clip.CLIP:
    """The CLIP to train (fp32, train mode): from scratch, or pretrained / a folder."""
    from_folder = os.path.isdir(args.model) or args.model.startswith(("local-dir:", "hf-hub:"))
    if args.set and (args.pretrained is not None or from_folder):
        raise ValueError("--set changes the architecture: only for training from scratch")
    if args.pretrained is None and not from_folder:
        config = cli.apply_overrides(attn_clip.get_model_config(args.model).to_dict(), args.set)
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
        if args.loss == "siglip" and not model.config.is_coca:
            attn_clip.add_logit_bias(model)  # init -10, as SigLIP's
    if args.init_image_from is not None:  # e.g. a CoCa's ViT from the trained demo-shapes
        attn_clip.init_image_trunk_from(model, args.init_image_from)
    return model.train()


def frozen_trunk(model: attn_clip.CLIP, args: argparse.Namespace) -> torch.nn.Module | None:
    """``--lock-image-trunk``: the image tower's trunk (the ViT / ResNet before its pooler),
    frozen (the caller keeps it in eval mode); the attentional pooler / projection still
    train. None without the flag."""
    return model.visual.trunk.requires_grad_(False) if args.lock_image_trunk else None


def caption_special_ids(model: attn_clip.CLIP, tokenizer: Any) -> tuple[int, ...]:
    """The tokens word dropout keeps: start, end of text and the model's own pad id (a CoCa
    over RoBERTa pads with 1, not its config's 0); none for a CLIP (no decoder)."""
    if not model.config.is_coca:
        return ()
    return tokenizer.sot_token_id, tokenizer.eot_token_id, model.pad_id


def train(args: argparse.Namespace) -> dict[str, Any]:
    check_inputs(args)
    run = at.start_run(args)  # checks the run flags; writes nothing yet
    device = run.d.device
    model = build_model(args).to(device)
    weights = {k: getattr(args, k) for k in ("caption_loss_weight", "clip_loss_weight")}
    loss_fn = attn_clip.create_loss(model, args.loss, **weights)  # CoCa: + the caption loss
    if args.caption_input_noise > 0 and not model.config.is_coca:
        raise ValueError("--caption-input-noise is for CoCa models (it noises the decoder's input)")
    model.visual.requires_grad_(not args.lock_image)
    trunk = frozen_trunk(model, args)
    if args.lock_text:  # open_clip's lock_text_tower / HFTextEncoder.lock (its LayerNorm flag:
        # HF towers only; our own text tower's LayerNorms are locked like its other weights)
        freeze_norm = args.lock_text_freeze_layer_norm or not model.config.text.hf_model_name
        model.text.lock(args.lock_text_unlocked_layers, freeze_layer_norm=freeze_norm)
    model.set_grad_checkpointing(args.grad_checkpointing)
    ema = at.make_ema(model, args.ema_decay)
    tokenizer = attn_clip.get_tokenizer(model.config)
    special_ids = caption_special_ids(model, tokenizer)
    train_tf = attn_clip.image_transform(model.preprocess_cfg, is_train=not args.no_augment)
    eval_tf = attn_clip.image_transform(model.preprocess_cfg)
    csv = dict(img_key=args.csv_img_key, caption_key=args.csv_caption_key, sep=args.csv_separator)
    if shards.uses_shards(args):  # checks the data; resuming, the layout (nothing written yet)
        loader = shards.recipe_loader(args, run, train_tf, tokenizer=tokenizer)
    else:
        data = CsvImageTextDataset(args.train_data, train_tf, tokenizer, seed=args.seed, **csv)
        data.check_readable()  # no image decodes: stop now, before anything is written
        loader = at.make_loader(
            data, args.batch_size, run.d, seed=args.seed, num_workers=args.workers
        )
    val = CsvImageTextDataset(args.val_data, eval_tf, tokenizer, **csv) if args.val_data else None
    zs_sets = cli.zero_shot_sets(args, eval_tf)  # {folder name: ImageFolderDataset}

    @torch.no_grad()
    def evaluate(m: attn_clip.CLIP) -> dict[str, float]:
        """Zero-shot top-1 / top-5 on every ImageFolder set, retrieval recall on ``val``."""
        out: dict[str, float] = {}
        for name, dataset in zs_sets.items():
            batches = at.readable_batches(dataset, args.eval_batch_size)
            classes = [c.replace("_", " ") for c in dataset.classes]
            r = attn_clip.evaluate_zero_shot(
                m.eval(), tokenizer, batches, classes, args.zeroshot_templates, device=device
            )
            out[f"zeroshot/{name}/top1"], out[f"zeroshot/{name}/top5"] = r["top1"], r["top5"]
        if val is not None:
            batches = at.readable_batches(val, args.eval_batch_size)
            recall = attn_clip.evaluate_retrieval(m.eval(), batches, device=device)
            if not recall:
                warnings.warn(f"--val-data {args.val_data}: no image is readable", stacklevel=2)
            out.update({f"val/{k}": v for k, v in recall.items()})
        return out

    max_steps, epochs = at.plan_steps(len(loader), args.accum, args.epochs, args.max_steps)
    optimizer, scheduler = at.adamw_cosine(model, args, max_steps, no_weight_decay=["*cls_token"])
    init_path = args.out / "wise_ft_init.safetensors"
    if args.wise_ft_alpha is not None and run.resume and not init_path.is_file():
        raise ValueError(
            f"--wise-ft-alpha: {run.last} was trained without it (no {init_path.name}); "
            "start fresh with --no-resume"
        )
    if args.wise_ft_alpha is not None and not run.resume and run.d.is_main:
        save_state_dict(model.state_dict(), init_path)

    def train_mode(m: torch.nn.Module) -> None:  # m: model, or its DDP wrapper
        m.train()
        model.visual.train(not args.lock_image)
        if trunk is not None:
            trunk.eval()

    def after_update() -> dict[str, float]:
        model.clamp_logit_scale_()
        return {"logit_scale": model.logit_scale.exp().item()}

    config = at.LoopConfig.from_args(
        args,
        max_steps,
        epochs,
        best_metric=f"zeroshot/{args.zeroshot_dir[0].name}/top1" if zs_sets else None,
        start={
            "model": args.model,
            "pretrained": args.pretrained,
            "loss": "coca" if model.config.is_coca else args.loss,
            "init_image_from": args.init_image_from,
            "caption_input_noise": args.caption_input_noise,
            "lock_image_trunk": args.lock_image_trunk,
            "lock_text": args.lock_text,
            "lock_text_unlocked_layers": args.lock_text_unlocked_layers,
        },
    )
    has_eval = bool(zs_sets) or val is not None

    def evaluate_all() -> dict[str, float]:
        out = evaluate(model)
        if ema is not None:
            out.update({f"ema/{k}": v for k, v in evaluate(ema.module).items()})
        return out

    result = at.fit(
        run,
        model,
        optimizer,
        scheduler,
        loader,
        config,
        step_fn=at.contrastive_step(
            loss_fn, args.lock_image, args.caption_input_noise, special_ids
        ),
        evaluate=evaluate_all if has_eval else None,
        write_files=shards.with_data_state(
            lambda folder: attn_clip.save_config(model, folder), loader
        ),
        train_mode=train_mode,
        after_update=after_update,
        ema=ema,
    )
    if run.d.is_main:  # final/ (open_clip layout), --export-fp16, WiSE-FT
        final = model if ema is None else ema.module
        attn_clip.save_pretrained(final.eval(), args.out / "final")
        if args.export_fp16 is not None:
            attn_clip.save_weights(final, args.export_fp16, dtype=torch.float16)
        if args.wise_ft_alpha is not None:
            wise = copy.deepcopy(model)  # the same architecture; every weight is replaced
            init = {k: v.to(device) for k, v in read_state_dict(init_path).items()}
            wise.load_state_dict(attn_clip.wise_ft(init, model, args.wise_ft_alpha))
            attn_clip.save_pretrained(wise, args.out / "wise_ft")
            if has_eval:
                result.update({f"wise_ft/{k}": v for k, v in evaluate(wise).items()})
    run.close(result)
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    return train(build_parser().parse_args(argv))


if __name__ == "__main__":
    cli.run_main(main)
