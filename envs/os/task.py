"""``os``: AgentBench-FC's OS interaction as a task worker.

Each episode gets an exclusive container (``agentrl-os:default``, built by
``scripts/build_os_image.sh``; 1 GiB memory, no swap, 2 CPUs, a pids limit, no network), in
which the task's ``init`` scripts run, then its ``start`` script in the agent's shell. The agent
works with ``bash_action(script)`` (output shown as AgentBench shows it: cut at 800 characters)
and ends with ``answer_action(answer)`` or ``finish_action(thought)``; at most ``round_limit``
(8) steps. Scoring as AgentBench does: ``match`` compares the (stripped) answer with the label or
a regex; ``check`` runs the check scripts in the container with the answer as argument, a
``null`` step running the example solution, whose output the next script gets. Reward 1 or 0.

Statuses: ``completed`` after an answer or finish (reward 1/0); ``task limit reached`` after
``round_limit`` steps without one. Invalid steps with ``on_invalid_action="end"`` (for RL recipes): no
tool call, arguments that are not a JSON object, ``bash_action``/``answer_action`` without an
argument -> ``agent validation failed``; an unknown tool -> ``agent invalid action``. With
``"feedback"`` (the default: AgentBench-FC's own behaviour) the agent gets AgentBench's message and the step
counts. An init script that fails -> ``unknown`` (as AgentBench); the container or the engine
failing (e.g. the container is killed) -> ``task error``. The container is removed when the
episode ends, however it ends; containers of a worker that was killed are removed when a worker
starts again (``sweep_orphans``).

    python -m agentrl_ext.env.worker agentrl_ext.envs.os.task:OSTask \\
        --controller-url http://127.0.0.1:5020/api --task-kwargs '{"split": "test"}'
"""

from __future__ import annotations

import dataclasses
import getpass
import logging
import re
import shutil
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from agentrl_ext.env.protocol import SampleIndex, SampleStatus, TaskOutput
from agentrl_ext.env.providers import LocalProvider, ResourceProvider, ResourceSpec, SessionResource
from agentrl_ext.env.worker import InvalidAction, SampleResult, Session, Task
from agentrl_ext.env.worker.actions import AgentAction, ToolCall, parse_action

from . import prompts
from .data import OSSample, load_split
from .integrity import container_clock_ns, tampering
from .shell import SHELL_DIR, Shell, run_script
from .trusted import TrustedTools, prepare_trusted_tools

logger = logging.getLogger(__name__)

PROVIDERS = ("docker", "local")
INVALID_ACTION_POLICIES = ("end", "feedback")
TIMEOUT_POLICIES = ("feedback", "task_error")
DEFAULT_IMAGES = {"default": "agentrl-os:default", "packages": "agentrl-os:packages"}
TIMEOUT_NOTE = "\n[the command did not finish within {seconds:g} seconds and was stopped]"
TOOL_NAMES = [tool["function"]["name"] for tool in prompts.TOOLS]
LOCAL_WARNING = (
    "OS task on the LOCAL provider: NOT ISOLATED. The agent's commands and the tasks' init/check "
    "scripts (useradd, chmod, rm, apt ...) run on this machine as user %s, with its network and files. "
    "Use it only in a throwaway VM; start a Docker engine for real isolation."
)


