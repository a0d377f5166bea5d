"""Every numeric training option is range-checked when the run config is built: a value that would
train garbage (nan or inf anywhere, a negative or infinite learning rate, betas outside [0, 1), no
positive loss weight, a seed numpy cannot take) is refused with exit 2, naming the field and the
value, before config.yaml or any stage folder is written."""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf
from train_runs import DEBUG, ROOT, composed, main_in_process

from lwm.configs import ConfigError, from_dict
from lwm.core.config import to_run_config

RANGES = [
    (["schedule.stages.0.lr=inf"], r"schedule.stages\[0\].lr: expected a finite number, got inf"),
    (["schedule.stages.0.lr=nan"], r"schedule.stages\[0\].lr: expected a finite number, got nan"),
    (["schedule.stages.0.lr=-0.001"], r"stage 'a': lr must be a finite number >= 0 within float32's range, got -0.001"),
    (["schedule.stages.1.rope_theta=nan"], r"schedule.stages\[1\].rope_theta: expected a finite number, got nan"),
    (["schedule.stages.0.rope_theta=0"], r"stage 'a': rope_theta must be a finite number > 0, got 0.0"),
    (["+schedule.stages.0.min_lr_ratio=-5"], r"stage 'a': min_lr_ratio must lie in \[0, 1\], got -5.0"),
    (["+schedule.stages.0.min_lr_ratio=1.5"], r"stage 'a': min_lr_ratio must lie in \[0, 1\], got 1.5"),
    (["+schedule.stages.0.min_lr_ratio=nan"], r"schedule.stages\[0\].min_lr_ratio: expected a finite number"),
    (["model.norm_eps=nan"], r"model.norm_eps: expected a finite number, got nan"),
    (["model.norm_eps=0"], r"norm_eps must be > 0, got 0.0"),
    (["model.rope_theta=inf"], r"model.rope_theta: expected a finite number, got inf"),
    (["optim.weight_decay=nan"], r"optim.weight_decay: expected a finite number, got nan"),
    (["optim.weight_decay=-0.1"], r"optim.weight_decay must be a finite number >= 0, got -0.1"),
    (["optim.betas=[2,-1]"], r"optim.betas must be two numbers in \[0, 1\), got \[2.0, -1.0\]"),
    (["optim.betas=[0.9,1.0]"], r"optim.betas must be two numbers in \[0, 1\), got \[0.9, 1.0\]"),
    (["optim.grad_clip=inf"], r"optim.grad_clip: expected .*finite number, got inf"),
    (["optim.text_weight=-1"], r"optim.text_weight must be a finite number >= 0, got -1.0"),
    (
        ["optim.text_weight=0", "optim.vision_weight=0"],
        r"optim.text_weight and optim.vision_weight are both 0: at least one must be > 0",
    ),
    (["trainer.seed=-1"], r"trainer.seed must lie in \[0, 4294967295\], got -1"),
    (["trainer.seed=4294967296"], r"trainer.seed must lie in \[0, 4294967295\], got 4294967296"),
    (["trainer.peak_tflops=nan"], r"trainer.peak_tflops: expected a finite number, got nan"),
    (["schedule.stages.0.lr=1e39"], r"stage 'a': lr must be a finite number >= 0 within float32's range, got 1e\+39"),
]


@pytest.fixture(scope="module")
def debug_config():
    """train.py's composed config with the tests' debug overrides, composed once (Hydra takes a
    second a composition on a loaded machine)."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return compose("train", overrides=["trainer.out_dir=unused", *DEBUG])


@pytest.mark.parametrize("overrides,message", RANGES)
def test_a_number_out_of_range_is_refused_when_the_config_is_built(debug_config, overrides, message):
    """What train.py's main does first (lwm.core.config.to_run_config): its ValueError is the exit 2."""
    cfg = debug_config.copy()
    for override in OverridesParser.create().parse_overrides(overrides):  # Hydra's reading of inf, nan, lists
        OmegaConf.update(cfg, override.key_or_group, override.value(), force_add=True)
    with pytest.raises(ValueError) as refused:
        to_run_config(cfg)
    assert re.search(message, str(refused.value)), refused.value


@pytest.mark.parametrize("overrides,message", [RANGES[0], RANGES[13], RANGES[17]])
def test_train_py_exits_2_before_anything_is_written(tmp_path, monkeypatch, capsys, overrides, message):
    code, _, err = main_in_process(monkeypatch, capsys, tmp_path / "run", *overrides)
    assert code == 2 and re.search(message, err), err[-2000:]
    assert "Traceback" not in err and not (tmp_path / "run").exists()  # no config.yaml, no stage folder


def test_the_edges_that_mean_something_are_accepted():
    """A stage's lr 0 (steps that change no weight: a check of a start), one loss weight 0 (train on
    the other kind only), betas of 0, min_lr_ratio 0 and 1, seed 0 and numpy's largest."""
    run = composed(
        "model=debug",
        "schedule=debug",
        "schedule.stages.0.lr=0",
        "+schedule.stages.0.min_lr_ratio=0",
        "+schedule.stages.1.min_lr_ratio=1",
        "optim.text_weight=0",
        "optim.betas=[0,0]",
        "trainer.seed=4294967295",
    )
    assert run.schedule.stages[0].lr == 0 and run.optim.text_weight == 0 and run.optim.betas == (0.0, 0.0)
    assert composed("model=debug", "optim.vision_weight=0", "trainer.seed=0").optim.vision_weight == 0


@dataclass
class _Number:
    x: float = 1.0


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf"), 10**400])
def test_every_float_field_refuses_what_is_not_finite(value):
    """lwm.configs.from_dict, which builds every config: no field means nan or inf (an integer past
    float's range is one)."""
    with pytest.raises(ConfigError, match=r"x: expected a finite number, got"):
        from_dict(_Number, {"x": value})
    assert from_dict(_Number, {"x": 3}).x == 3.0
