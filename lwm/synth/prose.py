"""Long procedural documents: a title, then paragraphs of sentences from templates about one invented
cast of names, places and words (the haystacks and long-text examples of the synthetic sample).

The word tables (syllables, place endings, slot words, sentence templates, titles) are data, in
prose_words.json beside this file. Everything is drawn from a numpy Generator passed in, so the same
seed gives the same text.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

from .language import NUMBER_WORDS, _pick, _sentence

_TABLES = json.loads((Path(__file__).with_name("prose_words.json")).read_text())
SYLLABLES: list[str] = _TABLES["syllables"]
PLACE_ENDINGS: list[str] = _TABLES["place_endings"]
WORDS: dict[str, list[str]] = _TABLES["words"]  # slot -> the words it is filled with
TEMPLATES: list[str] = _TABLES["templates"]  # sentences with {slot}s; {slot2}: another value than {slot}
TITLES: list[str] = _TABLES["titles"]
LONG_SLOTS = {
    "big": lambda r: f"{int(r.integers(1000, 100000)):,}",
    "year": lambda r: str(int(r.integers(1200, 2100))),
    "num": lambda r: str(int(r.integers(2, 1000))),
    "small": lambda r: str(int(r.integers(1, 60))),
    "hour": lambda r: NUMBER_WORDS[int(r.integers(1, 13))],
}


def _word(rng: np.random.Generator, syllables: tuple[int, int] = (2, 4)) -> str:
    return "".join(_pick(rng, SYLLABLES) for _ in range(int(rng.integers(*syllables))))


def _fill(template: str, rng: np.random.Generator, cast: dict[str, list[str]]) -> str:
    """Fill {slot}s; {name2} is another name than {name} (when there is one), {color2} another color ..."""
    chosen: dict[str, str] = {}

    def draw(key: str) -> str:
        if key in cast:
            return _pick(rng, cast[key])
        return LONG_SLOTS[key](rng) if key in LONG_SLOTS else _pick(rng, WORDS[key])

    def slot(m: re.Match) -> str:
        key = m.group(1).rstrip("2")
        value = draw(key)
        for _ in range(8):
            if not m.group(1).endswith("2") or value != chosen.get(key):
                break
            value = draw(key)
        chosen.setdefault(key, value)
        return value

    return re.sub(r"\{(\w+)\}", slot, template)


def document(rng: np.random.Generator, chars: int) -> str:
    """About `chars` characters of prose: a title, then paragraphs of 3-8 sentences about one cast of
    invented names, places and words."""
    cast = {
        "name": [_word(rng).capitalize() for _ in range(int(rng.integers(30, 60)))],
        "place": [_word(rng).capitalize() + _pick(rng, PLACE_ENDINGS) for _ in range(int(rng.integers(12, 24)))],
        "word": [_word(rng, (2, 5)) for _ in range(int(rng.integers(40, 80)))],
    }
    paragraphs = [_sentence(_fill(_pick(rng, TITLES), rng, cast))[:-1]]
    size = len(paragraphs[0])
    while size < chars:
        text = " ".join(_sentence(_fill(_pick(rng, TEMPLATES), rng, cast)[:-1]) for _ in range(int(rng.integers(3, 9))))
        paragraphs.append(text)
        size += len(text) + 2
    return "\n\n".join(paragraphs) + "\n"
