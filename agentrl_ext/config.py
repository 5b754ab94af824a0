"""The ``agentrl:`` config node: every key agentrl_ext adds to verl's config, in one place.

The dataclasses below are the only source of truth. They are registered in Hydra's ConfigStore
as the config group ``agentrl`` (option ``default``), so a recipe selects them with
``- agentrl: default`` in its defaults list and overrides values under ``agentrl:``; Hydra and
OmegaConf then reject unknown keys and values of the wrong type at composition time, before
anything starts. :meth:`AgentRLConfig.from_config` turns the composed node into the typed
object; each group checks its own values in ``__post_init__``. It is called in one place,
:func:`agentrl_ext.run_spec.resolve_run_spec`, which also resolves the values that follow from
others and freezes the result: inner code takes that run spec and never re-reads the ``DictConfig``.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Sequence
from dataclasses import FrozenInstanceError, dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Dict, List, Optional  # noqa: UP035 (OmegaConf structured configs)

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from agentrl_ext.cli import DEFAULT_CONTROLLER_PORT
from agentrl_ext.env.client import DEFAULT_CAPACITY_WAIT_S, DEFAULT_RETRY_DEADLINE_S, DEFAULT_TIMEOUT_S
from agentrl_ext.models.chat_template import CHAT_TEMPLATES

#: the environment variable that sets ``agentrl.cache_dir`` when the config leaves it unset
CACHE_DIR_ENV = "AGENTRL_CACHE_DIR"
DEFAULT_CACHE_DIR = ".cache/agentrl"


class Freezable:
    """A config dataclass that refuses assignment once frozen (:func:`agentrl_ext.run_spec.freeze`):
    the run spec's values are resolved once and never changed after."""

    _frozen: ClassVar[bool] = False

    def __setattr__(self, name: str, value: Any) -> None:
        if self._frozen:
            raise FrozenInstanceError(
                f"{type(self).__name__}.{name} is part of the resolved run spec, which no stage changes; "
                f"set agentrl.* in the recipe or on the command line instead"
            )
        super().__setattr__(name, value)


@dataclass
class AssetsConfig(Freezable):
    """``agentrl.assets``: offline assets the entry point builds before launching verl, when missing."""

    #: build the tiny offline model at ``actor_rollout_ref.model.path`` if that path does not exist
    #: (or holds a tiny model built from other settings; its ``agentrl_tiny_model.json`` tells)
    build_tiny_model: bool = False
    #: seed of the tiny model built there
    tiny_model_seed: int = 0
    #: sizes of that tiny model that differ from TinyModelSpec's (e.g. {hidden_size: 128, num_layers: 4})
    tiny_model_spec: dict[str, int] = field(default_factory=dict)
    #: expert episodes per task (the run's tasks that have an expert) whose chat-rendered text the
    #: tiny tokenizer also learns from, so that the tasks' prompts and tool calls take few tokens,
    #: as with a real model's tokenizer; 0: the embedded corpus only. Played through the
    #: controller, so the environments must be up (the main job starts them first).
    tokenizer_expert_episodes: int = 0
    #: the tiny model's chat template: ``qwen25`` (Qwen2.5's form: tool schemas as JSON) or
    #: ``compact`` (one short line per tool: openings take about half the tokens); see
    #: agentrl_ext/models/chat_template.py
    tiny_chat_template: str = "qwen25"
    #: build the toy letters dataset at ``data.train_files`` / ``data.val_files`` if missing
    build_toy_data: bool = False
    #: build ``data.train_files`` (AgentRL's task mixing) and ``data.val_files`` from the
    #: controller's indices of the run's tasks (``agentrl.envs.tasks``) before training
    build_env_data: bool = False
    #: how often each task appears in that training data, relative to the others (default 1 each:
    #: AgentRL's balanced mixing), e.g. {guess: 2}: guess twice as often, spread evenly
    task_weights: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.tokenizer_expert_episodes < 0:
            raise ValueError(
                f"agentrl.assets.tokenizer_expert_episodes must be >= 0 (0: no task text), "
                f"got {self.tokenizer_expert_episodes}"
            )
        if self.tiny_chat_template not in CHAT_TEMPLATES:
            raise ValueError(
                f"agentrl.assets.tiny_chat_template={self.tiny_chat_template!r} is not a tiny-model chat "
                f"template; choose one of {', '.join(sorted(CHAT_TEMPLATES))}"
            )
        bad = {task: w for task, w in self.task_weights.items() if not w > 0}
        if bad:
            raise ValueError(
                f"agentrl.assets.task_weights must be > 0, got {bad}; to train without a task, "
                f"leave it out of the run's tasks"
            )


