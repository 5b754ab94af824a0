"""``agentrl-build-dataset`` against a real controller: a training set is never built from a
held-out split by accident, and an unreachable controller is one line naming the URL."""

from __future__ import annotations

from collections import Counter

import pandas as pd
import pytest

from agentrl_ext.data.multitask import main as build_main
from agentrl_ext.env.launcher import EnvStack
from agentrl_ext.env.launcher import main as envs_main
from agentrl_ext.testing.env_servers import EnvServers, free_port

GUESS = "agentrl_ext.envs.guess.task:GuessTask"
CALC = "agentrl_ext.envs.calc.task:CalcTask"


@pytest.fixture(scope="module")
def controller(tmp_path_factory):
    """guess on its held-out (test) split, calc on its train split."""
    with EnvServers(tmp_path_factory.mktemp("env-logs")) as servers:
        ctl = servers.controller()
        servers.worker(ctl, GUESS, task_kwargs={"split": "test"}, heartbeat_interval=0.5)
        servers.worker(ctl, CALC, task_kwargs={"split": "train"}, heartbeat_interval=0.5)
        for name in ("guess", "calc"):
            servers.wait_routable(ctl, name)
        yield ctl.api


def test_the_launcher_serves_the_train_split_by_default_on_cpu(capsys):
    assert EnvStack(tasks=["guess", "dbbench"]).task_kwargs["guess"]["split"] == "train"
    assert EnvStack(tasks=["dbbench"]).task_kwargs["dbbench"]["split"] == "train"
    with pytest.raises(SystemExit):
        envs_main(["up", "--help"])
    assert "(default: train)" in " ".join(capsys.readouterr().out.split())


def test_a_training_set_from_a_held_out_split_needs_a_flag_on_cpu(controller, tmp_path, capsys):
    out = tmp_path / "train.parquet"
    with pytest.raises(SystemExit) as exc:
        build_main(["--controller-url", controller, "--tasks", "guess,calc", "--out", str(out)])
    err = capsys.readouterr().err
    assert exc.value.code == 1 and not out.exists()
    assert "held-out split(s) (guess: test)" in err and "--allow-held-out" in err
    assert "Traceback" not in err

    # the train split alone is fine, silently
    assert build_main(["--controller-url", controller, "--tasks", "calc", "--out", str(out)]) == 0
    assert "held-out" not in capsys.readouterr().err

    # asked for explicitly: written, and said so
    argv = ["--controller-url", controller, "--tasks", "guess,calc", "--out", str(out), "--allow-held-out"]
    assert build_main(argv) == 0
    assert (
        "warning: this training set is built from held-out split(s) (guess: test)" in capsys.readouterr().err
    )
    assert set(pd.read_parquet(out)["data_source"]) == {"guess", "calc"}

    # an evaluation set (each index once) of the held-out split needs no flag
    val = tmp_path / "val.parquet"
    assert (
        build_main(["--controller-url", controller, "--tasks", "guess", "--out", str(val), "--kind", "val"])
        == 0
    )
    assert Counter(pd.read_parquet(val)["data_source"]) == {"guess": 100}  # guess/README: test = 0..99


def test_an_unreachable_controller_is_one_line_on_cpu(tmp_path, capsys, monkeypatch):
    import functools

    from agentrl_ext.env import client
    from agentrl_ext.env.client import ControllerClient, RetryPolicy

    # the same error after a 2 s wait instead of the 60 s default (what the client waits is tested in tests/env)
    monkeypatch.setattr(
        client, "ControllerClient", functools.partial(ControllerClient, retry=RetryPolicy(deadline_s=2.0))
    )
    url = f"http://127.0.0.1:{free_port()}/api"
    with pytest.raises(SystemExit) as exc:
        build_main(["--controller-url", url, "--tasks", "guess", "--out", str(tmp_path / "x.parquet")])
    err = capsys.readouterr().err
    assert exc.value.code == 1
    assert err.strip().count("\n") == 0 and url in err and "agentrl-envs up" in err
