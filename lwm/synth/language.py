"""Words about scenes: event sentences, captions, questions and answers, and multiple-choice variants of
the questions with a closed answer set. (Long procedural documents: lwm.synth.prose.)

Everything is drawn from a numpy Generator passed in, so the same seed gives the same text.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from lwm.data.choices import LETTERS, letter_question, lettered

from .scene import COLORS, DIRECTIONS, Event, Scene

NUMBER_WORDS = (
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
)


def _pick(rng: np.random.Generator, options):
    return options[int(rng.integers(len(options)))]


def _sentence(text: str) -> str:
    return text[0].upper() + text[1:] + "."


def _a(phrase: str) -> str:
    return ("an " if phrase[0] in "aeiou" else "a ") + phrase


# --- events --------------------------------------------------------------------------------------


def _verbs(e: Event) -> tuple[str, str]:
    """(third person, base form) of what happens: ("turns blue", "turn blue")."""
    return {
        "appear": ("appears", "appear"),
        "disappear": ("disappears", "disappear"),
        "recolor": (f"turns {e.value}", f"turn {e.value}"),
        "start": (f"starts moving {e.value}", f"start moving {e.value}"),
    }[e.kind]


def event_text(scene: Scene, e: Event) -> str:
    """'the red circle turns blue'; a shape that appears is new: 'a yellow triangle appears'."""
    thing = scene.objects[e.object].name
    return f"{_a(thing) if e.kind == 'appear' else 'the ' + thing} {_verbs(e)[0]}"


# --- captions ------------------------------------------------------------------------------------


def _motion_phrase(scene: Scene, i: int, rng: np.random.Generator) -> str:
    o, e = scene.objects[i], scene.event_of(i)
    if e is not None and e.kind == "start":
        return _pick(rng, ("that is still at first", "resting at first"))
    if o.motion == "still":
        return _pick(rng, ("that stays still", "standing still", "that does not move"))
    axis = "left and right" if DIRECTIONS[o.motion][0] else "up and down"
    return _pick(rng, (f"moving {axis}", f"that moves {axis}", f"bouncing {axis}"))


def _join(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def caption(scene: Scene, rng: np.random.Generator) -> str:
    n = len(scene.objects)
    shapes = f"{NUMBER_WORDS[n]} colored shape{'s' if n > 1 else ''}"
    parts = [
        _pick(
            rng,
            (
                f"A video of {shapes} on a dark background.",
                f"{_sentence(shapes)} on a dark background.",
                f"This clip shows {shapes} on a dark background.",
            ),
        )
    ]
    at_start = [i for i in range(n) if not (scene.event_of(i) and scene.event_of(i).kind == "appear")]
    if at_start:
        things = [f"{_a(scene.objects[i].name)} {_motion_phrase(scene, i, rng)}" for i in at_start]
        parts.append(_pick(rng, ("At the start there is ", "First we see ", "It begins with ")) + _join(things) + ".")
    else:
        parts.append("At first no shape is visible.")
    if scene.digit is not None:
        d = scene.digit
        parts.append(
            _pick(
                rng,
                (
                    f"A large gray digit {d} is drawn in the middle.",
                    f"The digit {d} is shown in gray behind the shapes.",
                    f"A big gray {d} stays in the center.",
                ),
            )
        )
    for k, e in enumerate(scene.events):
        lead = (
            _pick(rng, (f"At {e.t} seconds, ", f"After {e.t} seconds, "))
            if k == 0
            else _pick(rng, (f"At {e.t} seconds, ", f"Then at {e.t} seconds, ", f"Later, at {e.t} seconds, "))
        )
        parts.append(lead + event_text(scene, e) + ".")
    return " ".join(parts)


# --- questions and answers -----------------------------------------------------------------------


class QA(NamedTuple):
    question: str
    answer: str
    kind: str  # "count", "color", "color_start", "color_end", "motion", "digit", "no_digit", "event", "when"


MOTION_ANSWERS = ("It does not move.", "Left and right.", "Up and down.")
# The closed answer sets: the kinds of question that also get a multiple-choice variant. Every set has
# at least four answers; "Four." and "In a circle." are never right here (1-3 shapes, straight motion).
CHOICES = {
    "count": tuple(_sentence(w) for w in NUMBER_WORDS[1:5]),
    "color": tuple(_sentence(c) for c in COLORS),
    "motion": MOTION_ANSWERS + ("In a circle.",),
    "digit": tuple(f"{d}." for d in range(10)),
}
CHOICES["color_start"] = CHOICES["color_end"] = CHOICES["color"]
OPTIONS = 4  # options of a multiple-choice question (Video-MME's count)


def questions(scene: Scene) -> list[QA]:
    """Questions with their answers and kinds; every answer follows from the scene's metadata."""
    n = len(scene.objects)
    qa = [QA("How many different shapes are shown in the video?", _sentence(NUMBER_WORDS[n]), "count")]
    for i, o in enumerate(scene.objects):
        final = scene.final_color(i)
        if final == o.color:
            qa.append(QA(f"What color is the {o.shape}?", _sentence(o.color), "color"))
        else:
            qa.append(QA(f"What color is the {o.shape} at the start?", _sentence(o.color), "color_start"))
            qa.append(QA(f"What color is the {o.shape} at the end?", _sentence(final), "color_end"))
        e = scene.event_of(i)
        if e is None or e.kind != "start":
            axis = (
                MOTION_ANSWERS[0]
                if o.motion == "still"
                else MOTION_ANSWERS[1]
                if DIRECTIONS[o.motion][0]
                else MOTION_ANSWERS[2]
            )
            qa.append(QA(f"How does the {o.shape} move?", axis, "motion"))
    if scene.digit is not None:
        qa.append(QA("Which digit is shown?", f"{scene.digit}.", "digit"))
    else:
        qa.append(QA("Is a digit shown in the video?", "No.", "no_digit"))
    for e in scene.events:
        qa.append(QA(f"What happens at {e.t} seconds?", _sentence(event_text(scene, e)), "event"))
        qa.append(QA(f"When does the {scene.objects[e.object].name} {_verbs(e)[1]}?", f"At {e.t} seconds.", "when"))
    return qa


class Choice(NamedTuple):
    question: str  # "What color is the circle? A. Red. B. Cyan. C. Green. D. White. Answer with the letter."
    options: list[str]  # ["A. Red.", "B. Cyan.", "C. Green.", "D. White."]
    letter: str  # "B": the option that is the answer


def multiple_choice(qa: QA, rng: np.random.Generator) -> Choice | None:
    """A four-option variant of a question with a closed answer set (None for the others): three
    distractors drawn from the same set, the answer at a random letter."""
    answers = CHOICES.get(qa.kind)
    if answers is None:
        return None
    if qa.answer not in answers:
        raise ValueError(f"answer {qa.answer!r} of {qa.question!r} is not in the {qa.kind!r} set {answers}")
    others = [a for a in answers if a != qa.answer]
    picked = [others[int(k)] for k in rng.choice(len(others), size=OPTIONS - 1, replace=False)] + [qa.answer]
    texts = [picked[int(k)] for k in rng.permutation(len(picked))]
    return Choice(letter_question(qa.question, texts), lettered(texts), LETTERS[texts.index(qa.answer)])