@dataclass
class AgentLoopConfig(Freezable):
    """``agentrl.agent_loop``: the multi-turn function-call agent loop (``agent_name: agentrl``)."""

    #: controller base URL, e.g. http://127.0.0.1:5020/api; on several nodes an address every
    #: node reaches (agentrl-train probes it from each node before the first step); with
    #: agentrl.envs.launch leave it unset: the run spec derives the launched controller's
    #: (http://<agentrl.envs.advertise_host or host>:<agentrl.envs.port>/api)
    controller_url: Optional[str] = None  # noqa: UP045  (OmegaConf structured configs need Optional)
    #: controller of the validation rows (``extra_info.split`` val, agentrl-build-dataset --kind val):
    #: one serving the held-out test split (agentrl-envs up --split test); null: controller_url
    val_controller_url: Optional[str] = None  # noqa: UP045
    #: hard cap on assistant turns (each task's own turn limit applies too)
    max_turns: int = 32
    #: reward of a trajectory that does not end ``completed`` (AgentRL: -0.2)
    incomplete_punishment: float = -0.2
    #: an episode counts as a success when it ends ``completed`` with at least this reward
    success_reward: float = 1.0
    #: cap on the tokens of one assistant turn (None: the whole remaining response budget)
    max_tokens_per_turn: Optional[int] = None  # noqa: UP045
    #: the model's tool-call format: hermes (Qwen2.5) or any verl tool parser name
    tool_format: str = "hermes"
    #: seconds a session start / interact keeps retrying an unreachable controller (and a start a
    #: 503) before the sample is dropped: a controller restart shorter than this costs a wait, not
    #: episodes (a call that reached the controller is never retried: that episode is dropped)
    env_retry_deadline_s: float = DEFAULT_RETRY_DEADLINE_S
    #: optional cap on those attempts (null: only env_retry_deadline_s bounds them)
    env_attempts: Optional[int] = None  # noqa: UP045
    #: seconds a session start waits for a free worker slot (the controller's 503 when every worker
    #: of the task is at capacity) before the episode is dropped; the wait is counted
    #: (agentrl/env/start_wait_s_*). Size the fleet (agentrl.envs.replicas) so that it rarely waits
    env_capacity_wait_s: float = DEFAULT_CAPACITY_WAIT_S
    #: seconds one environment call may take: longer than the controller's own bounds (120 s for a
    #: worker's answer, ~26 s to declare a hung worker lost), so its ``task error`` and reason arrive first
    env_timeout_s: float = DEFAULT_TIMEOUT_S
    #: retries of a generation that came back aborted (e.g. the server was paused for a weight
    #: update); its partial tokens are discarded, and after the last retry the episode is dropped
    abort_retries: int = 2
    #: seconds to wait before retrying an aborted generation
    abort_retry_delay_s: float = 1.0
    #: the trainer stops with an error after this many batches in a row in which every episode
    #: failed (controller or workers gone: there is nothing to train on, and the update is a no-op)
    max_failed_batches: int = 3
    #: the trainer stops with an error when more than this share of a batch's episodes could not
    #: reach the environment service (env_transport with no answer from the controller, or its
    #: credentials refused: a node that cannot reach it); a worker dying behind a reachable
    #: controller is not counted; 1.0 turns it off
    max_transport_failure_share: float = 0.2

    def __post_init__(self) -> None:
        if not 0.0 <= self.max_transport_failure_share <= 1.0:
            raise ValueError(
                f"agentrl.agent_loop.max_transport_failure_share={self.max_transport_failure_share} must be "
                "within [0, 1] (1 turns the check off)"
            )
        if self.env_capacity_wait_s < 0:
            raise ValueError(
                f"agentrl.agent_loop.env_capacity_wait_s={self.env_capacity_wait_s} must be >= 0"
            )
        if self.max_turns < 1:
            raise ValueError(f"agentrl.agent_loop.max_turns={self.max_turns} must be >= 1")
        if self.max_failed_batches < 1:
            raise ValueError(f"agentrl.agent_loop.max_failed_batches={self.max_failed_batches} must be >= 1")
        if self.env_attempts is not None and self.env_attempts < 1:
            raise ValueError(f"agentrl.agent_loop.env_attempts={self.env_attempts} must be >= 1 (or null)")
        if self.env_retry_deadline_s < 0:
            raise ValueError(
                f"agentrl.agent_loop.env_retry_deadline_s={self.env_retry_deadline_s} must be >= 0"
            )
        if self.abort_retries < 0 or self.abort_retry_delay_s < 0:
            raise ValueError(
                f"agentrl.agent_loop.abort_retries={self.abort_retries} and abort_retry_delay_s="
                f"{self.abort_retry_delay_s} must be >= 0"
            )
        if self.env_timeout_s <= 0:
            raise ValueError(f"agentrl.agent_loop.env_timeout_s={self.env_timeout_s} must be > 0")
        if self.max_tokens_per_turn is not None and self.max_tokens_per_turn < 1:
            raise ValueError(
                f"agentrl.agent_loop.max_tokens_per_turn={self.max_tokens_per_turn} must be >= 1 (or null)"
            )


