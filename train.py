"""Train an LWM-style model: python train.py [group=option ...] [key=value ...]

With no arguments: the debug model learns LWM's needle on the bundled sample data through the quick
progressive schedule on CPU (128 -> 512 -> 2K tokens), then the needle grid is printed. See conf/
for the groups (model, data, parallel, schedule, trainer, optim, experiment) and docs/clusters.md for
multi-GPU, torchrun and SLURM launches.
"""
# ruff: noqa: E402 (the stopping signals are held back before the imports, which take seconds)

import signal

# SLURM's warning before a time limit (SIGUSR1) kills a process that has no handler for it yet: until
# lwm.train.requeue handles them, the stopping signals wait, blocked, instead of killing the run unsaved.
# The processes multiprocessing starts import this file again (as __mp_main__) and keep them blocked
# for good: SLURM signals every process of the job, and a terminal's Ctrl-C (SIGINT) every process of
# its group; the rank alone decides when to stop (a loader worker that died of SIGUSR1 or SIGINT would
# end the run). A pool that stops its workers with SIGTERM unblocks it.
signal.pthread_sigmask(signal.SIG_BLOCK, (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT))

import hydra
from omegaconf import DictConfig


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> None:
    # The run's modules (torch, Lightning: seconds) are imported here, not at the top: each loader worker
    # imports this file again, and its fork server imports what this file's names come from beforehand
    from lwm.train.command import run_command

    run_command(cfg)


def _command() -> None:
    """A function, so that the name it imports is not one of this file's (see main)."""
    from lwm.train.command import as_command

    as_command(main)


if __name__ == "__main__":
    _command()
