"""train.py under a real SLURM: scripts/slurm/local-cluster.sh starts a one-machine cluster once per
test run (skipped, saying why, only where it cannot: not root, no package source), and docs/clusters.md's
sbatch line runs 2 tasks of the debug model with cp 2. Stopped at a random step by SIGUSR1 (what
SLURM sends before the time limit) or SIGTERM (a preemption, `scontrol requeue`), the job saves the
step it stopped at, is requeued (by itself on SIGUSR1) and resumes by itself from that save; then
killed without warning (SIGKILL to its processes) and requeued, it resumes from its last periodic
checkpoint. It ends with weights equal bit for bit to an uninterrupted run's (its two processes started as
torchrun starts them) and every step once in metrics.csv."""

from __future__ import annotations

import csv
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from readme_commands import readme_command
from safetensors.torch import load_file
from train_runs import DEBUG, ROOT, STOPPED, forked_train, losses

CLUSTER = ROOT / "scripts" / "slurm" / "local-cluster.sh"
STEPS = 30  # stage a: long enough to be stopped three times at random steps; stage b keeps its 4
SMALL = [*DEBUG, f"schedule.stages.0.steps={STEPS}", "data.num_workers=1"]  # a loader worker through requeues
DONE = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL"}


@pytest.fixture(scope="session")
def cluster():
    if subprocess.run(["bash", CLUSTER, "status"], capture_output=True).returncode == 0:
        yield  # started before the tests (.ci/run does): left running
        return
    proc = subprocess.run(["bash", CLUSTER, "start"], capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        if "needs root" in proc.stderr or "no package source" in proc.stderr or "no apt-get" in proc.stderr:
            pytest.skip(f"no local SLURM cluster: {proc.stderr.strip()}")
        raise AssertionError(f"{CLUSTER} start failed:\n{proc.stdout}\n{proc.stderr}")
    yield
    subprocess.run(["bash", CLUSTER, "stop"], check=True)


def submit(runs: Path, *overrides: str) -> tuple[str, Path]:
    """docs/clusters.md's sbatch line with the test's run folder, log and schedule; (job id, log)."""
    cmd = readme_command("sbatch scripts/slurm/train-cpu.sbatch")
    env = {
        **os.environ,
        "LWM_RUNS": str(runs),
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",  # srun-train.sh runs `python`
        "OMP_NUM_THREADS": "1",
        "PYTHONWARNINGS": "ignore",
    }
    log = runs / "slurm-%j.out"
    cmd = [cmd[0], "--parsable", f"--output={log}", *cmd[1:], *SMALL, *overrides]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    job = proc.stdout.strip()
    return job, runs / f"slurm-{job}.out"


def job_field(job: str, name: str) -> str:
    text = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True, check=True).stdout
    return re.search(rf"\b{name}=(\S+)", text).group(1)


def wait_done(job: str, log: Path, timeout: float = 240) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = job_field(job, "JobState")
        if state in DONE:
            return state
        time.sleep(0.5)
    subprocess.run(["scancel", job])
    raise AssertionError(f"job {job} still {state} after {timeout}s:\n{read(log)[-3000:]}")


def read(log: Path) -> str:
    return log.read_text(errors="replace").replace("\r", "\n") if log.exists() else ""


def bar_steps(text: str) -> list[int]:
    return [int(n) for n in re.findall(rf"^a:.*?\| *(\d+)/{STEPS} ", text, re.M)]


def checkpointed_steps(run: Path) -> int:
    """The steps of stage a in its metrics.csv, written at each checkpoint (every 5 steps). The log's bar
    is no clock: srun passes a task's output on by lines or 1 KB pieces, and a bar line has no newline,
    so the log shows the bar at about step 13, then at the stage's end."""
    try:
        rows = list(csv.DictReader(open(run / "a" / "logs" / "metrics.csv")))
        return 1 + max(int(r["step"]) for r in rows if r.get("train/loss"))
    except (OSError, ValueError, KeyError, TypeError):  # not written yet, or being written
        return 0


def wait_for_checkpoint(
    job: str, log: Path, run: Path, step: int, timeout: float = 120, restarts: int | None = None
) -> None:
    """Until stage a writes its checkpoint of `step`, then a random moment (a few steps at most).
    restarts: first until the job runs its restart of that number, then until that run has trained a
    step of its own (a signal sent before would find the job pending, or the stage not yet started:
    an earlier stop can come after `step` when the steps are fast)."""
    deadline = time.monotonic() + timeout
    base = 0
    if restarts is not None:
        while job_field(job, "Restarts") != str(restarts) or job_field(job, "JobState") != "RUNNING":
            assert time.monotonic() < deadline and job_field(job, "JobState") not in DONE, read(log)[-3000:]
            time.sleep(0.05)
        base = checkpointed_steps(run) + 1 if restarts else 0
    while checkpointed_steps(run) < max(step, base):
        assert time.monotonic() < deadline and job_field(job, "JobState") not in DONE, read(log)[-3000:]
        time.sleep(0.05)
    time.sleep(random.uniform(0, 0.3))


