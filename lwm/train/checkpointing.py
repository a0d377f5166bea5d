"""A stage's checkpoints from saving to resuming, in one place (lwm.disk.checkpoints does the files and
their checksums; lwm.disk.stage_folder says where they are):

- when: StageCheckpoint writes checkpoints/last.ckpt every trainer.checkpoint_every steps and at the
  step a stage stops before its end;
- how: AtomicCheckpointIO for single-file checkpoints, and a ModelParallelStrategy whose sharded
  checkpoints are swapped in whole, checksummed per rank and verified before anything in them is
  unpickled;
- after a kill: `recover` puts back a sharded checkpoint caught between its two renames;
- what a run resumes from: `resumes` (told to, or a SLURM job started again) and `resume_point`.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

import torch
import torch.distributed as dist
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.strategies import ModelParallelStrategy
from torch.distributed.checkpoint.api import CheckpointException

from lwm.disk.checkpoints import (
    CheckpointError,
    check_sharded,
    checksum_path,
    load_verified,
    read_sums,
    save_verified,
    sha256,
    write_sums,
)
from lwm.disk.stage_folder import StageFolder
from lwm.disk.writes import NoSpaceLeft
from lwm.ranks import say
from lwm.train.launcher import NamingLauncher
from lwm.train.requeue import slurm_job


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's checkpoint IO for single-file checkpoints, written and read as above."""

    def save_checkpoint(self, checkpoint, path, storage_options=None) -> None:
        save_verified(checkpoint, Path(path))

    def load_checkpoint(self, path, map_location=None, weights_only=None) -> dict:
        return load_verified(Path(path), map_location or "cpu")

    def remove_checkpoint(self, path) -> None:
        super().remove_checkpoint(path)
        checksum_path(Path(path)).unlink(missing_ok=True)


SUMS = "SHA256SUMS"


def _staging(path: Path) -> tuple[Path, Path]:
    """(the folder a new sharded checkpoint is written to, where the previous one waits meanwhile)."""
    return path.with_name(f".{path.name}.tmp"), path.with_name(f".{path.name}.old")


def recover(path: Path) -> None:
    """Put back a sharded checkpoint that a kill caught between its two renames."""
    _, old = _staging(Path(path))
    if not Path(path).exists() and old.is_dir():
        try:
            os.replace(old, path)
        except FileNotFoundError:  # another rank of the run put it back first
            pass


def _written_by(name: str, rank: int) -> bool:
    """Whether `rank` wrote (and so hashes and verifies) this file of a sharded checkpoint: the
    `__<rank>_<i>.distcp` shards are each rank's own, the metadata files rank 0's."""
    if name.startswith("__") and name.endswith(".distcp"):
        return name[2:].split("_")[0] == str(rank)
    return rank == 0


