"""A context-parallel group started by a program that torchrun does not launch: lmms-eval runs its model
in the process it was started in, shards requests over torchrun's ranks itself, and calls barriers on
any default process group it finds, so that process must not join one.

    loaded, ranks = start_ranks(ModelOptions(model=DIR), cp=2)   # loaded.model is None: it is in the ranks
    ranks.generate(prompt, config); ranks.score(prompt, continuations)

`start_ranks` spawns `cp` processes (spawned, not forked: the host may hold CUDA or threads), each
loading the model on its own device (cuda:r for rank r, else the host's device) and joining a process
group of their own. The host talks to rank 0 through a pipe: rank 0 broadcasts each call (the method,
the prompt as int32, the rest of its arguments) to the others, every rank makes it on the same prompt
(as the ranks of a torchrun job do, each prefilling its part), and rank 0 sends the result back. A
call that fails on bad input fails alike on every rank: the host gets the error, and the ranks wait for
the next call. The ranks end when the host stops them (at its exit) or is gone (rank 0 reads the end of
the pipe and tells the others).
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import socket
import sys

import numpy as np
import torch
import torch.distributed as dist

from lwm.infer.load import Loaded, model_companions
from lwm.infer.runtime import ModelOptions, Runtime, load_generator

JOIN_S = 60  # how long the host waits for a stopped rank to end


def start_ranks(options: ModelOptions, cp: int, device: str | None = None) -> tuple[Loaded, Ranks]:
    """`cp` ranks running the model of `options`, and what comes with the model (its weights stay there)."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise ValueError(
            f"cp={cp} starts its own {cp} ranks from one process: run the host as one process, not under "
            "torchrun or accelerate launch"
        )
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and torch.cuda.device_count() < cp:
        raise ValueError(f"cp={cp} puts a rank on each GPU, and this host has {torch.cuda.device_count()}")
    loaded = model_companions(options.model, options.tokenizer)  # a bad path is said before anything starts
    with socket.socket() as s:  # a free port for the ranks' store
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    context = multiprocessing.get_context("spawn")
    host_end, rank_end = context.Pipe()
    procs = [
        context.Process(target=_serve, args=(r, cp, port, options, device, rank_end if r == 0 else None), daemon=True)
        for r in range(cp)
    ]
    for p in procs:
        p.start()
    rank_end.close()  # only rank 0 holds it now: its end is the pipe's end
    ranks = Ranks(host_end, procs)
    atexit.register(ranks.close)
    ranks.reply()  # the model loaded on every rank, or why not
    print(f"context parallel over {cp} ranks: processes {[p.pid for p in procs]}", file=sys.stderr)
    return loaded, ranks


class Ranks:
    """The host's end: generate and score as lwm.infer.Generator's, run by every rank."""

    def __init__(self, conn, procs: list):
        self.conn, self.procs = conn, procs

    def generate(self, prompt, config=None) -> list[int]:
        self.conn.send(("generate", np.asarray(prompt, np.int32), config))
        return self.reply()

    def score(self, prompt, continuations: list) -> list[float]:
        self.conn.send(("score", np.asarray(prompt, np.int32), continuations))
        return self.reply()

    def reply(self):
        try:
            ok, value = self.conn.recv()
        except EOFError:
            codes = [p.exitcode for p in self.procs]
            raise RuntimeError(f"the context-parallel ranks ended (exit codes {codes})") from None
        if not ok:
            kind, message = value
            raise (ValueError if kind == "ValueError" else RuntimeError)(message)
        return value

    def close(self) -> None:
        """Stop the ranks (once; also at the host's exit)."""
        procs, self.procs = self.procs, []
        if not procs:
            return
        try:
            self.conn.send(None)
        except OSError:  # rank 0 is gone already
            pass
        for p in procs:
            p.join(JOIN_S)
            if p.is_alive():
                p.terminate()


def _join(rank: int, world: int, port: int, device: str) -> Runtime:
    own = f"cuda:{rank}" if device.startswith("cuda") else device
    url = f"tcp://127.0.0.1:{port}"
    if own.startswith("cuda"):
        torch.cuda.set_device(torch.device(own))  # NCCL's object collectives run on the current device
        dist.init_process_group("nccl", init_method=url, rank=rank, world_size=world, device_id=torch.device(own))
    else:
        dist.init_process_group("gloo", init_method=url, rank=rank, world_size=world)
    return Runtime(own, dist.group.WORLD, rank, world)


def _failure(e: Exception) -> tuple[bool, tuple[str, str]]:
    """A failure as the host raises it: a ValueError (bad input) as itself, anything else named."""
    if isinstance(e, ValueError):
        return False, ("ValueError", str(e))
    return False, (type(e).__name__, f"on a context-parallel rank: {type(e).__name__}: {e}")


def _serve(rank: int, world: int, port: int, options: ModelOptions, device: str, conn) -> None:
    """A rank: load the model, then make every call rank 0 receives from the host, until it sends None."""
    try:
        runtime = _join(rank, world, port, device)
        _, generator = load_generator(options, runtime)
    except Exception as e:
        if conn is not None:
            conn.send(_failure(e))
        raise
    if conn is not None:
        conn.send((True, None))
    while True:
        box = [None]
        if conn is not None:
            try:
                box[0] = conn.recv()
            except EOFError:  # the host is gone
                pass
        dist.broadcast_object_list(box, src=0)
        if box[0] is None:
            break
        name, prompt, rest = box[0]
        try:
            reply = (True, getattr(generator, name)(prompt.tolist(), rest))
        except ValueError as e:  # bad input: alike on every rank, which go on to the next call
            reply = _failure(e)
        except Exception as e:
            if conn is not None:
                conn.send(_failure(e))
            raise
        if conn is not None:
            conn.send(reply)
    dist.destroy_process_group()
