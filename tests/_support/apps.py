"""What the app tests share: one real process of an app (for what only a process proves:
exit codes, stdin, the interpreter's own start), the one-line error checks, and a PNG header
that claims any size. Everything else calls the apps' ``main(argv)`` in process (``import
zero_shot``: apps/ is on pytest's pythonpath)."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
APPS = ROOT / "apps"


def run_app(
    name: str, *args: object, stdin: str | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """``apps/<name>.py ARGS`` in a fresh interpreter, offline, as a user runs it."""
    return subprocess.run(
        [sys.executable, str(APPS / f"{name}.py"), *map(str, args)],
        cwd=ROOT,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={"HF_HUB_OFFLINE": "1", "PATH": os.environ.get("PATH", "/usr/bin:/bin")},
    )


def error_line(capsys: pytest.CaptureFixture[str]) -> str:
    """The one ``error: ...`` line an in-process ``main()`` printed on stderr."""
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def assert_one_line_error(proc: subprocess.CompletedProcess[str], *needles: str) -> None:
    """A real process exited 2 with one ``error:`` line holding each of ``needles``."""
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


def png_header(path: Path, width: int, height: int) -> Path:
    """A tiny PNG whose header claims ``width x height`` pixels (a decompression bomb)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data) & 0xFFFFFFFF
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    ihdr = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    data = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0"))
    path.write_bytes(data + chunk(b"IEND", b""))
    return path


# a tiny coca_ViT-B-32 (one block per tower, 64 wide) for the caption app and tab tests
TINY_COCA = dict(
    embed_dim=64,
    vision={"layers": 1, "width": 64, "head_width": 32, "image_size": 32, "patch_size": 16,
            "attn_pooler_queries": 8, "attn_pooler_heads": 2},
    text={"layers": 1, "width": 64, "heads": 2},
    multimodal={"layers": 1, "width": 64, "heads": 2},
)  # fmt: skip


def save_tiny_coca(directory: Path) -> Path:
    """A random-init (seed 0) :data:`TINY_COCA` in a ``save_pretrained`` folder."""
    import attn_clip
    import torch

    torch.manual_seed(0)
    return attn_clip.save_pretrained(
        attn_clip.create_model("coca_ViT-B-32", **TINY_COCA), directory
    )