@dataclass
class CrossPolicyConfig(Freezable):
    """``agentrl.cross_policy``: AgentRL's cross-policy sampling with a stale pool."""

    #: cross-policy sampling: each generation call may go to a stale copy of the policy
    enable: bool = False
    #: probability that a generation call goes to the stale pool (AgentRL: 0.25)
    stale_ratio: float = 0.25
    #: the stale pool's weights are refreshed every this many steps (AgentRL: 25)
    stale_step: int = 25
    #: replicas in the stale pool
    stale_replicas: int = 1
    #: routing seed (each agent-loop worker draws its own stream from it)
    seed: int = 0
    #: log each pool's importance ratio π_θ/π_behaviour at the start of the update (one extra
    #: actor forward per step, the one bypass mode otherwise saves)
    ratio_metrics: bool = True

    def __post_init__(self) -> None:
        if not 0.0 <= self.stale_ratio <= 1.0:
            raise ValueError(f"agentrl.cross_policy.stale_ratio={self.stale_ratio} must be within [0, 1]")
        if self.stale_step < 1:
            raise ValueError(f"agentrl.cross_policy.stale_step={self.stale_step} must be >= 1")
        if self.stale_replicas < 1:
            raise ValueError(f"agentrl.cross_policy.stale_replicas={self.stale_replicas} must be >= 1")


@dataclass
class TurnCreditConfig(Freezable):
    """``agentrl.turn_credit``: a per-turn advantage added to ``task_norm_grpo``'s episode advantage.

    Turns taken in the same state (the same token context: same task prompt, same turns and
    answers so far) anywhere in the batch form a group; each turn's return is its episode's reward
    discounted by ``gamma`` per later turn, and its advantage within the group is
    (return - mean) / (std + eps), as GiGPO's step-level advantage (arXiv 2505.10978). Every token of
    the turn gets the episode advantage plus ``weight`` times it. Off (``weight`` 0) by default.
    """

    #: weight of the per-turn advantage (GiGPO's omega); 0 turns it off
    weight: float = 0.0
    #: discount per later turn of a turn's return (GiGPO: 0.95)
    gamma: float = 0.95

    def __post_init__(self) -> None:
        if not self.weight >= 0.0:
            raise ValueError(f"agentrl.turn_credit.weight={self.weight} must be >= 0 (0 turns it off)")
        if not 0.0 < self.gamma <= 1.0:
            raise ValueError(f"agentrl.turn_credit.gamma={self.gamma} must be within (0, 1]")


