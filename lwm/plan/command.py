"""lwm-plan: will this run fit, and how fast will it go? Rank 0's real training step (and an
inference prefill) under fake tensors, for each stage asked, on a device of your choice.

    lwm-plan model=7b schedule=lwm_vision trainer.devices=8 --gpu h100-80g --stage all
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from dataclasses import asdict, fields
from pathlib import Path

from lwm.core.config import ParallelConfig, StageConfig, stage_model_config
from lwm.parallel.flash_impl import NAME
from lwm.plan import bounds, report
from lwm.plan.advice import cheapest_fit, fewer_kept_blocks
from lwm.plan.compiled import compiled_saving
from lwm.plan.config import PlanConfig, compose_run
from lwm.plan.devices import GIB, parse_device
from lwm.plan.fake import gpu_settings
from lwm.plan.infer import plan_inference
from lwm.plan.memory import Mesh, plan_step
from lwm.plan.search import (
    check_mesh,
    longest_sequence,
    no_fit,
    smallest_fitting_cp,
    stage_dp,
    stage_meshes,
)
from lwm.plan.time import step_time, step_work

NODE = 8  # GPUs per node when --cp/--dp give the world directly (an HGX node)


def planned_world(config: PlanConfig, run) -> tuple[int, int]:
    """(world, GPUs per node). --cp with --dp give the world directly (cp x dp x tp, 8 per node); a
    run that names no world (no trainer override, one device) is planned on the smallest that runs
    every stage of its schedule (the least common multiple of their cps, times tp, 8 per node);
    otherwise the run's own."""
    tp = run.parallel.tp
    if config.dp:
        return (config.cp or 1) * config.dp * tp, NODE
    named = any(o.lstrip("+~").startswith("trainer") for o in config.overrides)
    world = run.trainer.world_size
    if not named and world == 1 and not config.cp:
        world = math.lcm(*(s.cp for s in run.schedule.stages)) * tp
        if world > 1:
            print(
                f"note: planned on {world} GPUs, the smallest world that runs every stage of schedule "
                f"{run.schedule.name!r} (name yours with trainer.devices= trainer.num_nodes=)"
            )
            return world, NODE
    return world, run.trainer.devices


def planned_stages(config: PlanConfig, run, world: int) -> list[tuple[StageConfig, Mesh]]:
    """(stage, mesh) for each stage asked, every mesh checked before any fake work."""
    stages = run.schedule.stages
    if config.stage != "all":
        stages = [s for s in stages if s.name == config.stage]
        if not stages:
            names = [s.name for s in run.schedule.stages]
            raise ValueError(
                f"--stage {config.stage!r} is not a stage of schedule {run.schedule.name!r}: {names} (or all)"
            )
    if config.seq_len:  # one configuration, given directly: the first stage asked lends lr, theta, batch
        stages = [
            dataclasses.replace(
                stages[0], name=f"seq{config.seq_len}", seq_len=config.seq_len, global_batch=None, batch_size=1
            )
        ]
    if config.batch:  # sequences per data-parallel rank, in place of the stage's
        stages = [dataclasses.replace(s, global_batch=None, batch_size=config.batch) for s in stages]
    planned = []
    for stage in stages:
        cp = config.cp or stage.cp
        stage = dataclasses.replace(stage, cp=cp)
        dp = stage_dp(stage, world, run.parallel)
        mesh = Mesh(stage.seq_len, cp, dp, stage.per_rank_batch(dp), run.parallel.tp)
        check_mesh(mesh, run.model, run.parallel, f"stage {stage.name!r}")
        bounds.check_step(mesh, stage_model_config(run.model, stage), f"stage {stage.name!r}")
        planned.append((stage, mesh))
    return planned


