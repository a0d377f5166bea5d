"""The preflight's planning (lwm.core.preflight runs `run` in a process of its own through
lwm.child): one stage of a run on a device of given memory, as lwm-plan plans it; when it does not
fit, the smallest larger cp of the same world that does, or the cheapest memory feature that does.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import asdict
from pathlib import Path

import torch

from lwm.core.config import stage_model_config
from lwm.core.preflight import PreflightJob, StagePlan, size
from lwm.parallel import compute_settings
from lwm.plan.advice import cheapest_fit
from lwm.plan.devices import GIB, Device
from lwm.plan.fake import gpu_settings
from lwm.plan.memory import Mesh, plan_step
from lwm.plan.search import check_mesh, no_fit, smallest_fitting_cp, stage_dp, stage_meshes


def plan_stage(job: PreflightJob) -> StagePlan:
    """Rank 0's step of the job's stage under fake tensors with the job's device's settings (cuda:
    bf16 compute on fp32 shards, the run's CUDA attention kernel; cpu: fp32, the CPU kernel), document masks
    off as in lwm-plan; ValueError for a mesh the stage cannot run on (the values named)."""
    stage = job.stage
    if job.device == "cuda":
        settings = gpu_settings(job.parallel.attention_kernel)
    else:
        settings = compute_settings(torch.device("cpu"), job.model.head_dim)
    dp = stage_dp(stage, job.world, job.parallel)
    mesh = Mesh(stage.seq_len, stage.cp, dp, stage.per_rank_batch(dp), job.parallel.tp)
    check_mesh(mesh, job.model, job.parallel, f"stage {stage.name!r}")
    parallel = dataclasses.replace(job.parallel, document_mask=False)  # runs are read on the host
    device = Device(
        "preflight", job.device_bytes / GIB, 1.0, 1.0, 1.0, 1.0, job.reserved_gib, job.fragmentation
    )  # only the memory matters here

    def peak_of(m: Mesh) -> int:
        s = dataclasses.replace(stage, cp=m.cp)
        return plan_step(stage_model_config(job.model, s), s, m, parallel, job.optim, settings).peak

    mem = plan_step(stage_model_config(job.model, stage), stage, mesh, parallel, job.optim, settings)
    plan = StagePlan(
        stage.name, stage.seq_len, mesh.cp, mesh.dp, mesh.batch, mem.peak, device.needs(mem.peak),
        job.device_bytes, job.reserved_gib, job.fragmentation, mem.parts, tp=mesh.tp,
    )  # fmt: skip
    if not device.fits(mem.peak):
        mesh_for = stage_meshes(stage, job.world, job.model, parallel)
        search = smallest_fitting_cp(mesh, mesh_for, peak_of, device)
        plan.why = no_fit(mesh, search)[1]
        if search.fits is not None:
            m = search.fits
            plan.fits_with = {"cp": m.cp, "dp": m.dp, "batch": m.batch, "peak_bytes": search.peaks[m.cp]}
            plan.why += f" (planned peak {size(search.peaks[m.cp])})"
        else:  # no cp does: the cheapest memory feature that makes this mesh fit, as lwm-plan says

            def plan_with(model, par):
                return plan_step(stage_model_config(model, stage), stage, mesh, par, job.optim, settings)

            advice = cheapest_fit(job.model, parallel, mesh, plan_with, device, job.ranks_per_node)
            if advice.change is not None:
                overrides = " ".join(advice.change.overrides)
                plan.why += f"; it fits with {overrides} (planned peak {size(advice.memory.peak)})"
    return plan


def run(job: PreflightJob) -> int:
    """The preflight's child (lwm.child runs it): the job's StagePlan written as JSON to job.out."""
    Path(job.out).write_text(json.dumps(asdict(plan_stage(job))))
    return 0