class OSTask(Task):
    """AgentBench-FC OS interaction.

    Args:
        split: ``test`` (144, ``os-std``), ``dev`` (26) or ``train`` (1000, ``train_0317``).
        data_dir: the data directory (default: ``$AGENTRL_DATA_DIR`` or the XDG default).
        provider: ``docker`` (an exclusive container per episode) or ``local`` (a temporary
            directory and plain subprocesses on this machine: NOT isolated, logged loudly).
        allow_local_fallback: with ``provider="docker"``, use the local provider (with the same
            warning) when no Docker engine answers, instead of failing at start.
        images: image per AgentBench image subtype; a missing subtype image falls back to
            ``default`` with a warning (default: ``agentrl-os:default``, ``agentrl-os:packages``).
        memory_bytes, cpus, pids_limit: the container's limits (1 GiB, no swap; 2; 1024).
        round_limit: agent steps per episode (AgentBench-FC: 8).
        command_timeout_s: limit of one ``bash_action`` (AgentBench: 30 s).
        script_timeout_s: limit of one init, check or example script (AgentBench: 30 s).
        on_timeout: ``feedback`` (default: the output so far and a note go to the agent) or
            ``task_error`` (AgentBench-FC's outcome: its shell read times out and the sample fails).
        on_invalid_action: ``feedback`` (default: AgentBench-FC's rule, its message and the
            step counts against the round limit) or ``end`` (the step ends the episode; for RL
            recipes that want it); see the module docstring. ``calculate_overall`` records it.
        limit: serve only the first ``limit`` samples (smoke tests).
    """

    name = "os"
    tools = prompts.TOOLS
    concurrency = 32

    def __init__(
        self,
        split: str = "test",
        data_dir: str | Path | None = None,
        provider: str = "docker",
        allow_local_fallback: bool = False,
        images: dict[str, str] | None = None,
        memory_bytes: int = 1 << 30,
        cpus: float = 2.0,
        pids_limit: int = 1024,
        round_limit: int = 8,
        command_timeout_s: float = 30.0,
        script_timeout_s: float = 30.0,
        on_timeout: str = "feedback",
        on_invalid_action: str = "feedback",
        limit: int | None = None,
        **overrides: Any,
    ) -> None:
        super().__init__(**overrides)
        if provider not in PROVIDERS:
            raise ValueError(f"OSTask provider={provider!r}; expected one of {PROVIDERS}")
        if on_invalid_action not in INVALID_ACTION_POLICIES:
            raise ValueError(
                f"OSTask on_invalid_action={on_invalid_action!r}; expected one of {INVALID_ACTION_POLICIES}"
            )
        if on_timeout not in TIMEOUT_POLICIES:
            raise ValueError(f"OSTask on_timeout={on_timeout!r}; expected one of {TIMEOUT_POLICIES}")
        if round_limit < 1:
            raise ValueError(f"OSTask round_limit must be >= 1, got {round_limit}")
        for setting, value in (
            ("command_timeout_s", command_timeout_s),
            ("script_timeout_s", script_timeout_s),
        ):
            if value <= 0:
                raise ValueError(f"OSTask {setting} must be positive, got {value}")
        self.provider_name = provider
        self.allow_local_fallback = allow_local_fallback
        self.images = {**DEFAULT_IMAGES, **(images or {})}
        self.spec = ResourceSpec(
            image=self.images["default"],
            memory_bytes=memory_bytes,
            cpus=cpus,
            pids_limit=pids_limit,
            network="none",
            workdir="/root",
        )
        self.round_limit = round_limit
        self.command_timeout_s = command_timeout_s
        self.script_timeout_s = script_timeout_s
        self.on_timeout = on_timeout
        self.on_invalid_action = on_invalid_action
        self.split, samples = load_split(split, data_dir)
        self.samples: list[OSSample] = samples[:limit] if limit is not None else samples
        self.provider: ResourceProvider | None = None
        self.isolated = True
        self._specs: dict[str, ResourceSpec] = {}
        self._trusted: dict[str, TrustedTools] = {}

    # ------------------------------------------------------------------------ lifecycle

    async def setup(self) -> None:
        if self.provider_name == "docker":
            try:
                self.provider = self._docker_provider()
            except RuntimeError:
                if not self.allow_local_fallback:
                    raise
                logger.exception("no usable Docker engine; falling back to the local provider")
        if self.provider is None:
            self.provider = LocalProvider(default_spec=self.spec)
            self.isolated = False
            banner = "!" * 100
            logger.warning("%s\n" + LOCAL_WARNING + "\n%s", banner, getpass.getuser(), banner)
        logger.info(
            "os: %d %s samples, %s provider, images %s",
            len(self.samples),
            self.split,
            "docker" if self.isolated else "LOCAL (not isolated)",
            {k: v.image for k, v in self._specs.items()},
        )

    def _docker_provider(self) -> ResourceProvider:
        """A DockerProvider after sweeping this task's orphaned containers; RuntimeError naming the fix."""
        try:
            import docker
            import docker.errors

            from agentrl_ext.env.providers.docker import LABEL_MANAGED, LABEL_TASK, DockerProvider

            client = docker.from_env()
            client.ping()
        except Exception as exc:  # any failure to reach an engine means: no engine
            raise RuntimeError(
                f"OSTask needs a Docker engine ({exc}); start one (`bash scripts/dockerd.sh start`, "
                "`export DOCKER_HOST=$(bash scripts/dockerd.sh host)`), or pass provider='local' "
                "(NOT isolated: the agent's commands run on this machine)"
            ) from exc
        provider = DockerProvider(client, self.spec, max_parallel=self.concurrency + 4)
        swept = provider.sweep_orphans(self.name)
        if swept:
            logger.warning("os: removed %d container(s) left by a worker that died", swept)
        for subtype, image in self.images.items():
            try:
                client.images.get(image)
            except docker.errors.ImageNotFound:
                if subtype == "default":
                    raise RuntimeError(
                        f"OSTask image {image!r} is not on the Docker engine; build it with "
                        "`bash scripts/build_os_image.sh` (or pass images={'default': ...})"
                    ) from None
                logger.warning(
                    "os: image %r for subtype %r is missing (scripts/build_os_image.sh %s); "
                    "its samples use %r",
                    image,
                    subtype,
                    subtype,
                    self.images["default"],
                )
                continue
            trusted = prepare_trusted_tools(client, image, {LABEL_MANAGED: "true", LABEL_TASK: self.name})
            self._trusted[subtype] = trusted
            self._specs[subtype] = dataclasses.replace(
                self.spec, image=image, read_only_volumes=trusted.mounts
            )
        return provider

    async def teardown(self) -> None:
        if self.provider is not None:
            await self.provider.close()

    def get_indices(self) -> list[SampleIndex]:
        return list(range(len(self.samples)))

    @asynccontextmanager
    async def sandbox(
        self, sample: OSSample, session_id: int
    ) -> AsyncIterator[tuple[SessionResource, Shell]]:
        """The episode's container (or local directory) and the agent's shell in it; removed at exit."""
        assert self.provider is not None, "setup() was not called"
        if self.isolated:
            spec = self._specs.get(sample.image, self._specs["default"])
            async with self.provider.session(self.name, session_id, spec) as box:
                yield box, Shell(box, SHELL_DIR, self.command_timeout_s, workdir=None)
            return
        state = tempfile.mkdtemp(prefix="agentrl-os-shell-")
        try:
            async with self.provider.session(self.name, session_id) as box:
                yield box, Shell(box, state, self.command_timeout_s, workdir=None)
        finally:
            shutil.rmtree(state, ignore_errors=True)

    # -------------------------------------------------------------------------- episode

    async def start_sample(self, index: SampleIndex, session: Session) -> SampleResult:
        position = int(index)
        if not 0 <= position < len(self.samples):
            raise IndexError(f"os index {index!r} out of range 0..{len(self.samples) - 1}")
        sample = self.samples[position]
        async with self.sandbox(sample, session.id) as (box, shell):
            for number, script in enumerate(sample.init):
                init = await run_script(
                    box, script, [], self.script_timeout_s, None, self._trusted_tools(sample)
                )
                if init.exit_code != 0:  # AgentBench: status unknown; the reason goes with it
                    reason = f"init script {number} failed with exit code {init.exit_code}" + (
                        f": {init.output[-500:]}" if init.output.strip() else " (its stdout was empty)"
                    )
                    return SampleResult(
                        SampleStatus.UNKNOWN,
                        reward=0.0,
                        result={"result": False, "index": position, "error": reason},
                        error=reason,
                    )
            if sample.start is not None:
                await shell.run(sample.start.code)  # AgentBench ignores its outcome
            trusted = self._trusted_tools(sample)
            # what the task set up is the baseline: a check runs nothing the agent changed after it
            since = await container_clock_ns(box, trusted) if trusted is not None else None
            session.inject(
                {"role": "system", "content": prompts.SYSTEM_PROMPT},
                {"role": "user", "content": prompts.user_prompt(sample.description)},
            )
            return await self._play(sample, position, box, shell, session, since)

    async def _play(
        self,
        sample: OSSample,
        index: int,
        box: SessionResource,
        shell: Shell,
        session: Session,
        since: int | None = None,
    ) -> SampleResult:
        commands = 0
        for _ in range(self.round_limit):
            action = await session.action(validate=self.on_invalid_action == "end")
            if not action.tool_calls:  # only in "feedback" mode
                session.inject({"role": "user", "content": prompts.NO_TOOL_CALL})
                continue
            call = action.tool_calls[0]  # AgentBench acts on the first call only
            problem = first_call_problem(action) if action.problem is not None else None
            if problem is not None:  # only in "feedback" mode: AgentBench's answer, the step counts
                unknown = problem.status is SampleStatus.AGENT_INVALID_ACTION
                content = prompts.UNKNOWN_TOOL if unknown else problem.reason
                session.inject({"role": "tool", "tool_call_id": call.id, "content": content})
                continue
            value = self._argument(call)
            if value is _MISSING:  # "feedback" mode: AgentBench fails to index the arguments
                session.inject(
                    {"role": "tool", "tool_call_id": call.id, "content": "list index out of range"}
                )
                continue
            if call.name == prompts.BASH_ACTION:
                commands += 1
                session.inject(
                    {"role": "tool", "tool_call_id": call.id, "content": await self._bash(shell, value)}
                )
                continue
            return await self._score(sample, index, box, value, commands, call.name, since)
        return SampleResult(
            SampleStatus.TASK_LIMIT_REACHED,
            reward=0.0,
            metrics={"commands": commands},
            result={"result": False, "reason": "round limit", "index": index},
        )

    def _argument(self, call: ToolCall) -> Any:
        """The call's first argument value, as AgentBench takes it (whatever its name).

        ``finish_action`` may have none (None). Otherwise none: ``agent validation failed``
        ("end"), or _MISSING ("feedback").
        """
        if call.arguments:
            return next(iter(call.arguments.values()))
        if call.name == prompts.FINISH_ACTION:
            return None
        if self.on_invalid_action == "end":
            wanted = "script" if call.name == prompts.BASH_ACTION else "answer"
            raise InvalidAction(
                SampleStatus.AGENT_VALIDATION_FAILED, f"tool call {call.name!r} has no {wanted!r} argument"
            )
        return _MISSING

    async def _bash(self, shell: Shell, script: Any) -> str:
        if not isinstance(script, str):  # AgentBench: an empty output for a non-string script
            return prompts.os_output("")
        result = await shell.run(script)
        text = result.output
        if result.timed_out:
            if self.on_timeout == "task_error":
                raise TimeoutError(f"bash_action did not finish within {self.command_timeout_s:g} s")
            text = text[: prompts.OUTPUT_LIMIT] + TIMEOUT_NOTE.format(seconds=self.command_timeout_s)
        return prompts.os_output(text)

    # -------------------------------------------------------------------------- scoring

    async def _score(
        self,
        sample: OSSample,
        index: int,
        box: SessionResource,
        answer: Any,
        commands: int,
        tool: str,
        since: int | None = None,
    ) -> SampleResult:
        tampered: list[str] = []
        if sample.match is not None:
            if isinstance(answer, str) and sample.match.get("strip"):
                answer = answer.strip()
            correct = match_answer(answer, sample.match)
        else:
            correct = await self._check(sample, box, answer)
            trusted = self._trusted_tools(sample)
            if correct and trusted is not None and since is not None:
                # after the checks: what a check ran must be what the image had (see .integrity)
                tampered = await tampering(box, trusted, since)
                correct = not tampered
        extra = {"tampered": tampered} if tampered else {}
        return SampleResult(
            SampleStatus.COMPLETED,
            reward=1.0 if correct else 0.0,
            metrics={"correct": int(correct), "commands": commands},
            result={
                "result": correct,
                "answer": answer,
                "tool": tool,
                "evaluation": sample.evaluation,
                "index": index,
                "source": sample.source,
                **extra,
            },
        )

    async def _check(self, sample: OSSample, box: SessionResource, answer: Any) -> bool:
        return await check_answer(box, sample, answer, self.script_timeout_s, self._trusted_tools(sample))

    def _trusted_tools(self, sample: OSSample) -> TrustedTools | None:
        """The interpreters the task's scripts run with: the trusted tools of the sample's image
        (None on the local provider, which has no volumes)."""
        if not self.isolated or not self._trusted:
            return None
        return self._trusted.get(sample.image, self._trusted["default"])

    @property
    def benchmark(self) -> str:
        """What this worker runs, as results should name it: ``os-std`` on AgentBench's test split."""
        return "os-std" if self.split == "test" else f"os-{self.split}"

    def calculate_overall(self, results: list[TaskOutput]) -> dict[str, Any]:
        """The default summary plus AgentBench's ``overall`` (total, pass, wrong, acc)."""
        summary = super().calculate_overall(results)
        passed = sum(1 for r in results if isinstance(r.result, dict) and r.result.get("result"))
        total = len(results)
        summary["invalid_action_rule"] = self.on_invalid_action
        summary["benchmark"] = self.benchmark
        summary["overall"] = {
            "total": total,
            "pass": passed,
            "wrong": total - passed,
            "acc": passed / total if total else 0.0,
        }
        return summary


