"""lwm.processes: what a process of this host is, read from /proc, as a run folder's lock, a rank that lost a
peer and a loader worker watching its rank each ask; a child of this test stopped, killed and reaped."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from lwm.processes import GONE, alive, state


def wait_for(pid: int, what: str | None) -> str | None:
    deadline = time.monotonic() + 10
    while state(pid) != what and time.monotonic() < deadline:
        time.sleep(0.02)
    return state(pid)


def test_running_stopped_zombie_and_gone():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert state(child.pid) is None and alive(child.pid)
        os.kill(child.pid, signal.SIGSTOP)
        assert wait_for(child.pid, "is stopped (SIGSTOP)") == "is stopped (SIGSTOP)"
        assert alive(child.pid)  # stopped is not dead: a loader worker keeps waiting for its rank
        os.kill(child.pid, signal.SIGKILL)
        # dead, not yet reaped by this process: gone for everyone who asks
        assert wait_for(child.pid, "has died (a zombie)") == "has died (a zombie)"
        assert not alive(child.pid)
    finally:
        child.kill()
        child.wait()
    assert state(child.pid) == GONE and not alive(child.pid)
    assert state(os.getpid()) is None and alive(os.getpid())
