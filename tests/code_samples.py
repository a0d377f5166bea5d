"""Cached video codes for the data tests, in lwm-tokenize's format: tokens/<id>.npy (uint16, (T, 256)) and
manifest.jsonl with each frame's time (0.5 s apart)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

T_FRAMES = {"clip_a": 4, "clip_b": 6, "clip_c": 3}  # video id -> frames


def write_codes(root: Path) -> Path:
    (root / "tokens").mkdir(parents=True)
    rng = np.random.default_rng(0)
    with open(root / "manifest.jsonl", "w") as f:
        for vid, t in T_FRAMES.items():
            np.save(root / "tokens" / f"{vid}.npy", rng.integers(0, 8192, (t, 256)).astype(np.uint16))
            f.write(json.dumps({"id": vid, "timestamps": [i * 0.5 for i in range(t)]}) + "\n")
    return root
