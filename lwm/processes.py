"""This host's processes by pid: whether one still runs, and what became of one that does not.

One reading of /proc/<pid>/stat for everyone who asks: a run folder's lock (is its holder gone?), a rank
that lost a peer (dead or stopped?), a loader worker watching its rank (end with it), a test waiting for
processes to end.
"""

from __future__ import annotations

import os

# /proc/<pid>/stat's state letters of a process that is no longer running, in words
DEAD = {"Z": "has died (a zombie)", "X": "has died"}
STOPPED = {"T": "is stopped (SIGSTOP)", "t": "is stopped (traced)"}
GONE = "has died (no such process)"


def _letter(pid: int) -> str | None:
    """The state letter of process `pid` (R, S, D, Z, T, ...), None where there is no such process.
    Without /proc, 'R' for a pid that exists (its state unknown)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]  # the field after the command, which may hold spaces
    except FileNotFoundError:
        return None
    except OSError:  # no /proc: whether the pid exists at all
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:  # another user's: it exists
            pass
        return "R"


def state(pid: int) -> str | None:
    """None while process `pid` runs (or sleeps or waits); else what became of it, in words: dead (gone, or a
    zombie not yet reaped) or stopped."""
    letter = _letter(pid)
    return GONE if letter is None else DEAD.get(letter) or STOPPED.get(letter)


def alive(pid: int) -> bool:
    """Whether process `pid` has not died: a stopped one is alive, a zombie (dead, not yet reaped) is not."""
    letter = _letter(pid)
    return letter is not None and letter not in DEAD
