"""Generation over a prompt spread across a context-parallel group (or on one process).

    gen = Generator(model, vocab, group)            # group: the cp process group, or None
    new_ids = gen.generate(prompt_ids, GenerationConfig(max_new_tokens=32, stop_tokens=[eos]))
    logprobs = gen.score(prompt_ids, [option_a_ids, option_b_ids])

Prefill: with N > 1 ranks, the largest part of the prompt that the layout can split (a multiple
of N, 2N for zigzag, leaving at least the last token) runs through ring attention, each rank on
its own slice; the rest, and every generated token, runs on all ranks as an `extend` step whose
queries attend to all ranks' cache slices. The ring part runs in segments of `prefill_chunk` tokens
per rank (each segment's ring attention merged with a ring pass over the earlier segments' cache
slices); with one process the prompt is prefilled in chunks of `prefill_chunk` tokens. Either way
activations stay bounded however long the prompt is. Every rank ends
with the same logits; sampled tokens are taken from the group's first rank. Decoding reads nothing
to the host per token: the tokens stay on the device until generation ends, and whether a stop
token came is read once every `GenerationConfig.stop_check_every` tokens.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from lwm.data.vocab import Vocab
from lwm.infer.cache import KVCache
from lwm.infer.sampling import GenerationConfig, allowed_ids, next_token
from lwm.parallel.comm import agree_on_failure, broadcast_from_first
from lwm.parallel.layout import positions as layout_positions
from lwm.parallel.layout import ring_parts, shard


class Generator:
    def __init__(
        self, model, vocab: Vocab, group=None, layout: str = "striped", prefill_chunk: int = 8192, backend: str = "auto"
    ):
        if model.config.vocab_size < vocab.used_size:
            raise ValueError(
                f"the model has {model.config.vocab_size} vocabulary rows but the vocabulary uses "
                f"{vocab.used_size} ids (text {vocab.text_size} + vision + specials)"
            )
        if prefill_chunk < 1:
            raise ValueError(f"prefill_chunk must be >= 1, got {prefill_chunk}")
        self.model, self.vocab = model.eval(), vocab
        self.group, self.layout, self.prefill_chunk, self.backend = group, layout, prefill_chunk, backend
        self.cache: KVCache | None = None
        self._original_attention = model.attention_fns()

    def release(self) -> None:
        """Drop the cache and give the model back its own attention (generate and score do this
        when they return; prefill and extend leave the cache attached for more extend calls)."""
        self.cache = None
        self.model.set_attention(self._original_attention)

    @property
    def device(self) -> torch.device:
        return self.model.head_weight.device

    def _ids(self, ids) -> torch.Tensor:
        ids = torch.as_tensor(ids, dtype=torch.long).flatten()
        if ids.numel() == 0:
            raise ValueError("the prompt is empty")
        if int(ids.min()) < 0 or int(ids.max()) >= self.model.config.vocab_size:
            raise ValueError(
                f"token ids must lie in [0, {self.model.config.vocab_size}), got [{int(ids.min())}, {int(ids.max())}]"
            )
        return ids.to(self.device)

    @torch.no_grad()
    def extend(self, ids, all_logits: bool = False) -> torch.Tensor:
        """Run new tokens after what is cached -> logits (L, V), or (1, V) of the last one."""
        return self._extend(self._ids(ids), all_logits)

    def _extend(self, ids: torch.Tensor, all_logits: bool = False) -> torch.Tensor:
        """extend of checked ids (L,) on the device."""
        pos = self.cache.start_extend(ids.numel(), self.device)
        h = self.model.hidden(ids[None], pos)[0]  # (L, dim)
        return self.model.logits(h if all_logits else h[-1:]).float()  # (L or 1, V)

    @torch.no_grad()
    def prefill(self, prompt, reserve: int = 0) -> torch.Tensor:
        """A fresh cache holding the prompt -> logits (V,) after its last token. `reserve`: room
        for that many more tokens, allocated now."""
        return self._fill(self._start(prompt, reserve))

    def _start(self, prompt, reserve: int) -> torch.Tensor:
        """What a rank does alone before a prefill: the prompt checked and on the device, a fresh
        cache with room for it and `reserve` more tokens."""
        prompt = self._ids(prompt)
        self.cache = cache = KVCache(self.model, self.group, self.layout, self.backend)
        cache.reserve(self._kv_like(), -(-(prompt.numel() + reserve) // cache.world_size) + 1)
        return prompt

    def _meet(self) -> None:
        """generate and score meet here before the group first talks. A rank that failed alone before
        (a bad prompt, the cache out of memory) raised instead, and tells the others in its caller's
        agree_on_failure round (lwm.parallel.comm.run_agreed, around each item or trial of the
        evaluations), which meets this one, so they raise PeerFailure instead of waiting for it in the
        ring; without such a caller its process ends and torchrun stops the others. A rank failing
        later, inside a collective, is not covered."""
        agree_on_failure(None, self.group, self.device)

    def _fill(self, prompt: torch.Tensor) -> torch.Tensor:
        """The prompt (S,) into the fresh cache -> logits (V,) after its last token."""
        S, cache = prompt.numel(), self.cache
        N, rank = cache.world_size, cache.rank
        unit = ring_parts(N, self.layout)
        ring = 0 if N == 1 else (S - 1) // unit * unit
        segment = max(unit, self.prefill_chunk * N // unit * unit)  # at most prefill_chunk tokens per rank
        for start in range(0, ring, segment):
            part = prompt[start : min(ring, start + segment)]
            cache.start_prefill(part.numel())
            local = shard(part, 0, rank, N, self.layout)  # this rank's slice of the segment
            pos = start + layout_positions(part.numel(), rank, N, self.layout, device=self.device)
            self.model.hidden(local[None], pos)
        logits = None
        for start in range(ring, S, self.prefill_chunk):
            logits = self._extend(prompt[start : start + self.prefill_chunk])
        return logits[-1]

    def _kv_like(self) -> torch.Tensor:
        c = self.model.config
        w = self.model.layers[0].attn.wk.weight
        return torch.empty(1, c.n_kv_heads, 0, c.head_dim, dtype=w.dtype, device=w.device)

    @torch.no_grad()
    def prefill_rows(self, prompts: list, reserve: int = 0) -> torch.Tensor:
        """Prompts of any lengths, each prefilled as `prefill` does, then stacked into one cache of B rows
        (KVCache.stack): B = len(prompts). -> logits (B, V) after each prompt's last token. Then extend_rows
        runs the same new tokens on every row, each at its own positions."""
        prompts = [self._ids(p) for p in prompts]
        caches, logits = [], []
        for i, prompt in enumerate(prompts):
            self._start(prompt, reserve=reserve if len(prompts) == 1 else 0)  # stacked: stack makes the room
            if i == 0:
                self._meet()
            logits.append(self._fill(prompt))
            caches.append(self.cache)
        for other in caches[1:]:
            caches[0].stack(other, reserve=-(-reserve // caches[0].world_size) + 1)
        self.cache = caches[0]
        return torch.stack(logits)  # (B, V)

    @torch.no_grad()
    def extend_rows(self, ids: torch.Tensor) -> torch.Tensor:
        """ids (n,) on the device, the same new tokens for every row of the cache -> logits (B, V) after the last."""
        B = 1 if self.cache.offsets is None else len(self.cache.offsets)
        pos = self.cache.start_extend(ids.numel(), self.device)  # (n,) or (B, n)
        h = self.model.hidden(ids[None].expand(B, -1), pos)  # (B, n, dim)
        return self.model.logits(h[:, -1]).float()  # (B, V)

    @torch.no_grad()
    def generate(self, prompt, config: GenerationConfig | None = None) -> list[int]:
        """New token ids after the prompt (a stop token ends generation and is not returned)."""
        config = config or GenerationConfig()
        try:
            prompt = self._start(prompt, reserve=config.max_new_tokens)
            allowed = allowed_ids(self.vocab, config.restrict, config.stop_tokens, self.device)
            stops = torch.tensor(config.stop_tokens, dtype=torch.long, device=self.device)  # (n_stop,)
            rng = torch.Generator(device=self.device).manual_seed(config.seed)
            self._meet()
            values = self._decode(self._fill(prompt), config, allowed, stops, rng).tolist()  # the one read
        finally:
            self.release()
        return until_stop(values, config.stop_tokens)

    def _decode(
        self,
        logits: torch.Tensor,
        config: GenerationConfig,
        allowed: torch.Tensor,
        stops: torch.Tensor,
        rng: torch.Generator,
    ) -> torch.Tensor:
        """Tokens (n,) on the device after logits (V,), each fed back without being read. Whether a stop
        token came is read once every config.stop_check_every tokens, on every rank alike (the tokens are
        the first rank's), so up to that many - 1 tokens past a stop are made; until_stop drops them."""
        n_max = config.max_new_tokens
        ids = torch.empty(n_max, dtype=torch.long, device=self.device)
        n = 0
        while True:
            token = broadcast_from_first(next_token(logits, config, allowed, rng), self.group)  # (1,)
            ids[n : n + 1] = token
            n += 1
            if n == n_max or self._stopped(ids[:n], stops, config.stop_check_every):
                return ids[:n]
            logits = self._extend(token)[-1]

    @staticmethod
    def _stopped(ids: torch.Tensor, stops: torch.Tensor, every: int) -> bool:
        """Whether ids (n,) hold a stop token, read to the host only when n is a multiple of `every`
        (the tokens since the last read are the ones looked at)."""
        if stops.numel() == 0 or ids.numel() % every:
            return False
        return bool(torch.isin(ids[-every:], stops).any())  # a host sync, once per `every` tokens

    @torch.no_grad()
    def score(self, prompt, continuations: list) -> list[float]:
        """The log-probability of each continuation after the prompt (sum over its tokens); the
        prompt is prefilled once and the cache rolled back after each continuation."""
        if not continuations or any(len(c) == 0 for c in continuations):
            raise ValueError("score needs at least one continuation, and none may be empty")
        scores = []
        try:
            continuations = [self._ids(c) for c in continuations]
            prompt = self._start(prompt, reserve=max(c.numel() for c in continuations))
            self._meet()
            last = F.log_softmax(self._fill(prompt), dim=-1)
            seen, lengths = self.cache.seen, self.cache.lengths
            for cont in continuations:
                total = last[cont[0]]
                if cont.numel() > 1:
                    logp = F.log_softmax(self._extend(cont[:-1], all_logits=True), dim=-1)  # (L-1, V)
                    total = total + logp.gather(1, cont[1:, None]).sum()
                    self.cache.truncate(seen, lengths)
                scores.append(float(total))
        finally:
            self.release()
        return scores


def until_stop(values: list[int], stop_tokens: list[int]) -> list[int]:
    """values up to the first stop token (not included)."""
    for i, value in enumerate(values):
        if value in stop_tokens:
            return values[:i]
    return values


def length_warning(tokens: int, max_seq_len: int, what: str) -> str | None:
    """The one warning for a sequence longer than the model's max_seq_len (positions it was never trained
    at), or None when it fits; `what` says what is that long ("prompts up to"). lwm-generate and video QA
    print it on stderr."""
    if tokens <= max_seq_len:
        return None
    return (
        f"warning: {what} {tokens} tokens, longer than the model's max_seq_len {max_seq_len}: the model was "
        "never trained at positions past it, so its output there is unreliable"
    )
