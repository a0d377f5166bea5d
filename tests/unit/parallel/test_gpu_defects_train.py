"""Issue 56's review of the CUDA training path, checked without a GPU: the attention of a training step
makes no blocking host-to-device copy (each waits for the GPU's queue to drain). Positions of a layout
are made on the device they index (the ring at cp 1, Ulysses' gathered positions); the varlen plan's
one table per batch is copied from pinned memory without blocking.

As if on a GPU: tests/comm_contract.py's HostTensors tags the tensors project code makes on the host;
a move of such a tensor to a device counts, unless it is asked non_blocking from pinned memory (the
pin stands in on CPU: a copy, remembered as pinned)."""

from __future__ import annotations

from collections import Counter

import comm_contract
import pytest
import torch
from comm_contract import HOST, MOVES, HostTensors, _names_device
from cuda_standins import installed
from document_refs import packings
from torch.utils.weak import WeakIdKeyDictionary

import lwm.parallel.ring_steps as ring_steps_module
from lwm.model import ModelConfig, Transformer
from lwm.model.documents import Documents
from lwm.parallel import apply_context_parallel, simulate_ring, ulysses_attention

PINNED = WeakIdKeyDictionary()


def _pin(t: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    out = t.clone()
    PINNED[out] = True
    return out


class Copies(HostTensors):
    """Host tensors moved to a device: 'blocking', or 'pinned' (non_blocking from pinned memory)."""

    def __init__(self, counts: Counter):
        super().__init__()
        self.counts = counts

    def __torch_function__(self, func, types, args=(), kwargs=None):
        first, kwargs = (args[0] if args else None), kwargs or {}
        if func in MOVES and first in HOST and (func is torch.Tensor.cuda or _names_device(args[1:], kwargs)):
            self.counts["pinned" if kwargs.get("non_blocking") and first in PINNED else "blocking"] += 1
        return super().__torch_function__(func, types, args, kwargs)


@pytest.fixture
def as_on_a_gpu(monkeypatch):
    monkeypatch.setattr(comm_contract, "PROJECT", ["lwm."])
    monkeypatch.setattr(torch.Tensor, "pin_memory", _pin)
    monkeypatch.setattr(ring_steps_module, "copies_pinned", lambda device: True, raising=False)
    with installed():
        yield


def _copies(fn) -> Counter:
    counts = Counter()
    with Copies(counts):
        fn()
    return counts


def _qkv(S=32, dtype=torch.bfloat16):
    torch.manual_seed(0)
    return [torch.randn(1, h, S, 16, dtype=dtype, requires_grad=True) for h in (4, 2, 2)]


@pytest.mark.parametrize("layout", ["contiguous", "striped", "zigzag"])
def test_attention_copies_no_positions_to_the_device(as_on_a_gpu, layout):
    """The ring over one process (what every cp 1 step runs) and Ulysses at one rank, forward and backward:
    no copy at all (before: one positions tensor a shard, a gather, every layer)."""

    def ring():
        out = simulate_ring(*_qkv(), 1, True, layout, backend="cuda_flash")
        out.sum().backward()

    def ulysses():
        out = ulysses_attention(*_qkv(), None, True, layout, backend="cuda_flash")
        out.sum().backward()

    assert _copies(ring) == Counter()
    assert _copies(ulysses) == Counter()


def test_a_training_step_with_documents_copies_only_the_pinned_table(as_on_a_gpu):
    """A bf16 model's loss and gradients at cp 1 with packed documents on the flash kernel (every GPU training
    run's step): one copy, the varlen plan's table, from pinned memory without blocking, for the whole step."""
    cfg = ModelConfig.from_preset("debug")
    tokens = torch.randint(0, cfg.vocab_size, (2, 65))
    seg = Documents(packings(2, 64, seed=2), 64)  # as the training loop hands them: read once, on the host
    torch.manual_seed(0)
    model = apply_context_parallel(Transformer(cfg).to(torch.bfloat16), backend="cuda_flash")

    def step():
        out = model(tokens[:, :-1], targets=tokens[:, 1:], loss_coeff=torch.full((2, 64), 1 / 128), segment_ids=seg)
        out.loss.backward()

    assert _copies(step) == Counter(pinned=1)
