"""Where the checkout keeps its files: the package is <repo>/lwm, and what the project makes or ships
(the sample corpus, demo data sets, the tiny VQGAN's weights) is under <repo>/data."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "data"
SAMPLE = DATA / "sample"
TINY_VQGAN = DATA / "checkpoints" / "vqgan_tiny.safetensors"
