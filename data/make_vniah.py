"""Visual needles for a needle-in-a-video-haystack test (LongVA's V-NIAH idea), designed so that
the tiny VQGAN's codes carry the answer.

The haystack is sample-style frames (data/sample_lib/scene.py: a few small shapes on a dark
background). The needle is one frame filled with a color of NEEDLE_COLORS (the closed answer set;
chance 1/6), with a white ring so it reads as a card and not as a background, per-pixel noise and
a small dark shape at a random place, so that no two needle frames are alike.

    python data/make_vniah.py --probe        # can the codes tell the needle's color? (seconds)

The probe encodes needle frames of every color and haystack frames with the VQGAN, takes each
frame's histogram over the codebook, and classifies held-out frames by the nearest class mean
(cosine): 7 classes, the six colors and "no needle". It prints the held-out accuracy per class.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT / "data") not in sys.path:
    sys.path.insert(0, str(ROOT / "data"))

from sample_lib.scene import PALETTE, SIZE, _shape_mask, random_scene, render  # noqa: E402

NEEDLE_COLORS = ("red", "green", "blue", "yellow", "magenta", "cyan")
NO_NEEDLE = "none"
DEFAULT_CHECKPOINT = ROOT / "data" / "checkpoints" / "vqgan_tiny.safetensors"


def needle_frame(color: str, rng: np.random.Generator) -> np.ndarray:
    """(SIZE, SIZE, 3) uint8: the card of `color`."""
    if color not in NEEDLE_COLORS:
        raise ValueError(f"needle color must be one of {NEEDLE_COLORS}, got {color!r}")
    yy, xx = np.mgrid[0:SIZE, 0:SIZE].astype(np.float32)
    frame = np.empty((SIZE, SIZE, 3), np.float32)
    frame[:] = PALETTE[color]
    r = np.hypot(xx - SIZE / 2, yy - SIZE / 2)
    frame[(r > SIZE * 0.36) & (r < SIZE * 0.42)] = 240  # the white ring
    cx, cy = rng.uniform(8, SIZE - 8, 2)
    frame[_shape_mask(str(rng.choice(["circle", "square", "triangle"])), cx, cy, 5, xx, yy)] = 30
    frame += rng.normal(0, 12, frame.shape)
    return np.clip(frame, 0, 255).astype(np.uint8)


def haystack_frames(n: int, rng: np.random.Generator) -> np.ndarray:
    """(n, SIZE, SIZE, 3) uint8 frames of random sample scenes, one frame from each."""
    out = []
    for i in range(n):
        frames = render(random_scene(rng, f"hay_{i}"))
        out.append(frames[rng.integers(len(frames))])
    return np.stack(out)


def labelled_frames(per_class: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(frames (N, SIZE, SIZE, 3) uint8, labels (N,) int): per_class frames of each color, then of
    the haystack (label len(NEEDLE_COLORS))."""
    rng = np.random.default_rng(seed)
    frames = [needle_frame(c, rng) for c in NEEDLE_COLORS for _ in range(per_class)]
    frames = np.concatenate([np.stack(frames), haystack_frames(per_class, rng)])
    labels = np.repeat(np.arange(len(NEEDLE_COLORS) + 1), per_class)
    return frames, labels


def code_histograms(vqgan, frames: np.ndarray) -> np.ndarray:
    """(N, n_codes) float: each frame's codes counted, L2-normalized."""
    import torch

    with torch.no_grad():
        codes = vqgan.encode(torch.from_numpy(frames), batch_size=32).numpy()  # (N, tokens_per_frame)
    hist = np.zeros((len(codes), vqgan.config.n_codes), np.float32)
    np.add.at(hist, (np.arange(len(codes))[:, None], codes), 1.0)
    return hist / np.linalg.norm(hist, axis=1, keepdims=True)


def nearest_centroid(train_x, train_y, test_x) -> np.ndarray:
    """Labels of test_x by the nearest class mean of train_x (cosine)."""
    classes = np.unique(train_y)
    means = np.stack([train_x[train_y == c].mean(0) for c in classes])
    means /= np.linalg.norm(means, axis=1, keepdims=True)
    return classes[(test_x @ means.T).argmax(1)]


def probe(vqgan, train_per_class: int = 20, test_per_class: int = 50, seed: int = 0,
          shuffle_labels: bool = False) -> dict:
    """Held-out accuracy of the nearest-centroid probe on the codes, overall and per class.
    shuffle_labels: fit on permuted training labels (a control: chance, 1/7)."""
    train, train_y = labelled_frames(train_per_class, seed)
    test, test_y = labelled_frames(test_per_class, seed + 1)  # other needles, other scenes
    if shuffle_labels:
        train_y = np.random.default_rng(seed).permutation(train_y)
    pred = nearest_centroid(code_histograms(vqgan, train), train_y, code_histograms(vqgan, test))
    names = [*NEEDLE_COLORS, NO_NEEDLE]
    return {"accuracy": float((pred == test_y).mean()),
            "per_class": {names[c]: float((pred[test_y == c] == c).mean()) for c in range(len(names))},
            "train_per_class": train_per_class, "test_per_class": test_per_class}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--probe", action="store_true", help="run the codes probe and print its accuracy")
    p.add_argument("--checkpoint", type=Path, default=DEFAULT_CHECKPOINT, help="the VQGAN (safetensors + json)")
    p.add_argument("--train-per-class", type=int, default=20)
    p.add_argument("--test-per-class", type=int, default=50)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if not args.probe:
        p.error("nothing to do: --probe is the only action so far")
    if not args.checkpoint.is_file():
        p.error(f"--checkpoint {args.checkpoint} does not exist")
    if args.train_per_class < 1 or args.test_per_class < 1:
        p.error("--train-per-class and --test-per-class must be positive")
    from lwm.vision.checkpoint import load_vqgan

    result = probe(load_vqgan(args.checkpoint).eval(), args.train_per_class, args.test_per_class, args.seed)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
