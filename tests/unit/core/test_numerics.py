"""lwm/core/numerics.py: denormal floats flushed to zero on the CPU (trainer.flush_denormal), and what it is for:
arithmetic on them is many times slower there."""

from __future__ import annotations

import time

import pytest
import torch

from lwm.core.numerics import flush_denormals

TINY = 1e-40  # below fp32's smallest normal number, 1.18e-38


@pytest.fixture
def restore():
    threads = torch.get_num_threads()
    yield
    torch.set_flush_denormal(False)  # the process's default
    torch.set_num_threads(threads)


def _flushed() -> bool:
    return (torch.tensor([TINY]) * 1.0).item() == 0.0


def test_flushing_computes_denormals_as_zero_and_can_be_turned_off(restore):
    if not flush_denormals(True):
        pytest.skip("this CPU cannot flush denormal floats (torch.set_flush_denormal returns False)")
    assert _flushed()
    assert flush_denormals(False) is False and not _flushed()
    assert (torch.tensor([TINY]) * 1.0).item() == pytest.approx(TINY, rel=1e-3)


def test_a_matmul_on_denormals_is_faster_flushed(restore):
    """The reason for the setting: a product whose inputs are denormal (as a fitted model's gradients become). One
    thread: the mode is each thread's, and this process's worker threads started before it was set."""
    torch.set_num_threads(1)
    flush_denormals(False)
    a, b = torch.full((256, 256), TINY), torch.randn(256, 256)  # made with them kept: flushed, a would be zeros
    if not flush_denormals(True):
        pytest.skip("this CPU cannot flush denormal floats")

    def best(on: bool, x: torch.Tensor) -> float:
        flush_denormals(on)
        times = []
        for _ in range(5):
            start = time.perf_counter()
            x @ b
            times.append(time.perf_counter() - start)
        return min(times)

    normal = best(False, torch.ones(256, 256))
    kept, flushed = best(False, a), best(True, a)
    if kept < 4 * normal:  # AMD's Zen cores: 0.4 ms either way
        pytest.skip(f"this CPU computes on denormals at full speed ({kept * 1e3:.2f} ms, normal {normal * 1e3:.2f} ms)")
    assert flushed < kept / 2, (kept, flushed)  # 44 ms and 0.35 ms: docs/benchmarks.md's machine
