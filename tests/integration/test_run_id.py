"""Every process of a run agrees on one output folder, whoever launched it and however late it
starts: Lightning's re-launch (the environment is inherited), torchrun (the agent's store) and
SLURM (job and step ids)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest

from lwm.core import run_id
from lwm.paths import REPO

ROOT = REPO
PRINT_ID = "from lwm.core.run_id import run_id; print(run_id())"


@pytest.fixture
def clean_env(monkeypatch):
    for name in (run_id.ENV, "SLURM_JOB_ID", "SLURM_STEP_ID", "TORCHELASTIC_RUN_ID", "WORLD_SIZE", "RANK"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_a_process_started_later_with_the_environment_gets_the_same_name(clean_env):
    name = run_id.run_id()
    time.sleep(1.1)  # a name from the child's own clock would differ
    child = subprocess.run(
        [sys.executable, "-c", PRINT_ID], env=dict(os.environ), capture_output=True, text=True, check=True
    )
    assert child.stdout.strip() == name


def test_each_composed_config_of_one_process_gets_its_own_folder(clean_env):
    """A multirun composes one config per job in one process: the jobs must not share a folder,
    and a process started after a job's config was made inherits that job's name."""
    from omegaconf import OmegaConf

    run_id.register_resolver()
    names = [OmegaConf.create({"out": "runs/${run_id:}"}).out for _ in range(3)]
    assert len(set(names)) == 3, names
    child = subprocess.run(
        [sys.executable, "-c", PRINT_ID], env=dict(os.environ), capture_output=True, text=True, check=True
    )
    assert "runs/" + child.stdout.strip() == names[-1]


def test_slurm_job_and_step_name_the_run(clean_env):
    clean_env.setenv("SLURM_JOB_ID", "4242")
    clean_env.setenv("SLURM_STEP_ID", "3")
    assert run_id.run_id() == "slurm-4242.3"


def test_torchrun_ranks_agree_although_one_starts_late(clean_env, tmp_path):
    script = tmp_path / "ids.py"
    script.write_text(
        textwrap.dedent(f"""
        import os, time
        if os.environ["RANK"] == "1":
            time.sleep(1.5)
        from lwm.core.run_id import run_id
        open(os.path.join({str(tmp_path)!r}, "rank" + os.environ["RANK"]), "w").write(run_id())
    """)
    )
    subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script)],
        cwd=ROOT,
        check=True,
        capture_output=True,
        timeout=120,
    )
    names = [(tmp_path / f"rank{r}").read_text() for r in range(2)]
    assert names[0] == names[1] and names[0][:2] == "20", names
