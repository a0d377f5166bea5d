"""Issue 24's defects of launching, inference and evaluation on GPUs, checked without one: each rank
on its own GPU (12), no per-token reads of device values or copies between host and device in
decoding (12), a failure on one rank agreed by the whole group (8), and the
post-training needle evaluation started as one process, not as a rank of the run (9)."""

from __future__ import annotations

import subprocess
from collections import Counter

import comm_contract
import pytest
import torch
import torch.distributed as dist
from char_tokenizer import Tok
from comm_contract import HOST, MOVES, HostTensors, _names_device
from torch.utils._python_dispatch import TorchDispatchMode
from video_qa_stubs import StubSource

from lwm import child
from lwm.data.text_tokenizer import TextTokenizer
from lwm.data.vocab import Vocab
from lwm.eval.needle import NeedleGrid
from lwm.eval.needle_grid import run_needle
from lwm.eval.video_qa import run_video_qa
from lwm.eval.vniah_grid import run_vniah
from lwm.infer import GenerationConfig, Generator
from lwm.infer import runtime as runtime_module
from lwm.interop.vqgan_sources import load_vqgan
from lwm.model import ModelConfig, Transformer
from lwm.parallel import launch
from lwm.parallel.launch import LAUNCH_VARIABLES, rank_device, run_distributed
from lwm.paths import REPO
from lwm.synth import make_vniah
from lwm.train.evaluate import evaluate_needles

TORCHRUN = {"WORLD_SIZE": "4", "LOCAL_RANK": "2"}
TOKENIZER = REPO / "data" / "sample" / "tokenizer.model"


# ------------------------------------------------------------------------------------ 12: one GPU per rank


def test_under_torchrun_a_cuda_device_is_the_ranks_own():
    assert rank_device("cuda", TORCHRUN) == "cuda:2" and rank_device("cuda:2", TORCHRUN) == "cuda:2"
    assert rank_device("cpu", TORCHRUN) == "cpu"
    assert rank_device("cuda:1", {}) == "cuda:1" and rank_device("cuda", {"WORLD_SIZE": "1"}) == "cuda"  # one process
    with pytest.raises(
        ValueError, match=r"device cuda:0 under torchrun: this rank's LOCAL_RANK is 2, so its GPU is cuda:2"
    ):
        rank_device("cuda:0", TORCHRUN)
    with pytest.raises(ValueError, match="WORLD_SIZE is 2 but LOCAL_RANK is not set"):
        rank_device("cuda", {"WORLD_SIZE": "2"})


def test_the_ranks_gpu_is_current_before_nccl_starts(monkeypatch):
    calls = []
    for name, value in TORCHRUN.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: calls.append(("set_device", str(d))))
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda backend, **kw: calls.append((backend, str(kw["device_id"]))))
    runtime_module.start("cuda")
    assert calls == [("set_device", "cuda:2"), ("nccl", "cuda:2")]
    calls.clear()
    with pytest.raises(ValueError, match="LOCAL_RANK is 2"):
        runtime_module.start("cuda:0")  # refused before any group starts
    assert calls == []


# ------------------------------------------------------------------------------------ 12: host syncs per token

SYNCS = {torch.ops.aten._local_scalar_dense.default: "read", torch.ops.aten.nonzero.default: "nonzero"}


class DeviceReads(TorchDispatchMode):
    """Reads of a device tensor's values to the host (item, int, nonzero: each waits for the GPU)."""

    def __init__(self, counts: Counter):
        super().__init__()
        self.counts = counts

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in SYNCS and args[0] not in HOST:
            self.counts[SYNCS[func]] += 1
        return func(*args, **(kwargs or {}))


class HostToDevice(HostTensors):
    """Copies between host and device: a host tensor moved to the device, host data made into a device
    tensor, a device tensor read by tolist or copied to the host by project code's .cpu()."""

    def __init__(self, counts: Counter):
        super().__init__()
        self.counts = counts

    def __torch_function__(self, func, types, args=(), kwargs=None):
        first = args[0] if args else None
        if func in MOVES and first in HOST and (func is torch.Tensor.cuda or _names_device(args[1:], kwargs or {})):
            self.counts["to device"] += 1
        elif func is torch.Tensor.tolist and first not in HOST:
            self.counts["read"] += 1
        elif func is torch.Tensor.cpu and first not in HOST and comm_contract._from_project():
            self.counts["to host"] += 1
        return super().__torch_function__(func, types, args, kwargs)


