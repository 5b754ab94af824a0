"""os without Docker: splits, AgentBench-FC's schemas and output layout, the shell wrapper on the
local provider, and the provider choice (no silent fallback to the unisolated local provider)."""

from __future__ import annotations

import asyncio
import inspect
import json
import logging

import pytest
import yaml

from agentrl_ext.env.data_files import DataError
from agentrl_ext.env.providers import LocalProvider
from envs.os.data import load_split, parse_sample
from envs.os.prompts import TOOLS, os_output
from envs.os.shell import Shell, run_script
from envs.os.task import OSTask, check_answer, match_answer


def test_splits_have_agentbench_sizes_on_cpu(os_data_dir):
    sizes = {split: len(load_split(split, os_data_dir)[1]) for split in ("test", "dev", "train")}
    assert sizes == {"test": 144, "dev": 26, "train": 1000}  # data README: 7+5+6+19+10+9+88, 26, 1000
    assert load_split("std", os_data_dir)[0] == "test"


def test_samples_read_like_agentbench_on_cpu(os_data_dir):
    raw = json.loads((os_data_dir / "agentbench/os_interaction/data/1/stock.json").read_text())[0]
    sample = load_split("test", os_data_dir)[1][0]  # data/1/stock.json is the first file
    assert sample.description == raw["description"]
    script = (os_data_dir / "agentbench/os_interaction/scripts/1/init/stock-log.sh").read_text()
    assert [(s.language, s.code) for s in sample.init] == [("bash", script)]
    assert sample.check is not None and sample.check[0] is None and sample.check[1].language == "python"
    assert sample.example is not None and sample.example.code == raw["evaluation"]["example"]["code"]
    matches = [s for s in load_split("test", os_data_dir)[1] if s.match is not None]
    assert len(matches) == 9 and all(m.match.get("strip") for m in matches if "answer" in m.match)


def test_tool_schemas_are_agentbench_fc_on_cpu(os_data_dir):
    config = yaml.safe_load((os_data_dir / "agentbench/configs/tasks/os.yaml").read_text())
    assert TOOLS == config["default"]["parameters"]["tools"]
    round_limit = inspect.signature(OSTask).parameters["round_limit"].default
    assert config["default"]["parameters"]["round_limit"] == round_limit == 8


def test_output_layout_and_truncation_on_cpu():
    assert os_output("") == "The output of the OS is empty."
    assert os_output("x" * 800) == "The output of the OS:\n\n" + "x" * 800
    assert os_output("y" * 801) == (
        "The output of the OS:\n\n" + "y" * 780 + "\n[truncated because the output is too long]"
    )


def test_match_rules_on_cpu():
    assert match_answer("love", {"answer": "love", "strip": True})
    assert not match_answer("Love", {"answer": "love"})
    assert not match_answer(220, {"answer": "220"})  # AgentBench compares the raw value
    assert match_answer("got 42 files", {"regex": r"\b42\b"})
    assert not match_answer("got 420 files", {"regex": r"\b42\b"}), (
        "a regex that is not in the answer matched"
    )
    assert not match_answer("", {"regex": r"^\d+$"}), "a regex that is not in the answer matched"
    assert match_answer("  7 ", {"regex": r"\d"}) and not match_answer("seven", {"regex": r"\d"})
    assert not match_answer(None, {"regex": "x"})


# a check step that passes when its second argument is the first step's stdout, kept whole
ARGV_2_IS_STEP_1 = "import sys; sys.exit(0 if sys.argv[1:] == ['anything', 'from-step-1\\n'] else 1)"


def test_check_chain_runs_example_and_checker_without_docker_on_cpu(os_data_dir, tmp_path):
    # AgentBench's usual check: a null step runs the example (its stdout is the expected value),
    # then the group's integer-match.py compares the answer ($1) with it ($2); the scripts are the
    # vendored ones, run by the local provider (no container: the logic is the same).
    scripts = os_data_dir / "agentbench" / "os_interaction" / "scripts" / "1"
    evaluation = {
        "check": [None, {"language": "python", "file": "check/integer-match.py"}],
        "example": "echo 42",
    }
    sample = parse_sample({"description": "d", "evaluation": evaluation}, scripts, "synthetic#0")
    failing_first = parse_sample(
        {"description": "d", "evaluation": {"check": ["exit 1", {"language": "bash", "code": "exit 0"}]}},
        scripts,
        "synthetic#1",
    )
    chained = parse_sample(
        {
            "description": "d",
            "evaluation": {"check": ["echo from-step-1", {"language": "python", "code": ARGV_2_IS_STEP_1}]},
        },
        scripts,
        "synthetic#2",
    )

    async def scenario() -> list[bool]:
        provider = LocalProvider(tmp_path / "boxes")
        async with provider.session("os-check", 1) as box:
            verdicts = [
                await check_answer(box, sample, answer, 10) for answer in ("42", " 42\n", "41", "forty-two")
            ]
            verdicts.append(await check_answer(box, failing_first, "anything", 10))
            verdicts.append(await check_answer(box, chained, "anything", 10))
        await provider.close()
        return verdicts

    # 42 and " 42\n" are the integer 42; 41 is not; "forty-two" makes int() fail (exit 1); a failing
    # step fails the chain; a later step gets the earlier step's output
    assert asyncio.run(scenario()) == [True, True, False, False, False, True]


