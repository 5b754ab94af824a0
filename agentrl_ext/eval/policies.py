"""The models under evaluation, and how an episode is played with them.

Two kinds, each reusing the project's own multi-turn logic:

- :class:`LocalPolicy`: HF checkpoint directories, served in this process by the HF rollout
  server (:class:`~agentrl_ext.platform.hf_server.HFRolloutServer`, continuous batching). The
  episode is driven as in training (:func:`~agentrl_ext.rollout.episode.drive_episode` with the
  agent loop's :class:`~agentrl_ext.rollout.agent_loop.TokenActor`): token-in/token-out, the same
  chat template, Hermes tool-call parsing, statuses and budgets as in RL, so a held-out score
  here is what the trainer would measure.
- :class:`EndpointPolicy`: OpenAI-compatible ``/v1/chat/completions`` endpoints (vLLM, SGLang,
  a hosted API), driven on messages with :class:`~agentrl_ext.rollout.openai_pool.ChatActor`.

Either way the episode's record (:class:`~agentrl_ext.rollout.episode.Episode`) is what the
evaluator writes to its episodes file.

With several models, every generation call (every turn) is made by a model drawn from them
(AgentRL's cross-sampling at evaluation). The draws of an episode come from a stream seeded by
the run's seed and the episode's (task, index, run), so they do not depend on concurrency.
"""

from __future__ import annotations

import json
import logging
import random
import zlib
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from agentrl_ext.config import AgentLoopConfig, EvalConfig
from agentrl_ext.env.client import ControllerClient
from agentrl_ext.env.protocol import SampleStatus
from agentrl_ext.rollout.episode import Episode, drive_episode
from agentrl_ext.rollout.openai_pool import OpenAIPool, PoolMember, run_episode

logger = logging.getLogger(__name__)

#: how long closing a local policy waits for each model's decode thread to end
CLOSE_TIMEOUT_S = 60.0

#: statuses of an episode the environment (or the model endpoint) could not run to an end
FAILURE_STATUSES = frozenset({SampleStatus.TASK_ERROR.value, SampleStatus.UNKNOWN.value})


@dataclass
class Played:
    """What a policy reports of one episode (the evaluator turns it into an ``EpisodeRecord``)."""

    status: str
    #: the environment's reward of the last answer (before the success rule is applied)
    reward: float
    models: list[str]
    failed: bool = False
    error: str | None = None
    #: the conversation (opening messages, assistant turns with their tool calls, tool answers)
    messages: list[dict[str, Any]] = field(default_factory=list)
    #: the episode's record (:class:`~agentrl_ext.rollout.episode.Episode`), where one was driven
    record: Episode | None = None


@dataclass(frozen=True)
class Sampling:
    """Generation settings shared by both kinds of policy."""

    temperature: float = EvalConfig.temperature
    top_p: float = 1.0
    #: cap on one assistant turn's tokens (None: local: the episode's remaining budget; endpoint: its default)
    max_tokens: int | None = AgentLoopConfig.max_tokens_per_turn
    max_turns: int = AgentLoopConfig.max_turns


def episode_seed(seed: int, task: str, index: Any, run: int) -> int:
    """A stable 31-bit seed per (run seed, task, index, run), the same in every process."""
    return zlib.crc32(json.dumps([seed, task, index, run], default=str).encode()) & 0x7FFFFFFF


class Policy(Protocol):
    """What the evaluator needs of the models under evaluation."""

    names: list[str]

    async def play(self, client: ControllerClient, task: str, index: Any, seed: int) -> Played: ...

    async def close(self) -> None: ...


