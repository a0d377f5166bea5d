"""Who the other ranks are, so a rank whose collective fails can say which one it lost.

A collective with a dead rank ends in the backend's own error ("Connection reset by peer", a
timeout), which names an address at most. Each rank posts its pid and host in the process group's
store once the group is up (`register`); a rank whose step fails then looks at the others
(`lost`): a process of this host that is gone, a zombie or stopped is named; one on another host
cannot be looked at from here and is listed as such.
"""

from __future__ import annotations

import json
import os
import socket
from datetime import timedelta

import torch.distributed as dist

from lwm.processes import state

_peers: dict[int, dict] = {}  # rank -> {"pid", "host"}, this process's view after register()
_KEY = "lwm/peer/{}"


def register(timeout_s: float = 600.0) -> None:
    """Post this rank's pid and host, and read every rank's, waiting up to timeout_s for the last one (all
    ranks call it once the default group is up). Backends without a real store (the planner's fake group)
    are skipped."""
    if not dist.is_available() or not dist.is_initialized() or dist.get_backend() not in ("gloo", "nccl"):
        return
    store = dist.distributed_c10d._get_default_store()
    rank, world = dist.get_rank(), dist.get_world_size()
    store.set(_KEY.format(rank), json.dumps({"pid": os.getpid(), "host": socket.gethostname()}))
    keys = [_KEY.format(r) for r in range(world)]
    store.wait(keys, timedelta(seconds=timeout_s))
    _peers.clear()
    _peers.update({r: json.loads(store.get(k)) for r, k in enumerate(keys)})


def lost() -> str | None:
    """The other ranks that are dead or stopped, in words; None when none is known to be."""
    if not _peers:
        return None
    me, host = os.getpid(), socket.gethostname()
    dead, unseen = [], []
    for rank, peer in sorted(_peers.items()):
        if peer["pid"] == me and peer["host"] == host:
            continue
        if peer["host"] != host:
            unseen.append(f"{rank} ({peer['host']})")
            continue
        what = state(peer["pid"])
        if what:
            dead.append(f"rank {rank} (pid {peer['pid']} on {host}) {what}")
    if not dead:
        return None
    return "; ".join(dead) + (f"; ranks on other hosts not checked: {', '.join(unseen)}" if unseen else "")
