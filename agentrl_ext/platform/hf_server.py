"""HF-transformers rollout server: token-in/token-out generation for verl on CPU.

verl 0.9.1 only registers vLLM, SGLang and TensorRT-LLM rollouts, all GPU-only.
``HFRolloutServer`` is a Ray actor with the same async interface verl's agent
loops call on those servers (``generate(request_id, prompt_ids, sampling_params)``
returning a :class:`~verl.workers.rollout.replica.TokenOutput` with per-token
log-probs), plus the weight-update, sleep/wake and abort methods the trainer calls.

Concurrent requests are decoded together by a
:class:`~agentrl_ext.platform.hf_decoding.ContinuousBatcher` (continuous batching with a shared,
left-padded KV cache; per-token log-probs as exact as unbatched decoding). :class:`HFGenerator`
is the plain single-sequence decoder, kept as the reference the batched one is tested against.

Log-probs follow vLLM's ``processed_logprobs`` mode, which verl's trainer compares
against: ``log_softmax(logits / temperature)`` of the sampled token, before top-k /
top-p filtering.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

import torch

from agentrl_ext.platform.hf_decoding import (
    ContinuousBatcher,
    SamplingSpec,
    apply_repetition_penalty,
    filter_logits,
)

__all__ = [
    "HFGenerator",
    "HFRolloutServer",
    "SamplingSpec",
    "eos_ids_of",
    "filter_logits",
    "load_causal_lm",
    "torch_dtype",
]

logger = logging.getLogger(__name__)

_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


def torch_dtype(name: str) -> torch.dtype:
    """Map verl's dtype strings to torch dtypes, naming the accepted values on error."""
    try:
        return _DTYPES[str(name).lower()]
    except KeyError:
        raise ValueError(
            f"rollout dtype {name!r} is not supported by the HF rollout; use one of {sorted(_DTYPES)}"
        ) from None


class HFGenerator:
    """Single-sequence decoding with a KV cache on a transformers causal LM, one request at a time.

    The reference the batched decoder is tested against (same sampling rules, no padding); the
    server itself decodes with :class:`~agentrl_ext.platform.hf_decoding.ContinuousBatcher`.
    """

    def __init__(self, model: torch.nn.Module, eos_token_ids: set[int], tokenizer: Any = None) -> None:
        self.model = model
        self.eos_token_ids = eos_token_ids
        self.tokenizer = tokenizer
        self._lock = threading.Lock()

    @torch.no_grad()
    def generate(
        self, prompt_ids: list[int], spec: SamplingSpec, should_abort: Any = None
    ) -> tuple[list[int], list[float], str]:
        """Decode up to ``spec.max_tokens`` tokens; returns (token_ids, log_probs, stop_reason)."""
        with self._lock:  # one forward at a time: torch already uses every core
            return self._generate(prompt_ids, spec, should_abort)

    def _generate(
        self, prompt_ids: list[int], spec: SamplingSpec, should_abort: Any
    ) -> tuple[list[int], list[float], str]:
        gen = torch.Generator().manual_seed(spec.seed) if spec.seed is not None else None
        stop_ids = set(spec.stop_token_ids) | (set() if spec.ignore_eos else self.eos_token_ids)
        input_ids = torch.tensor([prompt_ids], dtype=torch.long)
        past = None
        tokens: list[int] = []
        log_probs: list[float] = []
        for _ in range(spec.max_tokens):
            if should_abort is not None and should_abort():
                return tokens, log_probs, "aborted"
            out = self.model(input_ids=input_ids, past_key_values=past, use_cache=True)
            past = out.past_key_values
            logits = out.logits[0, -1].float()
            if spec.repetition_penalty != 1.0 and (prompt_ids or tokens):
                logits = apply_repetition_penalty(logits, prompt_ids + tokens, spec.repetition_penalty)
            scaled = logits if spec.greedy else logits / spec.temperature
            logp = torch.log_softmax(scaled, dim=-1)
            if spec.greedy:
                token = int(torch.argmax(logits))
            else:
                probs = torch.softmax(filter_logits(scaled, spec.top_k, spec.top_p), dim=-1)
                token = int(torch.multinomial(probs, 1, generator=gen))
            tokens.append(token)
            log_probs.append(float(logp[token]))
            if token in stop_ids:
                return tokens, log_probs, "completed"
            if spec.stop and self.tokenizer is not None:
                text = self.tokenizer.decode(tokens)
                if any(s in text for s in spec.stop):
                    return tokens, log_probs, "completed"
            input_ids = torch.tensor([[token]], dtype=torch.long)
        return tokens, log_probs, "length"


