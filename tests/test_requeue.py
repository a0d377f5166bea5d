"""lwm/train/requeue.py without a cluster: what a job that stops before its time limit says when it
requeues itself."""

from __future__ import annotations

import os
import subprocess
import sys


def test_the_requeue_is_said_before_slurm_ends_the_job(tmp_path):
    """SLURM ends a job's processes as it requeues it, and may do so before `scontrol requeue`
    returns; the message was printed after it returned, so a requeued job's log could lack it (seen
    in tests/test_slurm.py's requeue test)."""
    scontrol = tmp_path / "bin" / "scontrol"
    scontrol.parent.mkdir()
    scontrol.write_text("#!/bin/sh\nkill -9 $PPID\nsleep 5\n")  # the requeue ends the job's process
    scontrol.chmod(0o755)
    env = {**os.environ, "PATH": f"{scontrol.parent}{os.pathsep}{os.environ['PATH']}"}
    code = "from lwm.train.requeue import _requeue; _requeue('7', 'runs/x')"
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == -9, proc.stderr[-2000:]
    assert "requeueing job 7; it resumes the run in runs/x" in proc.stdout
