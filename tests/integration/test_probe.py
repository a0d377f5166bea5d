"""lwm/train/probe.py: the held-out answer probe scores exactly what the full logits say (an answer is right
when every one of its tokens is the argmax), in one process and on an FSDP2 model over a cp 2 ring."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import torch

from lwm.data import Sharding
from lwm.data.example import Encoded
from lwm.model import PRESETS, Transformer
from lwm.parallel import ParallelDims, build_meshes, build_parallel_model, compute_settings
from lwm.parallel.launch import run_distributed
from lwm.train.probe import AnswerProbe, answer_ids


def greedy(model: Transformer, prefix: list[int], n: int) -> list[int]:
    ids = list(prefix)
    for _ in range(n):
        ids.append(int(model(torch.tensor([ids]))[0, -1].argmax()))
    return ids[len(prefix) :]


def example(model, rng, right: list[bool]) -> Encoded:
    """A prompt, then one 3-token answer per entry of `right` (the model's own greedy tokens where True, random
    ones where False) with 2 unscored tokens between, then a scored EOS (not an answer)."""
    tokens, mask = list(rng.integers(5, 500, 8)), [False] * 8
    for r in right:
        tokens += greedy(model, tokens, 3) if r else list(rng.integers(5, 500, 3))
        mask += [True] * 3
        tokens += list(rng.integers(5, 500, 2))
        mask += [False] * 2
    tokens, mask = tokens + [2], mask + [True]
    return Encoded(np.array(tokens, np.int64), np.array(mask), np.zeros(len(tokens), bool))


def reference(model, examples: list[Encoded]) -> float:
    """Right answers over all answers, from the full (L, V) logits of each example."""
    right = total = 0
    for enc in examples:
        logits = model(torch.from_numpy(enc.tokens[None, :-1]))[0]  # (L - 1, V)
        hit = (logits.argmax(-1) == torch.from_numpy(enc.tokens[1:])).numpy()
        ids = answer_ids(enc)[1:]
        for a in range(1, ids.max() + 1):
            right += bool(hit[ids == a].all())
            total += 1
    return right / total


CONFIG = dataclasses.replace(PRESETS["debug"], vocab_size=512)


def scored(model, examples, group=None, sharding=Sharding()) -> tuple[float, int]:
    module = SimpleNamespace(model=model, cp_group=group, parallel=SimpleNamespace(document_mask=True), device="cpu")
    probe = AnswerProbe(config=None, out=None, stage="a", steps=1)
    probe.examples = examples
    return probe.accuracy(module, sharding, "sequence")


def setup():
    torch.manual_seed(0)
    model = Transformer(CONFIG).eval()
    rng = np.random.default_rng(0)
    examples = [example(model, rng, r) for r in ([True, False], [False, False], [True, True], [True])]
    return model, examples


def test_the_probe_scores_what_the_full_logits_say():
    model, examples = setup()
    accuracy, answers = scored(model, examples)
    assert answers == 7
    # greedy answers are right, random ones wrong (a random 3-token answer all argmax: about 1 in 512**3)
    assert accuracy == reference(model, examples) == 4 / 7


def _cp_rank(rank, world):
    """The probe on rank `rank` of an FSDP2 model over a cp 2 ring (striped), the one process's weights."""
    model, examples = setup()
    where = build_meshes(ParallelDims(1, world, 1, "ring"), "cpu", rank)
    settings = compute_settings(torch.device("cpu"), CONFIG.head_dim)
    init = model.state_dict() if rank == 0 else {}
    sharded = build_parallel_model(CONFIG, where, settings, "cpu", init, "striped").eval()
    return scored(sharded, examples, where.cp_group, Sharding(cp_rank=rank, cp_size=world))


def test_the_probe_on_an_fsdp2_model_over_a_cp_2_ring_scores_as_one_process():
    """The probe runs the model's forward, which gathers FSDP2's root parameters (embedding, final norm, head):
    each rank scores the answers as one process does."""
    assert run_distributed(_cp_rank, 2) == [(4 / 7, 7), (4 / 7, 7)]
