r"""Distil a CLIP (any loadable model) into a smaller CLIP on an image-caption CSV.

    uv run scripts/make_shapes.py data/shapes
    uv run scripts/distill_clip.py --teacher demo-shapes --teacher-pretrained shapes \
        --model demo-shapes --set vision.width=64 vision.layers=2 text.token_dim=8 \
        --train-data data/shapes/train.csv --zeroshot-dir data/shapes/heldout \
        --zeroshot-classnames data/shapes/classnames.txt --out runs/distilled
    # or from webdataset shards: --train-data 'data/shards/train/{00000..00007}.tar'

The student (a named architecture with ``--set`` overrides, trained from scratch) learns
from the teacher (CLIP-KD / TinyCLIP, :func:`attn_train.distill.clip_distillation`): its
embeddings pulled towards the teacher's (``--w-feature``, 2000: the MSE is a mean over the
embedding's elements, so a weight of 1 barely counts; needs the same ``embed_dim``) and the
teacher's image-text similarities as soft targets (``--w-similarity``); optionally also from
its own captions (CLIP's contrastive loss, ``--w-contrastive``, 0 by default: both measured
in docs/training.md). Teacher and student share the tokenizer and image preprocessing.
After every epoch: the student's zero-shot top-1 / top-5 on each ``--zeroshot-dir``.
``OUT/last`` and ``OUT/best`` are CLIP folders (``--ema-decay``: also an EMA of the student,
scored as ``ema/...``), ``OUT/final`` the finished student (its EMA with ``--ema-decay``);
rerunning the same command resumes.

Exit codes: 0 done, 1 the loss became NaN / inf, 2 bad input (one ``error:`` line, nothing
written), 130 Ctrl-C (the line names the last checkpoint; the same command resumes).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import attn_clip
import attn_core.cli  # noqa: F401  (first: Ctrl-C while torch loads -> one line, exit 130)
import attn_train as at
import torch
from attn_train import CsvImageTextDataset, ImageFolderDataset, cli, distill
from attn_train import wds as shards


def build_parser() -> argparse.ArgumentParser:
    p = cli.make_parser(__doc__)
    g = p.add_argument_group("models")
    g.add_argument("--teacher", required=True, help="teacher: open_clip name or model folder")
    g.add_argument("--teacher-pretrained", default=None, help="the teacher's tag or file")
    g.add_argument("--model", default="demo-shapes", help="student architecture")
    g.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="student overrides")
    g.add_argument(
        "--ema-decay", type=float, help="keep an EMA of the student (0.998): final/ holds it"
    )
    g = p.add_argument_group("data")
    g.add_argument("--train-data", type=Path, required=True, help="CSV, or .tar shards {0..9}")
    shards.add_shard_args(g)  # --dataset-type --train-num-samples --dataset-resampled
    g.add_argument("--zeroshot-dir", type=Path, action="append", default=[], help="ImageFolder")
    g.add_argument("--zeroshot-classnames", type=Path, default=None, help="one class per line")
    g.add_argument("--zeroshot-templates", nargs="+", default=["a photo of a {}."], help="prompts")
    cli.add_image_loader_args(g)  # --workers --warn-skipped-fraction --eval-batch-size
    g = p.add_argument_group("distillation")
    g.add_argument("--w-contrastive", type=float, default=0.0, help="CLIP loss on the captions")
    g.add_argument("--w-feature", type=float, default=2000.0, help="embedding MSE to the teacher's")
    g.add_argument("--w-similarity", type=float, default=1.0, help="similarity-matrix KL")
    cli.add_schedule_args(g, epochs=10, batch_size=128, lr=1e-3, warmup=100)
    cli.add_optimizer_args(g, wd=0.1, min_lr_ratio=0.0, betas=(0.9, 0.98), eps=1e-6)
    cli.add_run_args(p.add_argument_group("run"), log_every=20, save_every=200)
    return p


def build_models(args: argparse.Namespace) -> tuple[attn_clip.CLIP, attn_clip.CLIP]:
    """``(teacher, student)``: the loaded teacher (eval, frozen) and a fresh student."""
    teacher = attn_clip.create_model(args.teacher, pretrained=args.teacher_pretrained)
    config = cli.apply_overrides(attn_clip.get_model_config(args.model).to_dict(), args.set)
    try:
        config = attn_clip.CLIPConfig.from_dict(config)
    except (TypeError, KeyError) as e:
        raise ValueError(f"--set {' '.join(args.set)}: {e}") from None
    student = attn_clip.create_model(config)
    attn_clip.init_vision_like_open_clip(student)
    tc, sc = teacher.config, student.config
    if (sc.text.vocab_size, sc.text.context_length) != (tc.text.vocab_size, tc.text.context_length):
        raise ValueError("the student must keep the teacher's text vocabulary and context length")
    if student.preprocess_cfg != teacher.preprocess_cfg:
        raise ValueError(
            f"the student's image preprocessing ({student.preprocess_cfg}) must equal the "
            f"teacher's ({teacher.preprocess_cfg}): keep vision.image_size"
        )
    if args.w_feature and sc.embed_dim != tc.embed_dim:
        raise ValueError(
            f"--w-feature needs the teacher's embed_dim ({tc.embed_dim}), the student has "
            f"{sc.embed_dim}: keep it or pass --w-feature 0"
        )
    return teacher.eval().requires_grad_(False), student.train()


def train(args: argparse.Namespace) -> dict[str, Any]:
    if not shards.uses_shards(args):  # (a shard list is checked there)
        cli.require_file(args.train_data, "--train-data")
    cli.require_file(args.zeroshot_classnames, "--zeroshot-classnames")
    for folder in args.zeroshot_dir:
        cli.require_dir(folder, "--zeroshot-dir")
    if args.accum != 1:
        raise ValueError("--accum is not supported: the contrastive terms need the whole batch")
    run = at.start_run(args)  # checks the run flags; writes nothing yet
    device = run.d.device
    teacher, student = (m.to(device) for m in build_models(args))
    ema = at.make_ema(student, args.ema_decay)
    tokenizer = attn_clip.get_tokenizer(student.config)
    transform = attn_clip.image_transform(student.preprocess_cfg, is_train=True)
    if shards.uses_shards(args):  # checks the data; resuming, the layout (nothing written yet)
        loader = shards.recipe_loader(args, run, transform, tokenizer=tokenizer)
    else:
        data = CsvImageTextDataset(args.train_data, transform, tokenizer, seed=args.seed)
        data.check_readable()  # no image decodes: stop now, before anything is written
        loader = at.make_loader(
            data, args.batch_size, run.d, seed=args.seed, num_workers=args.workers
        )
    eval_tf = attn_clip.image_transform(student.preprocess_cfg)
    names = None
    if args.zeroshot_classnames is not None:
        lines = args.zeroshot_classnames.read_text(encoding="utf-8").splitlines()
        names = [c.strip() for c in lines if c.strip()]
    zs_sets = {p.name: ImageFolderDataset(p, eval_tf, names) for p in args.zeroshot_dir}

    @torch.no_grad()
    def zero_shot(m: attn_clip.CLIP) -> dict[str, float]:
        out = {}
        for name, ds in zs_sets.items():
            classes = [c.replace("_", " ") for c in ds.classes]
            batches = at.readable_batches(ds, args.eval_batch_size)
            r = attn_clip.evaluate_zero_shot(
                m.eval(), tokenizer, batches, classes, args.zeroshot_templates, device=device
            )
            out[f"zeroshot/{name}/top1"], out[f"zeroshot/{name}/top5"] = r["top1"], r["top5"]
        return out

    max_steps, epochs = at.plan_steps(len(loader), args.accum, args.epochs, args.max_steps)
    optimizer, scheduler = at.adamw_cosine(student, args, max_steps, no_weight_decay=["*cls_token"])
    clip_loss = attn_clip.ClipLoss()

    def loss_fn(model: torch.nn.Module, batch: list[torch.Tensor]) -> torch.Tensor:
        images, texts = batch
        with torch.no_grad():
            t = teacher(images, texts)
        s = model(images, texts)
        loss = args.w_contrastive * clip_loss(s.image_embeds, s.text_embeds, s.logit_scale)
        kd = distill.clip_distillation(
            s.image_embeds, s.text_embeds, t.image_embeds, t.text_embeds, s.logit_scale,
            t.logit_scale, feature_weight=args.w_feature, similarity_weight=args.w_similarity,
        )  # fmt: skip
        return loss + kd

    def evaluate() -> dict[str, float]:
        out = zero_shot(student)
        if ema is not None:
            out.update({f"ema/{k}": v for k, v in zero_shot(ema.module).items()})
        return out

    params = [sum(p.numel() for p in m.parameters()) for m in (teacher, student)]
    start = {
        "teacher_params": params[0],
        "student_params": params[1],
        "teacher": zero_shot(teacher),
    }
    config = at.LoopConfig.from_args(
        args, max_steps, epochs, start=start,
        best_metric=f"zeroshot/{args.zeroshot_dir[0].name}/top1" if zs_sets else None,
    )  # fmt: skip
    result = at.fit(
        run,
        student,
        optimizer,
        scheduler,
        loader,
        config,
        loss_fn=loss_fn,
        evaluate=evaluate if zs_sets else None,
        write_files=shards.with_data_state(
            lambda folder: attn_clip.save_config(student, folder), loader
        ),
        after_update=lambda: student.clamp_logit_scale_() or {},
        ema=ema,
    )
    if run.d.is_main:  # final/: the student (its EMA with --ema-decay), open_clip's layout
        attn_clip.save_pretrained(
            (student if ema is None else ema.module).eval(), args.out / "final"
        )
    result.update(start)
    run.close(result)
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    return train(build_parser().parse_args(argv))


if __name__ == "__main__":
    cli.run_main(main)
