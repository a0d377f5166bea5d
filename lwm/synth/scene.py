"""Random scenes (shapes, an optional digit, events at whole seconds) and their rendering with numpy.

A scene is plain data; `scene_to_json` is what videos.jsonl records and `render` turns it into
frames (T, 64, 64, 3) uint8. Objects move in a straight line and bounce off the frame's edges.
The sample clips are 8-20 s at 4 fps; `random_scene` also makes scenes of a given length, frame
rate and kinds of events (lwm/synth/make_long_videos.py: up to an hour at 1 fps, only "start" events).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

FPS = 4
SIZE = 64
MIN_SECONDS, MAX_SECONDS = 8, 20

PALETTE = {
    "red": (230, 40, 40),
    "green": (40, 200, 60),
    "blue": (50, 90, 240),
    "yellow": (240, 220, 40),
    "white": (240, 240, 240),
    "magenta": (220, 50, 220),
    "cyan": (40, 220, 230),
    "orange": (250, 140, 20),
}
COLORS = tuple(PALETTE)
SHAPES = ("circle", "square", "triangle")
DIRECTIONS = {"left": (-1, 0), "right": (1, 0), "up": (0, -1), "down": (0, 1)}
MOTIONS = ("still",) + tuple(DIRECTIONS)
EVENT_KINDS = ("appear", "disappear", "recolor", "start")
DIGIT_COLOR = (150, 150, 150)  # "gray", not a palette color
DIGIT_SCALE = 5  # the 5x7 font drawn as 25x35 pixels

# 5x7 bitmap font, one string per row.
FONT = {
    0: ("01110", "10001", "10011", "10101", "11001", "10001", "01110"),
    1: ("00100", "01100", "00100", "00100", "00100", "00100", "01110"),
    2: ("01110", "10001", "00001", "00010", "00100", "01000", "11111"),
    3: ("11111", "00010", "00100", "00010", "00001", "10001", "01110"),
    4: ("00010", "00110", "01010", "10010", "11111", "00010", "00010"),
    5: ("11111", "10000", "11110", "00001", "00001", "10001", "01110"),
    6: ("00110", "01000", "10000", "11110", "10001", "10001", "01110"),
    7: ("11111", "00001", "00010", "00100", "01000", "01000", "01000"),
    8: ("01110", "10001", "10001", "01110", "10001", "10001", "01110"),
    9: ("01110", "10001", "10001", "01111", "00001", "00010", "01100"),
}


@dataclass
class Obj:
    shape: str
    color: str
    size: int  # half-width in pixels
    start: tuple[int, int]  # (x, y) center at t = 0
    motion: str  # "still" or the initial direction (it bounces off the edges)
    speed: int  # pixels per second once moving

    @property
    def name(self) -> str:
        return f"{self.color} {self.shape}"


@dataclass
class Event:
    t: int  # seconds; the change is visible from frame t * fps on
    kind: str  # one of EVENT_KINDS
    object: int  # index into Scene.objects
    value: str | None = None  # the new color (recolor) or the direction (start)


@dataclass
class Scene:
    id: str
    seconds: int
    background: tuple[int, int, int]
    objects: list[Obj]
    digit: int | None
    events: list[Event] = field(default_factory=list)  # sorted by time, at most one per object
    fps: int = FPS

    @property
    def frames(self) -> int:
        return self.seconds * self.fps

    def event_of(self, i: int) -> Event | None:
        return next((e for e in self.events if e.object == i), None)

    def final_color(self, i: int) -> str:
        e = self.event_of(i)
        return e.value if e is not None and e.kind == "recolor" else self.objects[i].color


def random_scene(
    rng: np.random.Generator,
    video_id: str,
    seconds: int | None = None,
    fps: int = FPS,
    event_kinds: tuple[str, ...] = EVENT_KINDS,
) -> Scene:
    """1-3 shapes, maybe a digit, and events at whole seconds in [2, seconds - 2] (at most one per shape;
    at least one when there is room). `seconds` is drawn from [MIN_SECONDS, MAX_SECONDS] unless given.
    Generators in the same state give the same shapes, digit and background at every given length;
    only the events differ."""
    if seconds is None:
        seconds = int(rng.integers(MIN_SECONDS, MAX_SECONDS + 1))
    if seconds < 1 or fps < 1 or not event_kinds or not set(event_kinds) <= set(EVENT_KINDS):
        raise ValueError(
            f"need seconds >= 1, fps >= 1 and event kinds among {EVENT_KINDS}; "
            f"got seconds={seconds}, fps={fps}, event_kinds={event_kinds}"
        )
    n = int(rng.integers(1, 4))
    shapes = [SHAPES[i] for i in rng.permutation(len(SHAPES))[:n]]
    colors = [COLORS[i] for i in rng.permutation(len(COLORS))[:n]]
    objects: list[Obj] = []
    for shape, color in zip(shapes, colors):
        size = int(rng.integers(6, 11))
        for _ in range(50):  # start apart, so that no shape hides another one that stays still
            x, y = (int(v) for v in rng.integers(size, SIZE - size, size=2))
            if all(max(abs(x - o.start[0]), abs(y - o.start[1])) > max(size, o.size) + 2 for o in objects):
                break
        objects.append(Obj(shape, color, size, (x, y), str(rng.choice(MOTIONS)), int(rng.integers(4, 13))))
    digit = int(rng.integers(10)) if rng.random() < 0.5 else None
    background = tuple(int(v) for v in rng.integers(8, 32, size=3))

    with_event = [i for i in range(n) if rng.random() < 0.6] or [int(rng.integers(n))]
    slots = np.arange(2, seconds - 1)  # whole seconds, none in the first two or the last one
    with_event = with_event[: len(slots)]  # a very short scene has room for fewer events (or none)
    times = sorted(int(t) for t in rng.choice(slots, size=len(with_event), replace=False)) if with_event else []
    spare_colors = [c for c in COLORS if c not in colors]
    events = []
    for t, i in zip(times, [with_event[j] for j in rng.permutation(len(with_event))]):
        kind = str(rng.choice(event_kinds))
        value = None
        if kind == "recolor":
            value = spare_colors.pop(int(rng.integers(len(spare_colors))))
        elif kind == "start":  # from rest, towards a side at least one second of motion away
            o = objects[i]
            room = {
                "left": o.start[0] - o.size,
                "right": SIZE - 1 - o.size - o.start[0],
                "up": o.start[1] - o.size,
                "down": SIZE - 1 - o.size - o.start[1],
            }
            value = str(rng.choice([d for d in DIRECTIONS if room[d] >= o.speed] or [max(room, key=room.get)]))
            o.motion = "still"
        events.append(Event(t, kind, i, value))
    return Scene(video_id, seconds, background, objects, digit, events, fps)


def _shape_mask(shape: str, cx: float, cy: float, r: int, xx: np.ndarray, yy: np.ndarray) -> np.ndarray:
    dx, dy = xx - cx, yy - cy
    if shape == "circle":
        return dx * dx + dy * dy <= r * r
    if shape == "square":
        h = 0.85 * r  # about the circle's area
        return (np.abs(dx) <= h) & (np.abs(dy) <= h)
    if shape == "triangle":  # apex up, base at the bottom
        return (dy >= -r) & (dy <= r) & (np.abs(dx) <= (dy + r) / 2)
    raise ValueError(f"unknown shape {shape!r}; expected one of {SHAPES}")


def _digit_mask(digit: int) -> np.ndarray:
    bitmap = np.array([[c == "1" for c in row] for row in FONT[digit]])  # (7, 5)
    big = np.kron(bitmap, np.ones((DIGIT_SCALE, DIGIT_SCALE), bool))  # (35, 25)
    mask = np.zeros((SIZE, SIZE), bool)
    top, left = (SIZE - big.shape[0]) // 2, (SIZE - big.shape[1]) // 2
    mask[top : top + big.shape[0], left : left + big.shape[1]] = big
    return mask


def color_at(scene: Scene, i: int, t: float) -> str | None:
    """The color of object i at time t (seconds), or None while it is not on screen."""
    o, e = scene.objects[i], scene.event_of(i)
    happened = e is not None and t >= e.t
    if e is not None and e.kind == "appear":
        return o.color if happened else None
    if e is not None and e.kind == "disappear":
        return None if happened else o.color
    return e.value if happened and e.kind == "recolor" else o.color


def render(scene: Scene) -> np.ndarray:
    """Frames (T, 64, 64, 3) uint8: background, the digit (centered), then the visible shapes, larger ones
    first (a smaller shape on top never hides a larger one completely)."""
    yy, xx = np.mgrid[0:SIZE, 0:SIZE].astype(np.float32)
    base = np.empty((SIZE, SIZE, 3), np.uint8)
    base[:] = scene.background
    if scene.digit is not None:
        base[_digit_mask(scene.digit)] = DIGIT_COLOR
    pos = [list(map(float, o.start)) for o in scene.objects]  # (x, y) per object
    vel = [list(DIRECTIONS.get(o.motion, (0, 0))) for o in scene.objects]  # unit steps per object
    order = sorted(range(len(scene.objects)), key=lambda i: -scene.objects[i].size)
    out = np.empty((scene.frames, SIZE, SIZE, 3), np.uint8)
    for f in range(scene.frames):
        for e in scene.events:
            if e.kind == "start" and f == e.t * scene.fps:
                vel[e.object] = list(DIRECTIONS[e.value])
        out[f] = base
        for i in order:
            color = color_at(scene, i, f / scene.fps)
            if color is not None:
                o = scene.objects[i]
                out[f][_shape_mask(o.shape, pos[i][0], pos[i][1], o.size, xx, yy)] = PALETTE[color]
        for i, o in enumerate(scene.objects):  # move, bouncing off the edges
            lo, hi = o.size, SIZE - 1 - o.size
            for axis in (0, 1):
                p = pos[i][axis] + vel[i][axis] * o.speed / scene.fps
                if p < lo or p > hi:
                    p = 2 * lo - p if p < lo else 2 * hi - p
                    vel[i][axis] = -vel[i][axis]
                pos[i][axis] = p
    return out


def scene_to_json(scene: Scene, event_texts: list[str]) -> dict:
    """The videos.jsonl record; event_texts are the sentences for scene.events (language.event_text)."""
    return {
        "id": scene.id,
        "path": f"videos/{scene.id}.mp4",
        "fps": scene.fps,
        "duration": scene.seconds,
        "frames": scene.frames,
        "width": SIZE,
        "height": SIZE,
        "objects": [
            {
                "shape": o.shape,
                "color": o.color,
                "final_color": scene.final_color(i),
                "size": o.size,
                "start": list(o.start),
                "motion": o.motion,
                "speed": o.speed,
            }
            for i, o in enumerate(scene.objects)
        ],
        "digit": scene.digit,
        "events": [
            {"t": e.t, "text": text, "kind": e.kind, "object": e.object, "value": e.value}
            for e, text in zip(scene.events, event_texts)
        ],
    }