@dataclass
class AsyncPipelineConfig(Freezable):
    """``agentrl.async_pipeline``: the fully asynchronous pipeline (``trainer.v1.trainer_mode=agentrl_async``)."""

    #: trajectories that may exist untrained, finished or in flight (the bounded buffer); null:
    #: 2 x data.train_batch_size x rollout.n (AgentRL)
    buffer_size: Optional[int] = None  # noqa: UP045
    #: episodes in flight at most (whole GRPO groups); null: as many as the buffer holds
    concurrency: Optional[int] = None  # noqa: UP045
    #: drop (and replace) a group when a turn generated by the current pool lags more than this
    #: many weight versions behind the step that would train it; null: bounded by the buffer only
    max_staleness: Optional[int] = None  # noqa: UP045
    #: a group some of whose episodes raised keeps its survivors when at least this many came back;
    #: else it is dropped and a fresh prompt replaces it (both counted)
    min_group_size: int = 2
    #: seconds between two looks at the buffer while the trainer waits for a batch
    poll_interval_s: float = 0.05

    def __post_init__(self) -> None:
        for name in ("buffer_size", "concurrency"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"agentrl.async_pipeline.{name}={value} must be >= 1 (or null)")
        if self.max_staleness is not None and self.max_staleness < 0:
            raise ValueError(
                f"agentrl.async_pipeline.max_staleness={self.max_staleness} must be >= 0 (or null)"
            )
        if self.min_group_size < 1:
            raise ValueError(f"agentrl.async_pipeline.min_group_size={self.min_group_size} must be >= 1")
        if self.poll_interval_s <= 0:
            raise ValueError(f"agentrl.async_pipeline.poll_interval_s={self.poll_interval_s} must be > 0")


@dataclass
class EnvsConfig(Freezable):
    """``agentrl.envs``: the environment stack ``agentrl-train`` starts itself (what ``agentrl-envs up`` starts)."""

    #: start the controller, the task workers and the servers they need before training, stop them after
    launch: bool = False
    #: the tasks to serve (names in the task catalogue, `agentrl-envs list`), e.g. [dbbench, kg]
    tasks: Optional[List[str]] = None  # noqa: UP006, UP045
    #: the controller's port
    port: int = DEFAULT_CONTROLLER_PORT
    #: the address the controller and the workers bind (beyond loopback a worker secret is
    #: required: agentrl.envs.secret_file or $AGENTRL_ENV_WORKER_SECRET)
    host: str = "127.0.0.1"
    #: the address the trainer's nodes and the workers reach the controller at (null: host); give
    #: it when host is 0.0.0.0, e.g. the head node's cluster address
    advertise_host: Optional[str] = None  # noqa: UP045
    #: file holding the worker secret the controller and the workers share (null: $AGENTRL_ENV_WORKER_SECRET)
    secret_file: Optional[str] = None  # noqa: UP045
    #: task workers per task (default 1 each), e.g. {alfworld: 7}: a step's episodes of a task
    #: should fit the sum of its workers' concurrency (docs/gpu.md sizes it per recipe)
    replicas: Dict[str, int] = field(default_factory=dict)  # noqa: UP006
    #: the tasks' split: train or test
    split: str = "train"
    #: each task worker in its own container (images built by scripts/build_task_image.sh)
    docker: bool = False
    #: per-task keyword arguments over the launcher's defaults, e.g. {dbbench: {backend: sqlite}}
    #: (an empty dict, not None: OmegaConf cannot merge an override such as
    #: ``+agentrl.envs.task_kwargs={guess: {show_range: true}}`` into a None node)
    task_kwargs: Dict[str, Any] = field(default_factory=dict)  # noqa: UP006
    #: seconds to wait for each worker to become healthy
    ready_timeout_s: float = 300.0
    #: where the controller and the workers run: local (processes or containers on the trainer's
    #: node) or ray (Ray actors on the cluster's nodes offering ray_resource; docs/environment_service.md)
    placement: str = "local"
    #: placement ray: the Ray cluster (auto: $RAY_ADDRESS or the one on this node; give verl's
    #: ray_kwargs.ray_init.address the same)
    ray_address: str = "auto"
    #: placement ray: the custom resource a node offers per task worker (ray start --resources '{"agentrl_env": 8}')
    ray_resource: str = "agentrl_env"
    #: placement ray: workers per task on every node offering ray_resource, also on nodes that join,
    #: e.g. {guess: 2} (instead of the one default worker; replicas still adds spread workers)
    per_node: Dict[str, int] = field(default_factory=dict)  # noqa: UP006

    def __post_init__(self) -> None:
        from agentrl_ext.env.tasks import SPLITS, task_specs

        known = ", ".join(task_specs())
        if self.launch and not self.tasks:
            raise ValueError(
                f"agentrl.envs.launch=true needs agentrl.envs.tasks, e.g. [dbbench,kg]; known tasks: {known}"
            )
        bad = {name: n for name, n in (self.replicas or {}).items() if n < 1}
        if bad:
            raise ValueError(f"agentrl.envs.replicas must be >= 1 per task, got {bad}")
        for name in [*(self.tasks or []), *(self.task_kwargs or {}), *(self.replicas or {})]:
            if name not in task_specs():
                raise ValueError(f"agentrl.envs: unknown task {name!r}; known tasks: {known}")
        if self.split not in SPLITS:
            raise ValueError(f"agentrl.envs.split={self.split!r}; expected one of {SPLITS}")
        if self.placement not in ("local", "ray"):
            raise ValueError(f"agentrl.envs.placement={self.placement!r}; expected local or ray")
        if self.per_node and self.placement != "ray":
            raise ValueError(
                f"agentrl.envs.per_node={dict(self.per_node)} places workers on Ray nodes; set agentrl.envs.placement=ray"
            )
        bad = {
            name: n for name, n in (self.per_node or {}).items() if n < 1 or name not in (self.tasks or [])
        }
        if bad:
            raise ValueError(
                f"agentrl.envs.per_node {bad}: each count must be >= 1 and name a task of agentrl.envs.tasks"
            )
        if not 0 < self.port < 65536:
            raise ValueError(f"agentrl.envs.port={self.port} is not a TCP port")
        if self.ready_timeout_s <= 0:
            raise ValueError(f"agentrl.envs.ready_timeout_s={self.ready_timeout_s} must be > 0")


