"""Make the text-to-video demo's data: short clips of one shape of one color moving one way, each with its
prompt ("a red circle moving left"), and prompts held out as unseen combinations of the three.

    python -m lwm.synth.make_t2v --out data/t2v [--seed 0] [--per-prompt 16] [--held-out 16] [--uncond 0]
                                 [--vqgan PATH] [--cells 1]

8 colors x 3 shapes x 4 directions = 96 prompts; --held-out of them (a seeded draw that leaves every color,
shape and direction among the trained ones) have no clips, only their line in heldout.jsonl. Layout:

    videos/t2v_0000.mp4 ...  64x64, 4 fps, 1 s (4 frames): the shape on a dark background, moving --cells code
                             cells (4 pixels each) a frame from a start on the cells' grid, never reaching an
                             edge (lwm.synth.scene renders it)
    videos.jsonl             {"path": "videos/t2v_0000.mp4"}: the clips as train_vqgan.py's data.index reads them
    codes/                   each clip's rendered frames encoded by the VQGAN (the bundled tiny one unless
                             --vqgan), as lwm-tokenize writes them: the training data, free of the MP4's losses;
                             the manifest names the VQGAN, so that the run's export bundles it
    train.jsonl              {"vision": "t2v_0000", "caption": "a red circle moving left", "color": "red",
                              "shape": "circle", "motion": "left", "fields": "[caption],vision"}; and for a
                             seeded --uncond fraction of the clips a second line with "fields": "vision" (no
                             caption), so that the model also learns the unconditional draw guidance subtracts
    heldout.jsonl            {"caption": ..., "color": ..., "shape": ..., "motion": ..., "cells": 1}, one line per
                             held-out prompt (cells: the clips' cells a frame, so that its real clips are drawn alike)
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import numpy as np

from lwm.arg_types import fraction, positive_int, seed_value
from lwm.interop.vqgan_sources import open_vqgan
from lwm.paths import TINY_VQGAN
from lwm.synth.make_vniah import encode, save_video, write_manifest
from lwm.synth.scene import COLORS, DIRECTIONS, SHAPES, SIZE, Obj, Scene, render
from lwm.video.writer import write_mp4

FPS, SECONDS = 4, 1
CELL = 4  # pixels a VQGAN code covers (64x64 frames, 16x16 codes)
OBJECT_SIZE = 9  # half-width
CELLS = 1  # code cells the shape moves a frame: a frame is the last moved by whole codes
BACKGROUND = (16, 16, 24)
UNCOND = 0.0  # of the clips, trained a second time without their caption: the draw guidance subtracts


def caption(color: str, shape: str, motion: str) -> str:
    return f"a {color} {shape} moving {motion}"


def prompts() -> list[tuple[str, str, str]]:
    """Every (color, shape, motion) the demo knows, in a fixed order."""
    return list(itertools.product(COLORS, SHAPES, tuple(DIRECTIONS)))


def held_out(n: int, rng: np.random.Generator) -> list[tuple[str, str, str]]:
    """n prompts drawn so that each color, shape and direction stays among the other prompts (seen in training)."""
    every = prompts()
    rest, out = list(every), []
    for i in rng.permutation(len(every)):
        left = [p for p in rest if p != every[i]]
        if len(out) < n and all({p[k] for p in left} == {q[k] for q in every} for k in range(3)):
            out.append(every[i])
            rest = left
    if len(out) < n:
        raise ValueError(f"cannot hold out {n} prompts and keep every attribute trained; at most {len(out)}")
    return out


def scene(video_id: str, color: str, shape: str, motion: str, rng: np.random.Generator, cells: int = CELLS) -> Scene:
    """The shape moving `cells` code cells a frame, starting where its motion over the clip keeps it inside."""
    dx, dy = DIRECTIONS[motion]
    lo, hi = -(-OBJECT_SIZE // CELL), (SIZE - 1 - OBJECT_SIZE) // CELL  # in cells
    steps = (FPS * SECONDS - 1) * cells  # cells moved between the first frame and the last
    if hi - steps < lo:
        raise ValueError(f"a shape moving {steps} cells over {FPS * SECONDS} frames leaves the {SIZE}-pixel frame")
    x_cells = (lo + steps * (dx < 0), hi - steps * (dx > 0))
    y_cells = (lo + steps * (dy < 0), hi - steps * (dy > 0))
    start = (CELL * int(rng.integers(x_cells[0], x_cells[1] + 1)), CELL * int(rng.integers(y_cells[0], y_cells[1] + 1)))
    obj = Obj(shape, color, OBJECT_SIZE, start, motion, CELL * cells * FPS)  # pixels a second
    return Scene(video_id, SECONDS, BACKGROUND, [obj], None, [], FPS)


def run(
    out: Path,
    seed: int = 0,
    per_prompt: int = 16,
    n_held_out: int = 16,
    vqgan: str | Path = TINY_VQGAN,
    uncond: float = UNCOND,
    cells: int = CELLS,
) -> Path:
    rng = np.random.default_rng(seed)
    unseen = held_out(n_held_out, rng)
    model, identity = open_vqgan(vqgan)  # identity: recorded as lwm-tokenize does, so the export bundles it
    for d in ("videos", "codes/tokens"):
        (out / d).mkdir(parents=True, exist_ok=True)
    rows, manifest, n = [], [], 0
    for color, shape, motion in prompts():
        if (color, shape, motion) in unseen:
            continue
        for _ in range(per_prompt):
            video_id = f"t2v_{n:04d}"
            frames = render(scene(video_id, color, shape, motion, rng, cells))  # (4, 64, 64, 3)
            write_mp4(out / "videos" / f"{video_id}.mp4", frames, FPS)
            manifest.append(save_video(out / "codes", video_id, encode(model, frames)))
            truth = {"color": color, "shape": shape, "motion": motion}
            rows.append({"vision": video_id, "caption": caption(color, shape, motion), **truth})
            n += 1
    write_manifest(out / "codes", "t2v", manifest, identity)
    index = "".join(json.dumps({"path": f"videos/{row['vision']}.mp4"}) + "\n" for row in rows)
    (out / "videos.jsonl").write_text(index)
    lines = [{**row, "fields": "[caption],vision"} for row in rows]
    lines += [{**row, "fields": "vision"} for row, u in zip(rows, rng.random(len(rows))) if u < uncond]
    order = rng.permutation(len(lines))
    (out / "train.jsonl").write_text("".join(json.dumps(lines[i]) + "\n" for i in order))
    held = [{"caption": caption(*p), "color": p[0], "shape": p[1], "motion": p[2], "cells": cells} for p in unseen]
    (out / "heldout.jsonl").write_text("".join(json.dumps(h) + "\n" for h in held))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lwm.synth.make_t2v", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("data/t2v"))
    p.add_argument("--seed", type=seed_value, default=0)
    p.add_argument("--per-prompt", type=positive_int, default=16, help="clips of each trained prompt")
    p.add_argument("--held-out", type=positive_int, default=16, help="prompts kept out of training")
    p.add_argument(
        "--uncond", type=fraction, default=UNCOND, help="fraction of the clips also trained without their caption"
    )
    p.add_argument(
        "--vqgan", default=str(TINY_VQGAN), help="the VQGAN that encodes the clips (default: the bundled tiny one)"
    )
    p.add_argument("--cells", type=positive_int, default=CELLS, help="code cells the shape moves a frame (1 to 3)")
    args = p.parse_args(argv)
    try:
        scene("check", "red", "square", "left", np.random.default_rng(0), args.cells)
    except ValueError as e:
        p.error(f"--cells {args.cells}: {e}")
    try:
        held_out(args.held_out, np.random.default_rng(args.seed))
    except ValueError as e:
        p.error(f"--held-out {args.held_out}: {e}")
    out = run(args.out, args.seed, args.per_prompt, args.held_out, args.vqgan, args.uncond, args.cells)
    print(f"wrote {out}: {len(prompts()) - args.held_out} prompts x {args.per_prompt} clips, {args.held_out} held out")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
