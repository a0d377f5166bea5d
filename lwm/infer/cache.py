"""The key/value cache of one rank, and the attention functions that fill and read it.

Each layer's attention is swapped from outside (the model never knows) for a `CachedLayer`.
Before each forward pass the generator says which of two kinds it is (`KVCache.start_prefill` or
`start_extend`):

    prefill   the rank holds a slice of a prompt segment (its layout's tokens); attention is ring
              attention over the group (plus a ring pass over the earlier segments' cache
              slices), and the slice's keys and values are kept
    extend    every rank runs the same new tokens; their queries attend to all ranks' slices
              (lwm.parallel.cached_attention) and each new token's keys and values are kept
              by one rank only, position p by rank p mod N, so the slices stay balanced
"""

from __future__ import annotations

import torch

from lwm.parallel.cached import cached_attention, ring_prefill_attention
from lwm.parallel.comm import group_size_and_rank


class LayerCache:
    """Keys and values (B, Hkv, length, D) of this rank's tokens, in a buffer that grows by doubling.
    Rows of different lengths (two prompts decoded together) are left-padded: row b's keys begin at starts[b]."""

    def __init__(self):
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None
        self.length = 0
        self.starts: list[int] | None = None

    def reserve(self, like: torch.Tensor, capacity: int) -> None:
        B, H, _, D = like.shape
        if self.k is not None and self.k.shape[2] >= capacity:
            return
        k = like.new_empty(B, H, capacity, D)
        v = like.new_empty(B, H, capacity, D)
        if self.k is not None:
            k[:, :, : self.length], v[:, :, : self.length] = self.keys, self.values
        self.k, self.v = k, v

    def append(self, k: torch.Tensor, v: torch.Tensor) -> None:
        n = k.shape[2]
        if self.k is None or self.length + n > self.k.shape[2]:
            self.reserve(k, max(2 * (self.length + n), 16))
        self.k[:, :, self.length : self.length + n] = k
        self.v[:, :, self.length : self.length + n] = v
        self.length += n

    def stack(self, other: LayerCache, reserve: int) -> None:
        """This cache's rows, then other's, each row left-padded to the longer length, with room for
        `reserve` more tokens."""
        C = max(self.length, other.length)
        rows = [(c, r) for c in (self, other) for r in range(c.k.shape[0])]
        k = self.k.new_zeros(len(rows), self.k.shape[1], C + reserve, self.k.shape[3])  # (B, Hkv, C + reserve, D)
        v = torch.zeros_like(k)
        for b, (c, r) in enumerate(rows):
            k[b, :, C - c.length : C], v[b, :, C - c.length : C] = c.keys[r], c.values[r]
        self.starts = [C - c.length + (c.starts[r] if c.starts else 0) for c, r in rows]
        self.k, self.v, self.length = k, v, C

    @property
    def keys(self) -> torch.Tensor:
        return self.k[:, :, : self.length]

    @property
    def values(self) -> torch.Tensor:
        return self.v[:, :, : self.length]


class PassState:
    """What the next forward pass is, shared by a KVCache and its layers. The layers hold this, not
    the KVCache: a cycle (cache -> layer -> cache) would keep a dropped cache's tensors, and its
    process group, alive until Python's cycle collector happened to run."""

    def __init__(self, group, layout: str, backend: str):
        self.group, self.layout, self.backend = group, layout, backend
        self.world_size, self.rank = group_size_and_rank(group)
        self.prefilling = False  # set only by KVCache.start_prefill / start_extend
        self.own_first, self.own_count = 0, 0  # the new tokens this rank keeps (set by start_extend)


