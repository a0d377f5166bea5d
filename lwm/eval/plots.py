"""Heatmaps (matplotlib) and Markdown tables (tabulate) for evaluation results.

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

from tabulate import tabulate

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
) -> Path:
    """Draw a grid (rows top to bottom, cols left to right) as a PNG with row/column labels, axis
    labels, a title, the value in every cell and a color bar. Returns the path written."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt
    from matplotlib.colors import LinearSegmentedColormap

    values = [list(r) for r in values]
    if len(values) != len(rows) or any(len(r) != len(cols) for r in values):
        raise ValueError(
            f"values must be a {len(rows)} x {len(cols)} grid (rows x cols), got "
            f"{len(values)} rows of lengths {sorted({len(r) for r in values})}"
        )
    if not rows or not cols:
        raise ValueError("a heatmap needs at least one row and one column")
    cmap = LinearSegmentedColormap.from_list("lwm", [tuple(c / 255 for c in rgb) for rgb in colors])
    cmap = cmap.with_extremes(bad=tuple(c / 255 for c in MISSING))
    grid = [[math.nan if is_missing(v) else float(v) for v in r] for r in values]  # (rows, cols)
    fig, ax = plt.subplots(figsize=(1.1 + 0.9 * len(cols), 0.9 + 0.5 * len(rows)), dpi=100)
    image = ax.imshow(grid, cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto", interpolation="nearest")
    for i, row in enumerate(values):
        for j, v in enumerate(row):
            color = color_at(v, vmin, vmax, colors)
            dark = 0.299 * color[0] + 0.587 * color[1] + 0.114 * color[2] < 110
            ax.text(j, i, _format(v, fmt), ha="center", va="center", fontsize=9, color="white" if dark else "#202020")
    ax.set_xticks(range(len(cols)), [str(c) for c in cols])
    ax.set_yticks(range(len(rows)), [str(r) for r in rows])
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
    fig.colorbar(image, ax=ax)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    plt.close(fig)
    return path


def markdown_table(headers: Sequence, rows: Sequence[Sequence]) -> str:
    """A Markdown (GitHub) table; cells are str()-ed as they are (None -> "n/a"), not parsed as numbers."""
    cells = [[("n/a" if is_missing(c) else str(c)) for c in r] for r in rows]
    if any(len(r) != len(headers) for r in cells):
        raise ValueError(f"every row needs {len(headers)} cells")
    return tabulate(cells, [str(h) for h in headers], tablefmt="github", disable_numparse=True)


def grid_table(
    values: Sequence[Sequence], rows: Sequence, cols: Sequence, corner: str = "", fmt: str = "{:.2f}"
) -> str:
    """A grid (rows x cols) as a Markdown table with the row labels in the first column."""
    return markdown_table([corner, *cols], [[r, *(_format(v, fmt) for v in vs)] for r, vs in zip(rows, values)])
