"""The verl plugin: minimal, lazy where verl allows it, and loud (with the cause) when a
registration fails, although verl itself swallows plugin import errors at DEBUG level."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_plugin_registers_every_component_lazily_on_cpu():
    proc = _python(
        """
        import sys
        import verl  # loads the verl.plugins entry point
        from verl.experimental.agent_loop.agent_loop import _agent_loop_registry
        from verl.trainer.ppo.core_algos import get_adv_estimator_fn
        from verl.trainer.ppo.v1 import get_trainer_cls
        import agentrl_ext.plugin as plugin
        assert plugin.FAILURES == {}, plugin.FAILURES
        assert _agent_loop_registry["agentrl"] == {"_target_": "agentrl_ext.rollout.agent_loop.AgentRLAgentLoop"}
        assert "agentrl_ext.rollout.agent_loop" not in sys.modules, "the agent loop is imported where it runs"
        assert "agentrl_ext.algos.task_norm" not in sys.modules, "the estimator is imported on first call"
        assert callable(get_adv_estimator_fn("task_norm_grpo"))
        assert get_trainer_cls("agentrl_sync").__name__ == "AgentRLTrainerSync"
        print("OK")
        """
    )
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-3000:]


def test_a_broken_registration_is_loud_and_named_on_cpu():
    # a module of the chain fails to import (sys.modules[name] = None makes `import name` raise)
    proc = _python(
        """
        import sys
        sys.modules["agentrl_ext.trainer.agentrl_trainer"] = None
        import verl
        import agentrl_ext.plugin as plugin
        print(sorted(plugin.FAILURES))
        """
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "trainer mode 'agentrl_sync'" in proc.stdout
    assert "could not register trainer mode 'agentrl_sync' with verl" in proc.stderr
    assert "agentrl_ext.trainer.agentrl_trainer" in proc.stderr  # the cause


def test_agent_loop_import_error_surfaces_where_it_is_instantiated_on_cpu():
    proc = _python(
        """
        import sys
        import verl
        import hydra
        from verl.experimental.agent_loop.agent_loop import _agent_loop_registry
        sys.modules["agentrl_ext.rollout.agent_loop"] = None
        try:
            hydra.utils.instantiate(_agent_loop_registry["agentrl"])
        except Exception as exc:
            print("ERROR", type(exc).__name__, exc)
        """
    )
    assert "ERROR" in proc.stdout, proc.stderr[-3000:]
    assert "agentrl_ext.rollout.agent_loop" in proc.stdout