def final_weights(run: Path) -> dict[str, dict[str, torch.Tensor]]:
    return {stage: load_file(run / stage / "final.safetensors") for stage in ("a", "b")}


def check_same_run(run: Path, reference: Path) -> None:
    """Weights bit for bit as the uninterrupted run's, every step's metrics row once."""
    got, want = final_weights(run), final_weights(reference)
    for stage in want:
        assert got[stage].keys() == want[stage].keys()
        unequal = [k for k in want[stage] if not torch.equal(got[stage][k], want[stage][k])]
        assert not unequal, f"stage {stage}: {unequal} differ from the uninterrupted run's"
    for stage, steps in (("a", STEPS), ("b", 4)):
        assert sorted(losses(run, stage)) == list(range(steps)), stage
        assert losses(run, stage) == losses(reference, stage), stage


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """The job's config uninterrupted, its two ranks started as torchrun starts them (forked from a server
    that imported train.py's modules: tests/train_runs.py), not through SLURM."""
    out = tmp_path_factory.mktemp("slurm-reference")
    two = ("trainer.devices=2", "+schedule.stages.0.cp=2", "+schedule.stages.1.cp=2", "trainer.checkpoint_every=5")
    forked_train(out, *SMALL[len(DEBUG) :], *two, ranks=2)
    return out


# (signal, the checkpoint step after which it comes, the command that sends it)
STOPS = [("SIGUSR1", 5, "scancel --signal=USR1"), ("SIGTERM", 10, "scontrol requeue")]


def kill_tasks(job: str) -> None:
    """SIGKILL to the job's tasks (step 0), not the batch script: a machine lost without warning."""
    pids = subprocess.run(["scontrol", "listpids", job], capture_output=True, text=True, check=True).stdout
    for row in pids.splitlines()[1:]:  # PID JOBID STEPID ...
        if row.split()[2] == "0":
            os.kill(int(row.split()[0]), signal.SIGKILL)


def test_requeued_at_random_steps_and_killed_resumes_by_itself(cluster, reference, tmp_path):
    """One job stopped three times. SIGUSR1, what SLURM sends before the time limit (the job requeues
    itself), then SIGTERM, what a preemption or `scontrol requeue` sends (SLURM requeues the job), each at
    a random step after a periodic checkpoint: each time it goes on from the step it stopped at. Then its
    tasks killed without warning (SIGKILL) at a random step after a periodic checkpoint of its own, and
    the job requeued: it goes on from its last periodic checkpoint. srun's two tasks (Lightning's SLURM
    environment) end where two processes started as torchrun starts them end, stopped or not: the same
    weights bit for bit, every step's loss the same."""
    job, log = submit(tmp_path)
    run = tmp_path / f"slurm-{job}"
    try:
        for restarts, (_, step, command) in enumerate(STOPS):
            wait_for_checkpoint(job, log, run, step, restarts=restarts)
            subprocess.run([a.replace("<job>", job) for a in readme_command(command)], check=True)
        # the checkpoint of step 20 (or a later one) begun, so that of 15 whole: killed at a random step after it
        wait_for_checkpoint(job, log, run, 20, restarts=len(STOPS))
        kill_tasks(job)
        assert wait_done(job, log) in {"FAILED", "CANCELLED"}, read(log)[-3000:]
        subprocess.run([a.replace("<job>", job) for a in readme_command("scontrol requeue")], check=True)
        state = wait_done(job, log)
    finally:
        subprocess.run(["scancel", job])
    text = read(log)
    assert state == "COMPLETED" and job_field(job, "Restarts") == str(len(STOPS) + 1), text[-3000:]
    assert f"requeueing job {job}" in text and "stopped on SIGTERM" in text, text[-3000:]
    runs = re.split(r"started again \(restart \d+\)", text)
    assert len(runs) == len(STOPS) + 2, text[-3000:]
    for (signal_name, step, _), before, after in zip(STOPS, runs, runs[1:]):
        stop = re.search(rf"{signal_name}: the stage stops at step (\d+); its checkpoint is last.ckpt", before)
        assert stop, (signal_name, text[-3000:])
        stopped_at, resumed_at = int(stop.group(1)), bar_steps(after)[0]  # the resumed bar starts at its checkpoint
        # the signal's own save, not the periodic checkpoint before it (every 5 steps), is where the job goes on
        assert step <= stopped_at == resumed_at < STEPS, (signal_name, step, stopped_at, resumed_at, text[-3000:])
    # killed: no save of its own, so its last whole periodic checkpoint (every 5 steps)
    resumed_at = bar_steps(runs[-1])[0]
    assert resumed_at % 5 == 0 and 15 <= resumed_at < STEPS, (resumed_at, text[-3000:])
    assert [p.name for p in tmp_path.iterdir() if p.is_dir()] == [run.name]  # one folder for every run
    check_same_run(run, reference)


