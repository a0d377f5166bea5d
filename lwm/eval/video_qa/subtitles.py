"""Subtitle lines as the benchmarks' readers give them: a Line (start and end in seconds, text), the
error of a file that cannot be read, and `clean` (tags stripped, whitespace collapsed). Each
benchmark's module reads its own files and places the lines at the sampled frames its own way."""

from __future__ import annotations

import re
from dataclasses import dataclass

_TAG = re.compile(r"<[^>]+>")


@dataclass(frozen=True)
class Line:
    start: float
    end: float
    text: str


class SubtitleError(ValueError):
    """A subtitle file that cannot be read; the message names it."""


def clean(text: str) -> str:
    """Font and other tags removed, whitespace collapsed."""
    return " ".join(_TAG.sub("", text).split())
