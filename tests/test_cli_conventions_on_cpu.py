"""Every console script (setup.cfg's entry points) follows one convention: ``--tasks``,
``--controller-url``, help that shows defaults and no reST markup (``agentrl_ext/cli.py``);
``agentrl-train`` answers ``--help`` without importing verl and prints early-check errors alone."""

from __future__ import annotations

import argparse
import configparser
import importlib
import re
import subprocess
import sys

import pytest

from agentrl_ext.testing.env_servers import REPO
from agentrl_ext.testing.tiny_model import tiny_model_path


def console_scripts() -> dict[str, str]:
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    lines = cfg["options.entry_points"]["console_scripts"].strip().splitlines()
    return dict(tuple(part.strip() for part in line.split("=")) for line in lines)  # type: ignore[misc]


#: extra help pages: the subcommands
SUBCOMMANDS = {
    "agentrl-envs": [["up"], ["list"]],
    "agentrl-data": [["list"], ["install"], ["fetch"], ["path"]],
}
ARGPARSE_SCRIPTS = sorted(set(console_scripts()) - {"agentrl-train"})


def _help(script: str, argv: list[str], monkeypatch, capsys) -> tuple[str, list[argparse.ArgumentParser]]:
    module, _, name = console_scripts()[script].partition(":")
    main = getattr(importlib.import_module(module), name)
    parsers: list[argparse.ArgumentParser] = []
    original = argparse.ArgumentParser.print_help

    def record(self, file=None):
        parsers.append(self)
        original(self, file)

    monkeypatch.setattr(argparse.ArgumentParser, "print_help", record)
    with pytest.raises(SystemExit) as exc:
        main([*argv, "--help"])
    assert exc.value.code == 0
    return capsys.readouterr().out, parsers


@pytest.mark.parametrize("script", ARGPARSE_SCRIPTS)
def test_every_console_script_follows_the_convention_on_cpu(script, monkeypatch, capsys):
    for argv in [[], *SUBCOMMANDS.get(script, [])]:
        out, parsers = _help(script, argv, monkeypatch, capsys)
        assert out.startswith("usage: ")
        assert "``" not in out and not re.search(r":[a-z]+:`", out), f"{script} {argv}: reST markup in help"
        assert not re.search(r"--controller(?![-\w])", out), f"{script}: --controller-url, not --controller"
        assert not re.search(r"--task(?![-\w])", out), f"{script}: --tasks, not --task"
        (parser,) = parsers
        assert issubclass(parser.formatter_class, argparse.ArgumentDefaultsHelpFormatter), script
        for action in parser._actions:
            shown = action.help not in (None, argparse.SUPPRESS)
            if shown and action.option_strings and action.default not in (None, False, [], argparse.SUPPRESS):
                assert f"(default: {action.default})" in " ".join(out.split()), (script, action.dest)


def test_old_spellings_still_parse_on_cpu():
    from agentrl_ext.eval.cli import build_parser

    old = build_parser().parse_args(
        ["--controller", "http://x/api", "--task", "a,b", "--task", "c", "--model", "m"]
    )
    new = build_parser().parse_args(["--controller-url", "http://x/api", "--tasks", "a,b,c", "--model", "m"])
    from agentrl_ext.cli import tasks_of

    assert (old.controller_url, tasks_of(old.tasks)) == (new.controller_url, tasks_of(new.tasks))
    assert tasks_of(new.tasks) == ["a", "b", "c"]


def _train(*args: str, cwd) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "agentrl_ext.trainer.main", *args]
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=300, check=False)


def test_train_help_imports_no_verl_and_keeps_recipe_descriptions_whole_on_cpu(tmp_path):
    code = (
        "import sys; sys.argv = ['agentrl-train', '--help']\n"
        "from agentrl_ext.trainer.main import main; main()\n"
        "print('verl imported:', any(m == 'verl' or m.startswith('verl.') for m in sys.modules))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.rstrip().endswith("verl imported: False")
    assert proc.stderr == ""  # no warnings before (or after) the help
    flat = " ".join(proc.stdout.split())
    # the whole first paragraph of each recipe's header, e.g. cpu_multitask's five lines
    assert "evaluates again, prints the per-task table before/after and writes plots." in flat


def test_train_early_check_prints_the_message_alone_on_cpu(tmp_path):
    proc = _train(
        "--config-name", "cpu_smoke", f"actor_rollout_ref.model.path={tiny_model_path()}",
        f"hydra.run.dir={tmp_path / 'hydra'}", "algorithm.adv_estimator=task_norm_grpo", cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr and "engine is not available" not in proc.stderr
    assert (
        proc.stderr.strip()
        .splitlines()[-1]
        .startswith("agentrl-train: algorithm.adv_estimator=task_norm_grpo")
    )


def test_train_unknown_key_gets_a_did_you_mean_on_cpu(tmp_path):
    proc = _train("--config-name", "cpu_smoke", "agentrl.agent_loop.max_turn=3", cwd=tmp_path)
    assert proc.returncode == 1
    assert proc.stderr.strip() == (
        "agentrl-train: agentrl.agent_loop.max_turn is not an agentrl key; did you mean agentrl.agent_loop.max_turns"
        " or agentrl.agent_loop.max_tokens_per_turn or agentrl.eval.max_turns? (agentrl-train --help lists them all)"
    )
    # a key below a mapping-valued key is a key
    from agentrl_ext.config import unknown_agentrl_override

    assert unknown_agentrl_override("agentrl.envs.task_kwargs.guess.show_range") is None


def test_bare_cpu_agentrl_names_how_to_build_its_data_on_cpu(tmp_path):
    proc = _train(
        "--config-name", "cpu_agentrl", f"agentrl.cache_dir={tmp_path / 'cache'}",
        f"actor_rollout_ref.model.path={tiny_model_path()}", f"hydra.run.dir={tmp_path / 'hydra'}", cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert "agentrl.assets.build_env_data=true" in last and "agentrl-build-dataset --tasks" in last
