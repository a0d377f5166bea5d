"""Visual needles for a needle-in-a-video-haystack test (LongVA's V-NIAH idea), designed so that
the tiny VQGAN's codes carry the answer.

The haystack is sample-style frames (lwm/synth/scene.py: a few small shapes on a dark
background). The needle is one frame filled with a color of NEEDLE_COLORS (the closed answer set;
chance 1/6), with a white ring so it reads as a card and not as a background, per-pixel noise and
a small dark shape at a random place, so that no two needle frames are alike.

    python -m lwm.synth.make_vniah --probe        # can the codes tell the needle's color? (seconds)
    python -m lwm.synth.make_vniah --out data/vniah --n 4000 --frames 2 6   # training / held-out examples

The probe encodes needle frames of every color and haystack frames with the VQGAN, takes each
frame's histogram over the codebook, and classifies held-out frames by the nearest class mean
(cosine): 7 classes, the six colors and "no needle". It prints the held-out accuracy per class.

`--out` writes examples in the sample QA's chat form (the question before the video):
OUT/codes (or --codes; tokens/<id>.npy and manifest.*.jsonl, as lwm-tokenize writes them), OUT/train.jsonl and
OUT/heldout.jsonl, one line per example:

    {"vision": "vniah_f6_train_000012", "user": "You are a helpful assistant. USER: What color is the card
     in the video?", "assistant": "ASSISTANT:", "answer": "Red.", "frames": 5, "depth": 50.0,
     "fields": "[user+vision+assistant],answer"}

Each video has LOW to HIGH frames (`--frames`), one of them the needle, at a random depth. The
frames come from pools encoded once (a frame's codes do not depend on its neighbours); the
held-out examples draw from pools of their own frames.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

from lwm.data.chat import CHAT_SPEC, chat_fields
from lwm.data.code_cache import save_codes
from lwm.interop.vqgan_sources import open_vqgan
from lwm.paths import TINY_VQGAN
from lwm.synth.scene import PALETTE, SIZE, _shape_mask, random_scene, render

NEEDLE_COLORS = ("red", "green", "blue", "yellow", "magenta", "cyan")
NO_NEEDLE = "none"
DEFAULT_CHECKPOINT = TINY_VQGAN


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


def encode(vqgan, frames: np.ndarray) -> np.ndarray:
    """(N, SIZE, SIZE, 3) uint8 frames -> (N, tokens_per_frame) codes."""
    with torch.no_grad():
        return vqgan.encode(torch.from_numpy(frames), batch_size=32).numpy()


def histograms(codes: np.ndarray, n_codes: int) -> np.ndarray:
    """(N, tokens_per_frame) codes -> (N, n_codes) float: each frame's codes counted, L2-normalized."""
    hist = np.zeros((len(codes), n_codes), np.float32)
    np.add.at(hist, (np.arange(len(codes))[:, None], codes), 1.0)
    return hist / np.linalg.norm(hist, axis=1, keepdims=True)


def code_histograms(vqgan, frames: np.ndarray) -> np.ndarray:
    return histograms(encode(vqgan, frames), vqgan.config.n_codes)


def nearest_centroid(train_x, train_y, test_x) -> np.ndarray:
    """Labels of test_x by the nearest class mean of train_x (cosine)."""
    classes = np.unique(train_y)
    means = np.stack([train_x[train_y == c].mean(0) for c in classes])
    means /= np.linalg.norm(means, axis=1, keepdims=True)
    return classes[(test_x @ means.T).argmax(1)]


def probe(
    vqgan, train_per_class: int = 20, test_per_class: int = 50, seed: int = 0, shuffle_labels: bool = False
) -> dict:
    """Held-out accuracy of the nearest-centroid probe on the codes, overall and per class.
    shuffle_labels: fit on permuted training labels (a control: chance, 1/7)."""
    train, train_y = labelled_frames(train_per_class, seed)
    test, test_y = labelled_frames(test_per_class, seed + 1)  # other needles, other scenes
    if shuffle_labels:
        train_y = np.random.default_rng(seed).permutation(train_y)
    pred = nearest_centroid(code_histograms(vqgan, train), train_y, code_histograms(vqgan, test))
    names = [*NEEDLE_COLORS, NO_NEEDLE]
    return {
        "accuracy": float((pred == test_y).mean()),
        "per_class": {names[c]: float((pred[test_y == c] == c).mean()) for c in range(len(names))},
        "train_per_class": train_per_class,
        "test_per_class": test_per_class,
    }


QUESTION = "What color is the card in the video?"