class CachedLayer:
    """One layer's attention function; the PassState says what the pass is and which new tokens this rank keeps."""

    def __init__(self, state: PassState):
        self.state, self.cache = state, LayerCache()

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True) -> torch.Tensor:
        o = self.state
        if o.prefilling:  # this rank's slice of one prefill segment
            past = (self.cache.keys, self.cache.values) if self.cache.length else (None, None)
            self.cache.append(k, v)
            return ring_prefill_attention(q, k, v, *past, o.group, o.layout, o.backend)
        out = cached_attention(
            q,
            k,
            v,
            self.cache.keys if self.cache.length else None,
            self.cache.values if self.cache.length else None,
            o.group,
            backend=o.backend,
            starts=self.cache.starts,
        )
        if o.own_count:  # the new tokens this rank keeps: every world-size-th, from own_first
            mine = slice(o.own_first, None, o.world_size)
            self.cache.append(k[:, :, mine], v[:, :, mine])
        return out


class KVCache:
    """The cache of every layer of a model on this rank; `attach` swaps the model's attention."""

    def __init__(self, model, group=None, layout: str = "striped", backend: str = "auto"):
        if model.config.attn_head_groups != 1:
            raise ValueError(
                f"the KV cache attends whole layers: model.attn_head_groups must be 1 for generation, "
                f"got {model.config.attn_head_groups}"
            )
        self.state = state = PassState(group, layout, backend)
        self.world_size, self.rank = state.world_size, state.rank
        self.layers = [CachedLayer(state) for _ in model.layers]
        self.model = model
        model.set_attention(self.layers)
        self.seen = 0  # tokens of the sequence so far (all ranks)
        self.offsets: torch.Tensor | None = None  # (B,) each row's positions past row 0's, once rows are stacked

    def reserve(self, like: torch.Tensor, capacity: int) -> None:
        for layer in self.layers:
            layer.cache.reserve(like, capacity)

    @property
    def lengths(self) -> list[int]:
        return [layer.cache.length for layer in self.layers]

    def truncate(self, seen: int, lengths: list[int]) -> None:
        """Forget everything after a snapshot taken with (self.seen, self.lengths)."""
        self.seen = seen
        for layer, n in zip(self.layers, lengths):
            layer.cache.length = n

    def stack(self, other: KVCache, reserve: int = 0) -> None:
        """Other's rows after this cache's (B = 2 for two prompts decoded together, as classifier-free
        guidance runs its conditional and unconditional prompts), and the model's attention back on this
        cache's layers. Extends then run B rows of the same number of new tokens, each at its own positions,
        each attending only to its own row's keys; the new tokens are kept by the ranks that keep this
        cache's (row 0's positions), which only balances the slices."""
        rows = [layer.cache.k.shape[0] for layer in (self.layers[0], other.layers[0])]
        mine = self.offsets if self.offsets is not None else torch.zeros(rows[0], dtype=torch.long)
        self.offsets = torch.cat([mine, torch.full((rows[1],), other.seen - self.seen, dtype=torch.long)])  # (B,)
        for layer, theirs in zip(self.layers, other.layers):
            layer.cache.stack(theirs.cache, reserve)
        self.model.set_attention(self.layers)

    def start_prefill(self, n_new: int) -> None:
        """The next pass is a prompt segment of n_new tokens (all ranks), each rank holding its
        layout's slice; every rank keeps its slice's keys and values."""
        self.state.prefilling, self.seen = True, self.seen + n_new

    def start_extend(self, n_new: int, device) -> torch.Tensor:
        """The next pass is n_new tokens that every rank runs whole: their positions (n_new,) on `device`, or
        (B, n_new) once rows are stacked; marks the ones this rank will keep (position p is kept by rank
        p mod N), by arithmetic on the host, so that decoding reads nothing back from the device."""
        pos = torch.arange(self.seen, self.seen + n_new, device=device)
        if self.offsets is not None:
            pos = pos + self.offsets.to(device)[:, None]  # (n_new,) -> (B, n_new)
        state = self.state
        state.own_first = (self.rank - self.seen) % self.world_size
        state.own_count = len(range(state.own_first, n_new, self.world_size))
        state.prefilling, self.seen = False, self.seen + n_new
        return pos
