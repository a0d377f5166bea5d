"""lwm/train/requeue.py without a cluster: what a job that stops before its time limit says when it
requeues itself, and which processes hold the stopping signals back."""

from __future__ import annotations

import os
import subprocess
import sys

from lwm.paths import REPO

ROOT = REPO


def test_the_requeue_is_said_before_slurm_ends_the_job(tmp_path):
    """SLURM ends a job's processes as it requeues it, and may do so before `scontrol requeue`
    returns; the message was printed after it returned, so a requeued job's log could lack it (seen
    in tests/integration/test_slurm.py's requeue test)."""
    scontrol = tmp_path / "bin" / "scontrol"
    scontrol.parent.mkdir()
    scontrol.write_text("#!/bin/sh\nkill -9 $PPID\nsleep 5\n")  # the requeue ends the job's process
    scontrol.chmod(0o755)
    env = {**os.environ, "PATH": f"{scontrol.parent}{os.pathsep}{os.environ['PATH']}"}
    code = "from lwm.train.requeue import _requeue; _requeue('7', 'runs/x')"
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == -9, proc.stderr[-2000:]
    assert "requeueing job 7; it resumes the run in runs/x" in proc.stdout


def test_processes_started_by_multiprocessing_hold_back_the_stopping_signals():
    """A process multiprocessing starts (the loaders' fork server and workers, the index's pool)
    imports train.py again as __mp_main__ and keeps SIGUSR1 and SIGTERM blocked: SLURM signals every
    process of the job, and a loader worker that died of SIGUSR1 ended the run (tests/integration/test_slurm.py's
    requeue test failed so when they were unblocked there). The index's workers take SIGTERM back
    (tests/integration/test_data_index.py)."""
    code = (
        "import runpy, signal\n"
        "runpy.run_path('train.py', run_name='__mp_main__')\n"
        "print(sorted(s.name for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "['SIGINT', 'SIGTERM', 'SIGUSR1']"
