"""lwm.configs.from_dict, the one builder of typed configs: every annotation kind it checks, the key
path in each error, and that a dataclass's own checks still run."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from lwm.configs import ConfigError, from_dict


@dataclass
class Inner:
    name: str
    weight: float = 1.0


@dataclass
class Outer:
    steps: int = 1
    lr: float = 1e-3
    flag: bool = False
    betas: tuple[float, float] = (0.9, 0.95)
    mult: tuple[int, ...] = (1, 2)
    lengths: list[int] | None = None
    label: str | None = None
    fields: str | list | None = None
    inner: Inner = field(default_factory=lambda: Inner("a"))
    stages: list[Inner] = field(default_factory=list)
    sources: dict[str, dict] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.steps <= 0:
            raise ValueError(f"steps must be positive, got {self.steps}")


def test_builds_nested_values_and_converts():
    got = from_dict(
        Outer,
        {
            "steps": 3,
            "lr": 2,  # an integer is a number
            "betas": [0.5, 0.9],  # YAML lists become tuples where the field is one
            "mult": [1, 2, 4],
            "lengths": [128],
            "inner": {"name": "b"},
            "stages": [{"name": "s1", "weight": 0.5}],
            "sources": {"text": {"path": "x"}},
        },
        "run",
    )
    assert got == Outer(
        steps=3,
        lr=2.0,
        betas=(0.5, 0.9),
        mult=(1, 2, 4),
        lengths=[128],
        inner=Inner("b"),
        stages=[Inner("s1", 0.5)],
        sources={"text": {"path": "x"}},
    )
    assert isinstance(got.lr, float) and from_dict(Outer, None) == Outer()


@pytest.mark.parametrize(
    "values,message",
    [
        ({"stepz": 1}, r"^run: unknown key\(s\) \['stepz'\] for Outer; expected some of \['betas', "),
        ({"steps": True}, r"^run.steps: expected an integer, got True$"),
        ({"steps": 1.5}, r"^run.steps: expected an integer, got 1.5$"),
        ({"lr": "fast"}, r"^run.lr: expected a number, got 'fast'$"),
        ({"flag": 1}, r"^run.flag: expected true or false, got 1$"),
        ({"betas": [0.9]}, r"^run.betas: expected 2 values, got \[0.9\]$"),
        ({"mult": [1, "x"]}, r"^run.mult\[1\]: expected an integer, got 'x'$"),
        ({"lengths": 128}, r"^run.lengths: expected a list, got 128$"),
        ({"lengths": [1, None]}, r"^run.lengths\[1\]: expected an integer, got None$"),
        ({"label": 3}, r"^run.label: expected a string, got 3$"),
        ({"fields": 3}, r"^run.fields: expected str or list or null, got 3$"),
        ({"inner": {"weight": 2.0}}, r"^run.inner: .*missing 1 required positional argument: 'name'"),
        ({"inner": "b"}, r"^run.inner: expected a mapping of Inner fields, got 'b'$"),
        ({"stages": [{"name": "s", "wieght": 1}]}, r"^run.stages\[0\]: unknown key\(s\) \['wieght'\] for Inner"),
        ({"sources": {"text": 3}}, r"^run.sources.text: expected a mapping, got 3$"),
        ({"steps": 0}, r"^steps must be positive, got 0$"),  # the dataclass's own range check
    ],
)
def test_errors_name_the_key_path(values, message):
    with pytest.raises(ValueError, match=message):
        from_dict(Outer, values, "run")


def test_the_top_level_has_no_prefix():
    with pytest.raises(ConfigError, match=r"^the config: unknown key\(s\) \['x'\]"):
        from_dict(Outer, {"x": 1})
    with pytest.raises(ConfigError, match=r"^inner.name: expected a string, got 1$"):
        from_dict(Outer, {"inner": {"name": 1}})