@dataclass
class SFTConfig(Freezable):
    """``agentrl.sft``: a warm start before RL, verl's SFT trainer on the tasks' expert trajectories."""

    #: run the warm start (``agentrl-train`` plays the experts through the controller, trains with
    #: verl's SFT trainer, then starts RL from the weights it saved)
    enable: bool = False
    #: tasks whose experts play (empty: every task of the run with an expert, see agentrl_ext.data.expert)
    tasks: list[str] = field(default_factory=list)
    #: expert episodes per task, from the start of its train split
    episodes_per_task: int = 300
    #: {task: k}: k times as many episodes of that task (the same indices played again with other
    #: seeds, so a careless demonstrator makes other moves), hence k times its share of each SFT batch
    task_weights: dict[str, int] = field(default_factory=dict)
    #: a careless expert per task: {task: epsilon} plays its careless move (below) with probability
    #: epsilon each turn, the expert's otherwise; 1.0: the careless move only (a demonstrator that is
    #: not the expert at all); imperfect demonstrations RL can beat
    expert_noise: dict[str, float] = field(default_factory=dict)
    #: the careless move per task ({task: name}): ``<name>_action`` of the task's expert module;
    #: ``random`` (the default), ``feasible`` (every procedural task: a move consistent with all the
    #: environment said, chosen at random: the warm start learns to read the environment and RL the
    #: choice) or one the module adds, e.g. guess's ``habit`` (always the same number)
    careless_move: dict[str, str] = field(default_factory=dict)
    #: keep the demonstrations that lost within the task's rules (status ``task limit reached`` or
    #: a wrong answer) as well as the won ones. With a careless demonstrator, keeping only the won
    #: ones is already a policy improvement (the moves that happened to win are over-represented);
    #: keeping all makes the warm start's behaviour the demonstrator's, whose success is measured
    keep_lost: bool = False
    #: after the warm start (with ``agentrl.eval``), play each task's demonstrator this many times on
    #: every held-out seed and its expert once (the room RL has), and sample the warm-started
    #: model's moves in the demonstrator's contexts (whether it reads the environment); 0: off
    #: (``agentrl_ext.eval.warm_start_probe``, printed in report.md)
    probe_runs: int = 4
    #: optimizer steps
    steps: int = 60
    #: episodes per optimizer step
    batch_size: int = 16
    #: episodes per forward/backward
    micro_batch_size: int = 16
    #: peak learning rate
    lr: float = 2e-3
    #: linear warm-up steps
    warmup_steps: int = 5
    #: constant or cosine
    lr_scheduler: str = "cosine"
    #: tokens per episode at most (longer episodes are an error: raise it)
    max_length: int = 1024
    #: every batch one task's episodes (``agentrl_ext.trainer.sft_dataset.TaskBatchSampler``; each
    #: task keeps its share of the steps). The CPU platform pads a batch to its longest episode, so
    #: batches that mix short and long tasks cost the long one's length for every row; on the main
    #: job's data one task per batch halves the tokens a step. Off: verl's shuffled mixed batches
    batch_by_task: bool = False
    #: seed of verl's SFT trainer (data order, init of anything random)
    seed: int = 1
    #: extra overrides for verl.trainer.sft_trainer (e.g. [optim.weight_decay=0.0])
    overrides: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        for name in ("episodes_per_task", "steps", "batch_size", "micro_batch_size", "max_length"):
            if getattr(self, name) < 1:
                raise ValueError(f"agentrl.sft.{name}={getattr(self, name)} must be >= 1")
        bad_weights = {t: k for t, k in self.task_weights.items() if not (isinstance(k, int) and k >= 1)}
        if bad_weights:
            raise ValueError(f"agentrl.sft.task_weights must be integers >= 1, got {bad_weights}")
        if self.probe_runs < 0:
            raise ValueError(f"agentrl.sft.probe_runs={self.probe_runs} must be >= 0 (0: no probe)")
        if self.batch_size % self.micro_batch_size:
            raise ValueError(
                f"agentrl.sft.batch_size={self.batch_size} must be a multiple of "
                f"agentrl.sft.micro_batch_size={self.micro_batch_size}"
            )
        if self.lr <= 0 or self.warmup_steps < 0:
            raise ValueError(
                f"agentrl.sft.lr={self.lr} must be > 0 and warmup_steps={self.warmup_steps} >= 0"
            )
        if self.lr_scheduler not in ("constant", "cosine"):
            raise ValueError(f"agentrl.sft.lr_scheduler={self.lr_scheduler!r} must be constant or cosine")
        bad = {task: eps for task, eps in self.expert_noise.items() if not 0.0 <= eps <= 1.0}
        if bad:
            raise ValueError(f"agentrl.sft.expert_noise values must be in [0, 1], got {bad}")


