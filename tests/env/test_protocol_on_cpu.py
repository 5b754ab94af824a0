"""Protocol models, the invalid-action policy and configuration checks (no servers)."""

from __future__ import annotations

import pydantic
import pytest
from env_helpers import raw_tool_step, text_step, tool_step

from agentrl_ext.env.controller.config import ControllerConfig
from agentrl_ext.env.protocol import (
    EnvOutput,
    HeartbeatRequest,
    InteractRequest,
    SampleStatus,
    StartSampleRequest,
    WorkerStartSampleRequest,
    error_detail,
)
from agentrl_ext.env.providers.base import ResourceSpec, truncate_output
from agentrl_ext.env.worker import Task, function_tool, parse_action

TOOLS = ["echo", "finish"]


def test_status_values_are_agentrl_wire_strings():
    assert [s.value for s in SampleStatus] == [
        "running",
        "completed",
        "agent context limit",
        "agent validation failed",
        "agent invalid action",
        "task limit reached",
        "unknown",
        "task error",
        "cancelled",
    ]
    assert not SampleStatus.RUNNING.finished
    assert all(s.finished for s in SampleStatus if s is not SampleStatus.RUNNING)


def test_worker_answer_becomes_controller_answer_with_metrics_key():
    out = EnvOutput.model_validate({"messages": [{"role": "tool", "content": "x"}], "metric": {"score": 1}})
    answer = out.to_interact_response()
    assert answer.metrics == {"score": 1}
    assert "metrics" in answer.model_dump() and "metric" not in answer.model_dump()


@pytest.mark.parametrize(
    "body",
    [
        {"messages": []},
        {"messages": "hi"},
        {"messages": [{"content": "no role"}]},
        {"messages": [1, 2]},
    ],
)
def test_interact_request_rejects_malformed_messages(body):
    with pytest.raises(pydantic.ValidationError):
        InteractRequest.model_validate(body)


def test_start_sample_request_accepts_int_and_str_indices():
    assert StartSampleRequest(name="t", index=3).index == 3
    assert StartSampleRequest(name="t", index="a-1").index == "a-1"
    with pytest.raises(pydantic.ValidationError):
        StartSampleRequest.model_validate({"name": "t", "index": [1]})


@pytest.mark.parametrize(
    "body",
    [
        '{"name": "t", "index": true}',
        '{"name": "t", "index": false}',
    ],
)
def test_boolean_is_not_a_sample_index(body):
    with pytest.raises(pydantic.ValidationError, match="not the boolean"):
        StartSampleRequest.model_validate_json(body)
    with pytest.raises(pydantic.ValidationError, match="not the boolean"):
        WorkerStartSampleRequest.model_validate_json(body.replace('"name": "t"', '"session_id": 1'))
    with pytest.raises(pydantic.ValidationError, match="not the boolean"):
        HeartbeatRequest.model_validate({"name": "t", "concurrency": 1, "indices": [0, True]})


@pytest.mark.parametrize(
    ("body", "detail"),
    [
        (b'{"detail": "no such session 3"}', "no such session 3"),
        (b'{"error": "x"}', "{'error': 'x'}"),
        (b"<html>502 Bad Gateway</html>", "<html>502 Bad Gateway</html>"),
        (b"\xff" * 400, "\ufffd" * 300),
    ],
    ids=["detail", "other-json", "text", "bytes"],
)
def test_error_detail_reads_every_error_shape(body, detail):
    assert error_detail(body) == detail


def test_valid_tool_call_is_parsed():
    action = parse_action(tool_step("echo", {"text": "hi"}, "c9"), TOOLS)
    assert action.problem is None
    assert [(c.id, c.name, c.arguments) for c in action.tool_calls] == [("c9", "echo", {"text": "hi"})]


def test_no_tool_call_fails_validation():
    action = parse_action(text_step("I will not use tools"), TOOLS)
    assert action.problem is not None
    assert action.problem.status is SampleStatus.AGENT_VALIDATION_FAILED
    assert "no tool call" in action.problem.reason and "echo" in action.problem.reason


def test_unknown_tool_is_an_invalid_action():
    action = parse_action(tool_step("rm_rf", {}), TOOLS)
    assert action.problem is not None
    assert action.problem.status is SampleStatus.AGENT_INVALID_ACTION
    assert "'rm_rf'" in action.problem.reason


@pytest.mark.parametrize("raw", ['{"text": ', "[1, 2]", "not json"])
def test_malformed_arguments_fail_validation(raw):
    action = parse_action(raw_tool_step("echo", raw), TOOLS)
    assert action.problem is not None
    assert action.problem.status is SampleStatus.AGENT_VALIDATION_FAILED
    assert "'echo'" in action.problem.reason


def test_plain_text_task_accepts_text():
    assert parse_action(text_step("ls -la"), None).problem is None


def test_task_rejects_malformed_tools_naming_the_entry():
    class Bad(Task):
        name = "bad"
        tools = [function_tool("ok", "fine", {}), {"type": "function", "function": {}}]

        def get_indices(self):
            return [0]

        async def start_sample(self, index, session):
            raise AssertionError

    with pytest.raises(ValueError, match=r"tools\[1\]"):
        Bad()


def test_truncate_output_marks_the_cut():
    text, cut = truncate_output("x" * 1000, 800)
    assert cut and text.startswith("x" * 800) and "200 more characters" in text
    assert truncate_output("short", 800) == ("short", False)


@pytest.mark.parametrize("network", ["bridge", "default", "my-net"])
def test_resource_spec_allows_no_bridge_network(network):
    with pytest.raises(ValueError, match="not allowed"):
        ResourceSpec(network=network)


def test_controller_config_names_the_bad_value():
    with pytest.raises(ValueError, match="idle_timeout_s"):
        ControllerConfig(idle_timeout_s=0)
    with pytest.raises(ValueError, match="rejoin_grace_s"):
        ControllerConfig(rejoin_grace_s=-1)
    assert ControllerConfig(rejoin_grace_s=0).rejoin_grace_s == 0
