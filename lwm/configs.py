"""Typed configs from plain dicts: the one builder both training runs (train.py, train_vqgan.py) use
to turn a composed Hydra config into their dataclasses.

    trainer = from_dict(TrainerConfig, {"devices": 2}, "trainer")

Every field is checked against its annotation (int, float, str, bool, None, unions, list, tuple,
dict and nested dataclasses, recursively); an unknown key or a value of the wrong type is a
ConfigError that names the key path and what was expected. Lists become tuples where the field is
a tuple. A float must be finite (nan and inf are refused for every field: no option means
them). Range checks stay in each dataclass's __post_init__, which runs as usual.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from functools import cache
from pathlib import PurePath
from typing import Any, Union


class ConfigError(ValueError):
    """A config value that does not fit its field: `path: reason`."""


def from_dict(cls, values: Any, where: str = ""):
    """cls built from `values` (a dict, None for all defaults, or already a cls); `where` is its key
    path in the whole config ("" for the top)."""
    if isinstance(values, cls):
        return values
    if values is None:
        values = {}
    if not isinstance(values, dict):
        raise ConfigError(f"{where or 'the config'}: expected a mapping of {cls.__name__} fields, got {values!r}")
    hints = _hints(cls)
    known = [f.name for f in dataclasses.fields(cls) if f.init]
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise ConfigError(
            f"{where or 'the config'}: unknown key(s) {unknown} for {cls.__name__}; expected some of {sorted(known)}"
        )
    kwargs = {k: _convert(hints[k], v, _join(where, k)) for k, v in values.items()}
    try:
        return cls(**kwargs)
    except TypeError as e:  # a required field left out
        raise ConfigError(f"{where or 'the config'}: {e}") from None


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


@cache
def _hints(cls) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _name(tp) -> str:
    return tp.__name__ if isinstance(tp, type) and not typing.get_args(tp) else str(tp).replace("typing.", "")


def _convert(tp, value: Any, where: str):
    if tp is Any:
        return value
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (Union, types.UnionType):
        options = [a for a in args if a is not type(None)]
        if value is None:
            if len(options) < len(args):
                return None
        elif len(options) == 1:  # X | None: X's own message, which may name an item inside
            return _convert(options[0], value, where)
        else:
            for arg in options:
                try:
                    return _convert(arg, value, where)
                except ConfigError:
                    pass
        expected = " or ".join("null" if a is type(None) else _name(a) for a in args)
        raise ConfigError(f"{where}: expected {expected}, got {value!r}")
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value, where)
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        if origin is list:
            return [_convert(args[0], v, f"{where}[{i}]") for i, v in enumerate(value)] if args else list(value)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_convert(args[0], v, f"{where}[{i}]") for i, v in enumerate(value))
        if args and len(value) != len(args):
            raise ConfigError(f"{where}: expected {len(args)} values, got {list(value)!r}")
        return tuple(_convert(a, v, f"{where}[{i}]") for i, (a, v) in enumerate(zip(args, value))) if args else value
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {value!r}")
        return {k: _convert(args[1], v, _join(where, k)) for k, v in value.items()} if args else dict(value)
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        try:
            number = float(value)
        except OverflowError:  # an integer past float's range
            number = math.inf
        if not math.isfinite(number):
            raise ConfigError(f"{where}: expected a finite number, got {value!r}")
        return number
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {value!r}")
        return value
    if isinstance(tp, type) and issubclass(tp, PurePath):
        if not isinstance(value, (str, PurePath)):
            raise ConfigError(f"{where}: expected a path, got {value!r}")
        return tp(value)
    if tp in (list, dict) and not isinstance(value, tp):
        raise ConfigError(f"{where}: expected a {'list' if tp is list else 'mapping'}, got {value!r}")
    return value  # anything else (a class the config does not describe) is the dataclass's own to check