@dataclass
class EvalConfig(Freezable):
    """``agentrl.eval``: held-out evaluation of the policy before and after RL (``agentrl-train``)."""

    #: evaluate before RL (after the warm start) and after it, print the table and write the plots
    enable: bool = False
    #: the evaluation before RL too (false: after RL only, e.g. a second RL arm from a start that
    #: was evaluated already; scripts/train_arms.sh)
    before_rl: bool = True
    #: tasks to evaluate (empty: every task of the run)
    tasks: list[str] = field(default_factory=list)
    #: the held-out split: with agentrl.envs.launch, a second controller serves the tasks on it
    split: str = "test"
    #: the controller to evaluate through when agentrl.envs.launch is off (null: the agent loop's)
    controller_url: Optional[str] = None  # noqa: UP045
    #: the first this many indices of each task's split
    num_samples: int = 100
    #: episodes per sample
    runs_per_sample: int = 1
    #: sampling temperature (0: greedy)
    temperature: float = 0.0
    #: episodes in flight
    concurrency: int = 32
    #: assistant turns at most (null: agentrl.agent_loop.max_turns)
    max_turns: Optional[int] = None  # noqa: UP045

    def __post_init__(self) -> None:
        for name in ("num_samples", "runs_per_sample", "concurrency"):
            if getattr(self, name) < 1:
                raise ValueError(f"agentrl.eval.{name}={getattr(self, name)} must be >= 1")
        if self.temperature < 0:
            raise ValueError(f"agentrl.eval.temperature={self.temperature} must be >= 0")
        if self.max_turns is not None and self.max_turns < 1:
            raise ValueError(f"agentrl.eval.max_turns={self.max_turns} must be >= 1 (or null)")


