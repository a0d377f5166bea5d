"""lwm/train/probe.py: the held-out answer probe scores exactly what the full logits say (an answer is right
when every one of its tokens is the argmax)."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import torch

from lwm.data import Sharding
from lwm.data.example import Encoded
from lwm.model import PRESETS, Transformer
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


def test_the_probe_scores_what_the_full_logits_say():
    model = Transformer(dataclasses.replace(PRESETS["debug"], vocab_size=512)).eval()
    rng = np.random.default_rng(0)
    examples = [example(model, rng, r) for r in ([True, False], [False, False], [True, True], [True])]
    module = SimpleNamespace(model=model, cp_group=None, parallel=SimpleNamespace(document_mask=True), device="cpu")
    probe = AnswerProbe(config=None, out=None, stage="a", steps=1)
    probe.examples = examples
    accuracy, answers = probe.accuracy(module, Sharding(), "sequence")
    assert answers == 7
    # greedy answers are right, random ones wrong (a random 3-token answer all argmax: about 1 in 512**3)
    assert accuracy == reference(model, examples) == 4 / 7