def _traffic(gen: Generator, prompt: list[int], config: GenerationConfig) -> Counter:
    counts = Counter()
    with HostToDevice(counts), DeviceReads(counts):
        gen.generate(prompt, config)
    return counts


KINDS = ("read", "nonzero", "to device", "to host")


@pytest.mark.parametrize("sampling", [{}, {"temperature": 0.8, "top_k": 50}], ids=["greedy", "sampled"])
def test_decoding_makes_no_host_sync_per_token(monkeypatch, sampling):
    """Without stop tokens: the same reads (the new ids, once, at the end) for 4 and 16 new tokens, no
    nonzero, no copy either way per token. With a stop token that does not come: one read of a stop
    flag per stop_check_every tokens. As if the tensors comm_contract does not tag as host tensors
    were on a GPU."""
    monkeypatch.setattr(comm_contract, "PROJECT", ["lwm."])
    vocab = Vocab(256)
    torch.manual_seed(0)
    gen = Generator(Transformer(ModelConfig.from_preset("debug", vocab_size=vocab.size)).eval(), vocab)
    prompt = list(range(3, 40))
    few, many = (_traffic(gen, prompt, GenerationConfig(max_new_tokens=n, **sampling)) for n in (4, 16))
    assert {k: many[k] - few[k] for k in KINDS} == dict.fromkeys(KINDS, 0), (few, many)
    once = {**dict.fromkeys(KINDS, 0), "read": 1, "to device": 1}  # the new ids read, the prompt copied
    assert {k: few[k] for k in KINDS} == once, few

    never = next(t for t in range(vocab.text_size) if t not in gen.generate(prompt, GenerationConfig(20, **sampling)))
    for n, every in [(4, 8), (20, 8), (20, 3)]:
        config = GenerationConfig(max_new_tokens=n, stop_tokens=[never], stop_check_every=every, **sampling)
        counts = _traffic(gen, prompt, config)
        flags = (n - 1) // every  # not at the last token: the ids are read then anyway
        assert {k: counts[k] for k in KINDS} == {**once, "read": 1 + flags}, (n, every, counts)


# ------------------------------------------------------------------------------------ 8: failures agreed


class _Rank1Tok(Tok):
    """Rank 1's tokenizer fails on q2's question: alone, before the group first talks."""

    def encode(self, text):
        if "q2" in text:
            raise ValueError("rank 1 cannot encode q2")
        return super().encode(text)


class _Rank1Generator(Generator):
    """Rank 1 runs out of memory for q3's cache (before the group talks) and fails after q4's
    generation (after the group's last collective)."""

    def _start(self, prompt, reserve):
        if "USER: q3" in Tok().decode(list(prompt)):
            raise torch.OutOfMemoryError("rank 1 has no room for q3's cache")
        return super()._start(prompt, reserve)

    def generate(self, prompt, config=None):
        out = super().generate(prompt, config)
        if "USER: q4" in Tok().decode(list(prompt)):
            raise RuntimeError("rank 1 failed after q4")
        return out


def _qa_worker(rank: int, world: int) -> list[tuple]:
    vocab = Vocab(Tok.vocab_size)
    torch.manual_seed(0)
    model = Transformer(ModelConfig.from_preset("debug", vocab_size=vocab.size)).eval()
    gen = (_Rank1Generator if rank == 1 else Generator)(model, vocab, dist.group.WORLD)
    items = [{"video": "a.mp4", "question": f"q{i} ?", "answer": "x"} for i in range(1, 6)]
    tok = _Rank1Tok() if rank == 1 else Tok()
    result = run_video_qa(gen, tok, vocab, items, StubSource(), max_new_tokens=3, progress=False)
    return [(r["question"], r["error"], r.get("open", {}).get("output")) for r in result["records"]]


def test_a_failure_on_one_rank_is_recorded_by_every_rank_and_the_run_goes_on():
    rank0, rank1 = run_distributed(_qa_worker, 2, timeout=90.0)
    assert [q for q, _, _ in rank0] == [q for q, _, _ in rank1] == [f"q{i} ?" for i in range(1, 6)]
    for i in (0, 4):  # q1, q5: scored alike on both ranks
        assert rank0[i][1] is None and rank1[i][1] is None and rank0[i][2] == rank1[i][2] is not None
    own = {
        1: "ValueError: rank 1 cannot encode q2",
        2: "OutOfMemoryError: rank 1 has no room",
        3: "RuntimeError: rank 1",
    }
    for i, message in own.items():
        assert rank1[i][1].startswith(message), rank1[i]
        assert rank0[i][1].startswith("PeerFailure: another rank of the group failed (rank 1: " + message), rank0[i]


