"""One run per output folder: a lock file in the folder that names its holder.

    from lwm.out_lock import FolderLocked, output_lock

    with output_lock(out_dir, "train"):    # FolderLocked if a live run holds out_dir/train.lock
        ...                                # the run; on leaving, the lock is released and its file removed

A second `output_lock` on the same folder and name, from another process or this one, raises
FolderLocked (a RuntimeError) whose message names the holder's pid, host, start time and command
line; `.holder` is that record ({"pid", "host", "command", "since"}) and `.path` the lock file.
Different names lock independently (lwm-tokenize takes one per shard).

How: the lock file is opened and locked with flock, which the kernel drops when its holder dies in
any way (SIGKILL included), so the file a killed run leaves is taken over by the next one (with a
warning naming the old holder). Linux carries flock over NFS as an NFS lock. Where a filesystem has
no locks (ENOLCK: NFS without a lock daemon), the file itself is the lock, created with O_EXCL; then
a holder whose pid is dead on this host is stale and taken over, and one on another host keeps the
folder until a person removes the file (the message says so).
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import shlex
import socket
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

log = logging.getLogger(__name__)

# flock errors that mean "this filesystem has no locks", not "someone holds it"
_NO_LOCKS = frozenset({errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS})


class FolderLocked(RuntimeError):
    """The output folder is held by another run; the message names it."""

    def __init__(self, path: Path, holder: dict, hint: str = "wait for it to end, or use another output folder"):
        self.path, self.holder = path, holder
        who = (
            f"pid {holder.get('pid')} on {holder.get('host')} since {holder.get('since')}, command: {holder.get('command')}"
            if holder
            else f"holder unknown ({path} is empty or not JSON)"
        )
        super().__init__(f"{path.parent} is in use by another run ({who}); {hint}")


def _me() -> dict:
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "command": shlex.join(sys.orig_argv),
        "since": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def _holder(path: Path, tries: int = 20) -> dict:
    """The record in a lock file; a holder may be writing it right now, so an empty file is read again."""
    for _ in range(tries):
        try:
            record = json.loads(path.read_text())
            if isinstance(record, dict):
                return record
        except (OSError, ValueError):
            pass
        time.sleep(0.05)
    return {}


def _dead_here(holder: dict) -> bool:
    """Whether the holder ran on this host and its pid is gone."""
    if holder.get("host") != socket.gethostname() or not isinstance(holder.get("pid"), int):
        return False
    try:
        os.kill(holder["pid"], 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's
        return False
    return False


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path))
    except FileNotFoundError:
        return False


def _take_flock(path: Path) -> int | None:
    """The locked file's descriptor; None where the filesystem has no locks."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno in _NO_LOCKS:
                return None
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise FolderLocked(path, _holder(path)) from None
            raise
        if _same_file(fd, path):
            return fd
        os.close(fd)  # its holder removed it between our open and flock: lock the new file


def _take_exclusive(path: Path, me: dict) -> None:
    """The lock without flock: the file exists only while held; a dead holder's file is removed."""
    while True:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            holder = _holder(path)
            if not _dead_here(holder):
                hint = f"if no run uses the folder any more, remove {path}"
                raise FolderLocked(path, holder, hint) from None
            log.warning("taking over %s: its holder, pid %s, is dead", path, holder["pid"])
            path.unlink(missing_ok=True)
            continue
        with os.fdopen(fd, "w") as f:
            json.dump(me, f)
            f.flush()
            os.fsync(f.fileno())
        return


@contextmanager
def output_lock(folder: str | Path, name: str = "lwm") -> Iterator[Path]:
    """Hold `folder/<name>.lock` for the block (the folder is made if missing); see the module docstring.
    Yields the lock file's path."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path, me = folder / f"{name}.lock", _me()
    fd = _take_flock(path)
    if fd is None:
        _take_exclusive(path, me)
    else:
        previous = _holder(path, tries=1)
        if previous:
            log.warning(
                "taking over %s from pid %s on %s, which ended without releasing it",
                path,
                previous.get("pid"),
                previous.get("host"),
            )
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(me).encode(), 0)
        os.fsync(fd)
    try:
        yield path
    finally:
        if fd is None:
            if _holder(path, tries=1) == me:  # never remove a file another run made after a takeover
                path.unlink(missing_ok=True)
        else:
            if _same_file(fd, path):
                path.unlink()
            os.close(fd)
