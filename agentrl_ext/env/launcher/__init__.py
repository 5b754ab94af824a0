"""``agentrl-envs up``: the environment stack (controller, task workers, the servers they need) in one command.

    agentrl-envs up --tasks dbbench,kg,guess                # local worker processes
    agentrl-envs up --tasks dbbench,kg --docker --port 5020 # each worker in its own container
    agentrl-envs up --tasks alfworld,webshop --replicas alfworld=7,webshop=2 \
        --host 0.0.0.0 --advertise-host HEAD_IP --secret-file secret.txt  # for a multi-node trainer
    agentrl-envs up --tasks guess,calc --placement ray --ray-address HEAD:6379 \
        --per-node calc=1                                   # Ray actors on nodes offering agentrl_env
    agentrl-envs list                                       # the known tasks
    agentrl-envs front --controller-url URL --worker-secret-file F  # for AgentRL's agentrl-worker

``up`` starts what the tasks need (the MariaDB server of ``scripts/mariadb.sh`` for dbbench
unless it runs on SQLite, the private Docker engine of ``scripts/dockerd.sh`` for ``--docker``
and for tasks with per-session containers), the controller on ``HOST:PORT`` (127.0.0.1 unless
``--host``), ``--replicas`` workers per task (default one; a local process, or with ``--docker`` a container of the task's image built by
``scripts/build_task_image.sh``), waits until every worker is healthy and routable, prints
where everything listens, and on Ctrl-C / SIGTERM stops all of it, last started first, leaving
no process or container behind (and the servers it started itself, not those it found running).

The tasks it can start are the task catalogue's (:mod:`agentrl_ext.env.tasks`). One module per
concern: :mod:`.processes` (server processes, their command lines, waiting for routable workers:
also what the tests start their servers with, :mod:`agentrl_ext.testing.env_servers`),
:mod:`.containers` (workers in containers), :mod:`.ray_fleet` (``--placement ray``: the
controller and the workers as Ray actors across the cluster's nodes), :mod:`.stack` (:class:`EnvStack`, and
:func:`launch_from_config`, with which ``agentrl-train`` starts the same stack from the recipe,
``agentrl.envs.launch=true``), :mod:`.command` (the ``agentrl-envs`` command).
"""

from agentrl_ext.env.launcher.command import main
from agentrl_ext.env.launcher.containers import CONTAINER_LABEL
from agentrl_ext.env.launcher.processes import (
    DEFAULT_PORT,
    LOOPBACK,
    ServerProcess,
    controller_argv,
    free_port,
    front_argv,
    list_workers,
    script_path,
    wait_routable,
    wait_until,
    wants_mariadb,
    worker_argv,
)
from agentrl_ext.env.launcher.stack import EnvStack, launch_from_config

__all__ = [
    "CONTAINER_LABEL",
    "DEFAULT_PORT",
    "LOOPBACK",
    "EnvStack",
    "ServerProcess",
    "controller_argv",
    "free_port",
    "front_argv",
    "launch_from_config",
    "list_workers",
    "main",
    "script_path",
    "wait_routable",
    "wait_until",
    "wants_mariadb",
    "worker_argv",
]
