#!/bin/bash
# The job step of both sbatch scripts (train.sbatch: GPU nodes, train-cpu.sbatch: CPU processes):
# one train.py process per task, whose ranks Lightning reads from SLURM's variables, writing to
# runs/slurm-<job id> (under $LWM_RUNS if set): every rank names the same folder, and so does the job
# when it is requeued, where it resumes by itself (lwm/train/requeue.py). Arguments are train.py's
# overrides.
set -euo pipefail
cd "${SLURM_SUBMIT_DIR:?run from an sbatch script submitted in the checkout}"
[ -f train.py ] || { echo "srun-train.sh: $PWD has no train.py: submit the job from the checkout" >&2; exit 2; }
# exec: srun is the batch step. SIGUSR1 (--signal=USR1@N, `scancel --signal=USR1`) SLURM sends to the
# tasks directly. When it ends the job (`scontrol requeue`, scancel, a preemption) it sends SIGTERM to
# the tasks and to srun at once; srun ("forcing job termination") asks slurmctld to SIGKILL the step,
# which it refuses for a job it is already ending (the local cluster's slurmd log shows no SIGKILL
# before KillWait), and waits KillWait + 2 s: meanwhile the tasks finish their step and save
# (lwm/train/requeue.py), and SLURM's own SIGKILL comes KillWait seconds after its SIGTERM.
exec srun --kill-on-bad-exit=1 python train.py trainer.num_nodes="$SLURM_NNODES" \
  trainer.devices=$((SLURM_NTASKS / SLURM_NNODES)) trainer.out_dir="${LWM_RUNS:-runs}/slurm-$SLURM_JOB_ID" "$@"
