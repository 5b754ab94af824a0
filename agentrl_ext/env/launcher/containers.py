"""Task workers in containers (``agentrl-envs up --docker``): each worker in its own container of
the task's image (``scripts/build_task_image.sh``), labelled with the launcher that owns it, so
that the containers of a launcher that was killed are removed by the next one.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentrl_ext.env.launcher.processes import _script, free_port, worker_argv
from agentrl_ext.env.tasks import task_spec

logger = logging.getLogger(__name__)

CONTAINER_LABEL = "agentrl_ext.launcher"


class ContainerWorkers:
    """The container half of :class:`~agentrl_ext.env.launcher.stack.EnvStack` (its fields:
    ``services``, ``containers``, ``task_kwargs``, ``_client`` ...)."""

    services: dict[str, str]
    containers: dict[str, Any]
    task_kwargs: dict[str, dict[str, Any]]
    _client: Any
    heartbeat_interval: float | None

    if TYPE_CHECKING:  # EnvStack's

        @property
        def api(self) -> str: ...

        def _worker_address(self, port: int) -> dict[str, Any]: ...

    def _docker(self) -> Any:
        """The engine's client (one per stack, closed by :meth:`stop`)."""
        import docker

        if self._client is None:
            self._client = docker.DockerClient(base_url=self.services["dockerd"])
        return self._client

    def _start_container(self, name: str, key: str | None = None) -> None:
        key = key or name
        import docker

        from agentrl_ext.env.providers.docker import owner_is_alive, owner_label

        client = self._docker()
        for leftover in client.containers.list(all=True, filters={"label": CONTAINER_LABEL}):
            if not owner_is_alive(leftover.labels.get(CONTAINER_LABEL, "")):
                _remove_worker_container(client, leftover)  # of a launcher that died: sweep on restart
        image = f"agentrl-{name}:latest"
        try:
            client.images.get(image)
        except docker.errors.ImageNotFound:
            logger.info("building %s (scripts/build_task_image.sh %s)", image, name)
            built = _script(
                "build_task_image.sh", name, env={**os.environ, "DOCKER_HOST": self.services["dockerd"]}
            )
            if built.returncode != 0:
                raise RuntimeError(
                    f"scripts/build_task_image.sh {name} failed:\n{built.stdout}{built.stderr}"
                ) from None
        port = free_port()
        kwargs = {k: v for k, v in self.task_kwargs[name].items() if k != "data_dir"}
        address = self._worker_address(port)
        if address["secret_file"]:  # the file is on this host: its folder goes into the container
            folder = str(Path(address["secret_file"]).resolve().parent)
            volumes_secret = {folder: {"bind": folder, "mode": "ro"}}
            address["secret_file"] = str(Path(address["secret_file"]).resolve())
        else:
            volumes_secret = {}
        command = worker_argv("", port, self.api, kwargs, self.heartbeat_interval, python=(), **address)[1:]
        volumes = dict(volumes_secret)
        if "data" in task_spec(name).needs:
            from agentrl_ext.env.data_files import data_dir

            volumes[str(data_dir(self.task_kwargs[name].get("data_dir")))] = {"bind": "/data", "mode": "ro"}
        socket_url = str(kwargs.get("mariadb_url", ""))
        if socket_url.startswith("unix://"):
            folder = str(Path(socket_url.removeprefix("unix://").split("?")[0]).parent)
            volumes[folder] = {"bind": folder, "mode": "rw"}
        environment = {}
        if "docker" in task_spec(name).needs:  # its per-session containers: the engine's socket, same path
            engine = self.services["dockerd"]
            if engine.startswith("unix://"):
                path = engine.removeprefix("unix://")
                volumes[path] = {"bind": path, "mode": "rw"}
            environment["DOCKER_HOST"] = engine
        container_name = f"agentrl-envs-{key.replace('#', '-')}-{os.getpid()}"
        self.containers[key] = client.containers.run(
            image,
            command=command,
            name=container_name,
            # its own host name: the owner labels of the session containers it starts (host:pid:ticks,
            # pids of its own namespace) must not pass for this host's processes, or a sweep here (or
            # its own sweep there) would take live sessions for orphans and remove them
            hostname=container_name,
            network_mode="host",
            labels={CONTAINER_LABEL: owner_label()},
            volumes=volumes,
            environment=environment,
            detach=True,
        )

    def _remove_own_containers(self) -> None:
        """Remove every container labelled as this process's, also one never recorded (a Ctrl-C
        between the engine creating it and ``containers.run`` returning it)."""
        from agentrl_ext.env.providers.docker import owner_label

        try:
            client = self._docker()
            for container in client.containers.list(
                all=True, filters={"label": f"{CONTAINER_LABEL}={owner_label()}"}
            ):
                _remove_worker_container(client, container)
        except Exception as exc:  # noqa: BLE001 - the engine is gone: nothing left to remove there
            logger.warning("could not sweep this launcher's containers: %s", exc)


def _remove_worker_container(client: Any, container: Any) -> None:
    """Remove a worker container and the session containers its worker started (their owner label
    names the worker container's host name), which a killed worker leaves behind."""
    import docker.errors

    from agentrl_ext.env.providers.docker import LABEL_OWNER

    hostname = str(container.attrs.get("Config", {}).get("Hostname") or container.name)
    sessions = [
        c
        for c in client.containers.list(all=True, filters={"label": LABEL_OWNER})
        if c.labels.get(LABEL_OWNER, "").startswith(f"{hostname}:")
    ]
    for each in [container, *sessions]:
        try:
            each.remove(force=True)
        except docker.errors.NotFound:
            pass  # gone meanwhile (a worker closing its own session)
