"""Ctrl-C stops a run as SIGTERM does (lwm/train/requeue.py): the terminal's SIGINT reaches every
process of the run's group, its loader worker included; the stage saves at the step's end with the
default trainer.checkpoint_every=0, the run exits 4 with the resume hint, and a rerun resumes past
step 0. One process with one loader worker (a cp 2 run takes the same path on every rank: the
ranks agree at the step's end, tests/integration/test_slurm.py's SIGTERM runs show it)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time

from train_runs import DEBUG, ROOT, STOPPED, main_in_process

from lwm.disk.checkpoints import load_verified


def test_ctrl_c_saves_where_the_stage_is_and_the_rerun_resumes(tmp_path, monkeypatch, capsys):
    cmd = [sys.executable, "train.py", f"trainer.out_dir={tmp_path}", *DEBUG]
    cmd += ["stage_only=a", "schedule.stages.0.steps=1000", "data.num_workers=1"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    # a group of its own, as a terminal's foreground job: Ctrl-C signals every process in it
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )
    output: list[bytes] = []
    reader = threading.Thread(target=lambda: output.extend(iter(lambda: proc.stdout.read1(4096), b"")), daemon=True)
    reader.start()
    deadline = time.monotonic() + 300
    while not re.search(rb" [3-9]\d*/1000 ", b"".join(output)):  # a few steps done (the bar counts them)
        assert proc.poll() is None and time.monotonic() < deadline, b"".join(output).decode(errors="replace")[-3000:]
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGINT)
    code = proc.wait(timeout=120)
    reader.join(timeout=10)
    text = b"".join(output).decode(errors="replace")
    assert code == STOPPED, text[-3000:]
    match = re.search(r"SIGINT: the stage stops at step (\d+); its checkpoint is last.ckpt", text)
    assert match and "Traceback" not in text and "exited unexpectedly" not in text, text[-3000:]
    assert f"stopped on SIGINT: continue with trainer.out_dir={tmp_path} resume=true" in text, text[-3000:]
    step = int(match.group(1))
    last = tmp_path / "a" / "checkpoints" / "last.ckpt"
    assert step >= 3 and load_verified(last)["global_step"] == step
    assert not (tmp_path / "a" / "final.safetensors").exists()

    code, out, err = main_in_process(
        monkeypatch, capsys, tmp_path, "stage_only=a", "schedule.stages.0.steps=1000", "resume=true",
        f"stop_at_step={step + 1}",
    )  # fmt: skip
    assert code == STOPPED and f"(resuming from {last})" in out, (out + err)[-3000:]
    assert load_verified(last)["global_step"] == step + 1  # one step past where Ctrl-C stopped it
