"""train.py's command: a run from its composed config to its exit status (bad input 2, a full disk 3,
stopped 4, not finite 5), with what it prints before and after. train.py imports this module only as
it runs: a loader worker imports train.py again (as __mp_main__) and needs none of it."""

from __future__ import annotations

import sys
import time
from contextlib import nullcontext
from pathlib import Path

import torch.distributed as dist
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf, open_dict

from lwm.core.config import check_files, to_run_config, validate
from lwm.core.preflight import WillNotFit, attention_kernel, device_kind
from lwm.core.step import NonFiniteStep
from lwm.data import ExampleError, IndexNotWritable, SkippedTooMany, StaleIndex, TooLittleData
from lwm.disk.checkpoints import CheckpointError
from lwm.disk.folder_lock import FolderLocked, output_lock
from lwm.disk.run_folder import CONFIG, LOCK, OtherRun, check, clear, resolved
from lwm.disk.stage_folder import StageFolder
from lwm.disk.weights import WeightsError
from lwm.disk.writes import NoSpaceLeft, complete, write_atomic
from lwm.parallel import peers
from lwm.parallel.flash_impl import NAME
from lwm.parallel.launch import end_process_groups
from lwm.ranks import is_rank0, say
from lwm.train import requeue
from lwm.train.callbacks import loss_summary
from lwm.train.checkpointing import resumes
from lwm.train.entry import ensure_sample_data
from lwm.train.evaluate import EVALUATION_FAILED, evaluated
from lwm.train.run import run_schedule
from lwm.train.skipped import summary as skipped_summary
from lwm.train.trainer import quiet_lightning

EXIT_BAD_INPUT, EXIT_NO_SPACE = 2, 3  # as lwm-tokenize: 2 is bad input, 3 a full disk
EXIT_STOPPED = 4  # a stage stopped before its end (a signal, stop_at_step): the same command continues it
EXIT_NONFINITE = 5  # a step's loss, gradient norm or weights were not finite: the stage stopped, nothing of it saved
EXIT_EVALUATION = (
    6  # trained (weights and export kept), but the needle evaluation failed: the same command evaluates again
)
_started = [False]  # run_command was entered: Hydra composed the config (its own refusals come before)


