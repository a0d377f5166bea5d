"""The NCCL communication contract (tests/comm_contract.py) refuses what NCCL would refuse, on a
crafted bad call per rule, and lets good calls through with the right results. Every worker of
run_distributed runs under it (tests/conftest.py), these included."""

from __future__ import annotations

import comm_contract
import numpy as np
import pytest
import torch
import torch.distributed as dist
from comm_contract import HOST

from lwm.parallel.comm import agree_on_failure, broadcast_from_first
from lwm.parallel.launch import run_distributed

CPU = torch.device("cpu")  # the compute device of the gloo tests


def test_host_tensors_are_those_a_gpu_run_keeps_on_the_host(monkeypatch):
    monkeypatch.setattr(comm_contract, "PROJECT", [__name__])  # this module plays project code
    on_device = torch.ones(2)  # made outside: stands for a tensor the caller put on the device
    with comm_contract.contract(CPU):
        host = [
            torch.tensor([1]),  # a factory without device=
            torch.arange(3).float(),  # computed from a host tensor
            on_device.cpu(),
            torch.zeros_like(torch.zeros(1)),  # *_like follows its argument
            torch.from_numpy(np.zeros(2)),
        ]
        device = [
            torch.zeros(2, device=CPU),
            torch.zeros_like(on_device),
            torch.tensor([1]).to(CPU),  # an explicit move
            torch.ones(2).to(on_device),
            on_device + 1,
            torch.as_tensor(on_device),
        ]
        assert dist.all_reduce is not comm_contract.ORIGINALS["all_reduce"]
    assert [t in HOST for t in host] == [True] * len(host)
    assert [t in HOST for t in device] == [False] * len(device)
    assert dist.all_reduce is dist.distributed_c10d.all_reduce and not comm_contract.ORIGINALS  # undone


def _refusals(rank: int) -> dict:
    """Each rule broken once (by every rank, so no rank waits in a collective for another) -> its message."""
    refused = {}

    def expect(case, call):
        try:
            call()
        except comm_contract.ContractError as e:
            refused[case] = str(e)

    expect("host", lambda: dist.all_reduce(torch.tensor([1])))  # as broadcast_from_first did (defect 3)
    expect("host, computed", lambda: dist.all_reduce(torch.arange(4).float()))
    expect("device", lambda: dist.all_reduce(torch.zeros(2, device="meta")))
    expect("dtype int16", lambda: dist.all_reduce(torch.zeros(2, dtype=torch.int16, device=CPU)))
    expect("dtype complex", lambda: dist.broadcast(torch.zeros(2, dtype=torch.complex64, device=CPU), src=0))
    expect("dense", lambda: dist.broadcast(torch.zeros(3, 4, device=CPU).t(), src=0))
    expect("sparse", lambda: dist.all_reduce(torch.eye(2, device=CPU).to_sparse()))
    expect("sizes", lambda: dist.all_gather_single(torch.zeros(3, device=CPU), torch.zeros(2, device=CPU)))
    expect("any source", lambda: dist.recv(torch.zeros(2, device=CPU)))
    if rank == 0:  # rank 0 sends 4 floats; rank 1 posts a receive for 5
        dist.send(torch.ones(4, device=CPU), dst=1)
    else:
        expect("p2p sizes", lambda: dist.irecv(torch.empty(5, device=CPU), src=0))
        comm_contract.ORIGINALS["recv"](torch.empty(4, device=CPU), src=0)  # the message the check refused
    return refused


def _good_calls(rank: int, world: int) -> dict:
    x = torch.tensor([rank + 1.0], device=CPU)
    dist.all_reduce(x)
    peer = (rank + 1) % world, (rank - 1) % world
    got = torch.empty(2, device=CPU)
    ops = [dist.P2POp(dist.isend, torch.full((2,), float(rank), device=CPU), peer[0])]
    for work in dist.batch_isend_irecv(ops + [dist.P2POp(dist.irecv, got, peer[1])]):
        work.wait()
    gathered = torch.empty(world * 2, device=CPU)
    dist.all_gather_single(gathered, torch.full((2,), float(rank), device=CPU))
    parts = [torch.empty(1, device=CPU) for _ in range(world)]
    dist.all_gather(parts, torch.tensor([rank], device=CPU).float())
    swapped = torch.empty(world, device=CPU)
    dist.all_to_all_single(swapped, torch.full((world,), float(rank), device=CPU))
    moved = torch.tensor([rank]).to(CPU)  # made on the host, then moved: fine
    dist.broadcast(moved, src=0)
    box = [{"rank": rank}]
    dist.broadcast_object_list(box, src=0)
    agree_on_failure(None, None, CPU)
    return {
        "all_reduce": x.item(),
        "ring": got.tolist(),
        "gathered": gathered[::2].tolist(),
        "all_gather": [p.item() for p in parts],
        "all_to_all": swapped.tolist(),
        "moved": moved.item(),
        "object": box[0]["rank"],
        "broadcast_from_first": broadcast_from_first(torch.tensor([rank + 5], device=CPU), None).item(),
    }


def _contract_worker(rank: int, world: int) -> dict:
    comm_contract.PROJECT.append(__name__)  # this module's device-less tensors count as host tensors
    installed = dist.isend is not comm_contract.ORIGINALS.get("isend", dist.isend)  # by conftest, in this process
    return {"installed": installed, "refused": _refusals(rank), "good": _good_calls(rank, world)}


def test_each_rule_refuses_its_bad_call_and_good_calls_pass():
    results = run_distributed(_contract_worker, 2, timeout=60.0)
    rules = {  # case -> the rule its message names, and what else it must say
        "host": ("host", "shape (1,), dtype torch.int64, device cpu, strides (1,)"),
        "host, computed": ("host", "dtype torch.float32"),
        "device": ("device", "device meta"),
        "dtype int16": ("dtype", "torch.int16"),
        "dtype complex": ("dtype", "torch.complex64"),
        "dense": ("dense", "strides (1, 4)"),
        "sparse": ("dense", "shape (2, 2)"),
        "sizes": ("sizes", "4 elements"),
        "any source": ("sizes", "any source"),
        "p2p sizes": ("sizes", "rank 0 sent shape (4,), dtype torch.float32; rank 1 receives into shape (5,)"),
    }
    for rank, res in enumerate(results):
        assert res["installed"], rank
        expected = {case for case in rules if case != "p2p sizes" or rank == 1}
        assert set(res["refused"]) == expected, rank
        for case, message in res["refused"].items():
            rule, detail = rules[case]
            assert f"rule '{rule}'" in message and detail in message, (case, message)
        assert res["good"] == {
            "all_reduce": 3.0,
            "ring": [1.0 - rank] * 2,
            "gathered": [0.0, 1.0],
            "all_gather": [0.0, 1.0],
            "all_to_all": [0.0, 1.0],
            "moved": 0,
            "object": 0,
            "broadcast_from_first": 5,
        }, rank
    assert "all_reduce: rule 'host'" in results[0]["refused"]["host"]  # the op is named


def test_outside_workers_nothing_is_checked():
    with pytest.raises(KeyError):
        comm_contract.ORIGINALS["isend"]