class EndpointPolicy:
    """Models behind OpenAI-compatible endpoints, one drawn per turn."""

    def __init__(self, members: Sequence[PoolMember], sampling: Sampling, timeout_s: float = 300.0) -> None:
        self.pool = OpenAIPool(members, timeout_s=timeout_s)
        self.names = [m.name for m in members]
        self.sampling = sampling
        self.body: dict[str, Any] = {"temperature": sampling.temperature, "top_p": sampling.top_p}
        if sampling.max_tokens:
            self.body["max_tokens"] = sampling.max_tokens

    async def play(self, client: ControllerClient, task: str, index: Any, seed: int) -> Played:
        rng = random.Random(seed)
        try:
            result = await run_episode(
                client, self.pool, task, index, dict(self.body), self.sampling.max_turns, rng
            )
        except Exception as exc:  # noqa: BLE001  (a malformed answer of one endpoint fails one episode)
            return Played(
                SampleStatus.TASK_ERROR.value, 0.0, [], failed=True, error=f"{type(exc).__name__}: {exc}"
            )
        return Played(
            status=result.status,
            reward=result.reward,
            models=list(result.turn_members),
            failed=result.status in FAILURE_STATUSES,
            error=result.error,
            messages=list(result.messages),
            record=result.record,
        )

    async def close(self) -> None:
        await self.pool.close()


@dataclass(frozen=True)
class LocalBudget:
    """Token budgets of a local episode, with the trainer's meaning (``actor_rollout_ref.rollout.*``)."""

    #: the opening prompt's limit (an episode whose prompt is longer fails)
    prompt_length: int = 1024
    #: all tokens after the prompt: model turns and environment messages (then ``agent context limit``)
    response_length: int = 3072
    dtype: str = "float32"


def is_checkpoint_dir(path: str) -> bool:
    """Whether ``path`` is a local HF checkpoint directory (it holds a ``config.json``)."""
    return (Path(path).expanduser() / "config.json").is_file()


#: files that hold a Hugging Face model's weights (one of them, or shards named in an index)
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)


def resolve_checkpoint(path: str) -> str:
    """The Hugging Face folder to load for ``path``: the folder itself, or, for a verl checkpoint
    (``global_step_N/`` or its ``actor/``), its ``actor/huggingface``. A folder with a config but
    no weights (verl saved without ``hf_model``) is a ValueError naming the merge command."""
    folder = Path(path).expanduser()
    for candidate in (folder / "actor" / "huggingface", folder / "huggingface"):
        if (candidate / "config.json").is_file():
            folder = candidate
            break
    has_config = (folder / "config.json").is_file()
    if (
        has_config
        and not any((folder / f).is_file() for f in WEIGHT_FILES)
        and not any(folder.glob("*.safetensors"))
    ):
        actor = folder.parent if folder.name == "huggingface" else folder
        raise ValueError(
            f"{folder} holds a model config but no weights: verl saved this checkpoint without hf_model. "
            f"Merge its shards into that folder (python -m verl.model_merger merge --backend fsdp --local_dir "
            f"{actor} --target_dir {folder}), or let the run save them: "
            "actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra,hf_model]"
        )
    return str(folder)


