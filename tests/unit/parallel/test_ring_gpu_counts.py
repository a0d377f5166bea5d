"""bench/ring_gpu_counts at a small shape, so that the counts docs/benchmarks.md reports for the ring's
GPU path cannot drift: one flash call forward and one backward per ring step whatever the documents,
no host sync, no copy of grouped K/V; the same aten calls per step for 50 and 204 documents."""

from __future__ import annotations

import pytest

from bench import ring_gpu_counts as bench
from lwm.model.documents import Documents

ONE_CALL = {"forward calls": 1.0, "backward calls": 1.0, "syncs": 0, "kv copy bytes": 0}


def _exact(counts: dict) -> dict:
    return {name: counts[name] for name in ONE_CALL}


def test_the_fake_ring_makes_one_call_per_step_no_sync_and_no_kv_copy():
    """cp 8 striped, 7b shapes under fake tensors, 8192 tokens: dense, and packed from 50 documents
    of 64-256 tokens; with 32 and 8 (grouped) kv heads."""
    S = 8192
    fifty, two_hundred = bench._documents(S, 64, 256), bench._documents(S, 16, 64)
    assert (int(fifty.max()), int(two_hundred.max())) == (50, 204)
    for hkv in (32, 8):
        for seg in (None, Documents(fifty, S // bench.N)):
            assert _exact(bench.ring_counts(S, hkv, seg)) == ONE_CALL, (hkv, seg)
    few, many = (bench.ring_counts(S, 8, Documents(ids, S // bench.N)) for ids in (fifty, two_hundred))
    assert _exact(many) == ONE_CALL and many["aten calls"] == few["aten calls"]  # constant in documents


def test_rank0_loops_on_the_cuda_standins_make_one_call_per_step():
    """Rank 0's ring_forward / ring_backward on real tensors through the CUDA kernels' CPU stand-ins,
    1024 tokens packed from 27 documents."""
    ids = bench._documents(1024, 16, 64)
    assert int(ids.max()) == 27
    assert _exact(bench.rank0_counts(1024, ids)) == ONE_CALL


def test_help_says_the_whole_first_paragraph(capsys):
    with pytest.raises(SystemExit):
        bench.main(["--help"])
    description = " ".join(capsys.readouterr().out.split("\n\n")[1].split())
    assert description == " ".join(bench.__doc__.split("\n\n")[0].split())
    assert description.endswith("and aten calls per training step.")
