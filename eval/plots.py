"""Heatmaps and tables for evaluation results, drawn with Pillow (no matplotlib).

    heatmap(values, rows, cols, "grid.png", title="...", xlabel="context length", ylabel="depth (%)")
    print(grid_table(values, rows, cols, corner="depth \\ length"))

`values` is a grid as a list of rows (len(rows) x len(cols)); a cell may be None or NaN (no data),
drawn grey with "n/a". Colors run from red (vmin) through yellow to green (vmax), as in LWM's
needle plots; every cell shows its value.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

from PIL import Image, ImageDraw, ImageFont

RED_YELLOW_GREEN = ((0xF0, 0x49, 0x6E), (0xEB, 0xB8, 0x39), (0x0C, 0xD7, 0x9F))
MISSING = (0xC8, 0xC8, 0xC8)
INK = (0x20, 0x20, 0x20)


def is_missing(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def color_at(value: float, vmin: float = 0.0, vmax: float = 1.0, colors=RED_YELLOW_GREEN) -> tuple[int, int, int]:
    """The color of `value` on a piecewise-linear scale through `colors` from vmin to vmax (clamped)."""
    if is_missing(value):
        return MISSING
    t = 0.0 if vmax == vmin else min(max((value - vmin) / (vmax - vmin), 0.0), 1.0)
    x = t * (len(colors) - 1)
    i = min(int(x), len(colors) - 2)
    f = x - i
    return tuple(round(a + (b - a) * f) for a, b in zip(colors[i], colors[i + 1]))


def human_count(n: int | float) -> str:
    """1024 -> "1K", 1536 -> "1.5K", 1048576 -> "1M", 500 -> "500" (binary units, as context lengths go)."""
    for unit, size in (("M", 1 << 20), ("K", 1 << 10)):
        if n >= size:
            v = n / size
            return f"{v:.0f}{unit}" if v == int(v) else f"{v:.3g}{unit}"
    return f"{n:g}"


def _font(size: int):
    try:
        return ImageFont.load_default(size=size)  # Pillow >= 10.1 with FreeType: a scalable font
    except (TypeError, OSError, ImportError):
        return ImageFont.load_default()


def _text_size(draw: ImageDraw.ImageDraw, text: str, font) -> tuple[int, int]:
    box = draw.textbbox((0, 0), text, font=font)
    return box[2] - box[0], box[3] - box[1]


def _center(draw, xy, text, font, fill) -> None:
    draw.text(xy, text, font=font, fill=fill, anchor="mm")


def _format(value, fmt: str) -> str:
    return "n/a" if is_missing(value) else fmt.format(value)


def heatmap(
    values: Sequence[Sequence[float | None]],
    rows: Sequence,
    cols: Sequence,
    path,
    *,
    title: str = "",
    xlabel: str = "",
    ylabel: str = "",
    vmin: float = 0.0,
    vmax: float = 1.0,
    fmt: str = "{:.2f}",
    colors=RED_YELLOW_GREEN,
    cell: tuple[int, int] = (72, 40),
    font_size: int = 14,
) -> Path:
    """Draw a grid (rows top to bottom, cols left to right) as a PNG with row/column labels, axis
    labels, a title, the value in every cell and a color bar. Returns the path written."""
    values = [list(r) for r in values]
    if len(values) != len(rows) or any(len(r) != len(cols) for r in values):
        raise ValueError(
            f"values must be a {len(rows)} x {len(cols)} grid (rows x cols), got "
            f"{len(values)} rows of lengths {sorted({len(r) for r in values})}"
        )
    if not rows or not cols:
        raise ValueError("a heatmap needs at least one row and one column")
    font, small, big = _font(font_size), _font(font_size - 2), _font(font_size + 2)
    probe = ImageDraw.Draw(Image.new("RGB", (1, 1)))
    row_labels, col_labels = [str(r) for r in rows], [str(c) for c in cols]
    cw = max(
        cell[0],
        max(_text_size(probe, s, font)[0] for s in col_labels) + 10,
        max(_text_size(probe, _format(v, fmt), font)[0] for r in values for v in r) + 10,
    )
    ch = cell[1]
    label_w = max(_text_size(probe, s, font)[0] for s in row_labels) + 12
    line = _text_size(probe, "Ag", font)[1] + 8
    ylabel_w = line + 6 if ylabel else 0
    top = 12 + (line + 6 if title else 0)
    left = 12 + ylabel_w + label_w
    grid_w, grid_h = cw * len(cols), ch * len(rows)
    bar_x = left + grid_w + 20
    bar_w, tick_w = 18, max(_text_size(probe, fmt.format(v), small)[0] for v in (vmin, vmax)) + 8
    width = max(
        bar_x + bar_w + tick_w + 12,
        left + _text_size(probe, xlabel, font)[0] // 2 + grid_w // 2 + 12,
        _text_size(probe, title, big)[0] + 24,
    )
    height = top + grid_h + line + (line if xlabel else 0) + 16

    img = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(img)
    if title:
        _center(draw, (width // 2, 12 + line // 2), title, big, INK)
    for i, row in enumerate(values):
        y = top + i * ch
        _center(draw, (left - label_w // 2 - 2, y + ch // 2), row_labels[i], font, INK)
        for j, v in enumerate(row):
            x = left + j * cw
            color = color_at(v, vmin, vmax, colors)
            draw.rectangle([x, y, x + cw - 1, y + ch - 1], fill=color, outline="white")
            dark = 0.299 * color[0] + 0.587 * color[1] + 0.114 * color[2] < 110
            _center(draw, (x + cw // 2, y + ch // 2), _format(v, fmt), font, "white" if dark else INK)
    for j, s in enumerate(col_labels):
        _center(draw, (left + j * cw + cw // 2, top + grid_h + line // 2 + 2), s, font, INK)
    if xlabel:
        _center(draw, (left + grid_w // 2, top + grid_h + line + line // 2 + 2), xlabel, font, INK)
    if ylabel:  # drawn on its own strip and turned a quarter to read bottom-up
        tw, _ = _text_size(probe, ylabel, font)
        strip = Image.new("RGB", (tw + 8, line), "white")
        _center(ImageDraw.Draw(strip), (strip.width // 2, line // 2), ylabel, font, INK)
        strip = strip.rotate(90, expand=True)
        img.paste(strip, (12, max(0, top + grid_h // 2 - strip.height // 2)))
    steps = max(grid_h, 2)
    for k in range(steps):  # color bar: vmax at the top
        v = vmax - (vmax - vmin) * k / (steps - 1)
        draw.line([bar_x, top + k, bar_x + bar_w - 1, top + k], fill=color_at(v, vmin, vmax, colors))
    draw.rectangle([bar_x, top, bar_x + bar_w - 1, top + steps - 1], outline=INK)
    for v, y in ((vmax, top), (vmin, top + steps - 1)):
        draw.text((bar_x + bar_w + 4, y), fmt.format(v), font=small, fill=INK, anchor="lm")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    img.save(path, format="PNG")
    return path


def markdown_table(headers: Sequence, rows: Sequence[Sequence]) -> str:
    """A Markdown table; cells are str()-ed (None -> "n/a")."""
    cells = [[("n/a" if is_missing(c) else str(c)) for c in r] for r in rows]
    head = [str(h) for h in headers]
    if any(len(r) != len(head) for r in cells):
        raise ValueError(f"every row needs {len(head)} cells")
    widths = [max(len(x) for x in col) for col in zip(head, *cells)]
    fmt_row = lambda r: "| " + " | ".join(x.ljust(w) for x, w in zip(r, widths)) + " |"  # noqa: E731
    return "\n".join([fmt_row(head), "| " + " | ".join("-" * w for w in widths) + " |", *map(fmt_row, cells)])


def grid_table(
    values: Sequence[Sequence], rows: Sequence, cols: Sequence, corner: str = "", fmt: str = "{:.2f}"
) -> str:
    """A grid (rows x cols) as a Markdown table with the row labels in the first column."""
    return markdown_table([corner, *cols], [[r, *(_format(v, fmt) for v in vs)] for r, vs in zip(rows, values)])
