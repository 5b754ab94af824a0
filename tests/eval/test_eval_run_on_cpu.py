"""agentrl-eval-run through a real controller and task workers (held-out splits of guess and calc).

Models: a fake OpenAI-compatible server on 127.0.0.1 with two scripted models (``bisect`` plays
guess by binary search; ``blurt`` answers in words, with no tool call), and the tiny model served
in process by our HF rollout server. Expected outcomes are computed here from the tasks' READMEs
(the secret of guess sample i is ``random.Random(i).randint(1, 16)``), never from the evaluator.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import threading
import time
from typing import Any

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from agentrl_ext.env.protocol import SampleStatus
from agentrl_ext.eval import EvalReport, EvalSettings, evaluate, evaluate_async, render_comparison
from agentrl_ext.eval.cli import main as eval_main
from agentrl_ext.rollout.replay import main as replay_main
from agentrl_ext.testing.env_servers import EnvServers, free_port
from agentrl_ext.testing.tiny_model import tiny_model_path

GUESS = "agentrl_ext.envs.guess.task:GuessTask"
CALC = "agentrl_ext.envs.calc.task:CalcTask"


def binary_search_guesses(secret: int, low: int = 1, high: int = 16) -> int:
    """How many guesses (mid = (low + high) // 2) binary search needs to hit ``secret``."""
    for n in range(1, 100):
        mid = (low + high) // 2
        if mid == secret:
            return n
        low, high = (mid + 1, high) if mid < secret else (low, mid - 1)
    raise AssertionError("unreachable")


def bisect_turn(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The next guess of binary search, read off the conversation (the server keeps no state)."""
    opening = next((m["content"] for m in messages if m["role"] == "user"), "")
    match = re.search(r"from (\d+) to (\d+)", opening or "")
    low, high = (int(match[1]), int(match[2])) if match else (1, 16)
    last_guess = None
    for m in messages:
        if m["role"] == "assistant" and m.get("tool_calls"):
            last_guess = int(json.loads(m["tool_calls"][0]["function"]["arguments"])["number"])
        elif m["role"] == "tool" and last_guess is not None:
            if m["content"].strip() == "higher":
                low = last_guess + 1
            elif m["content"].strip() == "lower":
                high = last_guess - 1
    call = {
        "id": f"call_{len(messages)}",
        "type": "function",
        "function": {"name": "guess", "arguments": json.dumps({"number": (low + high) // 2})},
    }
    return {"role": "assistant", "content": None, "tool_calls": [call]}


@pytest.fixture(scope="module")
def fake_openai():
    """``/v1/chat/completions`` with models ``bisect`` and ``blurt``; yields (base URL, request log)."""
    seen: list[dict[str, Any]] = []

    async def chat(request: Request) -> JSONResponse:
        body = await request.json()
        seen.append(body)
        if body["model"] == "bisect":
            message = bisect_turn(body["messages"])
        elif body["model"] == "blurt":
            message = {"role": "assistant", "content": "I think it is 8."}
        else:
            return JSONResponse({"error": {"message": f"model {body['model']} not found"}}, status_code=404)
        return JSONResponse({"choices": [{"index": 0, "message": message, "finish_reason": "stop"}]})

    app = Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    yield f"http://127.0.0.1:{port}/v1", seen
    server.should_exit = True
    thread.join(10)


@pytest.fixture(scope="module")
def controller(tmp_path_factory):
    """A controller with the held-out (test) splits of guess and calc as ``guess_test``, ``calc_test``,
    and ``guess_partial``: guess with 2 guesses and ``partial_credit`` 0.5 (a lost sample's reward > 0)."""
    with EnvServers(tmp_path_factory.mktemp("env-logs")) as servers:
        ctl = servers.controller()
        for spec, name in ((GUESS, "guess_test"), (CALC, "calc_test")):
            servers.worker(ctl, spec, task_kwargs={"split": "test", "name": name}, heartbeat_interval=1.0)
        partial = {"split": "test", "name": "guess_partial", "max_turns": 2, "partial_credit": 0.5}
        servers.worker(ctl, GUESS, task_kwargs=partial, heartbeat_interval=1.0)
        for name in ("guess_test", "calc_test", "guess_partial"):
            servers.wait_routable(ctl, name)
        yield ctl.api


def test_cli_endpoint_model_results_and_table_on_cpu(controller, fake_openai, tmp_path, capsys):
    base_url, _ = fake_openai
    out = tmp_path / "eval.json"
    argv = f"--controller-url {controller} --tasks guess_test,calc_test --indices 0:20 --runs 2".split()
    argv += f"--base-url {base_url} --model bisect --out {out} --no-progress --label fake".split()
    assert eval_main(argv) == 0
    data = json.loads(out.read_text())
    episodes = data["episodes"]
    assert len(episodes) == 2 * 20 * 2
    assert [(e["task"], e["index"], e["run"]) for e in episodes] == [
        (t, i, r) for t in ("guess_test", "calc_test") for i in range(20) for r in range(2)
    ]
    expected_turns = {i: binary_search_guesses(random.Random(i).randint(1, 16)) for i in range(20)}
    for e in episodes:
        assert set(e) >= {"task", "index", "run", "reward", "success", "turns", "status", "error"}
        if e["task"] == "guess_test":  # binary search always finds it within the 6 guesses
            assert (e["status"], e["reward"], e["success"]) == ("completed", 1.0, True)
            assert e["turns"] == expected_turns[e["index"]]
            assert e["models"] == ["bisect"] * e["turns"]
        else:  # calc has no guess tool: the first call ends the sample as an invalid action
            assert e["status"] == "agent invalid action"
            assert (e["reward"], e["success"], e["turns"]) == (0.0, False, 1)
        assert e["failed"] is False and e["error"] is None
    guess, calc = data["summary"]["guess_test"], data["summary"]["calc_test"]
    mean_turns = sum(expected_turns.values()) / 20
    assert guess["episodes"] == 40 and guess["success_rate"] == 1.0 and guess["reward_mean"] == 1.0
    assert guess["turns_mean"] == pytest.approx(mean_turns)
    assert guess["statuses"] == {"completed": 40} and guess["failed"] == 0
    assert calc["success_rate"] == 0.0 and calc["statuses"] == {"agent invalid action": 40}
    assert data["label"] == "fake" and data["settings"]["runs"] == 2
    table = capsys.readouterr().out
    guess_row = rf"guess_test\s+40\s+100\.0%\s+1\.000\s+{mean_turns:.2f}\s+0\s+completed 40"
    assert re.search(guess_row, table), table
    assert re.search(r"calc_test\s+40\s+0\.0%\s+0\.000\s+1\.00\s+0\s+agent invalid action 40", table), table
    # the results file reads back, and compares against another evaluation
    report = EvalReport.load(out)
    assert report.summary["guess_test"].episodes == 40
    worse = EvalReport.from_dict({**data, "label": "worse"})
    worse.summary["guess_test"].success_rate = 0.25
    comparison = render_comparison([worse, report])
    # 95% interval of the change: 1.96 * sqrt(0.25 * 0.75 / 40 + 1.0 * 0.0 / 40) = 0.134
    assert re.search(r"guess_test\s+25\.0%\s+100\.0%\s+\+75\.0 pts\s+±13\.4 pts", comparison), comparison
    temperature = data["settings"]["temperature"]
    sampling = "greedy" if temperature == 0 else f"temperature {temperature:g}"
    assert f"worse: 40 episodes per task, {sampling}; fake: 40 episodes per task, {sampling}" in comparison
    # the held-out worker's name becomes the task's (what the main job's tables and plots show)
    report.rename_tasks({"guess_test": "guess"})
    assert list(report.summary) == ["guess", "calc_test"] and report.settings["tasks"] == [
        "guess",
        "calc_test",
    ]
    assert {e.task for e in report.episodes} == {"guess", "calc_test"}
    with pytest.raises(ValueError, match="merges two"):
        report.rename_tasks({"calc_test": "guess"})


def test_cross_sampling_draws_every_turn_seeded_on_cpu(controller, fake_openai):
    base_url, seen = fake_openai
    settings = EvalSettings(seed=3, concurrency=6)
    before = len(seen)
    report = evaluate(
        controller,
        ["guess_test"],
        ["bisect", "blurt"],
        settings,
        base_url=base_url,
        indices=list(range(20)),
        progress=False,
    )
    requests = seen[before:]
    assert len(report.episodes) == 20
    drawn = [m for e in report.episodes for m in e.models]
    assert {"bisect", "blurt"} <= set(drawn)
    # every turn is one request to the model the record names
    assert sorted(r["model"] for r in requests) == sorted(drawn)
    for e in report.episodes:
        if "blurt" in e.models:  # a turn without a tool call ends the sample at once
            assert e.models[-1] == "blurt" and e.models.count("blurt") == 1
            assert (e.status, e.success) == ("agent validation failed", False)
        else:
            assert e.status == "completed" and e.success
            assert e.turns == binary_search_guesses(random.Random(e.index).randint(1, 16))
    assert report.turn_share["blurt"] == pytest.approx(drawn.count("blurt") / len(drawn))
    # the same seed draws the same models for every episode, whatever the concurrency
    again = evaluate(
        controller,
        ["guess_test"],
        ["bisect", "blurt"],
        EvalSettings(seed=3, concurrency=1),
        base_url=base_url,
        indices=list(range(20)),
        progress=False,
    )
    assert [e.models for e in again.episodes] == [e.models for e in report.episodes]


def test_cli_tiny_model_served_locally_cross_sampled_on_cpu(controller, tmp_path):
    """The tiny model (untrained: it writes no tool call) through the training agent loop."""
    models = [str(tiny_model_path(seed=0)), str(tiny_model_path(seed=1))]
    out = tmp_path / "tiny.json"
    argv = f"--controller-url {controller} --tasks guess_test --indices 0:16 --max-tokens 16".split()
    argv += "--prompt-length 512 --response-length 128 --temperature 1.0 --concurrency 16".split()
    argv += f"--model {models[0]} --model {models[1]} --out {out} --no-progress".split()
    assert eval_main(argv) == 0
    data = json.loads(out.read_text())
    assert len(data["episodes"]) == 16
    names = {tiny_model_path(seed=0).name, tiny_model_path(seed=1).name}
    for e in data["episodes"]:
        # guess's README: a turn without a (valid) tool call ends the sample, agent validation failed
        assert (e["status"], e["turns"], e["reward"], e["success"], e["failed"]) == (
            SampleStatus.AGENT_VALIDATION_FAILED.value,
            1,
            0.0,
            False,
            False,
        ), e
        assert set(e["models"]) <= names
    assert {m for e in data["episodes"] for m in e["models"]} == names  # both models generated turns
    assert data["summary"]["guess_test"]["statuses"] == {"agent validation failed": 16}
    # the episodes file holds each conversation: the opening messages and the one assistant turn
    from agentrl_ext.eval.report import episodes_path, read_episodes

    for record in read_episodes(episodes_path(out)).values():
        roles = [m["role"] for m in record.messages]
        assert roles[-1] == "assistant" and roles.count("assistant") == 1 and "user" in roles, roles
        # and its record: the token ids and loss mask the local model's turn left (all model tokens)
        assert record.record is not None
        (turn,) = record.record["turns"]
        tokens = record.record["tokens"]
        assert (
            tokens["response_mask"] == [1] * turn["tokens"] and len(tokens["response_ids"]) == turn["tokens"]
        )
        assert turn["policy"] in names and turn["status"] == "agent validation failed"
    assert replay_main([str(episodes_path(out)), "--controller-url", controller]) == 0


def test_bad_input_is_named_on_cpu(controller, fake_openai, tmp_path, capsys):
    base_url, _ = fake_openai
    common = ["--controller-url", controller, "--no-progress", "--out", str(tmp_path / "x.json")]
    cases = [
        (
            ["--task", "nosuch", "--model", "bisect", "--base-url", base_url],
            r"task 'nosuch' is not served.*calc_test",
        ),
        (
            ["--task", "guess_test", "--indices", "98:102", "--model", "bisect", "--base-url", base_url],
            r"indices \[100, 101\] are not offered",
        ),
        (["--task", "guess_test", "--model", str(tmp_path)], r"not a local HF checkpoint directory"),
        (["--task", "guess_test", "--model", "bisect", "--base-url", base_url, "--runs", "0"], r"runs=0"),
        (["--task", "guess_test", "--model", "bisect", "--success-reward", "x=y"], r"TASK=NUMBER"),
    ]
    for argv, message in cases:
        with pytest.raises(SystemExit) as exc:
            eval_main(common + argv)
        assert exc.value.code == 2
        assert re.search(message, capsys.readouterr().err), message


def test_incomplete_episode_scores_zero_whatever_the_environment_gave_on_cpu(controller, fake_openai):
    # guess_partial allows 2 guesses: binary search (8, then 4 or 12) solves secrets 8, 4 and 12;
    # any other secret ends "task limit reached" with the environment's partial reward, 0.5 x the
    # information its answers gave (> 0 after two answers, envs/guess/README.md). Evaluation scores
    # an episode that did not complete as 0 (eval/report.py's rule), not with that reward.
    base_url, _ = fake_openai
    indices = list(range(12))
    report = evaluate(
        controller,
        ["guess_partial"],
        ["bisect"],
        EvalSettings(),
        base_url=base_url,
        indices=indices,
        progress=False,
    )
    solved = {i for i in indices if random.Random(i).randint(1, 16) in (8, 4, 12)}
    assert 0 < len(solved) < len(indices), solved  # both kinds of episode are in the sample
    assert len(report.episodes) == len(indices)
    for e in report.episodes:
        if e.index in solved:
            assert (e.status, e.reward, e.success) == ("completed", 1.0, True), e
        else:
            assert (e.status, e.reward, e.success) == ("task limit reached", 0.0, False), e
    assert report.summary["guess_partial"].reward_mean == pytest.approx(len(solved) / len(indices))


def test_endpoint_that_fails_counts_episodes_as_failed_on_cpu(controller, fake_openai):
    base_url, _ = fake_openai
    report = asyncio.run(
        evaluate_async(
            controller, ["guess_test"], ["missing-model"], base_url=base_url, indices=[0, 1], progress=False
        )
    )
    assert [(e.status, e.failed) for e in report.episodes] == [("task error", True)] * 2
    assert all("404" in (e.error or "") for e in report.episodes)
    assert report.summary["guess_test"].failed == 2 and report.summary["guess_test"].success_rate == 0.0


def test_a_dead_model_endpoint_fails_the_command_on_cpu(controller, tmp_path, capsys):
    """Nothing listens at --base-url: exit 1 and a summary on stderr, not a silent 0 % table."""
    dead = f"http://127.0.0.1:{free_port()}/v1"
    out = tmp_path / "dead.json"
    argv = ["--controller-url", controller, "--tasks", "guess_test", "--indices", "0,1", "--model", "m"]
    code = eval_main([*argv, "--base-url", dead, "--no-progress", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 1
    assert "2 of 2 episodes failed, not by the agent's doing (guess_test: 2)" in err
    assert "127.0.0.1" in err  # the error names the endpoint
    assert EvalReport.load(out).summary["guess_test"].failed == 2  # the results are still written


def test_an_unreachable_controller_is_one_line_on_cpu(tmp_path, capsys, monkeypatch):
    import functools

    from agentrl_ext.env.client import RetryPolicy
    from agentrl_ext.eval import runner

    # the same error after a 2 s wait instead of the 60 s default (what the client waits is tested in tests/env)
    monkeypatch.setattr(runner, "RetryPolicy", functools.partial(RetryPolicy, deadline_s=2.0))
    url = f"http://127.0.0.1:{free_port()}/api"
    with pytest.raises(SystemExit) as exc:
        eval_main(["--controller-url", url, "--tasks", "guess", "--model", "m", "--base-url", url])
    err = capsys.readouterr().err
    assert exc.value.code == 1
    assert err.strip().count("\n") == 0 and url in err and "agentrl-envs up" in err


def test_episodes_file_holds_transcripts_and_resume_skips_finished_ones_on_cpu(
    controller, fake_openai, tmp_path, caplog
):
    """Every episode goes to OUT_STEM.episodes.jsonl with its conversation; --resume runs only the
    episodes not finished there (failed ones again), and the summary covers all of them."""
    from agentrl_ext.eval.report import episodes_path, read_episodes

    base_url, seen = fake_openai
    out = tmp_path / "eval" / "guess.json"
    common = ["--controller-url", controller, "--tasks", "guess_test", "--base-url", base_url]
    common += ["--out", str(out), "--no-progress"]
    turns = {i: binary_search_guesses(random.Random(i).randint(1, 16)) for i in range(4)}

    # indices 0, 1 against a model the endpoint does not have: both fail, and are recorded so
    assert eval_main([*common, "--indices", "0:2", "--model", "missing-model"]) == 1
    assert (
        "episode guess_test[0] run 0 failed (task error): pool member missing-model answered HTTP 404"
        in caplog.text
    )
    path = episodes_path(out)
    assert path == tmp_path / "eval" / "guess.episodes.jsonl"
    assert [r.failed for r in read_episodes(path).values()] == [True, True]

    # resumed with the right model on 0..3: the two failed ones run again, and the two new ones
    before = len(seen)
    assert eval_main([*common, "--indices", "0:4", "--model", "bisect", "--resume"]) == 0
    assert len(seen) - before == sum(turns.values())  # one request per assistant turn
    records = read_episodes(path)
    assert sorted(k[1] for k in records) == ["0", "1", "2", "3"]
    for key, record in records.items():
        index = int(key[1])
        assert (record.status, record.reward, record.turns, record.failed) == (
            "completed",
            1.0,
            turns[index],
            False,
        )
        roles = [m["role"] for m in record.messages]
        assert roles[0] in ("system", "user") and roles.count("assistant") == turns[index]
        assert roles.count("tool") == turns[index] - 1  # the last guess is answered by the end of the episode
        calls = [m["tool_calls"][0]["function"]["name"] for m in record.messages if m["role"] == "assistant"]
        assert calls == ["guess"] * turns[index] and record.models == ["bisect"] * turns[index]
    assert EvalReport.load(out).summary["guess_test"].episodes == 4
    assert "messages" not in json.loads(out.read_text())["episodes"][0]  # the summary stays small
    assert "record" not in json.loads(out.read_text())["episodes"][0]
    # every line holds the episode's record, which agentrl-replay re-drives through the controller
    for key, record in records.items():
        assert record.record is not None and record.record["meta"] == {"run": 0}
        assert [t["policy"] for t in record.record["turns"]] == ["bisect"] * turns[int(key[1])]
        assert record.record["turns"][-1]["status"] == "completed"
    assert replay_main([str(path), "--controller-url", controller]) == 0

    # resumed again: nothing left to run, the same summary
    before = len(seen)
    assert eval_main([*common, "--indices", "0:4", "--model", "bisect", "--resume"]) == 0
    assert len(seen) == before
    summary = EvalReport.load(out).summary["guess_test"]
    assert (summary.episodes, summary.success_rate) == (4, 1.0)


def test_a_verl_checkpoint_is_read_from_its_huggingface_folder_on_cpu(tmp_path):
    """--model global_step_N (or its actor/) loads actor/huggingface; without weights there (saved
    without hf_model) the error names verl's merge command and the save_contents fix."""
    import shutil

    from agentrl_ext.eval.policies import resolve_checkpoint

    step = tmp_path / "global_step_2"
    hf = step / "actor" / "huggingface"
    hf.mkdir(parents=True)
    tiny = tiny_model_path()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny / name, hf / name)
    (step / "actor" / "model_world_size_1_rank_0.pt").write_bytes(b"")  # verl's FSDP shard
    for given in (step, step / "actor", hf):
        with pytest.raises(ValueError) as exc:
            resolve_checkpoint(str(given))
        message = str(exc.value)
        assert (
            f"python -m verl.model_merger merge --backend fsdp --local_dir {step / 'actor'} --target_dir {hf}"
            in message
        )
        assert "save_contents=[model,optimizer,extra,hf_model]" in message
    shutil.copytree(tiny, hf, dirs_exist_ok=True)  # as the merger (or hf_model) leaves it
    assert resolve_checkpoint(str(step)) == resolve_checkpoint(str(step / "actor")) == str(hf)
    assert resolve_checkpoint(str(tiny)) == str(tiny)


DBBENCH = "agentrl_ext.envs.dbbench.task:DBBenchTask"


def test_results_record_each_tasks_benchmark_and_invalid_action_rule_from_its_workers_on_cpu(
    fake_openai, tmp_path, capsys
):
    """Two dbbench workers on SQLite, one with the default rule and one with ``end``, and guess:
    the summary records, per task, the benchmark and rule the workers report (docs/tasks.md:
    dbbench on AgentBench's test split is ``dbbench-std``; ``feedback`` is AgentBench-FC's rule),
    and ``blurt`` (never a tool call) plays out as each rule says: 15 rounds then the task's limit,
    or one turn ending as a failed validation."""
    from agentrl_ext.data.store import install_from
    from agentrl_ext.testing.vendored_data import vendored_data_dir

    shared = vendored_data_dir()
    if not (shared / "SHA256SUMS").is_file():
        pytest.skip(f"no vendored data copy at {shared}")
    data_dir = tmp_path / "data"
    install_from(shared, data_dir)
    base_url, _ = fake_openai
    with EnvServers(tmp_path / "logs") as servers:
        ctl = servers.controller()
        common = {"data_dir": str(data_dir), "backend": "sqlite"}
        servers.worker(ctl, DBBENCH, task_kwargs=common, heartbeat_interval=1.0)
        end = {**common, "name": "dbbench_end", "on_invalid_action": "end"}
        servers.worker(ctl, DBBENCH, task_kwargs=end, heartbeat_interval=1.0)
        servers.worker(
            ctl, GUESS, task_kwargs={"split": "test", "name": "guess_test"}, heartbeat_interval=1.0
        )
        for name in ("dbbench", "dbbench_end", "guess_test"):
            servers.wait_routable(ctl, name)
        out = tmp_path / "eval.json"
        argv = f"--controller-url {ctl.api} --tasks dbbench,dbbench_end,guess_test --indices 0,1".split()
        argv += f"--base-url {base_url} --model blurt --out {out} --no-progress --label blurt".split()
        assert eval_main(argv) == 0
    summary = json.loads(out.read_text())["summary"]
    cards = {t: (s["benchmark"], s["invalid_action_rule"]) for t, s in summary.items()}
    assert cards == {
        "dbbench": ("dbbench-std", "feedback"),
        "dbbench_end": ("dbbench-std", "end"),
        "guess_test": (None, None),  # the procedural tasks report neither
    }
    assert (
        summary["dbbench"]["statuses"] == {"task limit reached": 2} and summary["dbbench"]["turns_mean"] == 15
    )
    assert summary["dbbench_end"]["statuses"] == {"agent validation failed": 2}
    assert summary["dbbench_end"]["turns_mean"] == 1
    table = capsys.readouterr().out
    assert re.search(r"task\s+benchmark\s+rule\s+episodes", table), table
    assert re.search(r"dbbench\s+dbbench-std\s+feedback\s+2\s+0\.0%", table), table
    assert re.search(r"dbbench_end\s+dbbench-std\s+end\s+2\s+0\.0%", table), table
    assert re.search(r"guess_test\s+-\s+-\s+2\s+", table), table
    # the rule reads back from the file, and a comparison across rules says so
    report = EvalReport.load(out)
    assert report.summary["dbbench"].invalid_action_rule == "feedback"
    data = json.loads(out.read_text())
    other = EvalReport.from_dict({**data, "label": "ended"})
    other.summary["dbbench"].invalid_action_rule = "end"
    comparison = render_comparison([other, report])
    assert "note: dbbench ran under different invalid-action rules (ended end, blurt feedback)" in comparison
    assert "dbbench_end ran under" not in comparison
