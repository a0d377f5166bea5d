"""One run per output folder: a lock file in the folder that names its holder.

    from lwm.disk.folder_lock import FolderLocked, output_lock

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
folder until a person removes the file (the message says so); two runs taking over one stale file
at the same instant can both win there, a gap flock does not have. A full disk while the holder is
written raises lwm.disk.writes.NoSpaceLeft.
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

from lwm.disk.writes import writes_to
from lwm.processes import alive

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
    for attempt in range(tries):
        if attempt:
            time.sleep(0.05)
        try:
            record = json.loads(path.read_text())
            if isinstance(record, dict):
                return record
        except (OSError, ValueError):
            pass
    return {}


def _dead_here(holder: dict) -> bool:
    """Whether the holder ran on this host and its pid is gone."""
    if holder.get("host") != socket.gethostname() or not isinstance(holder.get("pid"), int):
        return False
    return not alive(holder["pid"])


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path))
    except FileNotFoundError:
        return False


def _open(path: Path) -> tuple[int, bool]:
    """(descriptor, whether this call created the file)."""
    while True:
        try:
            return os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644), True
        except FileExistsError:
            pass
        try:
            return os.open(path, os.O_RDWR), False
        except FileNotFoundError:  # its holder removed it meanwhile
            pass


def _take(path: Path) -> int:
    """The lock file's descriptor, flocked where the filesystem has locks; FolderLocked if held."""
    while True:
        fd, created = _open(path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            locks = True
        except OSError as e:
            if e.errno not in _NO_LOCKS:
                os.close(fd)
                if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                    raise FolderLocked(path, _holder(path)) from None
                raise
            locks = False
        if locks and not _same_file(fd, path):
            os.close(fd)  # its holder removed it between our open and flock: lock the new file
            continue
        if created:
            return fd
        holder = _holder(path, tries=1 if locks else 20)
        if not locks and not _dead_here(holder):  # without flock the file is the lock
            os.close(fd)
            raise FolderLocked(path, holder, f"if no run uses the folder any more, remove {path}")
        log.warning(
            "taking over %s from pid %s on %s, which ended without releasing it",
            path,
            holder.get("pid"),
            holder.get("host"),
        )
        if locks:
            return fd
        os.close(fd)
        path.unlink(missing_ok=True)  # and create it again


def _write_holder(fd: int, path: Path) -> None:
    with writes_to(path):
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(_me()).encode(), 0)
        os.fsync(fd)


@contextmanager
def output_lock(folder: str | Path, name: str = "lwm") -> Iterator[Path]:
    """Hold `folder/<name>.lock` for the block (the folder is made if missing); see the module docstring.
    Yields the lock file's path."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.lock"
    fd = _take(path)
    try:
        _write_holder(fd, path)
        yield path
    finally:
        if _same_file(fd, path):  # never another run's file (made after a takeover)
            path.unlink()  # while still locked: a run that opened it meanwhile sees it gone and retries
        os.close(fd)