class _OutOfMemoryAt(Generator):
    """Runs out of memory for its cache at its `fail_at`-th prompt, before the group talks."""

    def __init__(self, *args, fail_at: int):
        super().__init__(*args)
        self.fail_at, self.starts = fail_at, 0

    def _start(self, prompt, reserve):
        self.starts += 1
        if self.starts == self.fail_at:
            raise torch.OutOfMemoryError(f"rank 1 has no room for cache {self.fail_at}")
        return super()._start(prompt, reserve)


def _grids_worker(rank: int, world: int, haystack: str) -> dict:
    """Both grids, 2 depths x 2 trials; rank 1 fails alone in the needle grid's first trial and in the
    V-NIAH grid's first trial's second prompt (its log-likelihoods, after the generated answer)."""
    tok = TextTokenizer(TOKENIZER)
    vocab = Vocab(tok.vocab_size)
    torch.manual_seed(0)
    model = Transformer(ModelConfig.from_preset("debug", vocab_size=vocab.size)).eval()
    group = dist.group.WORLD

    def gen(fail_at: int) -> Generator:
        return _OutOfMemoryAt(model, vocab, group, fail_at=fail_at) if rank == 1 else Generator(model, vocab, group)

    needle = run_needle(gen(1), tok, vocab, [200], [0, 50], trials=2, haystack=haystack, max_new_tokens=3)
    vqgan = load_vqgan(make_vniah.DEFAULT_CHECKPOINT).eval()
    vniah = run_vniah(gen(2), tok, vocab, vqgan, [1], [0, 50], trials=2, pool=1, max_new_tokens=2)
    return {
        "needle": [((r["depth"], r["trial"]), r["error"], r["answer"]) for r in needle["trials"]],
        "vniah": [((r["depth"], r["trial"]), r["error"], r.get("ll", {}).get("predicted")) for r in vniah["trials"]],
    }


def test_a_grid_trial_failing_on_one_rank_fails_on_every_rank_and_the_grid_goes_on(tmp_path):
    haystack = tmp_path / "hay.txt"
    haystack.write_text(" ".join(f"Line {i} was quiet and small." for i in range(300)))
    rank0, rank1 = run_distributed(_grids_worker, 2, str(haystack), timeout=60.0)
    for grid, at in [("needle", 1), ("vniah", 2)]:
        ours, theirs = rank0[grid], rank1[grid]
        assert [c for c, _, _ in ours] == [c for c, _, _ in theirs] == [(0.0, 0), (0.0, 1), (50.0, 0), (50.0, 1)]
        own = f"OutOfMemoryError: rank 1 has no room for cache {at}"
        assert theirs[0][1] == own and ours[0][1] == f"PeerFailure: another rank of the group failed (rank 1: {own})"
        for i in (1, 2, 3):  # the same prompts scored alike on both ranks
            assert ours[i][1] is None and theirs[i][1] is None and ours[i][2] == theirs[i][2] is not None, grid


# ------------------------------------------------------------------------------------ 9: needle evaluation alone


def test_the_needle_evaluation_runs_alone_not_as_a_rank(monkeypatch, tmp_path):
    for name in LAUNCH_VARIABLES:
        monkeypatch.setenv(name, "2" if "SIZE" in name else "0")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "run")
    monkeypatch.setenv("KEPT", "yes")
    given = {}

    def fake_run(cmd, **kwargs):
        given.update(kwargs)
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(child.subprocess, "run", fake_run)
    evaluate_needles(NeedleGrid(lengths=[64]), tmp_path / "model", "sp.model", tmp_path / "needle")
    env = given.get("env")
    assert env is not None, "the evaluation inherits torchrun's RANK, WORLD_SIZE, MASTER_ADDR ..."
    assert not {*LAUNCH_VARIABLES, "TORCHELASTIC_RUN_ID"} & set(env) and env["KEPT"] == "yes"
    assert env == launch.single_process_env()