def load_causal_lm(path: str, dtype: torch.dtype, trust_remote_code: bool = False) -> torch.nn.Module:
    """Load a causal LM for CPU inference with SDPA attention (flash-attn does not exist on CPU)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        path, dtype=dtype, attn_implementation="sdpa", trust_remote_code=trust_remote_code
    )
    model.eval()
    return model


def eos_ids_of(model: torch.nn.Module, tokenizer: Any) -> set[int]:
    """The model's end-of-sequence ids from its generation config and tokenizer."""
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), getattr(model, "config", None), tokenizer):
        eos = getattr(source, "eos_token_id", None) if source is not None else None
        if isinstance(eos, int):
            ids.add(eos)
        elif isinstance(eos, list | tuple):
            ids.update(int(e) for e in eos)
    return ids


def prefix_cache_tokens(config: Any) -> int:
    """The prefix cache's size in tokens: 8 prefill budgets (``rollout.max_num_batched_tokens``)
    when ``rollout.enable_prefix_caching`` is on (verl's default), else 0 (off)."""
    if not config.enable_prefix_caching:
        return 0
    return 8 * int(config.max_num_batched_tokens)


class HFRolloutServer:
    """Ray actor serving one HF model replica with verl's rollout-server interface.

    Concurrent ``generate`` calls are decoded together (continuous batching). Knobs, with vLLM's
    meaning: ``rollout.max_num_seqs`` is the most requests decoded in one batch (1 serves them one
    at a time), ``rollout.max_num_batched_tokens`` the most padded prompt tokens prefilled in one
    forward, ``rollout.enable_prefix_caching`` reuses an episode's KV from one turn to the next
    (found by content: verl gives every turn a fresh request id; see :func:`prefix_cache_tokens`).
    """

    def __init__(self, config: Any, model_config: Any, replica_rank: int = 0, **_: Any) -> None:
        from verl.utils.config import omega_conf_to_dataclass

        self.config = omega_conf_to_dataclass(config)
        if not hasattr(model_config, "tokenizer"):  # a DictConfig from the replica
            model_config = omega_conf_to_dataclass(model_config)
        self.model_config = model_config
        self.replica_rank = replica_rank
        path = model_config.local_path or model_config.path
        self.model = load_causal_lm(path, torch_dtype(self.config.dtype), model_config.trust_remote_code)
        tokenizer = getattr(model_config, "tokenizer", None)
        self.engine = ContinuousBatcher(
            self.model,
            eos_ids_of(self.model, tokenizer),
            tokenizer,
            max_batch_size=int(self.config.max_num_seqs),
            max_prefill_tokens=int(self.config.max_num_batched_tokens),
            prefix_cache_tokens=prefix_cache_tokens(self.config),
        )
        self.max_model_len = int(
            self.config.max_model_len or (self.config.prompt_length + self.config.response_length)
        )
        self.global_steps: int | None = None
        self._running: set[str] = set()
        logger.info("HF rollout server %d loaded %s", replica_rank, path)

    # -- generation -------------------------------------------------------------
    def _sampling_spec(self, prompt_len: int, params: dict[str, Any]) -> SamplingSpec:
        room = self.max_model_len - prompt_len
        if room < 1:
            raise ValueError(
                f"prompt of {prompt_len} tokens leaves no room to generate within max_model_len="
                f"{self.max_model_len}; raise rollout.max_model_len or shorten the prompt"
            )
        max_tokens = params.get("max_tokens", params.get("max_new_tokens"))
        if max_tokens is None:
            max_tokens = min(
                self.config.response_length,
                self.config.prompt_length + self.config.response_length - prompt_len,
            )
        stop = params.get("stop") or []
        return SamplingSpec(
            max_tokens=max(1, min(int(max_tokens), room)),
            temperature=float(params.get("temperature", 1.0)),
            top_p=float(params.get("top_p", 1.0)),
            top_k=int(params.get("top_k", -1) if params.get("top_k") is not None else -1),
            stop_token_ids=set(params.get("stop_token_ids") or []),
            stop=[stop] if isinstance(stop, str) else list(stop),
            ignore_eos=bool(params.get("ignore_eos", False)),
            seed=params.get("seed"),
            repetition_penalty=float(params.get("repetition_penalty", 1.0) or 1.0),
        )

    async def generate(
        self,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        request_id: str,
        image_data: Any = None,
        video_data: Any = None,
        **_: Any,
    ) -> Any:
        """Generate from token ids; returns verl's ``TokenOutput`` with log-probs."""
        from verl.workers.rollout.replica import TokenOutput

        if image_data is not None or video_data is not None:
            raise ValueError("the HF rollout server is text-only; multimodal inputs need vLLM or SGLang")
        prompt_ids = [int(t) for t in prompt_ids]
        if not prompt_ids:
            raise ValueError(
                f"request {request_id!r} has an empty prompt; the HF rollout needs at least one token"
            )
        spec = self._sampling_spec(len(prompt_ids), dict(sampling_params))
        self._running.add(request_id)
        try:
            tokens, log_probs, reason = await self.engine.generate(prompt_ids, spec)
        finally:
            self._running.discard(request_id)
        return TokenOutput(
            token_ids=tokens,
            log_probs=log_probs,
            stop_reason="aborted" if reason == "aborted" else "completed",
            extra_fields={"global_steps": self.global_steps},
        )

    # -- weights ------------------------------------------------------------------
    async def update_weights(self, state: dict[str, torch.Tensor], global_steps: int | None = None) -> None:
        """Load a full (HF-named) state dict pushed by the trainer.

        The copy runs between two forwards (under the decoder's model lock); requests in flight go
        on with the new weights, as on vLLM.
        """
        own = self.model.state_dict()
        unknown = [k for k in state if k not in own]
        if unknown:
            raise KeyError(f"weight update names {unknown[:5]} are not parameters of the rollout model")
        await asyncio.to_thread(self._copy_weights, own, state)
        self.global_steps = global_steps
        logger.debug("replica %d: loaded %d tensors (step %s)", self.replica_rank, len(state), global_steps)

    def _copy_weights(self, own: dict[str, torch.Tensor], state: dict[str, torch.Tensor]) -> None:
        with self.engine.model_lock, torch.no_grad():
            for name, tensor in state.items():
                own[name].copy_(tensor.to(own[name].dtype))
            self.engine.weights_changed()

    def export_state(self) -> dict[str, torch.Tensor]:
        """The served weights (CPU copies): lets tests compare them with the trainer's."""
        return {k: v.detach().clone() for k, v in self.model.state_dict().items()}

    def get_global_steps(self) -> int | None:
        return self.global_steps

    def state_dict_checksum(self) -> float:
        """Sum of all parameters: lets tests see that a weight update landed."""
        return float(sum(p.detach().double().sum() for p in self.model.parameters()))

    # -- lifecycle methods verl calls on every rollout server -------------------------
    async def sleep(self) -> None:
        return None

    async def wake_up(self) -> None:
        return None

    async def clear_kv_cache(self) -> None:
        with self.engine.model_lock:
            self.engine.weights_changed()

    async def release_kv_cache(self) -> None:
        return None

    async def resume_kv_cache(self) -> None:
        return None

    async def wait_for_requests_to_drain(self) -> None:
        while self._running:
            await asyncio.sleep(0.01)

    async def abort_all_requests(self, reject_request: bool = False) -> dict[str, Any]:
        """Finish every request in flight with its partial output (stop reason ``aborted``) and
        answer new ones the same way until :meth:`resume_generation`."""
        aborted = sorted(self._running)
        self.engine.abort()
        await self.wait_for_requests_to_drain()
        return {"aborted_count": len(aborted), "request_ids": aborted}

    async def resume_generation(self) -> None:
        self.engine.resume()

    def close(self, timeout_s: float = 60.0) -> bool:
        """Abort every request and wait for the decode thread to end (for an in-process server,
        before the process exits; see :meth:`ContinuousBatcher.close`)."""
        return self.engine.close(timeout_s)

    async def start_profile(self, **_: Any) -> None:
        return None

    async def stop_profile(self) -> None:
        return None
