"""Episode records and ``agentrl-replay``: record an episode of every task that runs here, replay
it through a new session of the task's worker, and see it match; an altered record fails, naming
the first difference.

The toy tasks play their experts; the AgentBench tasks play a few scripted actions (a tool call or
two that the task answers, then the turn cap or the task's own end), enough to check that the
worker answers the same actions with the same observations, statuses and rewards.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from agentrl_ext.data.expert import play_expert_episode
from agentrl_ext.env.client import ControllerClient
from agentrl_ext.env.protocol import SampleStatus
from agentrl_ext.rollout.episode import Episode, ScriptedActor, Turn, drive_episode, read_records
from agentrl_ext.rollout.replay import first_difference, main
from agentrl_ext.testing.env_servers import env_servers
from agentrl_ext.testing.vendored_data import installed_data_dir


def call(name: str, **arguments: Any) -> dict[str, Any]:
    """An assistant message with one tool call."""
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": f"call_{name}",
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(arguments)},
            }
        ],
    }


#: scripted actions of the AgentBench tasks: (launcher task, its kwargs, index, actions, turn cap)
SCRIPTS: dict[str, tuple[str, dict[str, Any], Any, list[dict[str, Any]], int]] = {
    "dbbench-sqlite": (
        "dbbench",
        {"backend": "sqlite"},
        0,
        [call("execute_sql", query="SELECT 1 + 1"), call("commit_final_answer", answers=["2"])],
        8,
    ),
    "dbbench-mariadb": (
        "dbbench",
        {},
        0,
        [call("execute_sql", query="SELECT 1 + 1"), call("commit_final_answer", answers=["2"])],
        8,
    ),
    "os": (
        "os",
        {},
        0,
        [call("bash_action", script="echo hello; ls / | head -3"), call("answer_action", answer="hello")],
        8,
    ),
    "kg": ("kg", {}, 0, [call("get_relations", variable="#0"), call("count", variable="#0")], 2),
    "webshop": (
        "webshop",
        {},
        0,
        [call("search_action", keywords="red shirt"), call("click_action", value="back to search")],
        2,
    ),
    "alfworld": (
        "alfworld",
        {},
        0,
        [call("take_action", action="look"), call("take_action", action="inventory")],
        2,
    ),
}


async def record_scripted(
    controller_url: str, task: str, index: Any, actions: list[dict[str, Any]], cap: int
) -> Episode:
    async with ControllerClient(controller_url) as client:
        return await drive_episode(
            client, task, index, ScriptedActor(actions, policy="script"), max_turns=cap
        )


def write(path: Path, *episodes: Episode | dict[str, Any]) -> Path:
    path.write_text(
        "".join(json.dumps(e.to_dict() if isinstance(e, Episode) else e) + "\n" for e in episodes)
    )
    return path


def altered(record: dict[str, Any]) -> dict[str, Any]:
    """The record with the first turn's first observation message changed."""
    changed = json.loads(json.dumps(record))
    changed["turns"][0]["observation"][0]["content"] = "not what the task said"
    return changed


# --------------------------------------------------------------------------------- the comparison


def test_first_difference_names_the_first_place_on_cpu():
    opening = [{"role": "user", "content": "go"}]

    def episode(*answers: tuple[str, str, float]) -> Episode:
        turns = [
            Turn(action={"role": "assistant", "content": "a"}, observation=[{"role": "tool", "content": text}],
                 status=status, reward=reward, finish=status != "running")
            for text, status, reward in answers
        ]  # fmt: skip
        final = SampleStatus(answers[-1][1])
        return Episode("t", 0, opening=opening, turns=turns, status=final, reward=answers[-1][2])

    recorded = episode(("3", "running", 0.0), ("done", "completed", 1.0))
    assert first_difference(recorded, episode(("3", "running", 0.0), ("done", "completed", 1.0))) is None
    assert first_difference(recorded, episode(("4", "running", 0.0), ("done", "completed", 1.0))) == (
        'turn 1 observation[0][\'content\']: recorded "3" != replayed "4"'
    )
    assert first_difference(recorded, episode(("3", "running", 0.0), ("done", "completed", 0.5))) == (
        "turn 2 reward: recorded 1.0 != replayed 0.5"
    )
    assert first_difference(
        recorded, episode(("3", "running", 0.0), ("done", "agent invalid action", 1.0))
    ) == ('turn 2 status: recorded "completed" != replayed "agent invalid action"')
    assert first_difference(recorded, episode(("3", "running", 0.0))) == (
        "number of turns: recorded 2 != replayed 1"
    )


def test_record_round_trips_through_json_on_cpu():
    turn = Turn(action={"role": "assistant", "content": "x"}, policy="m", version=3, tokens=4, offset=0,
                observation=[{"role": "tool", "content": "y"}], status="completed", reward=1.0, finish=True)  # fmt: skip
    episode = Episode("guess", 3, session_id=5, opening=[{"role": "user", "content": "go"}], turns=[turn],
                      status=SampleStatus.COMPLETED, reward=1.0, tokens={"prompt_ids": [1], "response_ids": [2],
                      "response_mask": [1]}, meta={"global_steps": 7})  # fmt: skip
    back = Episode.from_dict(json.loads(json.dumps(episode.to_dict())))
    assert back.to_dict() == episode.to_dict()
    assert back.messages == [{"role": "user", "content": "go"}, {"role": "assistant", "content": "x"}]
    with pytest.raises(ValueError, match="record version"):
        Episode.from_dict({**episode.to_dict(), "record_version": 99})


