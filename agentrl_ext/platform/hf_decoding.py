"""Sampling and continuous batching for the HF rollout server.

:class:`ContinuousBatcher` decodes every concurrent request in one loop. Requests arrive from many
coroutines (verl's agent loops call the server's ``generate`` concurrently); one decode thread owns
the model and, at every iteration,

1. admits waiting requests first come, first served, up to ``max_batch_size`` active rows and
   ``max_prefill_tokens`` padded prompt tokens, and runs one left-padded prefill forward for them;
2. runs one decode forward over all active rows (one new token each);
3. samples one token per row with that row's own sampling parameters (temperature, top-k, top-p,
   repetition penalty, seed) and finishes rows independently (stop ids, stop strings, max tokens).

Prefix caching (vLLM's ``enable_prefix_caching``, for multi-turn episodes): a finished request
leaves its KV behind, and a later request whose prompt starts with the same tokens (an episode's
next turn) reuses it and prefills only the rest. Entries are found by content, whatever the request
id (:mod:`agentrl_ext.platform.hf_prefix_cache`).

Exactness: active rows share one KV cache ``[rows, kv_heads, length, head_dim]``, left-padded to a
common length when rows join; the 2-D attention mask hides the padding and ``position_ids`` count
only a row's own tokens, so each row attends to exactly the keys, at exactly the positions, it
would see alone. Per-token log-probs therefore equal unbatched decoding up to float rounding
(about 1e-7 in float32 on the tiny model). A seeded request draws from its own
``torch.Generator``, so a seed gives the same tokens batched or alone.

Log-probs follow vLLM's ``processed_logprobs`` mode, which verl's trainer compares against:
``log_softmax(logits / temperature)`` of the sampled token, after the repetition penalty and
before top-k / top-p filtering.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from agentrl_ext.platform.hf_prefix_cache import CachedPrefix, PrefixCache

logger = logging.getLogger(__name__)

#: What a decoder returns for one request: (token ids, per-token log-probs, stop reason), where the
#: stop reason is ``completed`` (stop token or string), ``length`` (max tokens) or ``aborted``.
GenerationResult = tuple[list[int], list[float], str]


@dataclass
class SamplingSpec:
    """Sampling parameters of one request, normalised from verl's dict."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    stop_token_ids: set[int] = field(default_factory=set)
    stop: list[str] = field(default_factory=list)
    ignore_eos: bool = False
    seed: int | None = None
    repetition_penalty: float = 1.0

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


def filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Mask logits outside top-k and the top-p nucleus with -inf (1-D logits)."""
    if top_k is not None and 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, sorted_idx = torch.sort(logits, descending=True)
        cumulative = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
        # keep the smallest prefix whose mass reaches top_p (always keep the first token)
        remove = cumulative - torch.softmax(sorted_logits, dim=-1) >= top_p
        sorted_logits = sorted_logits.masked_fill(remove, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(0, sorted_idx, sorted_logits)
    return logits


def apply_repetition_penalty(logits: torch.Tensor, seen: list[int], penalty: float) -> torch.Tensor:
    """CTRL-style penalty on 1-D logits: divide positive, multiply negative logits of ``seen`` ids."""
    idx = torch.tensor(sorted(set(seen)), dtype=torch.long)
    vals = logits[idx]
    logits = logits.clone()
    logits[idx] = torch.where(vals > 0, vals / penalty, vals * penalty)
    return logits


@dataclass(eq=False)
class _Row:
    """One request: its parameters, its output so far and where its result goes."""

    prompt_ids: list[int]
    spec: SamplingSpec
    stop_ids: frozenset[int]
    deliver: Callable[[GenerationResult | BaseException], None]
    generator: torch.Generator | None = None
    tokens: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    length: int = 0  # tokens of this row in the KV cache = position id of its next input token
    cancelled: bool = False
    weights_version: int = -1  # the weights its KV was computed with (set at prefill)

    def finish(self, reason: str) -> None:
        self.deliver((self.tokens, self.log_probs, reason))


def sample_next_tokens(rows: list[_Row], logits: torch.Tensor) -> tuple[list[int], list[float]]:
    """One token and its processed log-prob per row of ``logits`` ``[rows, vocab]``.

    Vectorised over rows where the math allows; per row only where parameters differ (repetition
    penalty, top-k/top-p filter, a seeded generator).
    """
    logits = logits.float()
    penalised = [i for i, r in enumerate(rows) if r.spec.repetition_penalty != 1.0]
    if penalised:
        logits = logits.clone()
        for i in penalised:
            r = rows[i]
            logits[i] = apply_repetition_penalty(
                logits[i], r.prompt_ids + r.tokens, r.spec.repetition_penalty
            )
    temperatures = torch.tensor([1.0 if r.spec.greedy else r.spec.temperature for r in rows])
    scaled = logits / temperatures[:, None]
    log_probs = torch.log_softmax(scaled, dim=-1)
    tokens = torch.empty(len(rows), dtype=torch.long)
    greedy = [i for i, r in enumerate(rows) if r.spec.greedy]
    if greedy:
        tokens[greedy] = torch.argmax(logits[greedy], dim=-1)
    sampled = [i for i, r in enumerate(rows) if not r.spec.greedy]
    if sampled:
        candidates = scaled[sampled]
        for j, i in enumerate(sampled):
            spec = rows[i].spec
            if 0 < spec.top_k or spec.top_p < 1.0:
                candidates[j] = filter_logits(candidates[j], spec.top_k, spec.top_p)
        probs = torch.softmax(candidates, dim=-1)
        shared = [j for j, i in enumerate(sampled) if rows[i].generator is None]
        if shared:
            tokens[[sampled[j] for j in shared]] = _inverse_cdf_sample(probs[shared])
        for j, i in enumerate(sampled):
            if rows[i].generator is not None:
                tokens[i] = torch.multinomial(probs[j], 1, generator=rows[i].generator)[0]
    picked = log_probs.gather(1, tokens[:, None])[:, 0]
    return tokens.tolist(), picked.tolist()


def _inverse_cdf_sample(probs: torch.Tensor) -> torch.Tensor:
    """One draw per row of ``probs`` ``[rows, vocab]`` from the global RNG.

    Same distribution as ``torch.multinomial(probs, 1)``, which took ~1 ms for 32 rows of a 1k
    vocabulary on a 2-core CPU (as long as the tiny model's forward); this takes ~0.05 ms.
    """
    cdf = probs.cumsum(dim=-1)
    draw = torch.rand(probs.shape[0], 1) * cdf[:, -1:]
    # right=True returns the first index whose cdf exceeds the draw: never a zero-probability token
    picked = torch.searchsorted(cdf, draw, right=True)[:, 0]
    overflow = picked >= probs.shape[1]  # a draw rounded up to the total mass
    if bool(overflow.any()):
        last = probs.shape[1] - 1 - torch.argmax((probs.flip(-1) > 0).to(torch.uint8), dim=-1)
        picked = torch.where(overflow, last, picked)
    return picked


def _left_pad(t: torch.Tensor, length: int, dim: int) -> torch.Tensor:
    """Zero-pad ``t`` on the left of ``dim`` (-1 or -2) to ``length``."""
    missing = length - t.shape[dim]
    if missing == 0:
        return t
    return F.pad(t, (missing, 0) if dim == -1 else (0, 0, missing, 0))


def _settle(future: asyncio.Future[Any], result: GenerationResult | BaseException) -> None:
    if future.done():  # the caller was cancelled
        return
    if isinstance(result, BaseException):
        future.set_exception(result)
    else:
        future.set_result(result)


class ContinuousBatcher:
    """Decodes all concurrent requests of one model together (see the module docstring).

    ``max_batch_size`` bounds the rows decoded together (1 serves requests one at a time, first
    come first served); ``max_prefill_tokens`` bounds the padded prompt tokens of one prefill
    forward (one request is always admitted, whatever its length). The decode thread runs while
    there is work and exits when idle. Every forward holds :attr:`model_lock`; take it to change
    the weights between two forwards.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        eos_token_ids: set[int],
        tokenizer: Any = None,
        *,
        max_batch_size: int = 256,
        max_prefill_tokens: int = 8192,
        prefix_cache_tokens: int = 0,
    ) -> None:
        if max_batch_size < 1 or max_prefill_tokens < 1:
            raise ValueError(
                f"max_batch_size ({max_batch_size}) and max_prefill_tokens ({max_prefill_tokens}) must be >= 1; "
                "they come from rollout.max_num_seqs and rollout.max_num_batched_tokens"
            )
        self.model = model
        self.eos_token_ids = set(eos_token_ids)
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self.max_prefill_tokens = max_prefill_tokens
        self.model_lock = threading.Lock()
        self._cv = threading.Condition()
        self._waiting: deque[_Row] = deque()
        self._thread: threading.Thread | None = None
        self._aborting = False
        # decode-thread state: the active rows and their shared, left-padded KV cache and mask
        self._rows: list[_Row] = []
        self._cache: Any = None
        self._mask: torch.Tensor | None = None
        self.prefix_cache = PrefixCache(prefix_cache_tokens)
        #: counters: forwards run, tokens decoded, the widest batch, prompt tokens prefilled and
        #: prompt tokens taken from the prefix cache instead (for benchmarks and tests)
        self.stats = {
            "prefill_forwards": 0,
            "decode_forwards": 0,
            "decoded_rows": 0,
            "max_rows": 0,
            "prefill_tokens": 0,
            "prefix_hit_tokens": 0,
        }

    # -- requests (any thread) -------------------------------------------------------------
    async def generate(self, prompt_ids: list[int], spec: SamplingSpec) -> GenerationResult:
        """Queue a request and wait for its result; cancelling the caller drops its row."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[GenerationResult] = loop.create_future()

        def deliver(result: GenerationResult | BaseException) -> None:
            try:
                loop.call_soon_threadsafe(_settle, future, result)
            except RuntimeError:  # the caller's event loop is gone
                pass

        row = self.submit(prompt_ids, spec, deliver)
        try:
            return await future
        except asyncio.CancelledError:
            row.cancelled = True
            raise

    def submit(
        self,
        prompt_ids: list[int],
        spec: SamplingSpec,
        deliver: Callable[[GenerationResult | BaseException], None],
    ) -> _Row:
        """Queue a request; ``deliver`` is called once, from the decode thread, with its result."""
        stop_ids = set(spec.stop_token_ids) | (set() if spec.ignore_eos else self.eos_token_ids)
        generator = torch.Generator().manual_seed(int(spec.seed)) if spec.seed is not None else None
        row = _Row(list(prompt_ids), spec, frozenset(stop_ids), deliver, generator)
        with self._cv:
            if self._aborting:
                row.finish("aborted")
                return row
            self._waiting.append(row)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="hf-rollout-decode", daemon=True)
                self._thread.start()
            else:
                self._cv.notify()
        return row

    def abort(self) -> None:
        """Finish every queued and active request with its partial output, reason ``aborted``,
        and answer new requests the same way until :meth:`resume`."""
        with self._cv:
            self._aborting = True
            self._cv.notify()

    def resume(self) -> None:
        with self._cv:
            self._aborting = False

    def close(self, timeout_s: float = 60.0) -> bool:
        """Abort every request (as :meth:`abort`) and wait up to ``timeout_s`` for the decode thread
        to end; returns whether it did. Call it before the process exits: a daemon thread still
        inside a forward when the interpreter shuts down kills the process with SIGABRT
        (``terminate called without an active exception``), not the exit code the caller chose."""
        self.abort()
        with self._cv:
            thread = self._thread
        if thread is None or thread is threading.current_thread():
            return True
        thread.join(timeout_s)
        return not thread.is_alive()

    def weights_changed(self) -> None:
        """Call under :attr:`model_lock` after changing the weights: drops every cached prefix, and
        requests in flight leave none (their KV mixes two weight versions)."""
        self.prefix_cache.clear()

    @property
    def cached_prefix_tokens(self) -> int:
        """Tokens held by the prefix cache."""
        return self.prefix_cache.tokens

    @property
    def prefix_cache_tokens(self) -> int:
        """The prefix cache's budget in tokens (0: off)."""
        return self.prefix_cache.budget

    @property
    def pending(self) -> int:
        """Requests queued or being decoded."""
        with self._cv:
            return len(self._waiting) + len(self._rows)

    # -- decode thread ------------------------------------------------------------------
    def _run(self) -> None:
        with torch.no_grad():
            while True:
                with self._cv:
                    admit = self._take_work()
                    if admit is None:
                        self._thread = None
                        return
                try:
                    self._step(admit)
                except Exception as exc:  # a failed forward fails its requests, not the server
                    logger.exception(
                        "HF rollout decode step failed; failing %d requests", len(admit) + len(self._rows)
                    )
                    for row in self._rows + admit:
                        row.deliver(exc)
                    self._set_batch([], None, None)

    def _take_work(self) -> list[_Row] | None:
        """Under the lock: the requests to admit now, or None when there is nothing to do."""
        if self._aborting:
            for row in self._rows + list(self._waiting):
                row.finish("aborted")
            self._waiting.clear()
            self._set_batch([], None, None)
        while self._waiting and self._waiting[0].cancelled:
            self._waiting.popleft()
        if not self._waiting and not self._rows:
            return None
        admit: list[_Row] = []
        longest = 0
        while self._waiting and len(self._rows) + len(admit) < self.max_batch_size:
            row = self._waiting[0]
            padded = (len(admit) + 1) * max(longest, len(row.prompt_ids))
            if admit and padded > self.max_prefill_tokens:
                break
            if not row.cancelled:
                admit.append(row)
                longest = max(longest, len(row.prompt_ids))
            self._waiting.popleft()
        return admit

    def _step(self, admit: list[_Row]) -> None:
        if admit:
            self._prefill(admit)
        if self._rows:
            self._decode()

    def _forward(
        self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache: Any
    ) -> torch.Tensor:
        """Last-position logits ``[rows, vocab]``; the mask is dropped when nothing is padded
        (SDPA then takes its plain causal path, as an unbatched request does)."""
        padded = bool((mask == 0).any())
        with self.model_lock:
            out = self.model(
                input_ids=ids,
                attention_mask=mask if padded else None,
                position_ids=positions,
                past_key_values=cache,
                use_cache=True,
                logits_to_keep=1,
            )
        return out.logits[:, -1]

    def _prefill(self, admit: list[_Row]) -> None:
        """Prefill the admitted rows: those with a cached prefix in one forward over their new
        tokens, the others in one forward over their whole prompts; then add them to the batch."""
        version = self.prefix_cache.version
        fresh: list[_Row] = []
        reused: list[tuple[_Row, CachedPrefix, int]] = []
        for row in admit:
            row.weights_version = version
            hit = self.prefix_cache.take(row.prompt_ids, version)
            if hit is None:
                fresh.append(row)
            else:
                reused.append((row, *hit))
        if fresh:
            self._prefill_fresh(fresh)
        if reused:
            self._prefill_reused(reused)

    def _prefill_fresh(self, admit: list[_Row]) -> None:
        from transformers import DynamicCache  # imported where used, as load_causal_lm does

        longest = max(len(r.prompt_ids) for r in admit)
        ids = torch.zeros(len(admit), longest, dtype=torch.long)
        mask = torch.zeros(len(admit), longest, dtype=torch.long)
        for i, row in enumerate(admit):
            n = len(row.prompt_ids)
            ids[i, longest - n :] = torch.tensor(row.prompt_ids, dtype=torch.long)
            mask[i, longest - n :] = 1
            row.length = n
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache()
        logits = self._forward(ids, mask, positions, cache)
        self.stats["prefill_forwards"] += 1
        self.stats["prefill_tokens"] += int(mask.sum())
        keep = self._advance(admit, logits, cache, mask)
        self._merge(*self._select(admit, cache, mask, keep))

    def _prefill_reused(self, reused: list[tuple[_Row, CachedPrefix, int]]) -> None:
        """Rows whose first ``m`` prompt tokens have cached KV. Layout per row: ``[pad][its m cached
        tokens][pad][its new tokens]``; the mask hides both pads and positions count real tokens."""
        from transformers import DynamicCache

        past = max(m for _, _, m in reused)
        new = max(len(row.prompt_ids) - m for row, _, m in reused)
        rows = [row for row, _, _ in reused]
        past_mask = torch.zeros(len(rows), past, dtype=torch.long)
        ids = torch.zeros(len(rows), new, dtype=torch.long)
        new_mask = torch.zeros(len(rows), new, dtype=torch.long)
        for i, (row, _, m) in enumerate(reused):
            suffix = row.prompt_ids[m:]
            past_mask[i, past - m :] = 1
            ids[i, new - len(suffix) :] = torch.tensor(suffix, dtype=torch.long)
            new_mask[i, new - len(suffix) :] = 1
            row.length = len(row.prompt_ids)
        layers = [
            (
                torch.cat([_left_pad(p.keys[layer][None, :, :m], past, -2) for _, p, m in reused]),
                torch.cat([_left_pad(p.values[layer][None, :, :m], past, -2) for _, p, m in reused]),
            )
            for layer in range(len(reused[0][1].keys))
        ]
        cache = DynamicCache(ddp_cache_data=layers)
        mask = torch.cat([past_mask, new_mask], dim=1)
        cached = torch.tensor([m for _, _, m in reused], dtype=torch.long)
        positions = cached[:, None] + (new_mask.cumsum(-1) - 1).clamp(min=0)
        logits = self._forward(ids, mask, positions, cache)
        self.stats["prefill_forwards"] += 1
        self.stats["prefill_tokens"] += int(new_mask.sum())
        self.stats["prefix_hit_tokens"] += int(cached.sum())
        keep = self._advance(rows, logits, cache, mask)
        self._merge(*self._select(rows, cache, mask, keep))

    def _decode(self) -> None:
        assert self._mask is not None
        rows = self._rows
        ids = torch.tensor([[r.tokens[-1]] for r in rows], dtype=torch.long)
        positions = torch.tensor([[r.length] for r in rows], dtype=torch.long)
        self._mask = torch.cat([self._mask, torch.ones(len(rows), 1, dtype=torch.long)], dim=1)
        logits = self._forward(ids, self._mask, positions, self._cache)
        for row in rows:
            row.length += 1
        self.stats["decode_forwards"] += 1
        self.stats["decoded_rows"] += len(rows)
        self.stats["max_rows"] = max(self.stats["max_rows"], len(rows))
        keep = self._advance(rows, logits, self._cache, self._mask)
        if len(keep) < len(rows):
            self._set_batch(*self._select(rows, self._cache, self._mask, keep))

    def _advance(self, rows: list[_Row], logits: torch.Tensor, cache: Any, mask: torch.Tensor) -> list[int]:
        """Append one sampled token to every row, finish the rows that stop (keeping their KV
        first, so that their next turn finds it); the indices that go on."""
        tokens, log_probs = sample_next_tokens(rows, logits)
        keep: list[int] = []
        done: list[tuple[int, _Row, str]] = []
        for i, (row, token, log_prob) in enumerate(zip(rows, tokens, log_probs, strict=True)):
            if row.cancelled:
                continue
            row.tokens.append(token)
            row.log_probs.append(log_prob)
            reason = self._stop_reason(row, token)
            if reason is None:
                keep.append(i)
            else:
                done.append((i, row, reason))
        for i, row, reason in done:
            self._retain(row, i, cache, mask)
            row.finish(reason)
        return keep

    def _stop_reason(self, row: _Row, token: int) -> str | None:
        if token in row.stop_ids:
            return "completed"
        if row.spec.stop and self.tokenizer is not None:
            text = self.tokenizer.decode(row.tokens)
            if any(s in text for s in row.spec.stop):
                return "completed"
        if len(row.tokens) >= row.spec.max_tokens:
            return "length"
        return None

    # -- the prefix cache ------------------------------------------------------------------
    def _retain(self, row: _Row, i: int, cache: Any, mask: torch.Tensor) -> None:
        """Keep the KV of finished row ``i`` of ``cache``: its prompt and all its tokens but the
        last (which was sampled, never fed)."""
        if not self.prefix_cache.budget or row.weights_version != self.prefix_cache.version:
            return
        tokens = row.prompt_ids + row.tokens[:-1]
        if len(tokens) > self.prefix_cache.budget:
            return
        valid = mask[i].bool()
        keys = [layer.keys[i][:, valid] for layer in cache.layers]
        if keys[0].shape[1] != len(tokens):  # cannot happen; never keep a misaligned prefix
            logger.warning(
                "prefix cache: row holds %d KV positions for %d tokens; not kept",
                keys[0].shape[1],
                len(tokens),
            )
            return
        values = [layer.values[i][:, valid] for layer in cache.layers]
        self.prefix_cache.put(CachedPrefix(tokens, keys, values, row.weights_version))

    # -- the shared KV cache ---------------------------------------------------------------
    @staticmethod
    def _select(
        rows: list[_Row], cache: Any, mask: torch.Tensor, keep: list[int]
    ) -> tuple[list[_Row], Any, torch.Tensor | None]:
        """Keep rows ``keep`` of a batch and drop the leading columns that are padding in all of them."""
        if not keep:
            return [], None, None
        if len(keep) == len(rows):  # nothing left; column 0 holds a real token of some row
            return rows, cache, mask
        index = torch.tensor(keep, dtype=torch.long)
        mask = mask[index]
        start = int(torch.argmax(mask.any(dim=0).to(torch.uint8)))
        for layer in cache.layers:
            layer.keys = layer.keys[index, :, start:]
            layer.values = layer.values[index, :, start:]
        return [rows[i] for i in keep], cache, mask[:, start:]

    def _merge(self, rows: list[_Row], cache: Any, mask: torch.Tensor | None) -> None:
        """Add freshly prefilled rows to the active batch, left-padding both to a common length."""
        if not rows:
            return
        if not self._rows:
            self._set_batch(rows, cache, mask)
            return
        assert mask is not None and self._mask is not None
        length = max(mask.shape[1], self._mask.shape[1])
        for old, new in zip(self._cache.layers, cache.layers, strict=True):
            old.keys = torch.cat([_left_pad(old.keys, length, -2), _left_pad(new.keys, length, -2)])
            old.values = torch.cat([_left_pad(old.values, length, -2), _left_pad(new.values, length, -2)])
        merged = torch.cat([_left_pad(self._mask, length, -1), _left_pad(mask, length, -1)])
        self._set_batch(self._rows + rows, self._cache, merged)

    def _set_batch(self, rows: list[_Row], cache: Any, mask: torch.Tensor | None) -> None:
        self._rows, self._cache, self._mask = rows, cache, mask
