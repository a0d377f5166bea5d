"""Words about scenes (event sentences, captions, questions and answers, multiple-choice variants of the
questions with a closed answer set) and long procedural documents.

Everything is drawn from a numpy Generator passed in, so the same seed gives the same text.
"""

from __future__ import annotations

import re
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


# --- documents -----------------------------------------------------------------------------------

SYLLABLES = (
    "ka",
    "lo",
    "mi",
    "ra",
    "ten",
    "vor",
    "sa",
    "bel",
    "dun",
    "ri",
    "ash",
    "el",
    "mar",
    "tho",
    "quin",
    "zed",
    "ol",
    "pa",
    "ni",
    "ver",
    "gal",
    "fi",
    "ro",
    "sen",
    "tu",
    "ha",
    "jor",
    "lem",
    "cy",
    "dra",
    "bri",
    "nor",
    "wen",
    "ish",
    "ul",
    "gor",
    "tam",
    "yev",
    "pel",
    "cor",
    "sku",
    "ame",
    "tris",
    "obo",
    "ulf",
    "kel",
    "vin",
    "sha",
    "dor",
    "eth",
    "pim",
    "rax",
    "ju",
    "nev",
    "oss",
    "fal",
    "gri",
    "mun",
)
PLACE_ENDINGS = (
    "ford",
    "ton",
    "vale",
    "port",
    "mere",
    "wick",
    "holm",
    "bridge",
    "stead",
    "haven",
    "field",
    "by",
    "moor",
    "dale",
    "crest",
    "hollow",
    "gate",
    "reach",
)
WORDS = {
    "color": (
        "red",
        "green",
        "blue",
        "yellow",
        "white",
        "magenta",
        "cyan",
        "orange",
        "gray",
        "black",
        "purple",
        "brown",
        "silver",
        "golden",
        "pink",
        "violet",
        "crimson",
        "amber",
        "teal",
        "ivory",
    ),
    "shape": ("circle", "square", "triangle"),
    "dir": ("left", "right", "up", "down", "north", "south", "east", "west"),
    "day": ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"),
    "month": (
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ),
    "item": (
        "lanterns",
        "baskets",
        "maps",
        "stones",
        "ribbons",
        "candles",
        "kites",
        "bells",
        "jars",
        "coins",
        "letters",
        "marbles",
        "boxes",
        "flags",
        "keys",
        "shells",
        "feathers",
        "books",
        "cups",
        "tiles",
        "blankets",
        "mirrors",
        "compasses",
        "needles",
        "buttons",
        "barrels",
        "ladders",
        "umbrellas",
        "paintbrushes",
        "telescopes",
        "wheels",
        "hammers",
        "spoons",
        "pebbles",
        "scrolls",
        "whistles",
    ),
    "job": (
        "baker",
        "weaver",
        "painter",
        "sailor",
        "clockmaker",
        "gardener",
        "miller",
        "teacher",
        "scribe",
        "carpenter",
        "potter",
        "shepherd",
        "glassblower",
        "mapmaker",
        "fisher",
        "smith",
        "astronomer",
        "beekeeper",
        "librarian",
        "merchant",
        "musician",
        "innkeeper",
        "tailor",
        "cartographer",
        "blacksmith",
        "apothecary",
        "lighthouse keeper",
        "bookbinder",
        "stonemason",
        "ferryman",
        "chemist",
        "surveyor",
    ),
    "animal": (
        "fox",
        "heron",
        "goat",
        "owl",
        "otter",
        "crow",
        "hare",
        "badger",
        "swan",
        "lynx",
        "beaver",
        "squirrel",
        "falcon",
        "tortoise",
        "hedgehog",
        "salamander",
        "pelican",
        "reindeer",
        "woodpecker",
    ),
    "weather": (
        "rain",
        "fog",
        "snow",
        "wind",
        "sunshine",
        "hail",
        "thunder",
        "mist",
        "drizzle",
        "frost",
        "lightning",
        "sleet",
    ),
    "feeling": (
        "glad",
        "tired",
        "curious",
        "worried",
        "calm",
        "proud",
        "puzzled",
        "hopeful",
        "grateful",
        "nervous",
        "cheerful",
        "anxious",
        "delighted",
        "frightened",
        "embarrassed",
        "surprised",
    ),
    "thing": (
        "bridge",
        "tower",
        "market",
        "harbor",
        "mill",
        "library",
        "garden",
        "workshop",
        "station",
        "well",
        "observatory",
        "cathedral",
        "orchard",
        "courtyard",
        "fountain",
        "greenhouse",
        "warehouse",
        "lighthouse",
        "monastery",
        "university",
        "theater",
        "museum",
    ),
    "adj": (
        "ancient",
        "narrow",
        "quiet",
        "crowded",
        "forgotten",
        "enormous",
        "delicate",
        "mysterious",
        "beautiful",
        "dangerous",
        "peaceful",
        "abandoned",
        "magnificent",
        "ordinary",
        "remarkable",
        "wonderful",
        "terrible",
        "curious",
        "hidden",
        "famous",
        "crooked",
        "sparkling",
        "weathered",
    ),
    "verb": (
        "carried",
        "repaired",
        "discovered",
        "measured",
        "described",
        "remembered",
        "borrowed",
        "returned",
        "collected",
        "polished",
        "examined",
        "purchased",
        "recorded",
        "decorated",
        "exchanged",
        "delivered",
        "abandoned",
        "considered",
        "celebrated",
        "arranged",
    ),
    "food": (
        "bread",
        "apples",
        "cheese",
        "soup",
        "honey",
        "pears",
        "walnuts",
        "porridge",
        "pancakes",
        "blueberries",
        "dumplings",
        "chestnuts",
        "pumpkins",
        "turnips",
        "biscuits",
    ),
}
TEMPLATES = (
    "{name} the {job} lived in {place} and kept {num} {item} in a wooden chest.",
    "On {day} the {weather} came early to {place}, and {name} stayed inside to count {item}.",
    "In the year {year}, the town of {place} had {big} people and one {adj} {thing}.",
    "{name} walked {dir} from {place} to {place2}, a road of {num} miles.",
    "At the {thing} of {place}, {name} met {name2}, who was a {job} and felt {feeling}.",
    "{name2} painted a {color} {shape} on the door of the {thing}, then a {color2} {shape2} beside it.",
    "Every {month}, {name} sends {num} {item} to {name2} in {place2}.",
    "The {animal} by the {thing} watched {name} for {small} minutes before it ran {dir}.",
    "{name} said that the {color} {shape} moved {dir} at {small} seconds and stopped at {small2} seconds.",
    "A film was shown in {place}: a {color} {shape} on a dark screen, then the {shape} turned {color2}.",
    "{name} wrote the number {big} on a {color} card and hid it under the {thing}.",
    "By {month} of {year}, the {job}s of {place} had made {big} {item}.",
    "When the {weather} stopped, {name} and {name2} went {dir} to look for the lost {animal}.",
    "The secret number of {name} is {big}, and the secret color is {color}.",
    "{name2} counted {small} {color} {shape}s and {small2} {color2} {shape2}s on the wall.",
    "It took {name} {small} days to reach {place2}, where the {thing} was {color}.",
    "In {place}, people say the {animal} brings {weather} on {day}.",
    "The {job} from {place2} sold {num} {item} for {num2} coins each.",
    "{name} felt {feeling} because the {thing} in {place} had {num} windows and every one was {color}.",
    "The clock on the {thing} showed {hour} o'clock when {name} arrived.",
    "Near {place}, a {color} flag with a {shape} marks the road {dir}.",
    "{name} asked {name2} how many {item} were left, and the answer was {num}.",
    "At second {small}, the {color} {shape} appeared; at second {small2}, it was gone.",
    "The {thing} of {place} was built in {year} and rebuilt {small} years later.",
    "{name} learned to be a {job} from {name2}, who had been one for {small} years.",
    'In the old tongue of {place}, the word for {item} is "{word}" and the word for {weather} is "{word2}".',
    "The {adj} {thing} near {place} is called {word} by the {job}s who work there.",
    "{name} {verb} the {adj} {item} of {name2} and {verb2} them again before {day}.",
    "For supper, {name} cooked {food} and {food2}, and gave {small} portions to the {animal}.",
    "Nobody in {place} {verb} the {adj} {animal} that lived behind the {thing}.",
    "{name} kept a diary: on day {small} the sky was {color}, on day {small2} it was {color2}.",
    "The {job}s of {place} and {place2} met every {day} to trade {food} for {item}.",
    "A {adj} storm of {weather} closed the roads to {place} for {small} days in {month}.",
    "{name2}'s {animal} was {feeling} when it saw the {color} {shape} spinning on the {thing}.",
    "The {word} is a {adj} dance from {place}, played on {small} drums and one whistle.",
)
TITLES = (
    "The chronicle of {place}",
    "Letters from {place}",
    "A year in {place}",
    "The {job} of {place}",
    "Notes on {color} {shape}s",
    "The road from {place} to {place2}",
    "The {adj} {thing} of {place}",
)
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
