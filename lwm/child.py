"""A command's run(config) in a process of its own, for a caller that must not share its process
with it: training's evaluation runs after a possibly multi-process run, whose process group and
launcher variables would make the command one more rank. The function and the config travel as
JSON on the child's stdin: the function and the config's dataclass by their names (only lwm's own
modules), the config's fields as plain values rebuilt by lwm.configs.from_dict, so nothing is
unpickled. The exit status is run's.

    code = run_in_child(needle.run, config, env=single_process_env())
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import subprocess
import sys
from typing import BinaryIO, Callable, Mapping

from lwm.configs import from_dict


def _name(obj) -> str:
    return f"{obj.__module__}:{obj.__qualname__}"


def _resolve(name: str):
    """A module-level object of lwm named "module:qualname", or a ValueError."""
    module, _, qualname = name.partition(":")
    if not (module == "lwm" or module.startswith("lwm.")) or not qualname or "." in qualname:
        raise ValueError(f"lwm.child runs lwm's own module-level functions and configs, got {name!r}")
    return getattr(importlib.import_module(module), qualname)


def run_in_child(
    run: Callable[[object], int] | str, config, env: Mapping[str, str] | None = None, stderr: BinaryIO | None = None
) -> int:
    """run(config) in `python -m lwm.child` with environment `env` (None: this one's) -> its exit status.
    run must be a module-level function of lwm, or its name "module:qualname" (a package above the caller's,
    run as a program of its own: the preflight's planner), and config one of lwm's config dataclasses. stderr:
    a binary file the child's standard error goes to (None: this process's)."""
    name = run if isinstance(run, str) else _name(run)
    message = {"run": name, "config": _name(type(config)), "values": dataclasses.asdict(config)}
    payload = json.dumps(message, default=str).encode()  # paths as text, as from_dict reads them
    return subprocess.run([sys.executable, "-m", "lwm.child"], input=payload, env=env, stderr=stderr).returncode


def main() -> int:
    message = json.loads(sys.stdin.buffer.read())
    config = from_dict(_resolve(message["config"]), message["values"], "config")
    return _resolve(message["run"])(config)


if __name__ == "__main__":
    sys.exit(main())
