import functools

import comm_contract
import pytest
import torch

import lwm.parallel.launch as launch

_run_distributed = launch.run_distributed


@functools.wraps(_run_distributed)
def _checked_run_distributed(fn, world_size: int, *args, **kwargs) -> list:
    """Every worker of the gloo tests runs fn under the NCCL communication contract (tests/comm_contract.py)."""
    body = functools.partial(comm_contract.checked, fn)
    body.__name__ = getattr(fn, "__name__", repr(fn))  # for run_distributed's timeout message
    return _run_distributed(body, world_size, *args, **kwargs)


# Replaced before the test modules are imported, so their `from lwm.parallel.launch import run_distributed` gets it
launch.run_distributed = _checked_run_distributed


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(scope="session")
def spm_model(tmp_path_factory):
    """A small sentencepiece model trained here on generated text (no downloads)."""
    import random

    import sentencepiece as spm

    rng = random.Random(0)
    words = "the a red green blue circle square moves left right up down frame video second appears".split()
    words += ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 8))) for _ in range(300)]
    folder = tmp_path_factory.mktemp("spm")
    corpus = folder / "corpus.txt"
    corpus.write_text("\n".join(" ".join(rng.choice(words) for _ in range(12)) for _ in range(1000)))
    spm.SentencePieceTrainer.train(
        input=str(corpus),
        model_prefix=str(folder / "sp"),
        vocab_size=256,
        model_type="bpe",
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=-1,
        minloglevel=2,
    )
    return folder / "sp.model"