async def check_answer(
    box: SessionResource, sample: OSSample, answer: Any, timeout_s: float, trusted: TrustedTools | None = None
) -> bool:
    """AgentBench's check chain, run in ``box``: each script gets the answer and the previous
    scripts' outputs as arguments (a null step runs the sample's example); all must exit 0.
    ``trusted``: run the scripts with interpreters the agent cannot have replaced (see :mod:`.trusted`)."""
    assert sample.check is not None
    params = [str(answer)]
    for script in sample.check:
        script = script if script is not None else sample.example
        assert script is not None  # data.parse_sample guarantees an example for null steps
        result = await run_script(box, script, params, timeout_s, None, trusted)
        if result.exit_code != 0:
            return False
        params.append(result.output)
    return True


def match_answer(answer: Any, match: dict[str, Any]) -> bool:
    """AgentBench's match: equal to ``answer``, or ``regex`` found in it."""
    if "answer" in match:
        return bool(answer == match["answer"])
    if "regex" in match:
        return isinstance(answer, str) and re.search(match["regex"], answer) is not None
    return False


def first_call_problem(action: AgentAction) -> InvalidAction | None:
    """The problem of the step's first tool call alone (AgentBench looks at no other)."""
    for message in action.messages:
        calls = message.get("tool_calls") if message.get("role") == "assistant" else None
        if calls:
            first = {"role": "assistant", "content": None, "tool_calls": calls[:1]}
            return parse_action([first], TOOL_NAMES).problem
    return None


_MISSING: Any = object()