def space_failure(e: CheckpointException, folder: Path) -> OSError | None:
    """An out-of-space error (ENOSPC, EDQUOT) among a sharded save's failures, if any. torch.save's zip
    writer turns a write's OSError into RuntimeError("unexpected pos"), so such a failure on a
    filesystem left all but full (under 1% of it or 1 GiB free) counts as one too."""
    failures = [failure for failure, _ in e.failures.values()]
    for failure in failures:
        if isinstance(failure, OSError) and failure.errno in (errno.ENOSPC, errno.EDQUOT):
            return failure
    fs = os.statvfs(folder)
    full = fs.f_bavail * fs.f_frsize < min(fs.f_blocks * fs.f_frsize // 100, 2**30)
    if full and any("unexpected pos" in str(failure) for failure in failures):
        return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    return None


class AtomicModelParallelStrategy(ModelParallelStrategy):
    """Lightning's ModelParallelStrategy, with sharded checkpoints written to a staging folder beside
    the target and swapped in by renames once every rank has written its part (a kill leaves the old
    checkpoint or the new one, never a mix), a SHA256SUMS inside (each rank hashes its own shards), and
    loads that verify the sums and refuse code before torch.distributed.checkpoint unpickles anything.

    params_on_host: the model's parameter shards live in host memory (parallel.param_offload, FSDP2's
    CPUOffloadPolicy); Lightning's setup would move every parameter to the GPU, so it is left where
    it is."""

    def __init__(self, *args, params_on_host: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.params_on_host = params_on_host

    def model_to_device(self) -> None:
        if not self.params_on_host:
            super().model_to_device()

    def _configure_launcher(self) -> None:
        if not self.cluster_environment.creates_processes_externally:  # ranks Lightning starts: watched by ours
            self._launcher = NamingLauncher(self.cluster_environment, self.num_processes, self.num_nodes)

    def save_checkpoint(self, checkpoint, filepath, storage_options=None) -> None:
        path = Path(self.broadcast(str(filepath)))
        tmp, old = _staging(path)
        if self.global_rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)  # a killed save's leftover
        self.barrier()
        try:
            super().save_checkpoint(checkpoint, tmp, storage_options)
        except CheckpointException as e:  # every rank raises it, with every rank's failure
            full = space_failure(e, path.parent)
            if full is None:
                raise
            if self.global_rank == 0:
                shutil.rmtree(tmp, ignore_errors=True)  # the part written: space the run may need next
            raise NoSpaceLeft(path, full) from e
        self.barrier()
        mine = {f.name: sha256(f) for f in sorted(tmp.iterdir()) if _written_by(f.name, self.global_rank)}
        sums: list[dict | None] = [None] * self.world_size
        dist.all_gather_object(sums, mine)  # between this run's own ranks
        if self.global_rank == 0:
            write_sums({k: v for part in sums for k, v in part.items()}, tmp / SUMS)
            if path.exists():
                os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        self.barrier()

    def load_checkpoint(self, checkpoint_path, weights_only=None) -> dict:
        path = Path(self.broadcast(str(checkpoint_path)))
        check_sharded(path)
        sums = read_sums(path / SUMS) if (path / SUMS).is_file() else {}
        bad = [n for n, d in sums.items() if _written_by(n, self.global_rank) and sha256(path / n) != d]
        failed = torch.tensor([len(bad)], device=self.root_device)
        dist.all_reduce(failed)  # every rank refuses, or none
        if failed.item():
            raise CheckpointError(
                f"{path}: {bad or 'files of other ranks'} do not match {path / SUMS}: the checkpoint is corrupted "
                "or was cut short; resume from another checkpoint or delete it to start the stage again"
            )
        return super().load_checkpoint(path, weights_only=True)


class StageCheckpoint(ModelCheckpoint):
    """checkpoints/last.ckpt only: every `every` steps (0: never on a schedule) and at the step a
    stage stops before its last (stop_at_step, a stopping signal); at the end of a finished stage
    only when it is to be kept (its final.safetensors holds the weights anyway)."""

    def __init__(self, dirpath, every: int, steps: int, keep: bool):
        super().__init__(
            dirpath=dirpath,
            every_n_train_steps=every or None,
            save_last=True,
            save_top_k=0,
            monitor=None,
            enable_version_counter=False,
        )
        self.steps, self.keep = steps, keep
        self.saved_step: int | None = None  # the step of the last checkpoint written in this process

    @property
    def last_path(self) -> Path:
        return Path(self.dirpath) / f"{self.CHECKPOINT_NAME_LAST}{self.FILE_EXTENSION}"

    def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        self.saved_step = trainer.global_step

    def on_train_end(self, trainer, pl_module) -> None:
        """Written here, not by ModelCheckpoint.on_train_end, which writes last.ckpt only when the
        callback wrote none before in the process: after a periodic checkpoint a stopped stage
        would resume from that one. Not twice for one step (a stop right after a periodic save)."""
        stopped_early = trainer.global_step < self.steps
        if (stopped_early or self.keep) and self.saved_step != trainer.global_step:
            trainer.save_checkpoint(self.last_path)


def resumes(resume: bool, out_dir: str | Path) -> bool:
    """Whether the run resumes: when told to, or when SLURM started this job again and its folder is there."""
    restarts = int(os.environ.get("SLURM_RESTART_COUNT", "0"))
    if resume or restarts == 0 or not Path(out_dir).is_dir():
        return resume
    say(f"SLURM job {slurm_job()} started again (restart {restarts}): resuming the run in {out_dir}")
    return True


def resume_point(folder: StageFolder, resume: bool) -> Path | None:
    """The checkpoint a stage resumes from (its last.ckpt, put back first if a kill caught it between
    renames), or None: not resuming, or nothing saved yet."""
    recover(folder.last)
    return folder.last if resume and folder.last.exists() else None
