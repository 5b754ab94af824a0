"""Content-addressed prefix cache of the HF rollout server (vLLM's automatic prefix caching).

A finished request leaves its KV behind: its prompt and every generated token but the last. The
next request whose prompt starts with those tokens (an episode's next turn: the conversation so
far, then the environment's answer) reuses that KV and prefills only the rest.

Entries are found by what they hold, not by a request id: verl's ``LLMServerClient`` gives every
turn a fresh request id (``_vllm_request_id``), so a cache keyed by request id never hits during
training. As in vLLM, a prompt is cut into blocks of :data:`BLOCK_TOKENS` tokens and every block is
named by a hash chained over the blocks before it; an entry registers the chain of its full blocks.
A lookup walks the prompt's chain to the last block some entry holds, then extends the match token
by token inside that entry. The reuse is token-exact (the tokens are compared, a hash only finds the
candidate), a hit takes the entry out (its KV moves on with the request that extends it), entries
never outlive a weight update (:meth:`PrefixCache.clear`), and the cache keeps at most ``budget``
tokens, least recently used first out.
"""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict
from dataclasses import dataclass, field

import torch

__all__ = ["BLOCK_TOKENS", "CachedPrefix", "PrefixCache", "block_chain"]

#: tokens per hashed block; a prompt shares KV with an entry from its first block on
BLOCK_TOKENS = 16


def block_chain(tokens: list[int], blocks: int) -> list[int]:
    """Hashes naming the first ``blocks`` full blocks of ``tokens``, each chained over those before it."""
    chain: list[int] = []
    previous = 0
    for b in range(blocks):
        previous = hash((previous, tuple(tokens[b * BLOCK_TOKENS : (b + 1) * BLOCK_TOKENS])))
        chain.append(previous)
    return chain


@dataclass(eq=False)
class CachedPrefix:
    """The KV a finished request left behind: ``tokens`` and, per layer, keys and values
    ``[kv_heads, len(tokens), head_dim]`` computed with weights ``weights_version``."""

    tokens: list[int]
    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    weights_version: int
    chain: list[int] = field(default_factory=list)


class PrefixCache:
    """Thread-safe store of :class:`CachedPrefix` entries, found by content (module docstring)."""

    def __init__(self, budget: int) -> None:
        if budget < 0:
            raise ValueError(f"prefix_cache_tokens must be >= 0 (0 turns prefix caching off), got {budget}")
        self.budget = budget
        self._entries: OrderedDict[int, CachedPrefix] = OrderedDict()
        self._blocks: dict[int, int] = {}  # block hash -> id of the newest entry holding that block
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._tokens = 0
        self.version = 0

    @property
    def tokens(self) -> int:
        """Tokens held."""
        with self._lock:
            return self._tokens

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def entries(self) -> list[list[int]]:
        """The token lists held, least recently stored first (for tests)."""
        with self._lock:
            return [list(e.tokens) for e in self._entries.values()]

    def clear(self) -> None:
        """Drop every entry and move to the next weights version (after a weight update)."""
        with self._lock:
            self.version += 1
            self._entries.clear()
            self._blocks.clear()
            self._tokens = 0

    def take(self, prompt_ids: list[int], version: int) -> tuple[CachedPrefix, int] | None:
        """The entry sharing the longest prefix with ``prompt_ids`` and how many tokens it covers
        (at least one prompt token is always left to prefill); the entry leaves the cache."""
        if not self.budget:
            return None
        limit = len(prompt_ids) - 1
        chain = block_chain(prompt_ids, limit // BLOCK_TOKENS)
        with self._lock:
            entry_id = next((self._blocks[h] for h in reversed(chain) if h in self._blocks), None)
            if entry_id is None:
                return None
            entry = self._remove(entry_id)
        if entry.weights_version != version:
            return None
        end = min(len(entry.tokens), limit)
        m = 0
        while m < end and entry.tokens[m] == prompt_ids[m]:
            m += 1
        return (entry, m) if m else None

    def put(self, entry: CachedPrefix) -> None:
        """Keep ``entry`` unless it is too large or of older weights; evicts the least recently stored."""
        if not self.budget or len(entry.tokens) > self.budget:
            return
        entry.chain = block_chain(entry.tokens, len(entry.tokens) // BLOCK_TOKENS)
        with self._lock:
            if entry.weights_version != self.version:
                return
            entry_id = next(self._ids)
            self._entries[entry_id] = entry
            self._tokens += len(entry.tokens)
            for h in entry.chain:
                self._blocks[h] = entry_id
            while self._tokens > self.budget:
                self._remove(next(iter(self._entries)))

    def _remove(self, entry_id: int) -> CachedPrefix:
        """Under the lock: take entry ``entry_id`` out with the block names that point to it."""
        entry = self._entries.pop(entry_id)
        self._tokens -= len(entry.tokens)
        for h in entry.chain:
            if self._blocks.get(h) == entry_id:
                del self._blocks[h]
        return entry
