"""Run a function on N local processes (gloo, CPU) and collect what each rank returns.

Used by the multi-process tests and benchmarks; handy for trying context parallelism on a laptop.
"""

from __future__ import annotations

import atexit
import gc
import os
import socket
import tempfile
import time
import traceback
from collections.abc import Mapping
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port() -> int:
    """A TCP port free on this machine now, for a process group's rendezvous."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def end_process_groups(wait: bool = True) -> None:
    """The end of a process's torch.distributed: every rank waits for the others (`wait`), so none
    tears its connections down while another still talks, then the groups end. A gloo group whose
    last Python reference goes only as the interpreter shuts down aborts its process ("terminate
    called without an active exception", about one exit in five with a peer under load), so a
    collection of Python's reference cycles is queued for the end of the program, before that
    shutdown: a group kept alive only by a cycle is freed then."""
    if not (dist.is_available() and dist.is_initialized()):
        return
    if wait:
        dist.barrier()
    dist.destroy_process_group()
    if not _collect_at_exit:
        _collect_at_exit.append(atexit.register(gc.collect))


_collect_at_exit: list = []


def _rendezvous(rank: int, world_size: int, out_dir: str, timeout: float = 60.0) -> dist.TCPStore:
    """The group's store: rank 0 binds it to a port the system picks and writes the port to out_dir, where the
    other ranks read it. A port found free beforehand (free_port) can be taken by another process (a gloo
    connection's ephemeral port) before rank 0 binds it: EADDRINUSE, seen under -n 3."""
    port_file = Path(out_dir) / "port"
    if rank == 0:
        store = dist.TCPStore("127.0.0.1", 0, world_size, is_master=True, wait_for_workers=False)
        written = port_file.with_suffix(".tmp")
        written.write_text(str(store.port))
        written.rename(port_file)  # whole, never half-written
        return store
    deadline = time.monotonic() + timeout
    while not port_file.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"rank {rank}: rank 0 named no store port in {timeout}s")
        time.sleep(0.01)
    return dist.TCPStore("127.0.0.1", int(port_file.read_text()), world_size, is_master=False)


def _worker(rank, world_size, out_dir, fn, args, threads, environ):
    os.environ.clear()  # the caller's environment now, not the fork server's from its start
    os.environ.update(environ)
    torch.set_num_threads(threads)
    store = _rendezvous(rank, world_size, out_dir)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(store.port))  # for code that reads them
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size)
    try:
        result = {"ok": fn(rank, world_size, *args)}
    except Exception:  # reported to the parent, which raises it
        result = {"error": traceback.format_exc()}
    torch.save(result, Path(out_dir) / f"rank{rank}.pt")
    end_process_groups(wait="ok" in result)  # a failed rank's peers may never reach the barrier


# Imported once by the fork server, so a worker starts in milliseconds instead of importing torch.
FORKSERVER_PRELOAD = ["torch", "torch.distributed", "lwm.parallel", "lwm.model"]


def _start_method(fresh: bool) -> str:
    """forkserver where the platform has it and a fresh process is not asked for: workers are forked
    from a clean single-threaded server that imported torch once (spawn re-imports it in every
    worker: seconds each on a small machine); spawn otherwise."""
    if fresh or "forkserver" not in mp.get_all_start_methods():
        return "spawn"
    mp.set_forkserver_preload(FORKSERVER_PRELOAD)  # read when the server starts (the first call)
    return "forkserver"


def run_distributed(fn, world_size: int, *args, timeout: float = 300.0, threads: int = 1, fresh: bool = False) -> list:
    """fn(rank, world_size, *args) on each rank (a picklable, importable function); returns the
    per-rank results in rank order. An exception on any rank is raised here with its traceback;
    processes still running after `timeout` seconds are killed. Workers see the caller's environment;
    fresh=True starts each from nothing (spawn), for what a process reads only as it starts (the
    allocator's MALLOC_* settings)."""
    with tempfile.TemporaryDirectory() as out_dir:
        ctx = mp.start_processes(
            _worker,
            args=(world_size, out_dir, fn, args, threads, dict(os.environ)),
            nprocs=world_size,
            join=False,
            start_method=_start_method(fresh),
        )
        deadline = time.monotonic() + timeout
        while not ctx.join(timeout=1.0):
            if time.monotonic() > deadline:
                for proc in ctx.processes:
                    proc.kill()
                raise TimeoutError(f"{world_size} processes running {fn.__name__} did not finish in {timeout}s")
        # The one full unpickle in the project: files the workers just wrote to this call's own
        # temporary folder (any picklable result), never a file handed in from outside.
        results = [torch.load(Path(out_dir) / f"rank{r}.pt", weights_only=False) for r in range(world_size)]
    errors = [f"rank {r}:\n{res['error']}" for r, res in enumerate(results) if "error" in res]
    if errors:
        raise RuntimeError("\n".join(errors))
    return [res["ok"] for res in results]


# What launchers tell a process about its group (torchrun; Lightning's re-launch adds NODE_RANK), and
# what a child started as a single process must not inherit, or it tries to join that group alone.
LAUNCH_VARIABLES = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_NAME",
    "ROLE_WORLD_SIZE",
    "NODE_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
)


def single_process_env(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """environ without LAUNCH_VARIABLES and torchrun's TORCHELASTIC_*: for a child that runs alone."""
    return {k: v for k, v in environ.items() if k not in LAUNCH_VARIABLES and not k.startswith("TORCHELASTIC_")}


def rank_device(device: str, environ: Mapping[str, str] = os.environ) -> str:
    """This process's device: under torchrun (WORLD_SIZE > 1) a CUDA device is the rank's own GPU,
    cuda:LOCAL_RANK ("cuda" becomes it; another index is refused, or every rank would share one GPU);
    otherwise `device` as given."""
    if not device.startswith("cuda") or int(environ.get("WORLD_SIZE", "1")) <= 1:
        return device
    if "LOCAL_RANK" not in environ:
        raise ValueError(
            f"WORLD_SIZE is {environ['WORLD_SIZE']} but LOCAL_RANK is not set; start the ranks with torchrun"
        )
    local = int(environ["LOCAL_RANK"])
    index = torch.device(device).index
    if index is not None and index != local:
        raise ValueError(
            f"device {device} under torchrun: this rank's LOCAL_RANK is {local}, so its GPU is cuda:{local}; "
            "give cuda and each rank takes its own"
        )
    return f"cuda:{local}"


def init_from_env(device: str = "cpu"):
    """Under torchrun (WORLD_SIZE > 1 in the environment): start the default process group and
    return it; a plain single process gets None. For command-line tools. On CPU the group is gloo; on
    CUDA it is nccl on the rank's own GPU (rank_device), made current first: NCCL's object
    collectives and barrier run on the current device."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return None
    if not dist.is_initialized():
        if str(device).startswith("cuda"):
            gpu = torch.device(rank_device(str(device)))
            torch.cuda.set_device(gpu)
            dist.init_process_group("nccl", device_id=gpu)
        else:
            dist.init_process_group("gloo")
    return dist.group.WORLD