class LocalPolicy:
    """HF checkpoints served in this process; episodes driven with the training agent loop's actor.

    It also is the agent loop's server manager (``generate``): each call goes to a model drawn
    from a stream seeded by the episode's seed, and is sampled with a seed derived from it.
    """

    def __init__(
        self,
        paths: Sequence[str],
        controller_url: str,
        sampling: Sampling,
        budget: LocalBudget,
        max_num_seqs: int,
        names: Sequence[str] | None = None,
    ) -> None:
        from verl.workers.config import HFModelConfig, RolloutConfig

        from agentrl_ext.platform.hf_server import HFRolloutServer

        self.names = list(names) if names else _short_names(paths)
        paths = [resolve_checkpoint(p) for p in paths]
        for path in paths:
            if not is_checkpoint_dir(path):
                raise ValueError(
                    f"model {path!r} is not a local HF checkpoint directory (no config.json there); "
                    "give a checkpoint folder, or --base-url URL to evaluate a model behind an OpenAI-compatible endpoint"
                )
        if len(set(self.names)) != len(self.names):
            raise ValueError(f"model names {self.names} must be unique")
        rollout = RolloutConfig(
            name="hf",
            dtype=budget.dtype,
            prompt_length=budget.prompt_length,
            response_length=budget.response_length,
            tensor_model_parallel_size=1,
            max_num_seqs=max_num_seqs,
        )
        self.servers = {
            name: HFRolloutServer(rollout, HFModelConfig(path=str(Path(path).expanduser())))
            for name, path in zip(self.names, paths, strict=True)
        }
        self.tokenizer = _one_tokenizer(self.servers, paths)
        self.sampling = sampling
        self.budget = budget
        self._calls: dict[str, int] = defaultdict(int)
        self.settings = _loop_settings(controller_url, sampling)

    async def generate(
        self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any]
    ) -> Any:
        """verl's server-manager call: draw this turn's model, sample with a per-call seed."""
        params = dict(sampling_params)
        seed = int(params.pop("seed"))
        call = self._calls[request_id]
        self._calls[request_id] += 1
        call_seed = episode_seed(seed, "call", call, 0)
        name = random.Random(call_seed).choice(self.names) if len(self.names) > 1 else self.names[0]
        out = await self.servers[name].generate(
            prompt_ids=prompt_ids, sampling_params={**params, "seed": call_seed}, request_id=request_id
        )
        out.extra_fields = {**(out.extra_fields or {}), "policy": name}
        return out

    async def play(self, client: ControllerClient, task: str, index: Any, seed: int) -> Played:
        from agentrl_ext.rollout.agent_loop import TokenActor

        params = {"temperature": self.sampling.temperature, "top_p": self.sampling.top_p, "seed": seed}
        actor = TokenActor(
            self,
            self.tokenizer,
            self.settings,
            prompt_budget=self.budget.prompt_length,
            response_budget=self.budget.response_length,
            sampling_params=params,
        )
        episode = await drive_episode(client, task, index, actor, max_turns=self.settings.max_turns)
        return Played(
            status=episode.status.value,
            # the score is the task's own: no punishment of unfinished episodes
            reward=episode.reward if episode.status == SampleStatus.COMPLETED else 0.0,
            # a failed episode has no turns to attribute to a model (as in training)
            models=[] if episode.failed else list(actor.turn_policies),
            failed=episode.failed,
            error=episode.error,
            messages=list(episode.messages),
            record=episode,
        )

    async def close(self) -> None:
        self._calls.clear()
        # the decode threads end here, not at interpreter exit (Ctrl-C mid-evaluation exits 130)
        for name, server in self.servers.items():
            if not server.close(timeout_s=CLOSE_TIMEOUT_S):
                logger.warning(
                    "model %s: its decode thread did not end within %.0f s of the abort",
                    name,
                    CLOSE_TIMEOUT_S,
                )


def _short_names(paths: Sequence[str]) -> list[str]:
    """Folder names, or the full paths where two folders share a name."""
    names = [Path(p).expanduser().resolve().name for p in paths]
    return names if len(set(names)) == len(names) else [str(p) for p in paths]


def _one_tokenizer(servers: dict[str, Any], paths: Sequence[str]) -> Any:
    """The models' shared tokenizer; token-level cross-sampling needs one vocabulary and chat template."""
    tokenizers = [s.model_config.tokenizer for s in servers.values()]
    first = tokenizers[0]
    for path, other in zip(paths[1:], tokenizers[1:], strict=True):
        if other.get_vocab() != first.get_vocab() or other.chat_template != first.chat_template:
            raise ValueError(
                f"model {path!r} has another tokenizer or chat template than {paths[0]!r}; local "
                "cross-sampling works on token ids and needs one tokenizer: serve the models behind "
                "OpenAI-compatible endpoints (vllm serve ...) and pass --base-url or name=URL,model instead"
            )
    return first


def _loop_settings(controller_url: str, sampling: Sampling) -> Any:
    """The training agent loop's settings, as evaluation plays episodes with its token actor."""
    from agentrl_ext.config import AgentLoopConfig

    return AgentLoopConfig(
        controller_url=controller_url,
        max_turns=sampling.max_turns,
        max_tokens_per_turn=sampling.max_tokens,
        # the score is the task's own: no punishment of unfinished episodes
        incomplete_punishment=0.0,
    )
