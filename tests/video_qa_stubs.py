"""Stand-ins for lwm.eval.video_qa's sources and model: codes without a video (StubSource) and a model that
reads the question back from its prompt and answers right or, asked to, wrong (Oracle); mc_items, four
multiple-choice items of several durations."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from lwm.eval.video_qa.files import read_items
from lwm.eval.video_qa.text import LETTER_INSTRUCTION, LETTERS, option_text


def write_jsonl(path: Path, rows) -> Path:
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


# ------------------------------------------------------------------------------------ reading


class StubSource:
    def load(self, item):
        if (item.video or "").endswith("broken.mp4"):
            raise RuntimeError("decoder exploded")
        return np.zeros((2, 256), np.int64), {"codes_from": "stub", "frames": 2, "video_seconds": 42.0}


class Oracle:
    """Scores the right option highest and generates the right letter / answer, by reading the question
    back from the prompt. `wrong`: always the first option / a wrong answer instead."""

    group = None

    def __init__(self, tok, items, wrong=False):
        self.tok, self.wrong = tok, wrong
        self.items = {it.question: it for it in items if it.error is None}
        self.calls = []

    def _item(self, prompt):
        text = self.tok.decode(prompt)
        return next(it for q, it in self.items.items() if f"USER: {q}" in text), text

    def score(self, prompt, continuations):
        item, _ = self._item(prompt)
        self.calls.append(("score", len(continuations)))
        want = (item.answer_index + self.wrong) % len(item.options)
        assert [self.tok.decode(c) for c in continuations] == [option_text(o) for o in item.options]
        return [0.0 if i == want else -5.0 - i for i in range(len(continuations))]

    def generate(self, prompt, config):
        item, text = self._item(prompt)
        self.calls.append(("generate", config.restrict))
        assert config.restrict == "text" and config.stop_tokens == [self.tok.eos_id]
        if item.options is None:
            return self.tok.encode("Nope." if self.wrong else item.answer.upper() + "!")
        assert LETTER_INSTRUCTION in text
        return self.tok.encode("A." if self.wrong else f"{LETTERS[item.answer_index]}.")


def mc_items(tmp_path):
    rows = [  # (question, options, answer, duration)
        ("What color is the circle?", ["Red", "Cyan", "Green", "White"], "Cyan.", 30),
        ("Which shape?", ["A. circle", "B. square", "C. star"], "C", 300),
        ("How many?", ["One.", "Two.", "Three.", "Four."], "Four.", "long"),
        ("Where is it?", ["Left.", "Right."], "A", 5000),
    ]
    rows = [{"video": "a.mp4", "question": q, "options": o, "answer": a, "duration": d} for q, o, a, d in rows]
    return read_items(write_jsonl(tmp_path / "mc.jsonl", rows))
