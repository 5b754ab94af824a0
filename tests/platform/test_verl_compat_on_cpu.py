"""Fails loudly when verl changes a name or default the CPU backend relies on."""

from __future__ import annotations

import importlib

import pytest

from agentrl_ext.platform import verl_compat


def test_verl_version_is_pinned_on_cpu():
    verl_compat.check_verl_version()


@pytest.mark.parametrize(("module", "attr"), verl_compat.PRIVATE_NAMES)
def test_private_verl_names_exist_on_cpu(module, attr):
    obj = importlib.import_module(module)
    for part in attr.split("."):
        assert hasattr(obj, part), f"verl {module}.{attr} is gone: update agentrl_ext.platform.verl_compat"
        obj = getattr(obj, part)


def test_plugin_activates_cpu_backend_on_cpu():
    import verl  # noqa: F401  (loads the verl.plugins entry point)
    from verl.plugin.platform import get_platform
    from verl.utils.distributed import initialize_global_process_group_ray
    from verl.workers.engine.base import EngineRegistry
    from verl.workers.rollout.base import get_rollout_class
    from verl.workers.rollout.replica import get_rollout_replica_class

    from agentrl_ext.platform.hf_rollout import HFReplica, HFServerAdapter

    platform = get_platform()
    assert platform.device_name == "cpu"
    assert platform.communication_backend_name() == "gloo"
    assert platform.ray_resource_options(0.5) == {"num_cpus": 0.5}
    assert get_rollout_replica_class("hf") is HFReplica
    assert get_rollout_class("hf", "async") is HFServerAdapter
    assert initialize_global_process_group_ray.__defaults__ == (None, "gloo")
    assert EngineRegistry.get_engine_cls("language_model", "fsdp2").__name__ == "FSDPEngineWithLMHead"


def test_cpu_device_module_covers_verl_calls_on_cpu():
    from agentrl_ext.platform.cpu_platform import cpu_device_module as dev

    dev.empty_cache()
    dev.synchronize()
    free, total = dev.mem_get_info()
    assert 0 < free <= total
    assert dev.memory_allocated() > 0
    state = dev.get_rng_state()
    dev.set_rng_state(state)
    assert dev.current_device() == "cpu"
    with pytest.raises(AttributeError, match="does not emulate"):
        dev.no_such_cuda_call  # noqa: B018