def code_pool(vqgan, per_class: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(codes (N, tokens_per_frame) uint16, labels (N,)) of labelled_frames(per_class, seed)."""
    frames, labels = labelled_frames(per_class, seed)
    return encode(vqgan, frames).astype(np.uint16), labels


def examples(
    codes, labels, n: int, frames: tuple[int, int], seed: int, prefix: str, out: Path, made_by: dict | None = None
) -> list[dict]:
    """n examples: each video frames[0] to frames[1] frames of the pool, one of them a needle, its
    codes written to out/tokens/<id>.npy; returns the JSON lines. made_by: the VQGAN's identity (write_manifest)."""

    rng = np.random.default_rng(seed)
    hay = np.flatnonzero(labels == len(NEEDLE_COLORS))
    needles = np.flatnonzero(labels < len(NEEDLE_COLORS))
    rows, manifest = [], []
    for i in range(n):
        count = int(rng.integers(frames[0], frames[1] + 1))
        needle = int(rng.choice(needles))
        at = int(rng.integers(count))  # the needle's frame index
        order = list(rng.choice(hay, count - 1, replace=len(hay) < count - 1))
        order.insert(at, needle)
        vid = f"{prefix}_{i:06d}"
        manifest.append(save_video(out, vid, codes[order]))
        color = NEEDLE_COLORS[labels[needle]]
        rows.append(
            {
                "vision": vid,
                **chat_fields(QUESTION),
                "answer": f"{color.capitalize()}.",
                "frames": count,
                "depth": round(100 * at / max(count - 1, 1), 1),
                "fields": CHAT_SPEC,
            }
        )
    write_manifest(out, prefix, manifest, made_by)
    return rows


def save_video(out: Path, vid: str, codes: np.ndarray) -> dict:
    """Write one video's codes (T, tokens_per_frame) to out/tokens/<vid>.npy, at 1 fps; returns its
    manifest line."""
    with open(out / "tokens" / f"{vid}.npy", "wb") as f:
        sha256 = save_codes(f, codes)
    return {"id": vid, "frames": len(codes), "timestamps": [float(t) for t in range(len(codes))], "sha256": sha256}


def write_manifest(out: Path, prefix: str, manifest: list[dict], made_by: dict | None) -> None:
    """made_by: the identity of the VQGAN that made the codes (open_vqgan's), recorded on every line as
    lwm-tokenize does, so that a run's export bundles that VQGAN; None: not known."""
    with open(out / f"manifest.{prefix}.jsonl", "w") as f:
        f.writelines(json.dumps(m if made_by is None else {**m, "tokenizer": made_by}) + "\n" for m in manifest)


def write_examples(
    vqgan,
    out: Path,
    n: int,
    heldout: int,
    frames: tuple[int, int],
    seed: int,
    pool: int = 60,
    codes_dir: Path | None = None,
    made_by: dict | None = None,
) -> None:
    """Training and held-out examples; `pool` frames per class for training, a third as many held out.
    codes_dir: where the videos' codes go (default out/codes; several sets may share one); the
    video ids start with out's name, so they do not collide there. made_by: vqgan's identity (write_manifest)."""
    codes_dir = codes_dir or out / "codes"
    (codes_dir / "tokens").mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    for name, count, pool_seed in (("train", n, seed), ("heldout", heldout, seed + 10**6)):
        codes, labels = code_pool(vqgan, pool if name == "train" else max(1, pool // 3), pool_seed)
        rows = examples(codes, labels, count, frames, pool_seed, f"vniah_{out.name}_{name}", codes_dir, made_by)
        with open(out / f"{name}.jsonl", "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    print(f"wrote {n} training and {heldout} held-out examples ({frames[0]}-{frames[1]} frames) to {out}")


def check_set_args(p: argparse.ArgumentParser, args) -> None:
    """--frames, --n, --heldout and --checkpoint of a command that writes a video set."""
    if not 1 <= args.frames[0] <= args.frames[1]:
        p.error(f"--frames {args.frames[0]} {args.frames[1]}: need 1 <= LOW <= HIGH")
    if args.n < 1 or args.heldout < 1:
        p.error("--n and --heldout must be positive")
    if not args.checkpoint.is_file():
        p.error(f"--checkpoint {args.checkpoint} does not exist")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--probe", action="store_true", help="run the codes probe and print its accuracy")
    p.add_argument("--checkpoint", type=Path, default=DEFAULT_CHECKPOINT, help="the VQGAN (safetensors + json)")
    p.add_argument("--train-per-class", type=int, default=20)
    p.add_argument("--test-per-class", type=int, default=50)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, help="write training and held-out examples here")
    p.add_argument("--codes", type=Path, help="--out: write the videos' codes here (default OUT/codes)")
    p.add_argument("--n", type=int, default=4000, help="--out: training examples")
    p.add_argument("--heldout", type=int, default=200, help="--out: held-out examples")
    p.add_argument(
        "--frames",
        type=int,
        nargs=2,
        default=[2, 6],
        metavar=("LOW", "HIGH"),
        help="--out: frames per video (the needle included), uniform in [LOW, HIGH]",
    )
    args = p.parse_args(argv)
    if not args.probe and args.out is None:
        p.error("nothing to do: give --probe and/or --out")
    check_set_args(p, args)
    if args.train_per_class < 1 or args.test_per_class < 1:
        p.error("--train-per-class and --test-per-class must be positive")

    vqgan, made_by = open_vqgan(args.checkpoint)
    if args.probe:
        print(json.dumps(probe(vqgan, args.train_per_class, args.test_per_class, args.seed), indent=2))
    if args.out is not None:
        write_examples(
            vqgan, args.out, args.n, args.heldout, tuple(args.frames), args.seed, codes_dir=args.codes, made_by=made_by
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