def run_command(cfg: DictConfig) -> None:
    """The run Hydra composed: checked, trained stage by stage, summed up; exits with its status."""
    _started[0] = True
    try:
        run = to_run_config(cfg, HydraConfig.get().overrides.task)
        # through a symlink: the folder it leads to, said, and refused where it holds files no run wrote
        real, note = resolved(Path(run.trainer.out_dir))
        if note is not None:
            say(note)
            run.trainer.out_dir = cfg.trainer.out_dir = str(real)
        if run.schedule.init_hf is not None:  # config.yaml says what trains: the folder's model, the run's settings
            with open_dict(cfg):
                cfg.model = OmegaConf.structured(run.model)
        config = OmegaConf.to_container(cfg, resolve=True)
        validate(run)
        kernel = attention_kernel(run.parallel.attention_kernel, run.trainer.accelerator)
        if device_kind(run.trainer.accelerator) == "cuda":
            say(f"attention: {NAME[kernel]} (parallel.attention_kernel={run.parallel.attention_kernel})")
        # the folder's own run goes on where it is; another run there is refused (OtherRun)
        same = check(Path(run.trainer.out_dir), config, run.trainer.overwrite)
        run.resume = resumes(run.resume, run.trainer.out_dir) or same  # a requeued SLURM job goes on too
        if run.data.sample and is_rank0():
            ensure_sample_data(run.data)
            check_files(run)
    except (ValueError, TypeError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)
    quiet_lightning()
    out = Path(run.trainer.out_dir)
    if same and finished(run, out):
        return
    start = time.perf_counter()
    try:  # rank 0 holds the folder for the run: a second run on it is refused
        with output_lock(out, LOCK) if is_rank0() else nullcontext():
            if is_rank0():
                check(out, config, run.trainer.overwrite)  # again under the lock: a run may have begun meanwhile
                if run.trainer.overwrite:
                    for path in clear(out, [s.name for s in run.schedule.stages]):
                        say(f"trainer.overwrite=true: removed {path}")
                write_atomic(out / CONFIG, OmegaConf.to_yaml(cfg, resolve=True))
                model = run.schedule.init_hf or HydraConfig.get().runtime.choices.get("model")
                say(
                    f"run {out}: model {model} ({model_summary(run.model)}), schedule "
                    f"{run.schedule.name} ({len(run.schedule.stages)} stages), {run.trainer.world_size} process(es)"
                )
            where = run_schedule(run)
    except (FolderLocked, OtherRun, CheckpointError, WeightsError, WillNotFit) as e:  # a stage's start weights too
        print(f"error: {e}", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)
    # the data: strict's bad example, mostly bad, too little, changed during the run, an index that cannot be kept
    except (ExampleError, SkippedTooMany, TooLittleData, StaleIndex, IndexNotWritable) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)
    except NoSpaceLeft as e:
        print(f"error: {e}; free space and rerun with resume=true (finished stages are kept)", file=sys.stderr)
        sys.exit(EXIT_NO_SPACE)
    except NonFiniteStep as e:
        last = StageFolder.of(out, e.stage).last
        kept = f"its last checkpoint {last} is kept" if last.exists() else "it has no checkpoint yet"
        print(
            f"error: {e}. Nothing non-finite was saved: {kept}. Train with a lower lr (another trainer.out_dir), "
            "or skip such steps with optim.max_nonfinite_steps",
            file=sys.stderr,
        )
        sys.exit(EXIT_NONFINITE)
    except Exception as e:  # a collective that failed because another rank died: name that rank
        dead = peers.lost()
        if dead is None:
            raise
        cause = (str(e).strip().splitlines() or [""])[-1]
        print(f"error: rank {dist.get_rank()} lost another rank: {dead} ({type(e).__name__}: {cause})", file=sys.stderr)
        sys.exit(1)
    end_process_groups()
    if "stopped" in where and requeue.received():
        requeue.after_stop(out)
    elif "stopped" in where:
        say(f"stopped at stop_at_step={run.stop_at_step}: the same command (without stop_at_step) continues it")
    say(f"\n{'stopped' if 'stopped' in where else 'finished'} in {time.perf_counter() - start:.0f}s")
    for what, path in where.items():
        say(f"  {what:13s} {path}")
    say(f"  {'logs':13s} {out}/<stage>/logs/metrics.csv, TensorBoard: tensorboard --logdir {out}")
    for line in loss_summary(out, [stage.name for stage in run.schedule.stages]):
        say(line)
    for line in skipped_summary(out, [stage.name for stage in run.schedule.stages]):
        say(line)
    if "stopped" in where:
        sys.exit(EXIT_STOPPED)
    if EVALUATION_FAILED in where:
        print(
            f"error: the needle evaluation failed (its output above; what it finished is in {where[EVALUATION_FAILED]}); "
            "the trained weights are kept and the same command evaluates them again",
            file=sys.stderr,
        )
        sys.exit(EXIT_EVALUATION)


def model_summary(config) -> str:
    """What trains, in a few words: its size, shapes and family options."""
    options = [name for name in ("qkv_bias", "qk_norm", "tie_embeddings") if getattr(config, name)]
    return (
        f"{config.num_params() / 1e6:,.1f}M parameters, dim {config.dim}, {config.n_layers} layers, "
        f"{config.n_heads}/{config.n_kv_heads} heads, vocab {config.vocab_size}"
        + (f", {' '.join(options)}" if options else "")
        + f", chunks mlp {config.mlp_chunk_size} norm {config.norm_chunk_size} loss {config.loss_chunk_size}, "
        f"head groups {config.attn_head_groups}"
    )


def finished(run, out: Path) -> bool:
    """Whether every stage the command runs has its final weights in `out` (the run's own folder), and
    with export=true its export is whole: then it says so and does nothing. An export a full disk cut
    short is made by the rerun."""
    names = [run.stage_only] if run.stage_only else [s.name for s in run.schedule.stages]
    if not all(StageFolder.of(out, name).final.is_file() for name in names):
        return False
    if run.export and not complete(out / "hf"):
        return False
    if run.evaluate.lengths is not None and not evaluated(out / "needle"):
        return False  # an evaluation that failed or was cut short: the rerun evaluates
    say(
        f"run {out} is finished: {', '.join(names)} {'has its' if len(names) == 1 else 'have their'} final weights "
        f"({out}/<stage>/final.safetensors); nothing to train. To train again: another trainer.out_dir, or "
        "trainer.overwrite=true (removes this run's files)"
    )
    return True


def as_command(main) -> None:
    """Hydra's main (which composes the config and calls run_command) as the command: the stopping signals held back
    since the start handled, and Hydra's own refusals of an override or config name exit 2 as ours do."""
    _started[0] = False  # one process may run the command more than once (a test does)
    with requeue.stop_signals_noted():  # those held back meanwhile included
        try:
            main()
        except SystemExit as e:  # Hydra refuses an override or config name with status 1, before run_command
            if e.code == 1 and not _started[0]:
                sys.exit(EXIT_BAD_INPUT)
            raise
