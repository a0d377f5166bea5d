"""One training step (lwm/core/step.py): Lightning's LWMModule.training_step and lwm-plan's tracked
step (the preflight's, the fake step command's, bench/'s) run the same function, so what changes the
step changes what the plan measures."""

from __future__ import annotations

import torch

from lwm.core import step as step_file
from lwm.core.config import OptimConfig, ParallelConfig, StageConfig
from lwm.model import ModelConfig, Transformer
from lwm.paths import REPO
from lwm.train.module import LWMModule

DEBUG = ModelConfig.from_preset("debug")
SEQ = 64


def test_adamw_is_fused_where_its_tensors_are_in_host_memory():
    """A CPU run's AdamW, and a GPU run's under parameter offload, run torch's fused kernel (its per-parameter
    loop is about 6x slower there); a GPU run's keeps torch's default. The fused step gives the loop's
    weights (fp32, 3 steps of the debug model at lr 1e-2, which move a weight up to 3e-2: within 1e-5, measured
    4.3e-6 at most, the two kernels rounding apart) and Lightning's module on a CPU builds it."""
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert step_file.optimizer_on_host(cpu, False) and step_file.optimizer_on_host(cuda, True)
    assert not step_file.optimizer_on_host(cuda, False)
    stage = StageConfig("a", seq_len=SEQ, rope_theta=1e4, steps=3, lr=1e-2)
    weights = []
    for fused in (False, True):
        torch.manual_seed(0)
        model = Transformer(DEBUG)
        optimizer, scheduler = step_file.build_optimizer(model, stage, OptimConfig(weight_decay=0.1), fused=fused)
        assert optimizer.defaults["fused"] is (True if fused else None)
        for _ in range(3):
            tokens = torch.randint(0, DEBUG.vocab_size, (2, SEQ + 1))
            model(tokens[:, :-1], targets=tokens[:, 1:]).loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            scheduler.step()
        weights.append(model.state_dict())
    for name, value in weights[0].items():
        torch.testing.assert_close(weights[1][name], value, rtol=0, atol=1e-5, msg=name)
    module = LWMModule(DEBUG, stage, OptimConfig(), ParallelConfig())
    module.configure_model()
    assert module.configure_optimizers()["optimizer"].defaults["fused"] is True  # on the CPU


def test_a_checkpoint_from_automatic_optimization_resumes_at_its_step():
    """Checkpoints written before the module drove the step by manual optimization count their
    steps in the automatic loop (checked: such a last.ckpt of step 5 resumes by the new code to the
    old uninterrupted run's losses and weights, bit for bit)."""
    from lwm.train.module import steps_from_automatic_optimization

    def progress(n):
        return {"total": {"ready": n, "completed": n}, "current": {"ready": n, "completed": n}}

    fit = {
        "epoch_loop.automatic_optimization.optim_progress": {"optimizer": {"step": progress(5)}},
        "epoch_loop.manual_optimization.optim_step_progress": progress(0),
    }
    checkpoint = {"loops": {"fit_loop": fit}}
    steps_from_automatic_optimization(checkpoint)
    assert fit["epoch_loop.manual_optimization.optim_step_progress"] == progress(5)
    fit["epoch_loop.manual_optimization.optim_step_progress"] = progress(7)  # a new checkpoint: left as it is
    steps_from_automatic_optimization(checkpoint)
    assert fit["epoch_loop.manual_optimization.optim_step_progress"] == progress(7)


def test_the_guides_loop_without_lightning_learns(capsys):
    """docs/training.md's loop over the core's step (lwm.core, which imports no Lightning: test_floors), as
    written there: the one batch it repeats is learned (its loss at most half the first step's)."""
    guide = (REPO / "docs" / "training.md").read_text()
    section = guide.split("## The training step without Lightning", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    names: dict = {}
    exec(compile(code, "docs/training.md", "exec"), names)
    losses = names["losses"]
    assert len(losses) == names["stage"].steps and losses[-1] < 0.5 * losses[0], losses
    assert f"loss {losses[0]:.2f} -> {losses[-1]:.2f}" in capsys.readouterr().out


def test_a_runs_attention_kernel_is_activated_on_its_device(monkeypatch):
    """parallel.attention_kernel reaches torch's registry: auto on an H100 with FlashAttention-3 installed
    activates FA3 in this process; on a CPU run nothing is activated (the device stood in)."""
    import torch.nn.attention._registry as registry

    from lwm.core import preflight

    active = []
    monkeypatch.setattr(registry, "_FLASH_ATTENTION_IMPLS", {"FA3": lambda: active.append("FA3")})
    monkeypatch.setattr(registry, "_FLASH_ATTENTION_ACTIVE", None)
    monkeypatch.setattr(preflight, "installed_kernels", lambda: frozenset({"fa2", "fa3"}))
    assert preflight.attention_kernel("auto", "cpu") == "fa2" and active == []
    monkeypatch.setattr(preflight, "device_capability", lambda kind: (9, 0))
    assert preflight.attention_kernel("auto", "gpu") == "fa3" and active == ["FA3"]