def test_a_file_that_is_not_records_is_named_on_cpu(tmp_path, capsys):
    path = tmp_path / "x.jsonl"
    path.write_text('{"task": "guess"}\n')
    with pytest.raises(SystemExit) as exc:
        main([str(path)])
    assert exc.value.code == 2
    assert "x.jsonl:1 is not an episode record" in capsys.readouterr().err


# ------------------------------------------------------------------------------------ the toy tasks

TOY = [
    ("guess", "guess", "agentrl_ext.envs.guess.task:GuessTask"),
    ("calc", "calc", "agentrl_ext.envs.calc.task:CalcTask"),
    ("gridroom", "gridroom", "agentrl_ext.envs.gridroom.task:GridRoomTask"),
]


@pytest.fixture(scope="module")
def toy_controller(tmp_path_factory):
    with env_servers(TOY, tmp_path_factory.mktemp("logs")) as servers:
        yield servers.controller_url


@pytest.mark.parametrize("task", ["guess", "calc", "gridroom"])
def test_expert_episode_replays_the_same_and_an_altered_one_does_not_on_cpu(
    task, toy_controller, tmp_path, capsys
):
    async def play() -> Any:
        async with ControllerClient(toy_controller) as client:
            return await play_expert_episode(client, task, 10003)

    played = asyncio.run(play())
    assert played.status == SampleStatus.COMPLETED and played.record is not None
    record = played.record.to_dict()
    assert record["turns"] and all(t["policy"] == "expert" for t in record["turns"])
    good = write(tmp_path / "good.jsonl", record)
    assert main([str(good), "--controller-url", toy_controller]) == 0
    assert (
        f"good.jsonl:1 {task}[10003]: same ({len(record['turns'])} turns, completed, reward 1)"
        in capsys.readouterr().out
    )

    bad = write(tmp_path / "bad.jsonl", record, altered(record))
    assert main([str(bad), "--controller-url", toy_controller]) == 1
    out, err = capsys.readouterr()
    assert f"bad.jsonl:1 {task}[10003]: same" in out
    recorded_text = json.dumps(record["turns"][0]["observation"][0]["content"])[:40]
    assert (
        f"bad.jsonl:2 {task}[10003]: differs at turn 1 observation[0]['content']: recorded \"not what the task said\" != replayed {recorded_text}"
        in out
    )
    assert "1 of 2 record(s) replay differently" in err

    # only one line of the file
    assert main([str(bad), "--controller-url", toy_controller, "--line", "1"]) == 0
    if task == "guess":  # the record's task started by the command itself (train split by default)
        assert main([str(good), "--launch"]) == 0


def test_replay_of_a_session_that_hit_the_turn_cap_on_cpu(toy_controller, tmp_path):
    async def play() -> Episode:
        async with ControllerClient(toy_controller) as client:
            from agentrl_ext.data.expert import expert_policy

            return await drive_episode(
                client, "guess", 10005, ScriptedActor(expert_policy("guess")), max_turns=1
            )

    episode = asyncio.run(play())
    assert episode.status is SampleStatus.TASK_LIMIT_REACHED and len(episode.turns) == 1
    assert main([str(write(tmp_path / "cap.jsonl", episode)), "--controller-url", toy_controller]) == 0


# ---------------------------------------------------------------------------- the AgentBench tasks


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    """A data directory with the vendored data installed (skips when there is no copy)."""
    return installed_data_dir(tmp_path_factory)


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_scripted_episode_of_each_task_replays_the_same_on_cpu(name, data_dir, tmp_path, capsys, monkeypatch):
    """Starts the task as agentrl-envs up would (its data, MariaDB or Docker engine as it needs)."""
    from agentrl_ext.env.launcher import EnvStack, free_port

    monkeypatch.setenv("AGENTRL_DATA_DIR", str(data_dir))

    task, kwargs, index, actions, cap = SCRIPTS[name]
    try:
        stack = EnvStack(tasks=[task], port=free_port(), split="test", kwargs={task: kwargs} if kwargs else {},
                         log_dir=tmp_path / "logs").start()  # fmt: skip
    except (RuntimeError, ValueError, OSError) as exc:
        pytest.skip(f"{name} cannot start here: {exc}")
    try:
        episode = asyncio.run(record_scripted(stack.api, stack.served_name(task), index, actions, cap))
        assert not episode.failed, episode.error
        assert episode.turns and episode.turns[0].observation, "the task answered nothing to compare"
        path = write(tmp_path / f"{name}.jsonl", episode, altered(episode.to_dict()))
        assert main([str(path), "--controller-url", stack.api, "--line", "1"]) == 0, capsys.readouterr()
        assert main([str(path), "--controller-url", stack.api, "--line", "2"]) == 1
        assert "differs at turn 1 observation[0]['content']" in capsys.readouterr().out
    finally:
        stack.stop()


def test_an_unreachable_controller_is_one_line_on_cpu(tmp_path, capsys):
    from agentrl_ext.testing.env_servers import free_port

    episode = Episode("guess", 1, opening=[], turns=[], status=SampleStatus.COMPLETED)
    url = f"http://127.0.0.1:{free_port()}/api"
    with pytest.raises(SystemExit) as exc:
        main([str(write(tmp_path / "r.jsonl", episode)), "--controller-url", url])
    assert exc.value.code == 1
    err = capsys.readouterr().err
    assert err.startswith("agentrl-replay: ") and url in err and "Traceback" not in err


def test_records_file_lists_every_line_on_cpu(tmp_path):
    episode = Episode("guess", 1, opening=[], turns=[], status=SampleStatus.CANCELLED)
    path = write(tmp_path / "r.jsonl", episode, {"task": "x", "record": episode.to_dict(), "run": 0})
    assert [(n, e.task) for n, e in read_records(path)] == [(1, "guess"), (2, "guess")]
