"""Several Ray nodes on one machine, on loopback only: for the tests and the bench of the fleet on Ray.

Ray binds every node to the address it finds "remotely reachable" (it turns 127.0.0.1 into the
machine's interface address), so a multi-node cluster on this machine would listen beyond
loopback. :func:`in_loopback_namespace` runs a command in a new network namespace whose only
interface is ``lo`` (Linux, root: ``unshare --net``); there Ray falls back to 127.0.0.1 and
nothing the cluster or the fleet opens is reachable from outside the namespace.
:class:`LocalCluster` refuses to start anywhere else.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
from collections.abc import Sequence
from typing import Any

RAY_TMPDIR = "RAY_TMPDIR"
"""Where Ray keeps its files (sessions, sockets, the address file a plain ``ray.init()`` reads)."""


def only_loopback() -> bool:
    """Whether this process's network namespace has no interface but ``lo``."""
    return [name for _index, name in socket.if_nameindex()] == ["lo"]


def namespace_unavailable() -> str | None:
    """Why a loopback-only network namespace cannot be made here (None: it can)."""
    if os.geteuid() != 0:
        return "the multi-node Ray tests create a network namespace: run them as root"
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return "the multi-node Ray tests need unshare (util-linux) and ip (iproute2)"
    return None


def loopback_namespace_argv(argv: Sequence[str]) -> list[str]:
    """``argv`` run in a new network namespace with only ``lo`` (up)."""
    return ["unshare", "--net", "--", "sh", "-c", 'ip link set lo up && exec "$@"', "sh", *argv]


def in_loopback_namespace(
    argv: Sequence[str], timeout_s: float, capture: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` in a new loopback-only network namespace (root); its output captured as text
    (``capture``) or shown."""
    if reason := namespace_unavailable():
        raise RuntimeError(reason)
    # Ray's files of its own: a plain ray.init() elsewhere on this machine (another test, another
    # job) joins the cluster named in $RAY_TMPDIR/ray/ray_current_cluster, which must not be ours
    ray_tmp = tempfile.mkdtemp(prefix="rayns-", dir="/tmp")  # short: Ray's socket paths are bounded
    try:
        return subprocess.run(
            loopback_namespace_argv(argv),
            capture_output=capture,
            text=True,
            timeout=timeout_s,
            check=False,
            env={**os.environ, RAY_TMPDIR: ray_tmp},
        )
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)


def health_checks(node_death_s: float) -> dict[str, int]:
    """Ray's GCS health-check settings that declare a silent node dead after ~``node_death_s``
    (3 failed checks; on a real cluster: ``RAY_health_check_period_ms`` etc. on the head)."""
    period_ms = max(200, int(node_death_s * 1000 / 6))
    return {
        "health_check_initial_delay_ms": period_ms,
        "health_check_period_ms": period_ms,
        "health_check_timeout_ms": period_ms,
        "health_check_failure_threshold": 3,
    }


class LocalCluster:
    """A Ray head (no environment slots) and environment nodes offering ``resource``."""

    def __init__(
        self,
        head_cpus: int = 2,
        object_store_mb: int = 80,
        dashboard: bool = False,
        node_death_s: float | None = None,
    ) -> None:
        """``node_death_s``: about how long the head waits before it declares a silent node dead
        (None: Ray's default, about 65 s: 5 failed health checks, each 3 s apart with a 10 s timeout)."""
        from ray.cluster_utils import Cluster

        if not os.environ.get(RAY_TMPDIR, "").startswith("/tmp/rayns-"):
            raise RuntimeError(
                f"LocalCluster needs Ray files of its own (${RAY_TMPDIR}); run it through in_loopback_namespace"
            )
        if not only_loopback():
            raise RuntimeError(
                "LocalCluster binds Ray beyond loopback here; run it in a loopback-only network namespace "
                "(agentrl_ext.testing.ray_cluster.in_loopback_namespace)"
            )
        self.object_store = object_store_mb * 1024 * 1024
        self.cluster = Cluster(
            initialize_head=True,
            head_node_args={
                "num_cpus": head_cpus,
                # the dashboard also serves Ray's state API (ray list actors, ray.util.state)
                "include_dashboard": dashboard,
                "object_store_memory": self.object_store,
                **({"_system_config": health_checks(node_death_s)} if node_death_s else {}),
            },
        )
        self.env_nodes: list[Any] = []

    @property
    def address(self) -> str:
        return str(self.cluster.address)

    def add_env_node(self, slots: int, resource: str = "agentrl_env", cpus: int | None = None) -> Any:
        """Start a node offering ``slots`` of ``resource`` and ``cpus`` logical CPUs (default: one
        per slot, what a worker asks by default); returns Ray's node object."""
        node = self.cluster.add_node(
            num_cpus=slots if cpus is None else cpus,
            resources={resource: slots},
            object_store_memory=self.object_store,
        )
        self.env_nodes.append(node)
        return node

    def freeze(self, node: Any) -> list[int]:
        """SIGSTOP every process of ``node`` (Ray's and all their descendants): the node vanished
        without closing anything. :meth:`remove` ends them (SIGKILL works on stopped processes)."""
        import psutil

        tree: list[int] = []
        for infos in node.all_processes.values():
            for info in infos:
                if info.process is None:
                    continue
                try:
                    root = psutil.Process(info.process.pid)
                    tree += [p.pid for p in [root, *root.children(recursive=True)]]
                except psutil.NoSuchProcess:
                    continue
        for pid in tree:
            try:
                os.kill(pid, signal.SIGSTOP)
            except ProcessLookupError:
                pass
        self.frozen = getattr(self, "frozen", []) + tree
        return tree

    def remove(self, node: Any) -> None:
        """The node goes away (its raylet and every process Ray started on it are killed)."""
        self.cluster.remove_node(node, allow_graceful=False)
        self.env_nodes.remove(node)
        for pid in getattr(self, "frozen", []):  # what Ray did not kill takes its pending signals
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass

    def shutdown(self) -> None:
        self.cluster.shutdown()


SERVER_MARKERS = ("-m agentrl_ext.env.controller", "-m agentrl_ext.env.worker")


def server_processes(markers: Sequence[str] = SERVER_MARKERS) -> list[tuple[int, str]]:
    """(pid, command line) of every live (not zombie) controller or task-worker process in this
    process's network namespace."""
    import psutil

    here = os.readlink("/proc/self/ns/net")
    out = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        try:
            if os.readlink(f"/proc/{proc.pid}/ns/net") != here:
                continue
        except OSError:
            continue
        argv = " ".join(proc.info["cmdline"] or [])
        if proc.info["status"] != psutil.STATUS_ZOMBIE and any(marker in argv for marker in markers):
            out.append((proc.pid, argv))
    return out
