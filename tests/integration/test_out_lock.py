"""lwm.disk.folder_lock: one run per output folder. A second run is refused naming the holder; a holder killed
with SIGKILL leaves a lock the next run takes over; the same where the filesystem has no flock."""

from __future__ import annotations

import errno
import json
import os
import socket
import subprocess
import sys
import time

import pytest

import lwm.disk.folder_lock
from lwm.disk.folder_lock import FolderLocked, output_lock
from lwm.paths import REPO
from lwm.processes import state

ROOT = REPO
HOLD = """import sys
from lwm.disk.folder_lock import output_lock
with output_lock(sys.argv[1], "run"):
    print("held", flush=True)
    sys.stdin.read()
"""


def dead_pid() -> int:
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(proc.stdout)


def test_a_second_run_is_refused_and_a_killed_holders_lock_taken_over(tmp_path, caplog):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(tmp_path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert holder.stdout.readline() == "held\n"
        with pytest.raises(FolderLocked) as e:
            with output_lock(tmp_path, "run"):
                pass
        message = str(e.value)
        assert f"{tmp_path} is in use by another run (pid {holder.pid} on {socket.gethostname()}" in message
        assert "command: " in message and "output_lock" in message  # its command line
        assert e.value.holder["pid"] == holder.pid
        with output_lock(tmp_path, "other"):  # another name locks independently
            pass
    finally:
        holder.kill()  # SIGKILL: no finally runs, the lock file stays
        holder.wait()
    assert json.loads((tmp_path / "run.lock").read_text())["pid"] == holder.pid
    with output_lock(tmp_path, "run") as path:
        assert json.loads(path.read_text())["pid"] == os.getpid()
    assert f"from pid {holder.pid}" in caplog.text  # the takeover is said
    assert not path.exists()  # released on leaving


def test_the_same_process_cannot_take_it_twice_and_a_failing_block_releases(tmp_path):
    with pytest.raises(ZeroDivisionError):
        with output_lock(tmp_path / "new") as path:
            assert path == tmp_path / "new" / "lwm.lock"
            with pytest.raises(FolderLocked, match=f"pid {os.getpid()}"):
                with output_lock(tmp_path / "new"):
                    pass
            1 / 0
    assert not path.exists()
    with output_lock(tmp_path / "new"):
        pass


@pytest.fixture
def no_flock(monkeypatch):
    """A filesystem without locks (NFS without a lock daemon): flock fails with ENOLCK."""

    def flock(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(lwm.disk.folder_lock.fcntl, "flock", flock)


def test_without_flock_a_zombie_holder_holds_nothing(tmp_path, no_flock):
    """A holder that died and is not yet reaped (a zombie) is dead: its lock is taken over (its pid was taken
    for a running one's)."""
    with output_lock(tmp_path) as path:
        pass
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        deadline = time.monotonic() + 10
        while state(child.pid) != "has died (a zombie)" and time.monotonic() < deadline:
            time.sleep(0.02)
        holder = {"pid": child.pid, "host": socket.gethostname(), "command": "lwm-tokenize x", "since": "then"}
        path.write_text(json.dumps(holder))
        with output_lock(tmp_path):
            assert json.loads(path.read_text())["pid"] == os.getpid()
    finally:
        child.wait()


def test_without_flock_the_file_is_the_lock(tmp_path, no_flock, caplog):
    with output_lock(tmp_path) as path:
        with pytest.raises(FolderLocked, match=f"pid {os.getpid()}"):
            with output_lock(tmp_path):
                pass
        assert path.exists()
    assert not path.exists()
    # A dead holder on this host is stale: taken over.
    stale = {"pid": dead_pid(), "host": socket.gethostname(), "command": "lwm-tokenize x", "since": "then"}
    path.write_text(json.dumps(stale))
    with output_lock(tmp_path):
        assert json.loads(path.read_text())["pid"] == os.getpid()
    assert f"from pid {stale['pid']} on {socket.gethostname()}" in caplog.text
    # One on another host cannot be checked: refused, saying what to do.
    path.write_text(json.dumps({**stale, "host": "elsewhere"}))
    with pytest.raises(FolderLocked, match=f"on elsewhere since then, command: lwm-tokenize x.*remove {path}"):
        with output_lock(tmp_path):
            pass
