"""bench/memory_features.py on CPU at a tiny length: every configuration runs for real beside its plan,
and the real step's device peak (offload's host buffers taken out) and host bytes equal the plan's."""

from __future__ import annotations

import bench.memory_features as bench


def test_each_configuration_measured_equals_its_plan():
    args = bench.parse(["--preset", "debug", "--lengths", "128", "--real-lengths", "128", "--chunk", "64"])
    args.features = ["checkpointing", "offload", "all"]
    rows = bench.run(args)
    assert [r["feature"] for r in rows] == args.features
    for r in rows:
        assert r["real_peak"] == r["plan_peak"] and r["real_host"] == r["plan_host"], r
    assert rows[0]["real_host"] == 0 and rows[1]["real_host"] == rows[2]["real_host"] > 0  # offload's buffers
    table = bench.section(args, rows)
    assert "| 128 | checkpointing + offload | " in table and "| 1.00x | " in table and "| 1.000 |" in table
