"""A command's run(config) in a process of its own, for a caller that must not share its process
with it: training's evaluation runs after a possibly multi-process run, whose process group and
launcher variables would make the command one more rank. The function and its config travel
pickled on the child's stdin (parent to child, nothing else reads them); the exit status is run's.

    code = run_in_child(needle.run, config, env=single_process_env())
"""

from __future__ import annotations

import pickle
import subprocess
import sys
from typing import Callable, Mapping


def run_in_child(run: Callable[[object], int], config, env: Mapping[str, str] | None = None) -> int:
    """run(config) in `python -m lwm.child` with environment `env` (None: this one's) -> its exit status.
    run must be a module-level function (pickled by its name) and config picklable."""
    payload = pickle.dumps((run, config))
    return subprocess.run([sys.executable, "-m", "lwm.child"], input=payload, env=env).returncode


def main() -> int:
    run, config = pickle.load(sys.stdin.buffer)
    return run(config)


if __name__ == "__main__":
    sys.exit(main())
