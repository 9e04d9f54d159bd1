"""The run log: JSON records appended to ``OUT/log.jsonl`` plus a short console line."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from .distributed import Distributed

__all__ = ["RunLogger"]


class RunLogger:
    """Append JSON records to ``path`` and print ``key=value`` lines; silent on ranks > 0.

    Every record gets ``time``: seconds since the logger was made. The folder of ``path`` is
    made at the first record, so a run that fails its input checks leaves nothing behind.
    """

    def __init__(self, path: str | Path | None, d: Distributed, *, echo: bool = True) -> None:
        self.enabled = d.is_main
        self.echo = echo
        self.path = Path(path) if path is not None else None
        self.start = time.time()

    def log(self, record: dict[str, Any], echo: bool | None = None) -> None:
        if not self.enabled:
            return
        record = {"time": round(time.time() - self.start, 3), **record}
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a", encoding="utf-8") as f:
                f.write(json.dumps(record, ensure_ascii=False) + "\n")
        if self.echo if echo is None else echo:
            from tqdm import tqdm

            tqdm.write(" ".join(f"{k}={_fmt(v)}" for k, v in record.items()), file=sys.stdout)


def _fmt(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)