@dataclass
class RecordsConfig(Freezable):
    """``agentrl.records``: episode records of training written to disk (``agentrl-replay`` reads them)."""

    #: the share of training episodes written as records, drawn per episode (0: off)
    rate: float = 0.0
    #: the folder of the records files (one JSON Lines file per agent-loop process); needed when rate > 0
    dir: Optional[str] = None  # noqa: UP045

    def __post_init__(self) -> None:
        if not 0.0 <= self.rate <= 1.0:
            raise ValueError(f"agentrl.records.rate={self.rate} must be in [0, 1] (0: off)")
        if self.rate > 0 and not self.dir:
            raise ValueError(
                f"agentrl.records.rate={self.rate} writes episode records but agentrl.records.dir is not set; "
                "set it to a folder, e.g. agentrl.records.dir=outputs/records"
            )
        if self.dir:
            # absolute: the agent-loop workers (Ray processes) may not share the driver's directory
            self.dir = str(Path(os.path.expanduser(self.dir)).resolve())


@dataclass
class AgentRLConfig(Freezable):
    """The whole ``agentrl:`` node."""

    #: where offline assets are built; unset: ``$AGENTRL_CACHE_DIR``, else ``.cache/agentrl``
    #: (made absolute at start, because Ray processes may not share the driver's directory)
    cache_dir: Optional[str] = None  # noqa: UP045
    #: seconds between two looks of verl's replay buffer for a finished batch (verl's own, not
    #: configurable there: 2.0, which rounds every step's generation up to a 2-second boundary)
    replay_poll_interval_s: float = 0.05
    assets: AssetsConfig = field(default_factory=AssetsConfig)
    agent_loop: AgentLoopConfig = field(default_factory=AgentLoopConfig)
    cross_policy: CrossPolicyConfig = field(default_factory=CrossPolicyConfig)
    turn_credit: TurnCreditConfig = field(default_factory=TurnCreditConfig)
    envs: EnvsConfig = field(default_factory=EnvsConfig)
    async_pipeline: AsyncPipelineConfig = field(default_factory=AsyncPipelineConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    records: RecordsConfig = field(default_factory=RecordsConfig)

    def __post_init__(self) -> None:
        raw = (
            self.cache_dir
            if self.cache_dir is not None
            else os.environ.get(CACHE_DIR_ENV) or DEFAULT_CACHE_DIR
        )
        if not str(raw).strip():
            raise ValueError(
                f"agentrl.cache_dir is empty; set it to a writable directory (default {DEFAULT_CACHE_DIR})"
            )
        self.cache_dir = str(Path(os.path.expanduser(str(raw))).resolve())
        if not self.replay_poll_interval_s > 0:
            raise ValueError(
                f"agentrl.replay_poll_interval_s={self.replay_poll_interval_s} must be > 0 (verl's own is 2.0)"
            )

    @classmethod
    def from_config(cls, node: DictConfig | dict[str, Any] | None) -> AgentRLConfig:
        """The typed object of a composed ``agentrl`` node (or a plain dict), naming bad keys and values."""
        schema = OmegaConf.structured(cls)
        try:
            merged = OmegaConf.merge(schema, node if node is not None else {})
            obj = OmegaConf.to_object(merged)
        except OmegaConfBaseException as exc:
            known = [key for key, _default, _meaning in describe_keys(cls)]
            full_key = getattr(exc, "full_key", None)
            hint = did_you_mean(f"agentrl.{full_key}", known) if full_key else ""
            raise ValueError(f"invalid agentrl config: {exc}{hint}\nknown keys: {', '.join(known)}") from exc
        assert isinstance(obj, cls)
        return obj


def describe_keys(klass: type = AgentRLConfig, prefix: str = "agentrl") -> list[tuple[str, str, str]]:
    """``(key, default, meaning)`` of every key, the meaning read from the ``#:`` comments above
    each field (so the dataclasses stay the one source of truth, also for ``--help``)."""
    import ast
    import inspect
    from dataclasses import MISSING, fields, is_dataclass

    source = inspect.getsource(klass)
    lines = source.splitlines()
    comments: dict[str, str] = {}
    for node in ast.parse(source).body[0].body:  # type: ignore[attr-defined]
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            doc: list[str] = []
            row = node.lineno - 2
            while row >= 0 and lines[row].strip().startswith("#:"):
                doc.insert(0, lines[row].strip()[2:].strip())
                row -= 1
            comments[node.target.id] = " ".join(doc)
    out: list[tuple[str, str, str]] = []
    for f in fields(klass):
        key = f"{prefix}.{f.name}"
        if f.default_factory is not MISSING and is_dataclass(f.default_factory):  # a nested group
            out += describe_keys(f.default_factory, key)  # type: ignore[arg-type]
        else:
            default = f.default_factory() if f.default_factory is not MISSING else f.default
            out.append((key, repr(default) if default is not None else "null", comments.get(f.name, "")))
    return out


def did_you_mean(key: str, known: Sequence[str]) -> str:
    """``; did you mean X?`` for the known keys closest to ``key`` (difflib), or ``""``."""
    close = difflib.get_close_matches(key, known, n=3, cutoff=0.75)
    return f"; did you mean {' or '.join(close)}?" if close else ""


def unknown_agentrl_override(key: str) -> str | None:
    """The error for an ``agentrl.*`` override that names no key (with a suggestion), else None.
    A key below a mapping-valued key (``agentrl.envs.task_kwargs.guess.show_range``) is known."""
    known = [k for k, _default, _meaning in describe_keys()]
    if key in known or any(key.startswith(k + ".") or k.startswith(key + ".") for k in known):
        return None
    return f"{key} is not an agentrl key{did_you_mean(key, known)} (agentrl-train --help lists them all)"


CONFIGURATION_DOC_HEADER = """\
# Configuration: the `agentrl:` node

<!-- generated by `python -m agentrl_ext.config > docs/configuration.md` from the dataclasses in
agentrl_ext/config.py; tests/test_configuration_doc_on_cpu.py keeps it in sync -->

Every key we add to verl's config lives under one `agentrl:` node. Its one source of truth is the
dataclasses in `agentrl_ext/config.py`, registered as Hydra's config group `agentrl` (option
`default`): a recipe selects them with `- agentrl: default` in its defaults list, every key can be
overridden without `+` (with verl's own `main_ppo`, whose config has no `agentrl` node, add them
with `+`), and an unknown key or a value of the wrong type is an error before anything starts
(`agentrl-train` names the closest keys). YAML recipes read no environment variables.
`agentrl-train --help` prints the same list. Everything else is verl's own configuration.

The node is resolved once, by the entry point, into a frozen run spec (`agentrl_ext/run_spec.py`):
each group below checks its own values, the run spec what spans groups and the values that follow
from others (the agent loop's controller URL with `agentrl.envs.launch`, the evaluation's turn cap
and controller), and `agentrl-train`'s checks how it fits verl's own keys. The resolved node is
written into verl's config once, before the first stage, because verl's trainer and agent-loop
workers are Ray processes that receive verl's config and nothing else; no stage writes it again.

A recipe sets an `agentrl.*` key only to change it: a value equal to the one the key has without
it (the default below, a value the run spec derives, or what a base recipe it composes sets) is
refused by `tests/trainer/test_recipe_defaults_on_cpu.py`. Keys a recipe must set have no default
(null); a recipe whose meaning rests on a default says so in a comment.
"""


def configuration_markdown() -> str:
    """``docs/configuration.md``: every ``agentrl.*`` key with its default and meaning, one table
    per group, from :func:`describe_keys`."""
    groups: dict[str, list[tuple[str, str, str]]] = {}
    for key, default, meaning in describe_keys():
        parts = key.split(".")
        group = parts[1] if len(parts) > 2 else ""
        groups.setdefault(group, []).append((key, default, meaning))
    out = [CONFIGURATION_DOC_HEADER]
    for group, rows in groups.items():
        out += [
            f"## `agentrl.{group}`" if group else "## Top level",
            "",
            "| key | default | meaning |",
            "|---|---|---|",
        ]
        for key, default, meaning in rows:
            cell = meaning.replace("``", "`").replace("|", "\\|")
            out.append(f"| `{key}` | `{default}` | {cell} |")
        out.append("")
    return "\n".join(out)


def register_config_group() -> None:
    """Register the dataclasses as Hydra's config group ``agentrl`` (option ``default``)."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(group="agentrl", name="default", node=AgentRLConfig, package="agentrl")


register_config_group()


if __name__ == "__main__":
    print(configuration_markdown(), end="")
