"""The sample corpus end to end: generate it, tokenize its videos, read packed batches."""

import subprocess
import sys

import pytest
import torch

from lwm.data import DataConfig, Source, Vocab
from lwm.model import ModelConfig
from lwm.paths import REPO
from lwm.synth import make_sample
from lwm.train.datamodule import LWMDataModule

ROOT = REPO
from deps import skip_module_without_decord  # noqa: E402

skip_module_without_decord()
import av  # noqa: E402, F401
import decord  # noqa: E402, F401


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    out = tmp_path_factory.mktemp("sample")
    make_sample.main(["--out", str(out), "--n-videos", "4"])
    codes = out / "codes"
    cmd = [
        sys.executable,
        "-m",
        "lwm.video.tokenize",
        str(out / "videos"),
        "--out",
        str(codes),
        "--vqgan",
        "tiny",
        "--ids",
        "stem",
        "--max-frames",
        "4",
    ]
    subprocess.run(cmd, check=True, capture_output=True, cwd=ROOT)
    return out


def test_sample_corpus_to_packed_batches(sample):
    sources = [
        Source(str(sample / "qa.jsonl")),
        Source(str(sample / "captions.jsonl")),
        Source(str(sample / "text.jsonl"), overflow="window"),
    ]
    cfg = DataConfig(
        sources=sources,
        tokenizer=str(sample / "tokenizer.model"),
        codes=str(sample / "codes"),
        batch_size=2,
        strict=True,
    )  # strict: any bad example fails the test
    dm = LWMDataModule(cfg, seq_len=2048)
    vocab = Vocab(4096)
    assert dm.vocab == vocab and vocab.size == ModelConfig.from_preset("tiny").vocab_size
    it = iter(dm.train_dataloader())
    batches = [dm.on_before_batch_transfer(next(it)) for _ in range(6)]
    tokens = torch.cat([b["tokens"] for b in batches])
    assert tokens.min() >= 0 and tokens.max() < vocab.size
    assert (tokens == vocab.vision_start).any() and (tokens == vocab.eov).any()
    assert sum(int(b["vision_mask"].sum()) for b in batches) > 0  # text-to-video captions train codes
    assert all(b["loss_weight"].sum() > 0 for b in batches)