def test_a_signal_while_starting_stops_the_run_after_its_first_step(tmp_path):
    """SLURM checks time limits once a minute, so its warning can come while train.py is still importing
    (seconds): held back until it is handled, it stops the stage after one step, with a checkpoint."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    cmd = [sys.executable, "train.py", f"trainer.out_dir={tmp_path}", *DEBUG, "stage_only=a"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    time.sleep(1.0)  # inside the imports (torch and Lightning take longer)
    proc.send_signal(signal.SIGUSR1)
    out = proc.communicate(timeout=300)[0]
    assert proc.returncode == STOPPED and "stopped on SIGUSR1" in out, out[-3000:]
    assert sorted(losses(tmp_path)) == [0] and (tmp_path / "a" / "checkpoints" / "last.ckpt").is_file()


@pytest.mark.parametrize(
    "restarts,folder,resume,expected",
    [
        (None, True, False, False),  # a fresh job (or run) in an existing folder starts anew unless told
        ("0", True, False, False),
        ("1", True, False, True),  # SLURM started the job again: its run goes on
        ("1", False, False, False),  # requeued before it made its folder: nothing to resume
        (None, True, True, True),
    ],
)
def test_only_a_restarted_job_resumes_by_itself(tmp_path, monkeypatch, restarts, folder, resume, expected):
    from lwm.train.checkpointing import resumes

    monkeypatch.delenv("SLURM_RESTART_COUNT", raising=False)
    if restarts is not None:
        monkeypatch.setenv("SLURM_RESTART_COUNT", restarts)
    out = tmp_path / "run"
    if folder:
        out.mkdir()
    assert resumes(resume, out) is expected


def test_status_refuses_a_drained_node_naming_why(tmp_path):
    """SLURM drains a node by itself (a full spool disk) and keeps it so after the cause is gone: every
    job stays PENDING. status then fails, with SLURM's reason, so that .ci/run (and the fixture above)
    calls start, which resumes the node. Run against stand-ins of sinfo and the daemons' pid files."""
    bin_dir, state = tmp_path / "bin", tmp_path / "state"
    bin_dir.mkdir()
    state.mkdir()
    sinfo = bin_dir / "sinfo"
    sinfo.write_text(
        '#!/bin/sh\ncase "$*" in *%T*) echo drained ;; *%E*) echo "SlurmdSpoolDir is full" ;; *%N*) echo vm ;; '
        "*) echo 'cpu* up infinite 1 drain vm' ;; esac\n"
    )
    sinfo.chmod(0o755)
    for daemon in ("slurmctld", "slurmd"):
        (state / f"{daemon}.pid").write_text(str(os.getpid()))  # a live process stands for each daemon
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "LWM_SLURM_STATE": str(state)}
    done = subprocess.run(["bash", CLUSTER, "status"], env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "the node is drained (SlurmdSpoolDir is full); start resumes it" in done.stderr
    sinfo.write_text("#!/bin/sh\ncase \"$*\" in *%T*) echo idle ;; *) echo 'cpu* up infinite 1 idle vm' ;; esac\n")
    assert subprocess.run(["bash", CLUSTER, "status"], env=env, capture_output=True).returncode == 0


def test_logs_shows_both_daemons_last_lines(tmp_path):
    """What start prints when the node never becomes idle: each daemon's last lines, under its name."""
    for daemon in ("slurmctld", "slurmd"):
        (tmp_path / f"{daemon}.log").write_text("".join(f"{daemon} line {i}\n" for i in range(9)))
    env = {**os.environ, "LWM_SLURM_STATE": str(tmp_path)}
    done = subprocess.run(["bash", CLUSTER, "logs"], env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    for daemon in ("slurmctld", "slurmd"):
        assert f"==> {tmp_path / daemon}.log <==" in done.stdout, done.stdout
        assert f"{daemon} line 8" in done.stdout and f"{daemon} line 3\n" not in done.stdout, done.stdout
