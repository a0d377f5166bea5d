"""Training's preflight (lwm/core/preflight.py): a stage that will not fit the device is
refused before anything is allocated, naming the stage, its mesh, the planned peak, the device and
the smallest cp that fits (or why none does); one that fits passes and returns its plan."""

from __future__ import annotations

import dataclasses

import pytest

from lwm.core.preflight import PreflightJob, WillNotFit, check, device_kind, device_memory, preflight, wanted
from lwm.plan.config import compose_run
from lwm.plan.devices import GIB
from lwm.plan.stage_plan import plan_stage

WORLD = 2


@pytest.fixture(scope="module")
def run():
    """The debug model and schedule on 2 GPUs, activation checkpointing on (as at 7b)."""
    return compose_run(["model=debug", "schedule=debug", "parallel=7b", f"trainer.devices={WORLD}"])


@pytest.fixture(scope="module")
def roomy(run):
    """Stage a (64 tokens, cp 1, dp 2, 2 sequences per rank) planned in this process on 64 GiB."""
    return plan_stage(PreflightJob(run.model, run.schedule.stages[0], run.parallel, run.optim, WORLD, 64 * GIB, 0.0))


def _job(run, device_bytes: int, **stage_changes) -> PreflightJob:
    stage = dataclasses.replace(run.schedule.stages[0], **stage_changes)
    return PreflightJob(run.model, stage, run.parallel, run.optim, WORLD, device_bytes, 0.0)


def test_a_device_just_too_small_is_refused_naming_the_smallest_cp_that_fits(run, roomy):
    tight = int(roomy.needs_bytes) - 1  # one byte short of the peak with the allocator's 5%
    plan = plan_stage(_job(run, tight))
    assert not plan.fits and plan.peak_bytes == roomy.peak_bytes
    assert plan.fits_with["cp"] == 2 and plan.fits_with["peak_bytes"] < plan.peak_bytes  # half the tokens per rank
    with pytest.raises(WillNotFit) as refused:
        check(plan)
    message = str(refused.value)
    for named in (
        "stage 'a'",
        "seq_len 64",
        "cp 1",
        "dp 2",
        "planned peak",
        "on a device of",
        "smallest cp that fits is 2",
    ):
        assert named in message, (named, message)
    assert refused.value.plan is plan


def test_when_no_cp_fits_the_refusal_says_so(run):
    plan = plan_stage(_job(run, 1000))
    with pytest.raises(WillNotFit, match="No cp of 2 GPUs fits"):
        check(plan)
    assert plan.fits_with is None


def test_a_global_batch_that_follows_dp_is_refused_without_a_search(run, roomy):
    """With a global batch every cp puts the same tokens on a rank: no larger cp is planned."""
    plan = plan_stage(_job(run, int(roomy.needs_bytes) - 1, global_batch=4, batch_size=1))
    assert (
        "every cp that can run the stage puts 128 tokens on each rank" in plan.why
        and "gradient accumulation" in plan.why
    )


def test_a_big_enough_device_passes_planned_in_a_child_process(run, roomy):
    plan = preflight(run, run.schedule.stages[0], 64 * GIB, reserved_gib=0.0)
    assert plan.fits and plan.peak_bytes == roomy.peak_bytes and (plan.cp, plan.dp, plan.batch) == (1, 2, 2)
    assert sum(plan.parts.values()) == plan.peak_bytes


def test_an_impossible_mesh_is_an_error_naming_it(run):
    with pytest.raises(ValueError, match="world size 2 is not divisible by cp 3"):
        plan_stage(_job(run, 64 * GIB, cp=3))


def test_a_tensor_parallel_run_is_planned_at_its_tp(run, roomy):
    """tp 2 on the 2 GPUs: one data-parallel rank, each tp rank with half of every block (and the
    whole embedding and head); refused on a device one byte short, where no cp can help (cp 1 x
    tp 2 is all of it)."""
    tp_run = dataclasses.replace(run, parallel=dataclasses.replace(run.parallel, tp=2))
    plan = plan_stage(PreflightJob(run.model, run.schedule.stages[0], tp_run.parallel, run.optim, WORLD, 64 * GIB, 0.0))
    assert plan.fits and (plan.cp, plan.dp, plan.tp, plan.batch) == (1, 1, 2, 2) and plan.peak_bytes != roomy.peak_bytes
    assert "tp 2" in plan.summary()
    short = plan_stage(
        PreflightJob(run.model, run.schedule.stages[0], tp_run.parallel, run.optim, WORLD, int(plan.needs_bytes) - 1)
    )
    with pytest.raises(WillNotFit, match="cp 1 at tp 2 is already all of them"):
        check(short)


def test_on_for_gpus_off_on_cpu_unless_set():
    assert wanted(None, "gpu") and wanted(None, "cuda") and not wanted(None, "cpu")
    assert wanted(True, "cpu") and not wanted(False, "gpu")
    assert (device_kind("gpu"), device_kind("cpu")) == ("cuda", "cpu")


def test_a_cpu_run_is_planned_with_the_cpus_settings_on_its_share_of_memory(run, roomy):
    """trainer.preflight=true on a CPU run: fp32 compute (the GPU's plan computes in bf16), and each
    of a machine's ranks has its share of the physical memory."""
    plan = plan_stage(dataclasses.replace(_job(run, 64 * GIB), device="cpu"))
    assert plan.fits and plan.peak_bytes != roomy.peak_bytes
    assert 0 < device_memory("cpu", 2) <= device_memory("cpu", 1) // 2


def test_when_no_cp_fits_the_refusal_names_the_cheapest_memory_feature_that_does(run):
    """Checkpointing off, on a device between the checkpointed and the plain step's needs: no cp of
    the world fits (cp 2's half of the tokens neither), and the refusal names the feature that does."""
    plain = dataclasses.replace(run.parallel, activation_checkpointing=False)
    stage = dataclasses.replace(run.schedule.stages[0], cp=2)

    def job(parallel, device_bytes):
        return PreflightJob(run.model, stage, parallel, run.optim, WORLD, device_bytes, 0.0)

    checkpointed, full = plan_stage(job(run.parallel, 64 * GIB)), plan_stage(job(plain, 64 * GIB))
    assert checkpointed.needs_bytes < full.needs_bytes
    plan = plan_stage(job(plain, int(checkpointed.needs_bytes) + 1))
    with pytest.raises(WillNotFit, match=r"it fits with parallel.activation_checkpointing=true \(planned peak"):
        check(plan)
