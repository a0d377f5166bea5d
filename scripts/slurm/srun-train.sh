#!/bin/bash
# The job step of both sbatch scripts (train.sbatch: GPU nodes, train-cpu.sbatch: CPU processes):
# one train.py process per task, whose ranks Lightning reads from SLURM's variables, writing to
# runs/slurm-<job id> (under $LWM_RUNS if set): every rank names the same folder, and so does the job
# when it is requeued, where it resumes by itself (lwm/train/requeue.py). Arguments are train.py's
# overrides.
set -euo pipefail
cd "${SLURM_SUBMIT_DIR:?run from an sbatch script submitted in the checkout}"
[ -f train.py ] || { echo "srun-train.sh: $PWD has no train.py: submit the job from the checkout" >&2; exit 2; }
# exec: SLURM's signals reach srun itself, which passes them on to the tasks and waits for them
exec srun --kill-on-bad-exit=1 python train.py trainer.num_nodes="$SLURM_NNODES" \
  trainer.devices=$((SLURM_NTASKS / SLURM_NNODES)) trainer.out_dir="${LWM_RUNS:-runs}/slurm-$SLURM_JOB_ID" "$@"