def test_malformed_problem_names_where_on_cpu(tmp_path):
    with pytest.raises(DataError, match="f.json#3.*neither 'match' nor 'check'"):
        parse_sample({"description": "d", "evaluation": {}}, tmp_path, "f.json#3")
    with pytest.raises(DataError, match="f.json#0: script file .*nope.sh does not exist"):
        parse_sample({"description": "d", "evaluation": {"check": {"file": "nope.sh"}}}, tmp_path, "f.json#0")


def test_shell_state_carries_over_on_local_provider_on_cpu(tmp_path):
    from envs.os.data import Script

    async def scenario() -> list[str]:
        provider = LocalProvider(tmp_path / "boxes")
        outputs = []
        async with provider.session("os-test", 1) as box:
            shell = Shell(box, str(tmp_path / "state"), timeout_s=10)
            for code in (
                "mkdir sub && cd sub && var=3.14 && f() { echo fn-$1; }; export E=1",
                "basename $PWD; echo $var $E; f x",
                "echo out; echo err >&2; exit 3",
                "echo still $var",
            ):
                result = await shell.run(code)
                outputs.append(f"{result.exit_code}:{result.output}")
            checked = await run_script(
                box, Script("python", "import sys; print(sys.argv[1:])"), ["a b", "c"], 10, None
            )
            outputs.append(checked.output)
            quiet = await run_script(box, Script("bash", "echo $1-$2; echo hidden >&2"), ["p", "q"], 10, None)
            outputs.append(quiet.output)
        await provider.close()
        return outputs

    assert asyncio.run(scenario()) == [
        "0:",
        "0:sub\n3.14 1\nfn-x\n",
        "3:out\nerr\n",
        "0:still 3.14\n",
        "['a b', 'c']\n",
        "p-q\n",  # stdout only, as AgentBench feeds check scripts
    ]


def test_docker_is_required_unless_local_is_asked_for_on_cpu(os_data_dir, tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    task = OSTask(data_dir=str(os_data_dir))
    with pytest.raises(RuntimeError, match="needs a Docker engine.*provider='local'"):
        asyncio.run(task.setup())
    fallback = OSTask(data_dir=str(os_data_dir), allow_local_fallback=True)
    with caplog.at_level(logging.WARNING):
        asyncio.run(fallback.setup())
    assert not fallback.isolated and isinstance(fallback.provider, LocalProvider)
    assert "NOT ISOLATED" in caplog.text
    local = OSTask(data_dir=str(os_data_dir), provider="local")
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        asyncio.run(local.setup())
    assert not local.isolated and "NOT ISOLATED" in caplog.text


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"provider": "podman"}, "provider='podman'"),
        ({"on_timeout": "ignore"}, "on_timeout='ignore'"),
        ({"round_limit": 0}, "round_limit must be >= 1"),
        ({"split": "valid"}, "unknown OS-interaction split 'valid'"),
    ],
)
def test_bad_settings_name_the_value_on_cpu(os_data_dir, kwargs, message):
    with pytest.raises(ValueError, match=message):
        OSTask(data_dir=str(os_data_dir), **kwargs)


def test_results_name_the_benchmark_and_the_invalid_action_rule_on_cpu(os_data_dir):
    overall = OSTask(data_dir=str(os_data_dir)).calculate_overall([])
    assert (overall["benchmark"], overall["invalid_action_rule"]) == ("os-std", "feedback")
    strict = OSTask(data_dir=str(os_data_dir), split="dev", on_invalid_action="end").calculate_overall([])
    assert (strict["benchmark"], strict["invalid_action_rule"]) == ("os-dev", "end")
