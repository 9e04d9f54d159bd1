"""A contact sheet of search results: one row per query, the query then its hits."""

from __future__ import annotations

import os
from pathlib import Path

from attn_vision.images import ImageError, load_image_file
from attn_vision.wds import BadSample
from PIL import Image, ImageDraw, ImageFont, ImageOps

from .api import Hit
from .tars import sample_image_at

__all__ = ["contact_sheet"]


def contact_sheet(rows: list[tuple[str | os.PathLike, list[Hit]]], thumb: int = 160) -> Image.Image:
    """``rows``: ``(query, hits)`` per query -- a text (``str``) or an image file (a path)
    -- drawn as the query (its text, wrapped, or its image) then each hit's thumbnail with
    its rank and score. A file that can no longer be read is a grey box."""
    try:
        font = ImageFont.load_default(size=14)
    except (TypeError, OSError):  # Pillow without FreeType: the small bitmap font
        font = ImageFont.load_default()
    pad, label_h = 8, 20
    cols = max(len(hits) for _, hits in rows) + 1
    cell_w, cell_h = thumb + pad, thumb + label_h + pad
    sheet = Image.new("RGB", (pad + cols * cell_w, pad + len(rows) * cell_h), "white")
    draw = ImageDraw.Draw(sheet)

    def paste(path: Path, x: int, y: int, key: str | None = None) -> None:
        try:  # (a shard index's hit: sample ``key`` of the tar at ``path``)
            im = load_image_file(path)[0] if key is None else sample_image_at(path, key)
        except (ImageError, BadSample):  # moved or deleted since indexing: a grey box
            draw.rectangle([x, y, x + thumb - 1, y + thumb - 1], fill=(200, 200, 200))
            return
        im = ImageOps.contain(im, (thumb, thumb))
        sheet.paste(im, (x + (thumb - im.width) // 2, y + (thumb - im.height) // 2))

    for row, (query, hits) in enumerate(rows):
        y = pad + row * cell_h
        if not isinstance(query, str):
            paste(Path(query), pad, y)
        else:
            lines = [""]
            for w in query.split():  # wrap the query text into the first cell
                if draw.textlength(f"{lines[-1]} {w}", font=font) > thumb and lines[-1]:
                    lines.append(w)
                else:
                    lines[-1] = f"{lines[-1]} {w}".strip()
            draw.multiline_text((pad, y), "\n".join(lines[:8]), fill="black", font=font)
        draw.text((pad, y + thumb + 2), "query", fill=(90, 90, 90), font=font)
        for col, hit in enumerate(hits, 1):
            x = pad + col * cell_w
            paste(hit.path, x, y, hit.key)
            draw.text((x, y + thumb + 2), f"#{col}  {hit.score:.3f}", fill="black", font=font)
    return sheet
