"""data/make_vniah.py: the visual needle is designed so that the tiny VQGAN's codes carry its
answer. A nearest-centroid probe on the codes of held-out frames tells the six needle colors and
"no needle" (haystack frames) apart; fitted on shuffled labels it is at chance."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "data"))

import make_vniah  # noqa: E402

from lwm.vision.checkpoint import load_vqgan  # noqa: E402


@pytest.fixture(scope="module")
def vqgan():
    return load_vqgan(make_vniah.DEFAULT_CHECKPOINT).eval()


def test_the_codes_tell_the_needle_color(vqgan):
    result = make_vniah.probe(vqgan, train_per_class=10, test_per_class=20)
    assert result["accuracy"] >= 0.95, result
    assert min(result["per_class"].values()) >= 0.85, result
    control = make_vniah.probe(vqgan, train_per_class=10, test_per_class=20, shuffle_labels=True)
    assert control["accuracy"] < 0.4, control  # 7 classes: chance is 1/7


def test_needle_frames_vary_and_bad_colors_are_named():
    rng = np.random.default_rng(0)
    a, b = make_vniah.needle_frame("red", rng), make_vniah.needle_frame("red", rng)
    assert a.shape == (64, 64, 3) and a.dtype == np.uint8 and not np.array_equal(a, b)
    with pytest.raises(ValueError, match="needle color must be one of .* got 'gray'"):
        make_vniah.needle_frame("gray", rng)
    frames, labels = make_vniah.labelled_frames(3, seed=0)
    assert frames.shape == (21, 64, 64, 3) and labels.tolist() == [c for c in range(7) for _ in range(3)]
