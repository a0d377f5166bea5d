"""bench/train.py: each configuration's step is measured with no earlier configuration's model alive (FSDP2 and
the offload hooks keep a model in reference cycles until the collector runs: on a GPU its memory was in the
next configuration's peak)."""

from __future__ import annotations

import weakref

import pytest
import torch.distributed as dist

import bench.train as bt
from lwm.plan.fake import start_fake_group


@pytest.fixture
def one_rank():
    start_fake_group(1)  # FSDP2 over one rank; its collectives do nothing
    yield
    dist.destroy_process_group()


def test_a_configuration_is_measured_without_the_previous_ones_model(one_rank, monkeypatch):
    built, alive = [], []
    build, sync = bt.build_parallel_model, bt.sync

    def recorded(*args, **kwargs):
        model = build(*args, **kwargs)
        built.append(weakref.ref(model))
        return model

    def counted(device):  # bench/train.py syncs before it resets the peak and times the steps
        alive.append(sum(ref() is not None for ref in built[:-1]))
        return sync(device)

    monkeypatch.setattr(bt, "build_parallel_model", recorded)
    monkeypatch.setattr(bt, "sync", counted)
    for memory in (None, bt.Memory(bt.FEATURES["offload"])):  # checkpointing, then with activation offload
        bt.layer_step("debug", 2, 128, 1, "cpu", memory)
    assert len(built) == 2 and alive == [0, 0, 0, 0]  # [0, 0, 1, 1] before: the first model lived on
