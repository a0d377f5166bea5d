"""Choosing the next token: greedy or sampled (temperature, top-k), optionally restricted to the
text or the vision range of the vocabulary."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field

import torch

from lwm.arg_types import SEED_RANGE
from lwm.data.vocab import Vocab

RESTRICT = (None, "text", "vision")


@dataclass
class GenerationConfig:
    max_new_tokens: int = 64
    temperature: float = 0.0  # 0: greedy
    top_k: int | None = None
    stop_tokens: list[int] = field(default_factory=list)  # generation ends after one of these (not returned)
    restrict: str | None = None  # "text": text ids (+ stop tokens); "vision": codes, <eof>, <eov>, </vision>
    seed: int = 0
    # Whether a stop token came is read to the host once every this many tokens (the only read while
    # decoding): up to this many - 1 tokens past a stop are computed and dropped; 1 reads every token.
    stop_check_every: int = 8

    def __post_init__(self) -> None:
        check_integer("max_new_tokens", self.max_new_tokens, 1)
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, numbers.Real) or not math.isfinite(t) or t < 0:
            raise ValueError(f"temperature must be >= 0 (0 is greedy) and finite, got {t!r}")
        if self.top_k is not None:
            check_integer("top_k", self.top_k, 1, "or None")
        if self.restrict not in RESTRICT:
            raise ValueError(f"restrict must be one of {RESTRICT}, got {self.restrict!r}")
        s = self.seed
        if isinstance(s, bool) or not isinstance(s, numbers.Integral) or not SEED_RANGE[0] <= s < SEED_RANGE[1]:
            raise ValueError(f"seed must be an integer in [-2**63, 2**64) (what torch seeds with), got {s!r}")
        check_integer("stop_check_every", self.stop_check_every, 1)


def check_integer(name: str, value, minimum: int, more: str = "") -> None:
    """Raises ValueError naming the field unless value is an integer (not a bool) >= minimum."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{name} must be >= {minimum}{' ' + more if more else ''} (an integer), got {value!r}")


def allowed_ids(vocab: Vocab, restrict: str | None, stop_tokens: list[int], device="cpu") -> torch.Tensor:
    """A boolean mask (vocab.size,) on `device` of the ids that may be generated (restrict None: all used ids).
    Built once per generation on the logits' device, so no token pays a copy."""
    mask = torch.zeros(vocab.size, dtype=torch.bool, device=device)
    if restrict is None:
        mask[: vocab.used_size] = True
    elif restrict == "text":
        mask[: vocab.text_size] = True
    else:
        mask[vocab.vision_offset : vocab.eof] = True
        mask[[vocab.eof, vocab.eov, vocab.vision_end]] = True
    mask[list(stop_tokens)] = True
    return mask


def next_token(
    logits: torch.Tensor, config: GenerationConfig, allowed: torch.Tensor, generator: torch.Generator
) -> torch.Tensor:
    """logits (V,) of the last position, allowed (vocab.size,) on their device, `generator` on that device too
    -> the chosen id (1,) on that device. Nothing is read to the host: decoding makes no host sync per token."""
    logits = logits.float().masked_fill(~allowed[: logits.shape[-1]], float("-inf"))
    if config.temperature == 0:
        return logits.argmax(-1, keepdim=True)
    # shifted so the largest is 0 before dividing: a tiny temperature gives -inf (probability 0), never
    # inf - inf = nan, and tends to greedy; one below float32's normal range divides as the smallest normal,
    # the same limit: where the CPU flushes denormals (trainer.flush_denormal) it would read as 0, and 0 / 0 = nan
    logits = (logits - logits.max()) / max(config.temperature, torch.finfo(torch.float32).tiny)
    if config.top_k is not None and config.top_k < logits.numel():
        kth = torch.topk(logits, config.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return draw(torch.softmax(logits, dim=-1), generator)


def draw(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One id (1,) drawn from probs (V,): argmax(p / q) with q ~ Exp(1), which is how torch.multinomial
    draws one sample (the same draws for the same generator), without the validity checks that some
    torch versions read to the host."""
    q = torch.empty_like(probs).exponential_(1, generator=generator)  # (V,)
    return (probs / q).argmax(-1, keepdim=True)
