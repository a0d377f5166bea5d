"""The sample data on first use (its needle sets by
lwm/synth/make_retrieval.py's run, its videos' codes by lwm-tokenize's run, each given its config)."""

from __future__ import annotations

from pathlib import Path

from filelock import FileLock

from lwm.core.config import DataSpec
from lwm.paths import SAMPLE
from lwm.synth import make_retrieval
from lwm.synth.make_sample import ensure_sample
from lwm.video import tokenize
from lwm.video.tokenize import TokenizeConfig

# The sample's needle sets (lwm.synth.make_retrieval): LWM's needle and question in the chat form, 1-digit
# numbers, the bundled text without its numbers, LWM's instruction left out (what a small model learns
# in minutes); name -> (shortest, longest whole prompt in tokens, training examples).
SAMPLE_NEEDLES = {"128": (90, 128, 6000), "512": (128, 512, 3000), "2k": (512, 2048, 1000)}


def ensure_sample_needles(root: Path = SAMPLE / "needles") -> None:
    """Make the sample's needle sets that are missing (root/<name>/train.jsonl, heldout.jsonl, haystack.txt)."""
    for name, (low, high, n) in SAMPLE_NEEDLES.items():
        if (root / name / "heldout.jsonl").is_file():
            continue
        chat = dict(form="chat", needles=1, ask=1, numberless=True, instruction=False)
        make_retrieval.run(make_retrieval.RetrievalConfig(**chat, lengths=[low, high], n=n, out=root / name))


def ensure_sample_data(data: DataSpec) -> None:
    """Make data/sample (videos, texts, needle sets) and tokenize its videos once (each skips what is
    already there). Runs started together wait for the one making them."""
    ensure_sample()
    with FileLock(SAMPLE / ".prepare.lock"):
        _needles_and_codes(data)


def _needles_and_codes(data: DataSpec) -> None:
    ensure_sample_needles()
    codes = Path(data.codes)
    if list(codes.glob("manifest*.jsonl")) and not (codes / "failures.jsonl").read_text().strip():
        return
    rate = {"fps": data.fps} if data.fps else {"max_frames": data.max_frames or 8}
    checkpoint = data.vqgan_checkpoint and Path(data.vqgan_checkpoint)
    if not (checkpoint and checkpoint.exists()):
        print(f"note: {data.vqgan_checkpoint} not found; the sample videos are tokenized by a random-weight VQGAN")
        checkpoint = None
    config = TokenizeConfig(
        inputs=[str(SAMPLE / "videos")], out=codes, vqgan="tiny", ids="stem", checkpoint=checkpoint, **rate
    )
    code = tokenize.run(config)
    if code:
        raise RuntimeError(f"tokenizing the sample videos into {codes} failed (lwm-tokenize's exit status {code})")
