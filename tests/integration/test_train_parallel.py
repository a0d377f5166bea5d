"""train.py in several processes: context parallelism (hybrid), tensor parallelism with its export and
resume (their ranks forked as a launcher starts them, under the NCCL contract), and, as users launch it
(Lightning re-launches its command per rank), the default run folder shared by Lightning's ranks and a rank
that dies."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from train_runs import DEBUG, ROOT, STOPPED, forked_train, losses

from lwm.interop.hf import from_hf


# Every layout and N is exact at the attention level (tests/integration/test_parallel_dist.py), and every mode and
# tp x cp x dp mesh at the training-step level (tests/integration/test_tensor_parallel.py), so train.py needs one run of
# each size: cp 4 as hybrid (Ulysses 2 inside, a ring of 2 across, zigzag) here, cp 2 (striped) with tp 2
# below, their ranks forked (tests/train_runs.py). How the ranks are started is tested apart: Lightning's
# own processes in the dead-rank tests below, torchrun in tests/integration/test_multinode.py, srun in tests/integration/test_slurm.py.
def test_context_parallel_losses_equal_one_process(tmp_path, reference):
    """Hybrid cp 4 gives one process's losses, and the checkpoint holds every rank's random state."""
    proc = forked_train(
        tmp_path,
        "stage_only=a",
        "trainer.devices=4",
        "+schedule.stages.0.cp=4",
        "parallel.layout=zigzag",
        "trainer.keep_checkpoints=true",
        "parallel.mode=hybrid",
        "parallel.ulysses=2",
        ranks=4,
    )
    assert "cp 4 (hybrid: ulysses 2 x ring 2), dp 1" in proc.stdout, proc.stdout[-2000:]
    assert (tmp_path / "a" / "final.safetensors").exists()
    got = losses(tmp_path)
    assert sorted(got) == sorted(reference) and len(got) == 10
    meta = torch.load(tmp_path / "a" / "checkpoints" / "last.ckpt" / "meta.pt", weights_only=True)
    assert set(meta["rng_states"]) == {str(r) for r in range(4)}  # every rank's random state
    for step, loss in reference.items():
        assert got[step] == pytest.approx(loss, rel=1e-5), (step, got[step], loss)


def test_tensor_parallel_runs_exports_and_resumes(tmp_path, reference):
    """tp 2 x cp 2 (4 processes) gives one process's losses; its Hugging Face export holds the run's
    final weights; stopped at step 5, its sharded checkpoint has every rank's shard in SHA256SUMS
    (tests/integration/test_checkpoints.py refuses a flipped byte in one) and resumes to the same weights bit for
    bit, with parameter offload on; and it resumes onto another mesh, resharded: tp 1 x dp 2 at the same
    global batch."""
    args = ["stage_only=a", "trainer.devices=4", "parallel.tp=2"]
    whole, split, other = tmp_path / "whole", tmp_path / "split", tmp_path / "other"
    proc = forked_train(whole, *args, "+schedule.stages.0.cp=2", "export=true", ranks=4)
    assert "cp 2 (ring), tp 2, dp 1" in proc.stdout, proc.stdout[-2000:]
    got = losses(whole)
    assert sorted(got) == list(range(10))
    for step, loss in reference.items():
        assert got[step] == pytest.approx(loss, rel=1e-5), (step, got[step], loss)
    final = load_file(whole / "a" / "final.safetensors")
    exported = from_hf(whole / "hf").state_dict()
    assert set(exported) == set(final) and all(torch.equal(exported[k], v) for k, v in final.items())

    forked_train(split, *args, "+schedule.stages.0.cp=2", "stop_at_step=5", expect=STOPPED, ranks=4)
    shutil.copytree(split, other)
    last = split / "a" / "checkpoints" / "last.ckpt"
    names = {line.split()[1] for line in (last / "SHA256SUMS").read_text().splitlines()}
    assert {f"__{rank}_0.distcp" for rank in range(4)} | {".metadata", "meta.pt"} <= names
    assert not list(last.parent.glob(".last.ckpt.*"))  # no staging folder left
    # resumed with the parameters, gradients and AdamW's state in host memory (parallel.param_offload)
    forked_train(split, *args, "+schedule.stages.0.cp=2", "resume=true", "parallel.param_offload=true", ranks=4)
    assert sorted(losses(split)) == list(range(10))  # the rows before the stop kept
    resumed = load_file(split / "a" / "final.safetensors")
    assert all(torch.equal(resumed[k], v) for k, v in final.items())

    # 2 sequences per step as before: one per dp rank instead of two on the one, every layer whole
    forked_train(
        other, "stage_only=a", "trainer.devices=2", "+schedule.stages.0.global_batch=2", "resume=true", ranks=2
    )
    got = losses(other)
    assert sorted(got) == list(range(10))
    for step in range(5, 10):
        assert got[step] == pytest.approx(reference[step], rel=1e-5), step


@pytest.mark.parametrize("how", ["killed", "frozen"])
def test_a_dead_rank_stops_the_others(tmp_path, how):
    """Kill (SIGKILL) or freeze (SIGSTOP) rank 1 of a 2-process run mid-training: rank 0 must exit
    with an error naming rank 1, not hang, within trainer.timeout_s (plus tear-down time). The run is
    Lightning's own two processes (rank 1 re-launched by rank 0) in the default folder form
    (${run_id:}): both resolve it to one folder, where each writes its checkpoint shards every step."""
    import signal
    import time

    # Frozen, rank 0 waits the timeout out: short, though the first collectives wait for the slower rank's
    # start-up (2 cores, 3 test workers). Killed, it is told at once: the timeout only bounds that start-up.
    timeout_s = 16 if how == "frozen" else 60
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore", "LWM_TEST_RUN": str(tmp_path)}
    cmd = [
        sys.executable,
        "train.py",
        f"trainer.out_dir={tmp_path / 'runs' / '${run_id:}'}",
        *DEBUG,
        "stage_only=a",
        "trainer.devices=2",
        "+schedule.stages.0.cp=2",
        "schedule.stages.0.steps=100000",
        "trainer.checkpoint_every=1",
        # a dead rank's loader workers end with it (those of a frozen rank end when it is killed, as its own do)
        f"data.num_workers={2 if how == 'killed' else 0}",
        f"trainer.timeout_s={timeout_s}",
    ]
    log = tmp_path / "log.txt"  # a file, not a pipe: a frozen rank would hold a pipe open
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT)
    try:
        children: list[int] = []
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not (children and "train/loss=" in log.read_text()):  # in the loop
            time.sleep(0.5)
            assert proc.poll() is None, log.read_text()[-3000:]
            children = [  # rank 1, not rank 0's loader fork server (the same environment, but LOCAL_RANK)
                int(p)
                for p in subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
                if b"LOCAL_RANK=1\0" in _environ(int(p))
            ]
        assert children, "rank 1 never started"
        time.sleep(1)  # inside the training loop
        os.kill(children[0], signal.SIGKILL if how == "killed" else signal.SIGSTOP)
        killed = time.monotonic()
        proc.wait(timeout=timeout_s + 120)
        waited = time.monotonic() - killed
        out = log.read_text()
    finally:
        for pid in children:
            subprocess.run(["kill", "-9", str(pid)], capture_output=True)
        if proc.poll() is None:
            proc.kill()
    print(f"rank 0 exited {proc.returncode} {waited:.1f} s after rank 1 was killed")
    # nothing of the run is left: the ranks' loader workers and their fork servers end with their rank
    tag = f"LWM_TEST_RUN={tmp_path}\0".encode()
    left = time.monotonic() + 20
    while (
        rest := [p for p in os.listdir("/proc") if p.isdigit() and tag in _environ(int(p))]
    ) and time.monotonic() < left:
        time.sleep(0.5)
    assert not rest, [Path(f"/proc/{p}/cmdline").read_bytes()[:120] for p in rest if Path(f"/proc/{p}").exists()]
    assert proc.returncode != 0, out[-3000:]
    assert waited < (timeout_s + 60 if how == "frozen" else 30), (waited, out[-3000:])
    (run,) = (tmp_path / "runs").iterdir()  # one folder: rank 1 resolved the name rank 0 did
    assert list((run / "a" / "checkpoints").iterdir()), "no checkpoint was written before the kill"
    # the survivor names the rank it lost, not just the backend's error
    what = "has died" if how == "killed" else "is stopped (SIGSTOP)"
    assert f"error: rank 0 lost another rank: rank 1 (pid {children[0]} on" in out and what in out, out[-3000:]


def _environ(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:  # gone already
        return b""
