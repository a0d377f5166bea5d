"""Choosing the next token: greedy or sampled (temperature, top-k), optionally restricted to the
text or the vision range of the vocabulary."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

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
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 is greedy), got {self.temperature}")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k must be >= 1 or None, got {self.top_k}")
        if self.restrict not in RESTRICT:
            raise ValueError(f"restrict must be one of {RESTRICT}, got {self.restrict!r}")
        if self.stop_check_every < 1:
            raise ValueError(f"stop_check_every must be >= 1, got {self.stop_check_every}")


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
    logits = logits / config.temperature
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
