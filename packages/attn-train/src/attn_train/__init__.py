"""attn_train: the training loop of the attn-zoo recipes, once.

* :mod:`~attn_train.loop` -- :func:`start_run`, :func:`fit` (accumulation, AMP, clipping,
  schedules, NaN / inf stop, JSONL + console log, periodic eval and checkpoints, EMA).
* :mod:`~attn_train.checkpoint` -- atomic checkpoint directories, exact resume.
* :mod:`~attn_train.distributed` -- one process or ``torchrun`` DDP (gloo on CPU);
  :mod:`~attn_train.fsdp` -- ``--fsdp``: FSDP2 sharding, sharded checkpoints (imported by
  :func:`fit` only when used).
* :mod:`~attn_train.data` -- resumable loaders, image-caption CSVs, ImageFolders that skip
  unreadable images; :mod:`~attn_train.text` -- TSV pairs, labelled CSVs and their encoded
  data sets, a character vocabulary, token windows.
* :mod:`~attn_train.optim` -- timm's weight-decay / layer-decay parameter groups;
  :mod:`~attn_train.schedules` -- warm-up + cosine / inverse-sqrt for ``LambdaLR``.
* :mod:`~attn_train.synthetic` -- generated NLP toy tasks; :mod:`~attn_train.cli` -- the
  shared flags, input checks, help layout and exits (bad input 2, NaN 1, Ctrl-C 130);
  :mod:`~attn_train.metrics` -- top-k accuracy, text accuracy, a language model's loss;
  :mod:`~attn_train.distill` -- distillation losses (logits, hidden states, attention maps,
  CLIP embeddings).
"""

from . import distill
from .amp import autocast, make_scaler, resolve_precision
from .checkpoint import (
    ResumeError,
    find_checkpoint,
    load_checkpoint,
    read_checkpoint_file,
    read_progress,
    save_checkpoint,
)
from .contrastive import contrastive_step
from .data import (
    Collated,
    CsvImageTextDataset,
    ImageFolderDataset,
    ResumableSampler,
    UnreadableDataError,
    collate_skip_unreadable,
    make_loader,
    readable_batches,
)
from .distributed import (
    Distributed,
    check_device,
    cleanup_distributed,
    setup_distributed,
    unwrap,
    wrap_ddp,
)
from .log import RunLogger
from .loop import (
    LoopConfig,
    NonFiniteLossError,
    Run,
    SkippedImagesWarning,
    StepContext,
    TrainingInterrupted,
    check_finite,
    fit,
    loss_step,
    make_ema,
    start_run,
)
from .metrics import accuracy, classification_metrics, next_token_loss
from .optim import adamw_cosine, param_groups
from .schedules import cosine_schedule, inverse_sqrt_schedule, lambda_lr, plan_steps
from .text import (
    CharVocab,
    LabelledTexts,
    RandomWindows,
    TranslationPairs,
    pad_rows,
    read_labelled_csv,
    read_tsv,
)

__version__ = "0.1.0"
__all__ = [
    "CharVocab",
    "Collated",
    "CsvImageTextDataset",
    "Distributed",
    "ImageFolderDataset",
    "LabelledTexts",
    "LoopConfig",
    "NonFiniteLossError",
    "RandomWindows",
    "ResumableSampler",
    "ResumeError",
    "Run",
    "RunLogger",
    "SkippedImagesWarning",
    "StepContext",
    "TrainingInterrupted",
    "TranslationPairs",
    "UnreadableDataError",
    "accuracy",
    "adamw_cosine",
    "autocast",
    "check_device",
    "check_finite",
    "classification_metrics",
    "cleanup_distributed",
    "collate_skip_unreadable",
    "contrastive_step",
    "cosine_schedule",
    "distill",
    "find_checkpoint",
    "fit",
    "inverse_sqrt_schedule",
    "lambda_lr",
    "load_checkpoint",
    "loss_step",
    "make_ema",
    "make_loader",
    "make_scaler",
    "next_token_loss",
    "pad_rows",
    "param_groups",
    "plan_steps",
    "read_checkpoint_file",
    "read_labelled_csv",
    "read_progress",
    "readable_batches",
    "read_tsv",
    "resolve_precision",
    "save_checkpoint",
    "setup_distributed",
    "start_run",
    "unwrap",
    "wrap_ddp",
]
