"""A run folder knows whose it is: its config.yaml is the run's, and another run is refused there.

The first run into `trainer.out_dir` writes the resolved config there. A later command into the same
folder is compared with it, key by key:

- the same run (only the keys of RUN_ONLY may differ: where and how it runs, what happens after it)
  goes on where the folder is: a stopped stage resumes from its checkpoint, finished stages are kept;
  a run whose every stage has its final weights is finished, and says so;
- another run (a key that changes what is trained differs) is refused, naming the keys and both
  values, before anything is written: `trainer.overwrite=true` starts over in that folder (the run's
  own files are removed, nothing else), or name another folder;
- a recorded run that never finished a step (no final weights, checkpoint or metrics row: a command
  refused before its first step) is no run yet, and the command takes the folder.

A folder without config.yaml (weights put there by hand, an older run) is used as before: stages
are resumed only with resume=true; trainer.overwrite=true refuses it, naming what it holds, since
nothing says a run of this project wrote those files. A trainer.out_dir through symlinks is resolved
and the folder it leads to said; a symlink as out_dir itself must lead to a new or empty folder or to
a run of this project.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from omegaconf import OmegaConf

from lwm.disk.stage_folder import KEPT_METRICS, StageFolder

CONFIG = "config.yaml"
LOCK = "train"  # the run's output lock (lwm.disk.folder_lock): <out_dir>/train.lock while it runs
# The keys that do not change what a run trains: where it runs and on how many processes, how often it
# logs and saves, how it splits the work (exact on any layout), where it keeps activations (checkpointing
# and offload are exact), how it tiles the model's work (the memory features the preflight suggests: the
# same loss and gradients as the untiled model, tests/unit/interop/test_families.py, tests/unit/model/test_model.py), how it reads
# its data (loader workers keep the stream's order, the index is the same wherever it is kept), and what
# it does around the stages.
RUN_ONLY = (
    "resume",
    "stage_only",
    "stop_at_step",
    "export",
    "probe",
    "evaluate",
    "trainer.out_dir",
    "trainer.overwrite",
    "trainer.accelerator",
    "trainer.devices",
    "trainer.num_nodes",
    "trainer.log_every",
    "trainer.val_every",
    "trainer.checkpoint_every",
    "trainer.keep_checkpoints",
    "trainer.timeout_s",
    "trainer.peak_tflops",
    "trainer.preflight",
    "trainer.flush_denormal",  # how the CPU computes below 1.2e-38, not what is trained (a run from before it resumes)
    "parallel.mode",
    "parallel.layout",
    "parallel.ulysses",
    "parallel.tp",
    "parallel.activation_checkpointing",
    "parallel.keep_attention",  # the same gradients bitwise as recomputing it
    "parallel.keep_attention_blocks",  # the same; a run recorded before the field resumes
    "parallel.activation_offload",
    "parallel.param_offload",
    "model.mlp_chunk_size",
    "model.norm_chunk_size",
    "model.attn_head_groups",
    "model.loss_chunk_size",
    "data.num_workers",
    "data.index_workers",
    "data.index_dir",
    "data.on_changed_source",  # what a resume does when a source changed: asked for on the rerun
    "optim.max_nonfinite_steps",  # finite steps train alike; a rerun of a run it stopped (exit 5) may ask for it
    "data.strict",
    "data.max_skipped_fraction",
)
OUTPUTS = ("hf", "needle")  # besides the stage folders: the export and the evaluation


class OtherRun(ValueError):
    """trainer.out_dir holds another run; the message names the keys that differ."""


def _flat(tree, prefix: str = "") -> dict[str, object]:
    if isinstance(tree, dict):
        flat: dict[str, object] = {}
        for key, value in tree.items():
            flat.update(_flat(value, f"{prefix}{key}."))
        return flat if flat or not prefix else {prefix[:-1]: {}}
    return {prefix[:-1]: tree}


def _trained(config: dict) -> dict:
    """The config as what it trains: each stage by its global batch (sequences per step over all ranks),
    not by how the ranks split it (cp, batch_size per data-parallel rank), so a run resumes onto another
    mesh; the stages listed by index."""
    config = dict(config)
    schedule = dict(config.get("schedule") or {})
    trainer, parallel = config.get("trainer") or {}, config.get("parallel") or {}
    world = int(trainer.get("devices", 1)) * int(trainer.get("num_nodes", 1))
    stages = {}
    for i, stage in enumerate(schedule.get("stages") or []):
        stage = dict(stage) if isinstance(stage, dict) else {"stage": stage}
        cp, batch = stage.pop("cp", 1), stage.pop("batch_size", 1)
        if stage.get("global_batch") is None:
            dp = max(1, world // max(1, int(cp) * int(parallel.get("tp", 1))))
            stage["global_batch"] = int(batch) * dp
        stages[str(i)] = stage
    schedule["stages"] = stages
    config["schedule"] = schedule
    return config


def _run_only(key: str) -> bool:
    return any(key == k or key.startswith(k + ".") for k in RUN_ONLY)


def differences(old: dict, new: dict) -> list[str]:
    """`key: old -> new` for every key that changes what is trained (a key one side lacks: `<none>`)."""
    a, b = _flat(_trained(old)), _flat(_trained(new))
    keys = sorted(k for k in a.keys() | b.keys() if not _run_only(k) and a.get(k, "<none>") != b.get(k, "<none>"))
    return [f"{k}: {a.get(k, '<none>')!r} -> {b.get(k, '<none>')!r}" for k in keys]


def recorded(out: Path) -> dict | None:
    """The config of the run that made `out`, if it recorded one."""
    path = out / CONFIG
    if not path.is_file():
        return None
    try:
        config = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    except Exception as e:  # noqa: BLE001 (yaml's and OmegaConf's errors have no common base)
        raise OtherRun(
            f"{path} is not a run's config ({type(e).__name__}: {e}); restore it, or start over with "
            "trainer.overwrite=true (the folder's run files are removed)"
        ) from None
    if not isinstance(config, dict):
        raise OtherRun(f"{path} is not a run's config (it holds a {type(config).__name__})")
    return config


def stepped(out: Path, config: dict | None) -> bool:
    """Whether the run `config` records in `out` finished a step: a stage of its schedule holds final
    weights, a checkpoint or a metrics row."""
    for name in _stage_names(config):
        stage = StageFolder.of(out, name)
        if stage.final.exists() or (stage.checkpoints.is_dir() and any(stage.checkpoints.iterdir())):
            return True
        for log in (stage.logs / "metrics.csv", stage.logs / KEPT_METRICS):
            if log.is_file():
                with open(log, "rb") as f:
                    f.readline()  # the header
                    if f.readline().strip():  # a row
                        return True
    return False


def held(out: Path) -> list[str]:
    """What `out` holds besides the run's lock, by name (a folder's with a slash)."""
    if not out.is_dir():
        return []
    entries = [p for p in out.iterdir() if p.name != f"{LOCK}.lock"]
    return sorted(p.name + ("/" if p.is_dir() and not p.is_symlink() else "") for p in entries)


def _shown(names: list[str], most: int = 8) -> str:
    return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")


def resolved(out: Path) -> tuple[Path, str | None]:
    """trainer.out_dir with its symlinks resolved, and a line saying where it leads when that is another
    path. A link as out_dir itself must lead to a new or empty folder, or to a run of this project (check
    compares it then): raises OtherRun where it leads to files no run wrote."""
    try:
        real = out.resolve()
    except (RuntimeError, OSError):  # a loop of links (Python < 3.13 raises, later ones return a link)
        real = out
    if real.is_symlink():
        raise OtherRun(f"trainer.out_dir {out} is a loop of symlinks; name a real folder")
    if real == Path(os.path.abspath(out)):
        return out, None
    if out.is_symlink() and not (real / CONFIG).is_file() and (found := held(real)):
        raise OtherRun(
            f"trainer.out_dir {out} is a symlink to {real}, which holds files no run of this project wrote (no "
            f"{CONFIG}): {_shown(found)}. Name a folder of the run's own: a new one, or the link's target itself "
            "to train among those files"
        )
    return real, f"trainer.out_dir {out} leads to {real} (symlinks resolved): the run writes there"


def check(out: Path, config: dict, overwrite: bool) -> bool:
    """Whether `out` holds this run already (then it goes on where it is); raises OtherRun where it holds
    another, and for trainer.overwrite=true where it holds files but no run (no config.yaml): overwrite
    removes only a run's own files. A recorded run that never finished a step (a command refused before its
    first step) is no run yet: another config takes the folder. Reads only: every rank may call it."""
    if overwrite and not (out / CONFIG).is_file() and (found := held(out)):
        raise OtherRun(
            f"trainer.overwrite=true removes only the files of a run of this project, and trainer.out_dir {out} "
            f"holds no run (no {CONFIG}): {_shown(found)}. Move them away or remove them yourself, or name "
            "another trainer.out_dir"
        )
    old = None if overwrite else recorded(out)
    if old is None:
        return False
    changed = differences(old, config)
    if changed and not stepped(out, old):
        return False
    if changed:
        raise OtherRun(
            f"trainer.out_dir {out} holds another run ({out / CONFIG}); these keys differ: {'; '.join(changed)}. "
            "Name another trainer.out_dir, or start over there with trainer.overwrite=true (the run's stages, "
            f"{', '.join(o + '/' for o in OUTPUTS)} and {CONFIG} are removed)"
        )
    return True


def clear(out: Path, stages: list[str]) -> list[Path]:
    """trainer.overwrite=true: remove the files a run makes in `out` (the stages of this run's schedule and
    of the recorded one, the export, the evaluation, the config), nothing else; returns what it removed.
    A folder without config.yaml holds no run: nothing is removed (check refuses it first)."""
    if not (out / CONFIG).is_file():
        return []
    old = recorded_quietly(out)
    names = set(stages) | set(_stage_names(old))
    removed = []
    for name in sorted(names) + list(OUTPUTS) + [CONFIG]:
        path = out / name
        if path.is_symlink() or path.is_file():
            path.unlink()
        elif path.is_dir():
            shutil.rmtree(path)
        else:
            continue
        removed.append(path)
    return removed


def recorded_quietly(out: Path) -> dict | None:
    try:
        return recorded(out)
    except OtherRun:
        return None


def _stage_names(config: dict | None) -> list[str]:
    stages = ((config or {}).get("schedule") or {}).get("stages") or []
    names = [s.get("name") for s in stages if isinstance(s, dict)]
    return [n for n in names if isinstance(n, str) and n not in ("", ".", "..") and Path(n).name == n]
