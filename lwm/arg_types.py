"""argparse types shared by the command-line tools: a bad value is refused by argparse itself
("argument --fps: expected a positive number, got '0'"), before any work starts. And a command's parser
built from its config dataclass (option, add_options, from_args; below)."""

from __future__ import annotations

import argparse
import dataclasses
import math
import typing


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _finite(text: str, ok, expected: str) -> float:
    """A finite number that `ok` accepts (nan and inf refused)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and ok(value)):
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
    return value


def positive_float(text: str) -> float:
    return _finite(text, lambda v: v > 0, "a positive number")


def non_negative_float(text: str) -> float:
    """A sampling temperature: 0 for greedy."""
    return _finite(text, lambda v: v >= 0, "a finite number >= 0")


def fraction(text: str) -> float:
    return _finite(text, lambda v: 0 <= v <= 1, "a number from 0 to 1")


SEED_RANGE = (-(1 << 63), 1 << 64)  # what torch.Generator.manual_seed takes


def seed_value(text: str) -> int:
    """An integer torch can seed a generator with, in [-2**63, 2**64)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if not SEED_RANGE[0] <= value < SEED_RANGE[1]:
        raise argparse.ArgumentTypeError(f"expected an integer in [-2**63, 2**64), got {text!r}")
    return value


def seconds(text: str) -> float:
    return _finite(text, lambda v: v >= 0, "a time in seconds >= 0")


def csv_list(text: str) -> list[str]:
    """'a, b,,c' -> ['a', 'b', 'c']"""
    return [t.strip() for t in text.split(",") if t.strip()]


def device_name(text: str) -> str:
    """cpu, cuda or cuda:N, N a GPU of this machine (without one, cuda is refused)."""
    import torch  # only commands that take a device pay for it

    try:
        parsed = torch.device(text)
    except RuntimeError:
        raise argparse.ArgumentTypeError(f"expected cpu, cuda or cuda:N, got {text!r}") from None
    if parsed.type not in ("cpu", "cuda") or (parsed.type == "cpu" and parsed.index not in (None, 0)):
        raise argparse.ArgumentTypeError(f"expected cpu, cuda or cuda:N, got {text!r}")
    if parsed.type == "cuda":
        count = torch.cuda.device_count()
        if count == 0:
            raise argparse.ArgumentTypeError(f"{text!r}: this machine has no CUDA device")
        if parsed.index is not None and parsed.index >= count:
            raise argparse.ArgumentTypeError(
                f"{text!r}: this machine has {count} CUDA device(s), cuda:0..cuda:{count - 1}"
            )
    return text


# ------------------------------------------------------------------------------------ commands as dataclasses
# A command's options are the fields of its config dataclass: `option(...)` puts the argparse settings in a
# field's metadata, add_options builds the parser from the fields and from_args builds the config back from
# the parsed namespace. A field whose type is a dataclass (without option()) adds that dataclass's options,
# so a group of options shared by several commands (the model's, lwm.infer.runtime.ModelOptions) is one type.

_CLI = "lwm.arg_types"  # the metadata key of option()


def option(
    help: str,
    default=dataclasses.MISSING,
    *,
    default_factory=dataclasses.MISSING,
    flag: str | None = None,
    positional: bool = False,
    exclusive: str | None = None,
    **argparse_kwargs,
):
    """A dataclass field that is also a command-line option. flag: the option's name (default: --field-name);
    positional: an argument without a flag; exclusive: a name shared by options that exclude each other;
    argparse_kwargs: type, choices, action, metavar, nargs as for add_argument. A field without a default is a
    required option. The type defaults to int or float when the field's annotation is one of them."""
    spec = {"help": help, "flag": flag, "positional": positional, "exclusive": exclusive, "kwargs": argparse_kwargs}
    return dataclasses.field(default=default, default_factory=default_factory, metadata={_CLI: spec})


def _options(cls) -> list[tuple[dataclasses.Field, type, tuple[str, ...]]]:
    """(field, its type, the attribute path from cls) of every option of cls, nested dataclasses flattened."""
    hints = typing.get_type_hints(cls)
    found = []
    for f in dataclasses.fields(cls):
        if _CLI in f.metadata:
            found.append((f, hints[f.name], (f.name,)))
        elif dataclasses.is_dataclass(hints[f.name]):
            found += [(g, tp, (f.name, *path)) for g, tp, path in _options(hints[f.name])]
    return found


def add_options(parser: argparse.ArgumentParser, cls) -> argparse.ArgumentParser:
    """Add every option of the dataclass cls to parser, in field order (a nested dataclass's where it stands)."""
    groups: dict[str, argparse._MutuallyExclusiveGroup] = {}
    dests: dict[str, str] = {}
    for f, tp, path in _options(cls):
        spec = f.metadata[_CLI]
        if f.name in dests:
            raise TypeError(
                f"{cls.__name__}: option {f.name!r} is declared twice ({dests[f.name]} and {'.'.join(path)})"
            )
        dests[f.name] = ".".join(path)
        kwargs = {"help": spec["help"], **spec["kwargs"]}
        if "type" not in kwargs and "action" not in kwargs and tp in (int, float):
            kwargs["type"] = tp
        if f.default is not dataclasses.MISSING:
            kwargs["default"] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            kwargs["default"] = f.default_factory()
        elif not spec["positional"]:
            kwargs["required"] = True
        target = parser
        if spec["exclusive"]:
            if spec["exclusive"] not in groups:
                groups[spec["exclusive"]] = parser.add_mutually_exclusive_group()
            target = groups[spec["exclusive"]]
        if spec["positional"]:
            target.add_argument(f.name, **kwargs)
        else:
            target.add_argument(spec["flag"] or "--" + f.name.replace("_", "-"), dest=f.name, **kwargs)
    return parser


def from_args(cls, args: argparse.Namespace):
    """The config cls of a namespace that add_options(parser, cls) parsed (nested dataclasses rebuilt)."""
    hints = typing.get_type_hints(cls)
    values = {}
    for f in dataclasses.fields(cls):
        if _CLI in f.metadata:
            values[f.name] = getattr(args, f.name)
        elif dataclasses.is_dataclass(hints[f.name]):
            values[f.name] = from_args(hints[f.name], args)
    return cls(**values)


def to_argv(config) -> list[str]:
    """The command line that gives `config` back through add_options and from_args: its options that
    differ from their defaults, in field order (printed where one command runs another, so the user
    can run the same)."""
    argv: list[str] = []
    for f, _, path in _options(type(config)):
        value = config
        for name in path:
            value = getattr(value, name)
        spec = f.metadata[_CLI]
        if f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = f.default
        if value == default:
            continue
        words = [value] if not isinstance(value, (list, tuple)) else list(value)
        if isinstance(value, bool):
            words = []  # a switch: store_true or store_false
        flag = [] if spec["positional"] else [spec["flag"] or "--" + f.name.replace("_", "-")]
        argv += flag + [f"{w:g}" if isinstance(w, float) else str(w) for w in words]
    return argv
