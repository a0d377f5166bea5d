"""Lightning's re-launch of this node's other ranks, watched so that a rank that dies is named.

Lightning's own watch (`_ChildProcessObserver`) polls its child ranks every 5 s and SIGKILLs rank 0 the
moment one has exited non-zero, without a word. That races rank 0's own error, which names the rank it
lost (lwm.train.command): whichever came first decided whether the user read "rank 1 (pid ...) has died"
or saw rank 0 end by signal 9 with nothing said. Here rank 0 gets `grace_s` to end by itself; only then
does the watch say which rank died and end them all, as Lightning's does.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

from lightning.fabric.strategies.launchers.subprocess_script import _ChildProcessObserver
from lightning.fabric.utilities.distributed import _set_num_threads_if_needed
from lightning.pytorch.strategies.launchers.subprocess_script import _SubprocessScriptLauncher


class NamingObserver(_ChildProcessObserver):
    """Watches `children` (ranks 1, 2, ... of this node, in order) from a thread of rank 0 (`main_pid`)."""

    def __init__(self, main_pid: int, children: list[subprocess.Popen], poll_s: float = 1.0, grace_s: float = 10.0):
        super().__init__(main_pid=main_pid, child_processes=children, sleep_period=poll_s)
        self.grace_s = grace_s

    def _run(self) -> bool:
        for proc in self._child_processes:
            proc.poll()
        codes = [proc.returncode for proc in self._child_processes]
        if all(code == 0 for code in codes):
            return True
        dead = [(rank, proc) for rank, proc in enumerate(self._child_processes, 1) if proc.returncode]
        if not dead:
            return False
        time.sleep(self.grace_s)  # rank 0's own error names the rank, and its exit ends this thread
        host = socket.gethostname()
        named = "; ".join(f"rank {r} (pid {p.pid} on {host}) has died (exit code {p.returncode})" for r, p in dead)
        print(
            f"error: rank 0 lost another rank: {named}; ending the run's other processes", file=sys.stderr, flush=True
        )
        self._terminate_all()
        return True


class NamingLauncher(_SubprocessScriptLauncher):
    """Lightning's launcher with the watch above in place of its own."""

    def launch(self, function, *args, trainer=None, **kwargs):
        self.cluster_environment.validate_settings(num_devices=self.num_processes, num_nodes=self.num_nodes)
        if not self.cluster_environment.creates_processes_externally:
            self._call_children_scripts()
            NamingObserver(main_pid=os.getpid(), children=self.procs).start()
        _set_num_threads_if_needed(num_processes=self.num_processes)
        return function(*args, **kwargs)
