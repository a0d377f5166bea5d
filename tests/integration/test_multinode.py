"""Multi-node launch through torchrun: two agents with one process each meet at a c10d rendezvous on
localhost, as two nodes would, and run docs/clusters.md's command; they agree on node ranks, world size
and one run folder, read the data shards of their own dp rank, and log the same losses as a
one-node run of world size 2 (rtol 1e-6; its two ranks forked as tests/train_runs.py starts them: a
one-node torchrun is tests/integration/test_train_parallel.py's)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest
import torch
from readme_commands import readme_command
from train_runs import DEBUG, ROOT, forked_train, losses

TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def two_node_command(out: str) -> list[str]:
    """docs/clusters.md's line, on a free port, with the test's folder and small run."""
    cmd = readme_command("torchrun --nnodes 2")
    cmd = [a.replace("localhost:29400", f"localhost:{free_port()}") for a in cmd]
    assert cmd[0] == "torchrun" and cmd[cmd.index("--nproc-per-node") + 1] == "1", cmd
    return TORCHRUN + cmd[1:] + [f"trainer.out_dir={out}", *DEBUG, "stage_only=a", "trainer.keep_checkpoints=true"]


def test_two_torchrun_agents_equal_one_node(tmp_path):
    one = tmp_path / "one"
    forked_train(one, "stage_only=a", "trainer.devices=2", ranks=2)
    # ${run_id:}: the folder is named by rank 0 and shared through the agents' store
    cmd = two_node_command(str(tmp_path / "two" / "${run_id:}"))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    agents = [
        subprocess.Popen(cmd, cwd=ROOT, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        for _ in range(2)
    ]
    outputs = [agent.communicate(timeout=300)[0] for agent in agents]
    assert [a.returncode for a in agents] == [0, 0], "\n".join(o[-3000:] for o in outputs)
    # one agent is node 0 (it prints; the other's rank is 1 on node 1), and one folder holds the run
    assert sorted("finished in" in o for o in outputs) == [False, True], outputs
    (run,) = (tmp_path / "two").iterdir()
    meta = torch.load(run / "a" / "checkpoints" / "last.ckpt" / "meta.pt", weights_only=False)
    assert set(meta["rng_states"]) == {"0", "1"}  # both ranks' random states: world size 2
    got, want = losses(run), losses(one)
    assert sorted(got) == sorted(want) == list(range(10))
    for step, loss in want.items():  # dp 2: a node reading the other's shard would change every loss
        assert got[step] == pytest.approx(loss, rel=1e-6, abs=0), step