def run(config: PlanConfig) -> dict:
    run_cfg = compose_run(config.overrides)
    device = parse_device(config.gpu).with_kernel(run_cfg.parallel.attention_kernel)
    settings = gpu_settings(run_cfg.parallel.attention_kernel)  # what the step computes with on the GPU
    if config.tp:
        run_cfg.parallel = dataclasses.replace(run_cfg.parallel, tp=config.tp)
    model = run_cfg.model  # with schedule.init_hf, the folder's (lwm.core.config.start_model)
    world, node = planned_world(config, run_cfg)
    given = "--cp x --dp x --tp" if config.dp else "trainer.devices x trainer.num_nodes"
    bounds.check_world(world, f"{given} = {world}")
    planned = planned_stages(config, run_cfg, world)
    # Document masks are off: their runs are read on the host (lwm.plan.fake_step's docstring).
    parallel = dataclasses.replace(run_cfg.parallel, document_mask=False)
    if config.infer:
        infer_cp = config.cp or world
        check_mesh(Mesh(config.infer, infer_cp, 1), model, ParallelConfig(), f"--infer {config.infer}")
        bounds.check_prefill(config.infer, infer_cp, model, config.prefill_chunk, f"--infer {config.infer}")

    def peak_of(stage: StageConfig, keep: dict | None = None):
        def peak(mesh: Mesh) -> int:
            s = dataclasses.replace(stage, seq_len=mesh.seq_len, cp=mesh.cp)
            mem = plan_step(stage_model_config(model, s), s, mesh, parallel, run_cfg.optim, settings)
            if keep is not None:
                keep[mesh] = mem
            return mem.peak

        return peak

    def timed(stage: StageConfig, mesh: Mesh, mem, model=model, parallel=parallel) -> dict:
        mc = stage_model_config(model, stage)
        a2a = parallel.ulysses if parallel.mode == "hybrid" else 0
        work = step_work(
            mc,
            mesh,
            mem,
            parallel.layout,
            parallel.mode,
            parallel.activation_checkpointing,
            a2a,
            parallel.param_offload,
            parallel.kept_blocks(mc.n_layers),
            compiled_saving(mc, mesh.tp) if parallel.compile_blocks else None,
        )
        return {"time": asdict(step_time(work, mesh, device, node)), "work": asdict(work)}

    def memory(mesh: Mesh, mem) -> dict:
        ranks = min(mesh.world, node)  # ranks of this run on one node: they share its host memory
        return {
            "peak_bytes": mem.peak,
            "needs_bytes": device.needs(mem.peak),
            "host_peak_bytes": mem.host_peak,
            "host_needs_per_node": device.host_needs(mem.host_peak, ranks),
        }

    def advise(stage: StageConfig, mesh: Mesh, mem=None) -> dict:
        """The cheapest memory feature (or set of them) that makes the mesh fit, planned and timed; with
        `mem` (a step that fits the device, not the host, with kept attention), the most blocks that keep it."""

        def plan(m, p):
            return plan_step(stage_model_config(m, stage), stage, mesh, p, run_cfg.optim, settings)

        ranks = min(mesh.world, node)
        if mem is None:
            found = cheapest_fit(model, parallel, mesh, plan, device, ranks)
        else:
            found = fewer_kept_blocks(model, parallel, mesh, plan, device, ranks, mem)
        result = {"tried": found.tried, "overrides": None, "kind": "ladder" if mem is None else "kept"}
        if found.change is not None:
            result.update(overrides=list(found.change.overrides), **memory(mesh, found.memory))
            result.update(timed(stage, mesh, found.memory, found.change.model, found.change.parallel))
        return result

    rows, curves = [], {}
    for stage, mesh in planned:
        mem = plan_step(stage_model_config(model, stage), stage, mesh, parallel, run_cfg.optim, settings)
        row = {"stage": stage.name, **asdict(mesh), **memory(mesh, mem)}
        row.update(
            parts=mem.parts, breakdown=mem.breakdown, sent=mem.sent, written=mem.written, **timed(stage, mesh, mem)
        )
        host_ok = device.host_fits(mem.host_peak, min(mesh.world, node))
        if device.fits(mem.peak) and host_ok:
            row["verdict"] = f"fits, {device.headroom_gib(mem.peak):.1f} GiB free"
        elif device.fits(mem.peak):
            row["verdict"] = "host memory does not fit"
            row["why"] = (
                f"the node's host holds {row['host_needs_per_node'] / GIB:.0f} GiB with margins "
                f"({min(mesh.world, node)} ranks offloading {mem.host_peak / GIB:.1f} GiB each) of {device.host_gib:.0f}"
            )
            if parallel.kept_blocks(model.n_layers) > 1:
                row["advice"] = advise(stage, mesh, mem)
        else:
            mesh_for = stage_meshes(stage, mesh.world, model, parallel)
            probes: dict = {}
            search = smallest_fitting_cp(mesh, mesh_for, peak_of(stage, probes), device)
            row["verdict"], row["why"] = no_fit(mesh, search)
            row["searched"] = {str(cp): peak for cp, peak in sorted(search.peaks.items())}
            row["fits_with"] = None
            if search.fits is not None:  # the mesh that fits, with its own time
                probe, fitted = probes[search.fits], dataclasses.replace(stage, cp=search.fits.cp)
                row["fits_with"] = {**asdict(search.fits), "peak_bytes": probe.peak}
                row["fits_with"].update(needs_bytes=device.needs(probe.peak), **timed(fitted, search.fits, probe))
            else:  # no cp does: the cheapest memory feature that makes this mesh fit
                row["advice"] = advise(stage, mesh)
        rows.append(row)
        curves.setdefault(report.mesh_label(mesh.cp, mesh.dp, mesh.tp), {})[mesh.seq_len] = mem.peak
    device_row = {**asdict(device), "attention_efficiency": device.attention_efficiency}  # the planned kernel's
    plan = {"device": device_row, "model": asdict(model), "parallel": asdict(parallel), "stages": rows}
    if config.longest:
        first = planned[0][0]
        tp = planned[0][1].tp
        ranks = planned[0][1].world // tp  # what cp x dp can take
        found = []
        for cp in [c for c in (2**i for i in range(ranks.bit_length())) if ranks % c == 0]:
            kept: dict = {}
            granule = 1024 * cp
            ceiling = bounds.longest_plannable(Mesh(granule, cp, ranks // cp, 1, tp), model, granule)
            if not ceiling:
                print(f"note: --longest skips cp {cp}: not even {granule} tokens are within the planner's bounds")
                continue

            def host_fits(mesh: Mesh, kept=kept) -> bool:
                return device.host_fits(kept[mesh].host_peak, min(mesh.world, node))

            search = longest_sequence(cp, ranks // cp, peak_of(first, kept), device, granule, tp, host_fits, ceiling)
            found.append(search)
        plan["longest"] = [asdict(f) for f in found]
        curves = {report.mesh_label(f.cp, f.dp, f.tp): f.points for f in found}
    if config.infer:
        plan["infer"] = plan_inference(model, config.infer, infer_cp, device, node, config.prefill_chunk)
    _write(plan, curves, device, Path(config.out))
    return plan


def _write(plan: dict, curves: dict, device, out: Path) -> None:
    print(
        f"{device.name}: attention by {NAME[device.kernel]} at {device.attention_efficiency:.0%} of the peak "
        f"(parallel.attention_kernel), matmuls at {device.matmul_efficiency:.0%}"
    )
    print(report.stage_table(plan["stages"]))
    for line in report.parts_lines(plan["stages"]):
        print(line)
    if "longest" in plan:
        print(report.longest_table(plan["longest"]))
    if "infer" in plan:
        for line in report.infer_lines(plan["infer"]):
            print(line)
    print(f"wrote {report.write_json(plan, out)} and {report.plot(curves, device, out)}")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="lwm-plan", description=__doc__.split("\n\n")[0])
    for f in fields(PlanConfig):
        if f.name == "overrides":
            p.add_argument("overrides", nargs="*", help=f.metadata["help"])
        elif f.type in (bool, "bool"):
            p.add_argument(f"--{f.name.replace('_', '-')}", action="store_true", help=f.metadata["help"])
        else:
            kind = type(f.default)
            p.add_argument(f"--{f.name.replace('_', '-')}", type=kind, default=f.default, help=f.metadata["help"])
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        run(PlanConfig(**vars(args)))
    except (ValueError, TypeError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0
